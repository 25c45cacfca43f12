"""Conditional position encoding (CPVT's PEG): a depthwise convolution over the token grid."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from .._checks import check_grid_ndim, check_ndim, check_nonnegative_int, check_positive_int
from .._compat import autocast_off
from ..grid import Grid, Layout, as_layout
from ..sharding import call_gathered
from ._base import TokenEncoding, check_tokens


def feature_map(x: torch.Tensor, shape: List[int], prefix: int, dtype: torch.dtype) -> torch.Tensor:
    """The patch tokens of ``x: (B, P + N, C)`` as a feature map ``(B, C, *shape)`` in ``dtype`` (a TorchScript
    function, as :func:`add_feature_map`: PEG's eager and scripted forms)."""
    return x[:, prefix:].transpose(1, 2).reshape([x.shape[0], x.shape[2]] + shape).to(dtype)


def add_feature_map(x: torch.Tensor, encoded: torch.Tensor, prefix: int) -> torch.Tensor:
    """``x: (B, P + N, C)`` with the feature map ``encoded: (B, C, *grid)`` added to its patch tokens (row-major),
    in ``x``'s dtype; the prefix tokens unchanged."""
    patches = x[:, prefix:]
    return torch.cat([x[:, :prefix], patches + encoded.flatten(2).transpose(1, 2).to(patches.dtype)], dim=1)


class PEG(TokenEncoding):
    """Position Encoding Generator (Chu et al., CPVT 2021): ``x_patch + DWConv(x_patch)``.

    Position comes from zero padding at the borders, so it is defined for any grid size without
    any resampling. Prefix tokens pass through unchanged.

    ``block_index``: where a model adds it, before block ``block_index``; the default 1 is CPVT's best placement
    (after the first encoder block); 0 adds it to the patch embeddings.

    Call: ``pe(x, grid)`` with ``x: (B, P + N, dim)`` -> same shape.
    """

    reads_spacing = False  # position comes from the convolution's zero padding, in grid steps: a grid's spacing is refused (check_spacing)

    def __init__(self, dim: int, ndim: int = 2, kernel_size: int = 3, block_index: int = 1):
        super().__init__()
        self.ndim = check_ndim(ndim)
        self.block_index = check_nonnegative_int("block_index", block_index)
        self.dim = check_positive_int("dim", dim)
        check_positive_int("kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd so the output keeps the grid shape, got {kernel_size}")
        conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[ndim - 1]
        self.proj = conv(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: torch.Tensor, grid: Grid | Layout) -> torch.Tensor:
        layout = as_layout(grid)
        if layout.keep is not None:
            raise ValueError("peg convolves the full patch grid: apply it before dropping or masking tokens")
        grid = layout.grid
        check_grid_ndim(grid, self.ndim, "peg")
        self.check_spacing(grid)
        check_tokens(x, grid, self.dim)
        # the depthwise convolution runs in its weights' dtype, outside autocast: a small share of the compute, and
        # it keeps off the half-precision conv kernels (torch 2.1's CPU bf16 conv3d backward gave non-finite weight
        # gradients on some CPUs)
        with autocast_off(x.device):
            encoded = call_gathered(self.proj, feature_map(x, list(grid.shape), grid.prefix, self.proj.weight.dtype))
        return add_feature_map(x, encoded, grid.prefix)

    @classmethod
    def model_defaults(cls, context) -> dict:
        """CPVT's placement: after the first block (on the embeddings in a one-block model)."""
        return {**super().model_defaults(context), "block_index": min(1, context.depth - 1)}

    def scriptable(self) -> "ScriptedPEG":
        """The TorchScript form (:class:`ScriptedPEG`; a scripted model adds it before block ``block_index``)."""
        self.check_scriptable_class(PEG)
        return ScriptedPEG(self)

    def no_weight_decay(self) -> set[str]:
        """The convolution is an ordinary layer (CPVT decays it); nothing is excluded."""
        return set()

    def similarity_label(self, head: int | None = None) -> str:
        return "cosine similarity of PEG(constant input)"

    def similarity_note(self) -> str:
        return "no position vectors: PEG output for a constant input"

    def adaptation_label(self) -> str:
        return "convolution on the new grid"


class ScriptedPEG(nn.Module):
    """TorchScript form of :class:`PEG`: ``forward(x, shape, prefix) -> x`` with ``x: (B, P + N, dim)``, the
    encoding's depthwise convolution (``proj``, shared) over the input's patch grid added to the patch tokens."""

    def __init__(self, pe: PEG):
        super().__init__()
        self.proj = pe.proj

    def forward(self, x: torch.Tensor, shape: List[int], prefix: int) -> torch.Tensor:
        return add_feature_map(x, self.proj(feature_map(x, shape, prefix, self.proj.weight.dtype)), prefix)
