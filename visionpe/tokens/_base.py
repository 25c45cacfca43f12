"""Shared contract of the tokens family: position vectors added to the patch tokens."""
from __future__ import annotations

import torch

from ..encoding import Encoding
from ..grid import Grid, as_grid


class TokenEncoding(Encoding):
    """Base class: ``pe(x, grid) -> x`` with ``x: (B, P + N, dim)``; prefix tokens are left alone
    unless the encoding owns vectors for them."""

    family = "tokens"

    @staticmethod
    def add_to_patches(x: torch.Tensor, table: torch.Tensor, grid: Grid, prefix_table: torch.Tensor | None = None):
        """``x + [prefix_table; table]`` where ``table: (N, dim)``, ``prefix_table: (P, dim)`` or None."""
        check_tokens(x, grid, table.shape[-1])
        if prefix_table is None:
            prefix_table = table.new_zeros(grid.prefix, table.shape[-1])
        full = torch.cat([prefix_table, table], dim=0)
        return x + full.to(x.dtype)

    @torch.no_grad()
    def position_vectors(self, grid) -> torch.Tensor:
        """Position vectors of the grid's patches, ``(N, dim)`` float32 on the CPU.

        Default: ``pe(1, grid) - 1``, the encoding's output for a constant input (an encoding with a table
        returns its table instead).
        """
        grid = Grid(as_grid(grid).shape, 0, as_grid(grid).offset)
        device = next(iter(self.parameters()), torch.empty(0)).device
        ones = torch.ones(1, grid.num_tokens, self.dim, device=device)
        return (self(ones, grid) - ones)[0].float().cpu()

    def similarity_label(self, head: int | None = None) -> str:
        return "cosine similarity of position vectors"


def check_tokens(x: torch.Tensor, grid: Grid, dim: int) -> None:
    """``x`` must be ``(B, P + N, dim)`` for the grid: a clear error instead of a broadcasting one."""
    if not isinstance(x, torch.Tensor) or x.ndim != 3:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a (batch, tokens, dim) tensor, got {got}"
                         f"{' (add a batch axis: x[None])' if getattr(x, 'ndim', 0) == 2 else ''}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point (batch, tokens, dim) tensor, got {x.dtype} (position vectors "
                         "added to integer tokens would be truncated)")
    if x.shape[1] != grid.num_tokens:
        raise ValueError(f"x has {x.shape[1]} tokens but grid {grid.shape} with prefix={grid.prefix} "
                         f"has {grid.num_tokens}")
    if x.shape[2] != dim:
        raise ValueError(f"x has width {x.shape[2]} but the encoding was built with dim={dim}")
