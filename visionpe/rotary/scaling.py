"""Resolution scaling for RoPE on a grid other than the training grid: PI, NTK-aware and YaRN, per axis.

All functions work on frequency vectors ``freqs: (ndim, heads, pairs)`` (axis ``a`` component of the
frequency of pair ``p``) and per-axis scale factors ``s_a = size_a / ref_size_a``, axes in ``xy`` order
(last grid axis first). Applied per axis, as FiT's VisionNTK / VisionYaRN do for images.

- ``pi`` (position interpolation, Chen et al. 2023; timm Eva ``ref_feat_shape``): positions ``* 1/s_a``,
  so any grid spans the training grid's coordinate range.
- ``ntk`` (NTK-aware, bloc97 2023): band ``i`` of ``n`` on an axis is scaled by ``s_a^(-i/(n-1))``,
  which equals raising ``theta`` to ``theta * s_a^(n/(n-1))``: high frequencies kept, the lowest one
  interpolated. Only for ``s_a > 1``.
- ``yarn`` (Peng et al. 2023): each frequency is blended between kept and interpolated by a ramp over
  ``r = ref_a / wavelength`` (``r < alpha``: interpolate, ``r > beta``: keep), and attention logits are
  sharpened by ``(0.1 ln s + 1)^2`` (applied as that factor on q and on k), ``s`` the geometric mean
  of the per-axis factors. Only for ``s_a > 1``.
"""
from __future__ import annotations

import math

import torch

SCALINGS = ("none", "pi", "ntk", "yarn")


def axis_scales(shape_xy, ref_xy, dtype=torch.float32) -> torch.Tensor:
    """Per-axis size ratios ``s_a = size_a / ref_a``, ``(ndim,)``."""
    return torch.tensor([s / r for s, r in zip(shape_xy, ref_xy)], dtype=dtype)


def scale_positions(coords_xy: torch.Tensor, scales: torch.Tensor, scaling: str) -> torch.Tensor:
    """Coordinates ``(N, ndim)`` as the rotation sees them (only ``pi`` moves them)."""
    if scaling == "pi":
        return coords_xy / scales.to(coords_xy.device)
    return coords_xy


def scale_frequencies(freqs: torch.Tensor, band_fraction: torch.Tensor, scales: torch.Tensor, ref_xy,
                      scaling: str, yarn_alpha: float = 1.0, yarn_beta: float = 32.0) -> torch.Tensor:
    """Frequencies ``(ndim, heads, pairs)`` after NTK or YaRN scaling (unchanged for none/pi).

    ``band_fraction: (pairs,)`` is ``i / (n - 1)`` for the pair's band ``i`` of ``n`` on its axis.
    """
    if scaling not in ("ntk", "yarn"):
        return freqs
    s = scales.clamp(min=1.0).to(freqs.device)[:, None, None]  # (ndim, 1, 1): extension only
    if scaling == "ntk":
        return freqs * s ** -band_fraction.to(freqs.device)
    ref = torch.tensor(ref_xy, dtype=freqs.dtype, device=freqs.device)[:, None, None]
    rotations = ref * freqs.abs() / (2 * math.pi)  # turns per training length along the axis
    keep = ((rotations - yarn_alpha) / (yarn_beta - yarn_alpha)).clamp(0.0, 1.0)
    return freqs * ((1 - keep) / s + keep)


def attention_factor(scales: torch.Tensor, scaling: str) -> torch.Tensor | float:
    """YaRN's factor on q and k (``sqrt`` of the logit temperature) from the per-axis ratios ``scales: (ndim,)``:
    ``0.1 ln s + 1``, ``ln s`` the mean of the axes' ``ln max(s_a, 1)``, as a 0-d tensor in ``scales``' dtype (a
    tensor, not a number, so ``torch.export`` computes it in the graph from a dynamic size); 1 for every other
    scaling."""
    if scaling != "yarn":
        return 1.0
    return 0.1 * scales.clamp(min=1.0).log().mean() + 1.0
