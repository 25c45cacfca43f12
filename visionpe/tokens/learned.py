"""Learned absolute position tables (ViT/DeiT), joint or factorized per axis, resampled on resolution change."""
from __future__ import annotations

import torch
from torch import nn

from .._checks import (check_bool, check_choice, check_grid_ndim, check_ndim, check_nonnegative_int, check_number,
                       check_positive_int, to_shape)
from ..cache import TableCache
from ..grid import Grid, Layout, as_grid, as_layout
from ..resample import INTERPOLATIONS, resample_axis, resample_grid
from ._base import TokenEncoding, check_tokens


class Learned(TokenEncoding):
    """A learned vector per grid position (ViT), or a sum of per-axis vectors (``factorized=True``).

    Args:
        dim: token width.
        ndim: grid axes.
        grid_shape: the training grid ``(H, W)`` (or ``(T, H, W)``); the table covers it.
        num_prefix_tokens: prefix tokens that own a learned vector (timm's class-token ``pos_embed`` rows);
            0 leaves prefix tokens without position (timm's ``no_embed_class``).
        factorized: one table per axis, ``(size_a, dim)`` each, summed (ViViT/MViT style).
        interpolation, antialias: how the table is resampled for another grid (timm defaults:
            bicubic with antialias; ``antialias=False`` matches DeiT/MAE/HF transformers).

    Resolution change: called on a grid of another shape, the table is resampled to it (per axis when
    factorized). A grid with an ``offset`` selects the window ``[offset, offset + shape)`` of the table.

    Call: ``pe(x, grid)`` with ``x: (B, P + N, dim)`` -> same shape.
    """

    def __init__(self, dim: int, ndim: int = 2, grid_shape=(14, 14), num_prefix_tokens: int = 0,
                 factorized: bool = False, interpolation: str = "bicubic", antialias: bool = True,
                 init_std: float = 0.02):
        super().__init__()
        self.ndim = check_ndim(ndim)
        self.dim = check_positive_int("dim", dim)
        self.grid_shape = to_shape("grid_shape", grid_shape, ndim)
        check_nonnegative_int("num_prefix_tokens", num_prefix_tokens)
        check_bool("factorized", factorized)
        check_bool("antialias", antialias)
        check_number("init_std", init_std, minimum=0.0)
        check_choice("interpolation", interpolation, INTERPOLATIONS)
        self.num_prefix_tokens = num_prefix_tokens
        self.factorized = factorized
        self.interpolation, self.antialias = interpolation, antialias
        if factorized:
            self.axis_tables = nn.ParameterList(
                [nn.Parameter(torch.randn(size, dim) * init_std) for size in self.grid_shape])
        else:
            self.table = nn.Parameter(torch.randn(*self.grid_shape, dim) * init_std)
        self.prefix = nn.Parameter(torch.randn(num_prefix_tokens, dim) * init_std) if num_prefix_tokens else None
        self._cache = TableCache(maxsize=4)

    # -- tables ---------------------------------------------------------------------------------------
    def _axis_tables(self, shape) -> list[torch.Tensor]:
        return [resample_axis(t, 0, s, self.interpolation, self.antialias) for t, s in zip(self.axis_tables, shape)]

    def _grid_table(self, shape) -> torch.Tensor:
        """The table resampled to ``shape``: ``(*shape, dim)``."""
        if not self.factorized:
            return resample_grid(self.table, shape, self.interpolation, self.antialias)
        total = 0
        for axis, t in enumerate(self._axis_tables(shape)):
            view = [1] * self.ndim + [self.dim]
            view[axis] = t.shape[0]
            total = total + t.reshape(view)
        return total

    def patch_table(self, grid: Grid) -> torch.Tensor:
        """Position vectors of the grid's patches, ``(N, dim)``.

        Cached when gradients are off (evaluation at a new size does not resample every batch).
        """
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "learned")
        if grid.offset is not None:
            return self._window(grid)
        if grid.shape == self.grid_shape and not self.factorized:
            return self.table.reshape(-1, self.dim)
        key = (grid.shape, self.interpolation, self.antialias, str(next(self.parameters()).device))
        return self._cache.get(key, lambda: self._grid_table(grid.shape).reshape(-1, self.dim), self.parameters())

    def _window(self, grid: Grid) -> torch.Tensor:
        start = [int(o) for o in grid.offset]
        if any(o != int(o) or o < 0 for o in grid.offset) or any(
                s + n > m for s, n, m in zip(start, grid.shape, self.grid_shape)):
            raise ValueError(f"grid window offset={grid.offset} shape={grid.shape} must lie inside the learned "
                             f"grid {self.grid_shape} with non-negative integer offsets")
        full = self._grid_table(self.grid_shape)
        window = full[tuple(slice(s, s + n) for s, n in zip(start, grid.shape))]
        return window.reshape(-1, self.dim)

    def forward(self, x: torch.Tensor, grid: Grid | Layout) -> torch.Tensor:
        layout = as_layout(grid)
        grid = layout.grid
        check_grid_ndim(grid, self.ndim, "learned")
        check_tokens(x, layout, self.dim)
        prefix_table = None
        if self.prefix is not None:
            if grid.prefix != self.num_prefix_tokens:
                raise ValueError(f"grid has prefix={grid.prefix} but the table owns "
                                 f"num_prefix_tokens={self.num_prefix_tokens} vectors")
            prefix_table = self.prefix
        return self.add_to_patches(x, self.patch_table(grid), layout, prefix_table)

    def position_vectors(self, grid) -> torch.Tensor:
        grid = as_grid(grid)
        with torch.no_grad():
            return self.patch_table(Grid(grid.shape, 0, grid.offset)).detach().float().cpu()

    def adaptation_label(self) -> str:
        return f"table resampled ({self.interpolation}{', antialias' if self.antialias else ''})"

    @torch.no_grad()
    def resize(self, new_shape, interpolation: str | None = None, antialias: bool | None = None) -> "Learned":
        """Resample the stored table to ``new_shape`` for good (fine-tuning at a new resolution)."""
        new_shape = to_shape("new_shape", new_shape, self.ndim)
        interpolation = interpolation or self.interpolation
        antialias = self.antialias if antialias is None else antialias
        check_choice("interpolation", interpolation, INTERPOLATIONS)
        if self.factorized:
            for i, s in enumerate(new_shape):
                self.axis_tables[i] = nn.Parameter(resample_axis(self.axis_tables[i], 0, s, interpolation, antialias))
        else:
            self.table = nn.Parameter(resample_grid(self.table, new_shape, interpolation, antialias))
        self.grid_shape = new_shape
        self._cache.clear()
        return self

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, grid_shape={self.grid_shape}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"factorized={self.factorized}, interpolation={self.interpolation!r}, antialias={self.antialias}")
