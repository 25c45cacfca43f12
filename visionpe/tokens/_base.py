"""Shared contract of the tokens family: position vectors added to the patch tokens."""
from __future__ import annotations

import torch
from torch import nn

from ..grid import Grid


class TokenEncoding(nn.Module):
    """Base class: ``pe(x, grid) -> x`` with ``x: (B, P + N, dim)``; prefix tokens are left alone
    unless the encoding owns vectors for them."""

    family = "tokens"

    @staticmethod
    def add_to_patches(x: torch.Tensor, table: torch.Tensor, grid: Grid, prefix_table: torch.Tensor | None = None):
        """``x + [prefix_table; table]`` where ``table: (N, dim)``, ``prefix_table: (P, dim)`` or None."""
        if x.shape[1] != grid.num_tokens:
            raise ValueError(f"x has {x.shape[1]} tokens but grid {grid.shape} with prefix={grid.prefix} "
                             f"has {grid.num_tokens}")
        if prefix_table is None:
            prefix_table = table.new_zeros(grid.prefix, table.shape[-1])
        full = torch.cat([prefix_table, table], dim=0)
        return x + full.to(x.dtype)
