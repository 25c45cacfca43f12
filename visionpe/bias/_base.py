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


def offset_index(offsets: torch.Tensor, window) -> torch.Tensor:
    """Index of each offset in a ``prod(2 W_a - 1)`` table, first axis slowest (Swin's convention:
    ``(dh + Wh - 1) * (2 Ww - 1) + (dw + Ww - 1)`` in 2D, Video-Swin's in 3D)."""
    index = torch.zeros(offsets.shape[:-1], dtype=torch.long, device=offsets.device)
    for axis, w in enumerate(window):
        index = index * (2 * w - 1) + offsets[..., axis] + (w - 1)
    return index
