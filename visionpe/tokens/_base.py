"""Shared contract of the tokens family: position vectors added to the patch tokens."""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from ..encoding import Encoding
from ..grid import Grid, Layout, as_grid, as_layout


class TokenEncoding(Encoding):
    """Base class: ``pe(x, grid) -> x`` with ``x: (B, P + N, dim)``; prefix tokens are left alone
    unless the encoding owns vectors for them."""

    family = "tokens"
    block_index = 0  # in a model: added before this block (0: to the patch embeddings)

    @staticmethod
    def add_to_patches(x: torch.Tensor, table: torch.Tensor, layout: Grid | Layout,
                       prefix_table: torch.Tensor | None = None):
        """``x + [prefix_table; table]`` where ``table: (N, dim)``, ``prefix_table: (P, dim)`` or None; with kept
        patches (``layout.keep``) each sample gets the rows of its own patches."""
        layout = as_layout(layout)
        check_tokens(x, layout, table.shape[-1])
        if prefix_table is None:
            prefix_table = table.new_zeros(layout.grid.prefix, table.shape[-1])
        full = torch.cat([prefix_table, table], dim=0)  # (P + N, dim)
        if layout.keep is not None:
            full = full[layout.token_index(full.device)]  # (B or 1, P + K, dim)
        return x + full.to(x.dtype)

    @torch.no_grad()
    def position_vectors(self, grid) -> torch.Tensor:
        """Position vectors of the grid's patches, ``(N, dim)`` float32 on the CPU.

        Default: ``pe(1, grid) - 1``, the encoding's output for a constant input (an encoding with a table
        returns its table instead).
        """
        grid = as_grid(grid).without_prefix()
        device = next(iter(self.parameters()), torch.empty(0)).device
        ones = torch.ones(1, grid.num_tokens, self.dim, device=device)
        return (self(ones, grid) - ones)[0].float().cpu()

    def similarity_label(self, head: int | None = None) -> str:
        return "cosine similarity of position vectors"


def check_tokens(x: torch.Tensor, layout: Grid | Layout, dim: int) -> None:
    """``x`` must be ``(B, P + N, dim)`` for the grid (``P + K`` kept tokens for a layout with ``keep``, whose rows
    are one per sample or one for all, on ``x``'s device): a clear error instead of a broadcasting one."""
    layout = as_layout(layout)
    if not isinstance(x, torch.Tensor) or x.ndim != 3:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a (batch, tokens, dim) tensor, got {got}"
                         f"{' (add a batch axis: x[None])' if getattr(x, 'ndim', 0) == 2 else ''}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point (batch, tokens, dim) tensor, got {x.dtype} (position vectors "
                         "added to integer tokens would be truncated)")
    if x.shape[1] != layout.num_tokens:
        kept = "" if layout.keep is None else f" and {layout.keep.shape[1]} kept patches"
        raise ValueError(f"x has {x.shape[1]} tokens but grid {layout.grid.shape} with prefix={layout.grid.prefix}"
                         f"{kept} has {layout.num_tokens}")
    layout.check_batch(x.shape[0], x.device)
    if x.shape[2] != dim:
        raise ValueError(f"x has width {x.shape[2]} but the encoding was built with dim={dim}")


class ScriptedTokens(nn.Module):
    """TorchScript form of a tokens encoding (:meth:`~visionpe.Encoding.scriptable`): ``forward(x, shape, prefix)``
    with ``x: (B, P + N, dim)``, ``shape`` the patch grid read from the input (``[H, W]``) and ``prefix = P`` ->
    ``x`` plus ``[prefix vectors; patch_table(shape)]`` (zero prefix vectors where the encoding owns none). A
    subclass computes ``patch_table(shape, device) -> (N, dim)``."""

    def __init__(self, prefix_table: Optional[torch.Tensor] = None):
        super().__init__()
        self.prefix_table = prefix_table  # (P, dim), the encoding's parameter, or None

    def patch_table(self, shape: List[int], device: torch.device) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, shape: List[int], prefix: int) -> torch.Tensor:
        table = self.patch_table(shape, x.device)
        front = self.prefix_table
        if front is None:
            front = table.new_zeros(prefix, table.shape[-1])
        return x + torch.cat([front, table], dim=0).to(x.dtype)
