"""Learned absolute position tables (ViT/DeiT), joint or factorized per axis, resampled on resolution change."""
from __future__ import annotations

import torch
from torch import nn

from .._checks import (check_bool, check_choice, check_grid_ndim, check_ndim, check_nonnegative_int, check_number,
                       check_positive_int, to_shape)
from ..cache import TableCache
from ..grid import Grid, Layout, as_grid, as_layout
from ..resample import INTERPOLATIONS, resample_grid
from ._base import TokenEncoding, check_tokens


FACTORIZATIONS = (False, True, "space_time")


class Learned(TokenEncoding):
    """A learned vector per grid position (ViT), or a sum of factor tables (``factorized``).

    Args:
        dim: token width.
        ndim: grid axes.
        grid_shape: the training grid ``(H, W)`` (or ``(T, H, W)``); the table covers it.
        num_prefix_tokens: prefix tokens that own a learned vector (timm's class-token ``pos_embed`` rows);
            0 leaves prefix tokens without position (timm's ``no_embed_class``).
        factorized: ``False``: one joint table ``table: (*grid_shape, dim)``; ``True``: one table per axis,
            ``axis_tables[a]: (size_a, dim)``, summed (MViT style); ``"space_time"`` (3D): a joint spatial table
            ``table: (H, W, dim)`` plus a time table ``time_table: (T, dim)`` (ViViT's factorization: an image
            model's 2D table is its spatial part, so image weights carry over).
        interpolation, antialias: how the table is resampled for another grid (timm defaults:
            bicubic with antialias; ``antialias=False`` matches DeiT/MAE/HF transformers).

    Resolution change: called on a grid of another shape, each factor table is resampled to its axes' new sizes. A grid with an ``offset`` selects the window ``[offset, offset + shape)`` of the table.

    Call: ``pe(x, grid)`` with ``x: (B, P + N, dim)`` -> same shape.
    """

    def __init__(self, dim: int, ndim: int = 2, grid_shape=(14, 14), num_prefix_tokens: int = 0,
                 factorized: bool | str = False, interpolation: str = "bicubic", antialias: bool = True,
                 init_std: float = 0.02):
        super().__init__()
        self.ndim = check_ndim(ndim)
        self.dim = check_positive_int("dim", dim)
        self.grid_shape = to_shape("grid_shape", grid_shape, ndim)
        check_nonnegative_int("num_prefix_tokens", num_prefix_tokens)
        if not (isinstance(factorized, bool) or factorized == "space_time") or \
                (factorized == "space_time" and self.ndim != 3):
            raise ValueError(f"factorized={factorized!r} is not supported; allowed values: False, True, 'space_time' "
                             f"(space_time needs ndim=3, got ndim={self.ndim})")
        check_bool("antialias", antialias)
        check_number("init_std", init_std, minimum=0.0)
        check_choice("interpolation", interpolation, INTERPOLATIONS)
        self.num_prefix_tokens = num_prefix_tokens
        self.factorized = factorized
        self.interpolation, self.antialias = interpolation, antialias
        tables = [nn.Parameter(torch.randn(*[self.grid_shape[a] for a in axes], dim) * init_std)
                  for axes in self.factor_axes()]
        if factorized is True:
            self.axis_tables = nn.ParameterList(tables)
        else:
            self.table = tables[0]
            if factorized == "space_time":
                self.time_table = tables[1]
        self.prefix = nn.Parameter(torch.randn(num_prefix_tokens, dim) * init_std) if num_prefix_tokens else None
        self._cache = TableCache(maxsize=4)

    # -- tables ---------------------------------------------------------------------------------------
    def factor_axes(self) -> list[tuple[int, ...]]:
        """The grid axes each factor table spans, in the order of :meth:`factor_tables`."""
        if self.factorized is True:
            return [(axis,) for axis in range(self.ndim)]
        return [(1, 2), (0,)] if self.factorized == "space_time" else [tuple(range(self.ndim))]

    def factor_tables(self) -> list[torch.Tensor]:
        if self.factorized is True:
            return list(self.axis_tables)
        return [self.table, self.time_table] if self.factorized == "space_time" else [self.table]

    def _grid_table(self, shape, interpolation: str | None = None, antialias: bool | None = None) -> torch.Tensor:
        """The sum of the factor tables, each resampled to its axes of ``shape``: ``(*shape, dim)``."""
        interpolation = interpolation or self.interpolation
        antialias = self.antialias if antialias is None else antialias
        total = 0
        for axes, table in zip(self.factor_axes(), self.factor_tables()):
            view = [1] * self.ndim + [self.dim]
            for a in axes:
                view[a] = shape[a]
            total = total + resample_grid(table, [shape[a] for a in axes], interpolation, antialias).reshape(view)
        return total

    def patch_table(self, grid: Grid) -> torch.Tensor:
        """Position vectors of the grid's patches, ``(N, dim)``.

        Cached when gradients are off (evaluation at a new size does not resample every batch).
        """
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "learned")
        if grid.offset is not None:
            return self._window(grid)
        if grid.shape == self.grid_shape and self.factorized is False:
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
        names = [f"axis_tables.{a}" for a in range(self.ndim)] if self.factorized is True else ["table", "time_table"]
        for name, axes, table in zip(names, self.factor_axes(), self.factor_tables()):
            resized = nn.Parameter(resample_grid(table, [new_shape[a] for a in axes], interpolation, antialias))
            if name.startswith("axis_tables."):
                self.axis_tables[int(name.split(".")[1])] = resized
            else:
                setattr(self, name, resized)
        self.grid_shape = new_shape
        self._cache.clear()
        return self

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, grid_shape={self.grid_shape}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"factorized={self.factorized}, interpolation={self.interpolation!r}, antialias={self.antialias}")
