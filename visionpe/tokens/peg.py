"""Conditional position encoding (CPVT's PEG): a depthwise convolution over the token grid."""
from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from .._checks import check_grid_ndim, check_ndim, check_positive_int
from ..grid import Grid, as_grid
from ._base import TokenEncoding, check_tokens


class PEG(TokenEncoding):
    """Position Encoding Generator (Chu et al., CPVT 2021): ``x_patch + DWConv(x_patch)``.

    Position comes from zero padding at the borders, so it is defined for any grid size without
    any resampling. Prefix tokens pass through unchanged.

    Call: ``pe(x, grid)`` with ``x: (B, P + N, dim)`` -> same shape.
    """

    def __init__(self, dim: int, ndim: int = 2, kernel_size: int = 3):
        super().__init__()
        self.ndim = check_ndim(ndim)
        self.dim = check_positive_int("dim", dim)
        check_positive_int("kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd so the output keeps the grid shape, got {kernel_size}")
        conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[ndim - 1]
        self.proj = conv(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: torch.Tensor, grid: Grid) -> torch.Tensor:
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "peg")
        check_tokens(x, grid, self.dim)
        prefix, patches = x[:, :grid.prefix], x[:, grid.prefix:]
        feature_map = patches.transpose(1, 2).reshape(x.shape[0], x.shape[2], *grid.shape)
        weight = self.proj.weight
        if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):  # half input, float32 conv
            encoded = self.proj(feature_map.to(weight.dtype)).to(x.dtype)
        else:
            encoded = self.proj(feature_map)
        encoded = rearrange(encoded, "b c ... -> b (...) c")
        return torch.cat([prefix, patches + encoded.to(patches.dtype)], dim=1)

    def no_weight_decay(self) -> set[str]:
        """The convolution is an ordinary layer (CPVT decays it); nothing is excluded."""
        return set()

    def similarity_label(self, head: int | None = None) -> str:
        return "cosine similarity of PEG(constant input)"

    def similarity_note(self) -> str:
        return "no position vectors: PEG output for a constant input"

    def adaptation_label(self) -> str:
        return "convolution on the new grid"
