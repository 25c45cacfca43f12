"""V2PE (Ge et al., ICCV 2025, "V2PE: Improving Multimodal Long-Context Capability of Vision-Language Models with
Variable Visual Position Encoding", arXiv 2412.09616; official code ``OpenGVLab/V2PE``, ``get_rope_pos_id``): 1D RoPE
over the token sequence in which visual tokens advance the position index by a fraction ``delta < 1`` instead of 1.

In the VLM, text token ``i`` sits at ``p_i = p_{i-1} + 1`` and visual token ``i`` at ``p_i = p_{i-1} + delta``,
``delta`` drawn per sample in training from ``{1, 1/2, 1/4, ..., 1/256}`` and chosen at inference so that a long
multimodal sequence stays inside the context the model was trained on. The official code writes it as
``delta = rope_pos_id_stride / num_image_token`` (the span of one 256-token tile: ``v2pe_rnd`` draws the stride from
``{1, 2, ..., 256}`` in training, ``v2pe_fix`` fixes it at evaluation, 64 in its ScienceQA script: ``delta = 1/4``) and
places the tile's tokens at ``p + delta (k + 1)`` after the text position ``p``, a constant that cancels in scores.

In an encoder every patch is a visual token: patch ``n`` of the row-major (raster) order of the grid sits at
``delta * n``, and every rotation pair turns with that one position on RoPE's 1D spectrum ``w_p = theta^(-p/P)``
(``P = head_dim / 2``). On a ``(T, H, W)`` grid the raster runs over frames too (a video is a sequence of frames'
tokens). The raster index reads the patches' index coordinates with the grid's offset and spacing, ``n = sum_a c_a prod_{b > a} size_b``, so a shifted
grid moves every patch by the same amount and scores stay relative (in the raster index, not in 2D).

What is not here: the training-time draw of ``delta`` (a data-side choice: build one encoding per ``delta``), and
text tokens (the prefix tokens are not rotated, as in every encoding of the package).
"""
from __future__ import annotations

import math

import torch

from .._checks import check_number
from ..grid import Grid
from .placed import PlacedRoPE

STEPS = tuple(2.0 ** -k for k in range(9))  # the paper's training set of increments, 1 .. 1/256


class V2PE(PlacedRoPE):
    """V2PE: ``pe(q, k, grid) -> (q, k)``; patch ``n`` (raster order) rotated by ``delta * n * theta^(-p/P)``.

    ``step``: the increment ``delta`` of one visual token, in ``(0, 1]`` (the paper's set is :data:`STEPS`; default
    1/4, the official evaluation's stride 64 over 256 tokens). ``theta``: RoPE's base (default 10000, the official
    rotary's). ``pairs``: ``"interleaved"`` (default) or ``"half"`` (the official ``rotate_half`` layout).
    """

    def __init__(self, head_dim: int, num_heads: int = 1, ndim: int = 2, step: float = 0.25,
                 theta: float = 10000.0, pairs: str = "interleaved"):
        self.step = check_number("step", step, minimum=0.0, inclusive=False, maximum=1.0)
        super().__init__(head_dim, num_heads, ndim, theta, pairs)

    def pair_components(self) -> list[int]:
        return [0] * self.num_pairs

    def place(self, coords: torch.Tensor, grid: Grid, scales: torch.Tensor) -> torch.Tensor:
        """The raster index of each patch times ``step``: ``(N, 1)``."""
        strides = torch.tensor([math.prod(grid.shape[a + 1:]) for a in range(grid.ndim)], dtype=coords.dtype,
                               device=coords.device)
        return (coords @ strides * self.step)[:, None]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", step={self.step}"
