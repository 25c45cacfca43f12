"""VideoRoPE (Wei et al., ICML 2025, "VideoRoPE: What Makes for Good Video Rotary Position Embedding?").

Three changes to 3D RoPE on a ``(T, H, W)`` grid, following the official code (``Wiselnn570/VideoRoPE``,
``get_t_scale_rope_index`` and ``apply_m_modify_multimodal_rotary_pos_emb``, written on Qwen2-VL's M-RoPE):

- **low-frequency temporal allocation**: one spectrum ``w_p = theta^(-p/P)`` over all ``P`` pairs; time takes the
  last (lowest) ``sections[0]`` pairs, so its long periods do not oscillate over the clip (V-NIAH-D's
  distractors); the other pairs alternate h, w from the highest frequency down (``spectrum="videorope"`` of
  :class:`~visionpe.rotary.rope.AxialRoPE`);
- **diagonal layout**: spatial indices are centred, ``h - (H-1)//2`` and ``w - (W-1)//2``, and offset by the
  (scaled) time index, so the centre of frame ``t`` sits at ``(d t, d t, d t)``: the frames advance along the
  diagonal of position space, symmetric in h and w;
- **adjustable temporal spacing**: the time index is ``d t`` with ``d = temporal_spacing`` (the official runs use
  ``scale_factor = 2.0``, the default here).

Positions of patch ``(t, h, w)``: ``(d t, h - (H-1)//2 + d t, w - (W-1)//2 + d t)`` (index coordinates; a grid's
``offset`` and ``spacing`` apply to ``t, h, w`` first, PI scaling next, then the layout). The official code adds
the text length before the clip to all three; an encoder has no text, so that constant (which cancels in every
score) is 0 here. Qwen's layout of channels is ``pairs="half"``, ``theta`` its LLM's (1e6 for Qwen2-VL); the
default here is the rest of the package's (interleaved pairs, ``theta=100`` for ViT-sized grids).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .._checks import check_bool, check_number
from ..coords import CoordinateSystem
from ..grid import Grid
from .conventions import (AXIAL_CONVENTIONS, PER_HEAD_LAYOUTS, ChannelLayout, FrequencyBands, ResolutionScaling,
                          check_records)
from .rope import AxialRoPE
from .scaling import scale_positions


class VideoRoPE(AxialRoPE):
    """VideoRoPE on a ``(T, H, W)`` grid: ``pe(q, k, grid) -> (q, k)`` as every rotary encoding.

    ``sections=(t, h, w)``: pairs per axis (default equal thirds; the official Qwen2-VL split is ``(16, 24, 24)``
    of 64 pairs); time gets the ``t`` lowest frequencies. ``temporal_spacing``: the time step ``d``;
    ``diagonal=False`` keeps plain (uncentred, unshifted) spatial indices, VideoRoPE without its diagonal layout.
    Every other keyword is :class:`~visionpe.rotary.rope.AxialRoPE`'s (``scaling``, ``coords``, augmentation,
    ``rotate_fraction``, ...). With ``coords="normalized"`` the spatial axes are centred by the coordinates
    themselves and only the time offset is added.
    """

    ndims = (3,)

    refused = AXIAL_CONVENTIONS + PER_HEAD_LAYOUTS  # its spectrum is "videorope"

    def __init__(self, *, head_dim: int, num_heads: int = 1, ndim: int = 3, theta: float = 100.0, ref_shape=None,
                 temporal_spacing: float = 2.0, diagonal: bool = True, bands: FrequencyBands = FrequencyBands(),
                 channels: ChannelLayout = ChannelLayout(), coordinates: CoordinateSystem = CoordinateSystem(),
                 resolution: ResolutionScaling = ResolutionScaling()):
        if ndim != 3:
            raise ValueError(f"videorope is defined on (T, H, W) grids: ndim must be 3, got ndim={ndim!r} (for images "
                             "use rope_axial or rope_mixed)")
        check_records("VideoRoPE", VideoRoPE.refused, bands=bands, channels=channels, coordinates=coordinates,
                      resolution=resolution)
        self.temporal_spacing = check_number("temporal_spacing", temporal_spacing, minimum=0.0, inclusive=False)
        self.diagonal = check_bool("diagonal", diagonal)
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, theta=theta, ref_shape=ref_shape,
                         bands=replace(bands, spectrum="videorope"), channels=channels, coordinates=coordinates,
                         resolution=resolution)

    def place(self, coords: torch.Tensor, grid: Grid, scales: torch.Tensor) -> torch.Tensor:
        """The diagonal layout with temporal spacing on ``coords (N, 3)`` in component order (after PI)."""
        time = self.components(range(3)).index(0)
        steps = grid.steps
        centre = [0.0 if self.coordinates.normalized or a == 0 else (s - 1) // 2 * step
                  for a, (s, step) in enumerate(zip(grid.shape, steps))]
        centre = scale_positions(torch.tensor([self.components(centre)], dtype=coords.dtype, device=coords.device),
                                 scales, self.scaling)
        t = coords[:, time:time + 1] * self.temporal_spacing
        spatial = coords - centre + t if self.diagonal else coords
        is_time = torch.arange(3, device=coords.device) == time
        return torch.where(is_time, t, spatial)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", temporal_spacing={self.temporal_spacing}, diagonal={self.diagonal}"
