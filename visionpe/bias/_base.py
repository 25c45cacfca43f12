"""Shared pieces of the bias family: relative offsets on a grid and prefix padding."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cache import TableCache
from ..encoding import Encoding
from ..grid import Grid, as_grid

# pair indices depend on shapes only: one cache for every block and model, so a large grid's (T, T) index is built
# once per forward, not once per block
PAIR_INDEX = TableCache(maxsize=16, max_bytes=None)


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


def pair_index(shape, window, prefix: int, offset_rows: int, prefix_rows: tuple[int, int, int], device=None):
    """Row of every token pair in a per-offset table followed by prefix rows: ``(P + N, P + N)`` long.

    Patch pairs read :func:`grid_offset_index`; prefix->patch, patch->prefix and prefix->prefix pairs read rows
    ``offset_rows + prefix_rows[i]`` (BEiT's three learned entries, or one zero row for all three).
    """
    patches = grid_offset_index(shape, window, device)
    if not prefix:
        return patches
    to_patch, from_patch, between = (offset_rows + r for r in prefix_rows)
    index = torch.full([prefix + patches.shape[0]] * 2, between, dtype=patches.dtype, device=device)
    index[:prefix, prefix:] = to_patch
    index[prefix:, :prefix] = from_patch
    index[prefix:, prefix:] = patches
    return index


def pair_bias(table: torch.Tensor, grid: Grid, window, prefix_entries: torch.Tensor | None = None) -> torch.Tensor:
    """The bias of every token pair of ``grid``, read in one gather from a per-offset table.

    Args:
        table: ``(prod(2 W_a - 1), heads)``, one row per offset in a window ``window`` (Swin's order).
        prefix_entries: ``(3, heads)`` biases prefix->patch, patch->prefix, prefix->prefix (BEiT), or None for zero
            prefix rows and columns.
    Returns:
        ``(heads, P + N, P + N)``, contiguous. The index is cached for all blocks; no padding or concatenation of
        the ``(T, T)`` result (at 4096 tokens those copies cost more than the gather).
    """
    rows, heads = table.shape
    extra = table.new_zeros(1, heads) if prefix_entries is None else prefix_entries.to(table.dtype)
    prefix_rows = (0, 0, 0) if prefix_entries is None else (0, 1, 2)
    key = (grid.shape, grid.prefix, tuple(window), rows, prefix_rows, str(table.device))
    index = PAIR_INDEX.get(key, lambda: pair_index(grid.shape, window, grid.prefix, rows, prefix_rows, table.device))
    by_head = torch.cat([table, extra]).t().contiguous()  # (heads, rows + 1 or 3): each head's row contiguous
    return by_head.index_select(1, index.view(-1)).view(heads, *index.shape)
