"""HoPE (Li et al., NeurIPS 2025, "HoPE: Hybrid of Position Embedding for Long Context Vision-Language Models",
arXiv 2505.20444; code ``hrlics/HoPE``, whose training code is not released): M-RoPE whose temporal pairs turn at
zero frequency.

Hybrid frequency allocation (the paper's section 4.1): one spectrum ``w_p = theta^(-p/P)`` over the ``P = head_dim /
2`` pairs, as M-RoPE's; the spatial axes take the highest frequencies, interleaved (h, w, h, w, ... from pair 0, as
VideoRoPE deals them), and the lowest ``sections[0]`` pairs, which VideoRoPE gives to time, are set to zero
frequency (NoPE): an identity block. At ``head_dim = 128``: x and y interleaved over the first 96 channels, the last
32 unrotated. The paper proves that zero temporal frequencies maximise its semantic-preference bound at any
temporal distance; the defining property is that the temporal pairs never turn.

Dynamic temporal scaling (section 4.2) writes the positions of a clip's patches as VideoRoPE's diagonal layout with
the temporal stride ``gamma`` (``temporal_scale``) in place of VideoRoPE's fixed 2: patch ``(t, h, w)`` sits at

    (gamma t,  h + gamma t,  w + gamma t)

(VideoRoPE also centres h and w on the frame and adds the text length before the clip: constants that cancel in every
score, left out). ``gamma`` is drawn from ``{0.5, 0.75, 1, 1.25, 1.5}`` in training and chosen at inference. Time
turns only the zeroed pairs, so it reaches the scores through the diagonal shift of the spatial positions: a key one
frame later scores as a key ``gamma`` rows and columns further on in the query's frame. On an image ``(H, W)`` (a
one-frame video for Qwen2-VL) the positions are ``(h, w)``. No resolution scaling (positions extrapolate, as in the
VLM). The official repository has no training code. The paper's position formula was not legible in the text read;
its wording (``l - L_t``, the frame's distance from the clip's start, scaled by ``gamma`` where VideoRoPE fixes 2)
is VideoRoPE's layout, and the MRoPE-I paper (arXiv 2510.23095) counts HoPE among the diagonal layouts.
"""
from __future__ import annotations

import torch

from .._checks import check_number, to_shape
from ..grid import Grid
from .placed import PlacedRoPE
from .rope import videorope_axes

TEMPORAL_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)  # the paper's set of temporal strides (training draws one per video)


def hope_sections(head_dim: int) -> tuple[int, int, int]:
    """The paper's split of ``P = head_dim / 2`` pairs: ``P / 4`` zeroed for time (rounded down), the rest shared by
    h and w (h takes the odd one)."""
    pairs = head_dim // 2
    time = pairs // 4
    return time, pairs - time - (pairs - time) // 2, (pairs - time) // 2


class HoPE(PlacedRoPE):
    """HoPE on ``(H, W)`` or ``(T, H, W)`` grids: ``pe(q, k, grid) -> (q, k)``; see the module docstring.

    ``sections=(t, h, w)``: pairs per axis over the one spectrum (sum ``head_dim / 2``; default
    :func:`hope_sections`: a quarter zeroed for time, the paper's 32 of 128 channels); ``temporal_scale``: the
    stride ``gamma`` of one frame (default 1; the paper's set is :data:`TEMPORAL_SCALES`); ``theta``: the spectrum's base
    (default 10000; Qwen2-VL's LLM uses 1e6); ``pairs``: ``"interleaved"`` (default) or ``"half"`` (Qwen's
    ``rotate_half``).
    """

    ndims = (2, 3)

    def __init__(self, head_dim: int, num_heads: int = 1, ndim: int = 3, sections=None, temporal_scale: float = 1.0,
                 theta: float = 10000.0, pairs: str = "interleaved"):
        if ndim not in (2, 3):
            raise ValueError(f"hope places (T, H, W) video grids or (H, W) images: ndim must be 2 or 3, got "
                             f"ndim={ndim!r}")
        self.sections = hope_sections(head_dim) if sections is None else to_shape("sections", sections, 3)
        if sum(self.sections) != head_dim // 2:
            raise ValueError(f"sections={self.sections} must sum to head_dim / 2 = {head_dim // 2} (pairs for t, h, "
                             "w)")
        self.temporal_scale = check_number("temporal_scale", temporal_scale, minimum=0.0, inclusive=False)
        self.num_components = ndim
        super().__init__(head_dim, num_heads, ndim, theta, pairs)

    def pair_components(self) -> list[int | None]:
        """h and w alternating from the highest frequency (the last two components), then the
        temporal pairs, which turn with nothing (zero frequency)."""
        axes = videorope_axes(self.sections, self.num_pairs)  # 1: h, 2: w, 0: t
        return [None if a == 0 else a - 3 + self.num_components for a in axes]

    def place(self, coords: torch.Tensor, grid: Grid, scales: torch.Tensor) -> torch.Tensor:
        """The diagonal layout ``(gamma t, h + gamma t, w + gamma t)`` on a clip; ``(h, w)`` on an image."""
        if self.num_components == 2:
            return coords
        shift = coords[:, :1] * self.temporal_scale
        return torch.cat([shift, coords[:, 1:] + shift], -1)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", sections={self.sections}, temporal_scale={self.temporal_scale}"
