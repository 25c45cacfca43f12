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

The training-time draw: with ``step_choices`` (e.g. :data:`STEPS`, the paper's set), a forward in training mode
places the patches at ``delta' * n`` with ``delta'`` drawn uniformly from ``step_choices`` by torch's default
generator (CPU), one draw per model forward shared by every block (per call outside a model); a batch is one
sample's draw (the paper draws per sample: a batch of one is that). Evaluation mode uses the fixed ``step``.

What is not here: text tokens (the prefix tokens are not rotated, as in every encoding of the package).
"""
from __future__ import annotations

import math

import torch

from .._checks import check_number
from ..coords import forward_draw
from ..grid import Grid
from .placed import PlacedRoPE

STEPS = tuple(2.0 ** -k for k in range(9))  # the paper's training set of increments, 1 .. 1/256


class V2PE(PlacedRoPE):
    """V2PE: ``pe(q, k, grid) -> (q, k)``; patch ``n`` (raster order) rotated by ``delta * n * theta^(-p/P)``.

    ``step``: the increment ``delta`` of one visual token, in ``(0, 1]`` (the paper's set is :data:`STEPS`; default
    1/4, the official evaluation's stride 64 over 256 tokens): evaluation's, and training's without
    ``step_choices``. ``step_choices`` (keyword-only): the increments a training forward draws from (each in
    ``(0, 1]``; e.g. :data:`STEPS`), or None (default: the fixed ``step`` in training too). ``theta``: RoPE's base
    (default 10000, the official rotary's). ``pairs``: ``"interleaved"`` (default) or ``"half"`` (the official
    ``rotate_half`` layout).
    """

    def __init__(self, head_dim: int, num_heads: int = 1, ndim: int = 2, step: float = 0.25,
                 theta: float = 10000.0, pairs: str = "interleaved", *, step_choices=None):
        self.step = check_number("step", step, minimum=0.0, inclusive=False, maximum=1.0)
        self.step_choices = check_step_choices(step_choices)
        super().__init__(head_dim, num_heads, ndim, theta, pairs)

    def pair_components(self) -> list[int]:
        return [0] * self.num_pairs

    def place(self, coords: torch.Tensor, grid: Grid, scales: torch.Tensor) -> torch.Tensor:
        """The raster index of each patch times ``step``: ``(N, 1)``."""
        strides = torch.tensor([math.prod(grid.shape[a + 1:]) for a in range(grid.ndim)], dtype=coords.dtype,
                               device=coords.device)
        return (coords @ strides * self.step)[:, None]

    def draw_transform(self, augment: bool, device):
        """In training with ``step_choices``: the placed positions ``step * n`` scaled to ``delta' * n``, ``delta'``
        drawn from ``step_choices`` (one draw per model forward); otherwise None (the fixed ``step``)."""
        if not (augment and self.step_choices is not None):
            return None
        drawn = forward_draw((self, "step"), self.draw_step)
        return lambda positions: positions * (drawn.to(positions) / self.step)

    def draw_step(self) -> torch.Tensor:
        """One increment drawn uniformly from ``step_choices`` by torch's default (CPU) generator: a 0-dim float64
        tensor."""
        return torch.tensor(self.step_choices, dtype=torch.float64)[torch.randint(len(self.step_choices), ())]

    def extra_repr(self) -> str:
        choices = "" if self.step_choices is None else f", step_choices={self.step_choices}"
        return super().extra_repr() + f", step={self.step}{choices}"


def check_step_choices(step_choices) -> tuple[float, ...] | None:
    """``step_choices`` as a tuple of increments in ``(0, 1]``, or None."""
    if step_choices is None:
        return None
    if isinstance(step_choices, (str, bytes)) or not hasattr(step_choices, "__len__") or len(step_choices) == 0:
        raise ValueError(f"step_choices={step_choices!r} must be a non-empty sequence of increments in (0, 1] (the "
                         f"paper's: {STEPS}) or None")
    return tuple(check_number("step_choices", v, minimum=0.0, inclusive=False, maximum=1.0) for v in step_choices)
