"""Shared pieces of the bias family: relative offsets on a grid and prefix padding."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..encoding import Encoding
from ..grid import Grid, as_grid


class BiasEncoding(Encoding):
    """Base class: ``pe(grid) -> (num_heads, P + N, P + N)`` float32 bias added to attention logits."""

    family = "bias"

    @torch.no_grad()
    def pair_map(self, grid) -> torch.Tensor:
        """The bias on the grid's patches (no prefix rows or columns), ``(heads, N, N)`` float32."""
        grid = as_grid(grid)
        return self(grid.without_prefix()).detach().float().cpu()

    def similarity_label(self, head: int | None = None) -> str:
        return f"attention bias, {'mean over heads' if head is None else f'head {head}'}"

    def similarity_note(self) -> str:
        return "bias row of each query"

    @staticmethod
    def pad_prefix(bias: torch.Tensor, grid: Grid) -> torch.Tensor:
        """Zero rows and columns for the prefix tokens: ``(H, N, N) -> (H, P + N, P + N)``."""
        return F.pad(bias, (grid.prefix, 0, grid.prefix, 0)) if grid.prefix else bias


def relative_offsets(shape, device=None) -> torch.Tensor:
    """Pairwise offsets ``c_i - c_j`` of a grid's patches, ``(N, N, ndim)`` long, grid axis order."""
    axes = [torch.arange(s, device=device) for s in shape]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(shape))
    return coords[:, None, :] - coords[None, :, :]


def grid_offset_index(shape, window, device=None) -> torch.Tensor:
    """Index of each pairwise offset ``c_i - c_j`` of a grid's patches in a ``prod(2 W_a - 1)`` table, first axis
    slowest (Swin's convention: ``(dh + Wh - 1) * (2 Ww - 1) + (dw + Ww - 1)`` in 2D, Video-Swin's in 3D):
    ``(N, N)`` long. Built one axis at a time from the per-axis patch indices, so no ``(N, N, ndim)`` offsets
    tensor is held (at 4096 tokens that would be 268 MB)."""
    axes = [torch.arange(s, device=device) for s in shape]
    coords = [c.reshape(-1) for c in torch.meshgrid(*axes, indexing="ij")]  # per axis, (N,)
    index = None
    for c, w in zip(coords, window):
        term = c[:, None] - c[None, :] + (w - 1)
        index = term if index is None else index.mul_(2 * w - 1).add_(term)
    return index

