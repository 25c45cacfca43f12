"""Learned relative position bias tables: Swin window bias (2D, Video-Swin 3D, any ndim) and BEiT global bias."""
from __future__ import annotations

import copy
from typing import List

import torch
from torch import nn

from .._checks import check_axes, check_bool, check_choice, check_grid_ndim, check_number, check_positive_int, to_shape
from .._compat import TorchScriptRefusal, same_shape
from ..cache import TableCache
from ..encoding import constructor_keywords
from ..grid import Grid, as_grid
from ..resample import (TABLE_RESIZES, apply_axis_weights, geometric_weights, interpolate_axis, resample_grid,
                        resample_offsets_geometric)
from ..sharding import check_unsharded, full_tensor
from ._base import BiasEncoding, PairScore, gather_pair_bias, offset_table_score, pair_bias, pair_index


GROWS = ("error", "resample", "fit")  # a grid larger than the window: refused, or the table resampled to it; "fit":
# resampled to every grid's own window, smaller ones too


def num_offsets(window) -> int:
    n = 1
    for w in window:
        n *= 2 * w - 1
    return n


class RelativePositionBias(BiasEncoding):
    """A learned bias per head for every relative offset inside a window of ``window_size`` patches.

    ``relative_position_bias_table: ((2W_0-1)...(2W_{n-1}-1) [+3], num_heads)``, indexed as Swin does,
    so Swin/Video-Swin/BEiT state dicts load as they are. A grid smaller than the window uses the offsets
    it has; a grid larger than the window needs a bigger table: ``resize(new_window)`` for good, or,
    with ``grow="resample"``, the table is resampled on the fly (BEiT at a new resolution); ``grow="fit"`` resamples
    it to every grid's own offsets, a smaller grid's too (timm's BEiT at another size: its ``set_input_size`` and
    checkpoint filter resize the table to the grid either way).

    ``prefix_entries=True`` adds BEiT's three learned entries (prefix->patch, patch->prefix,
    prefix->prefix); otherwise prefix rows and columns are zero.

    ``interpolation``: how the table is resampled to a larger window (on the fly and by :meth:`resize`): one of
    torch's (``"bicubic"``, default, timm ``resize_rel_pos_bias_table_simple``; ``antialias`` for downsampling) or
    ``"geometric"``, BEiT's geometric spacing of the source offsets with linear interpolation (timm
    ``resize_rel_pos_bias_table``, what timm's BEiT checkpoint filter uses). Loading a timm BEiT or Swin checkpoint
    (:func:`~visionpe.weights.load_timm_checkpoint`) sets it to ``"geometric"``, so the loaded model grows its table
    as timm's own model would be built at the larger size.

    Call: ``pe(grid) -> (num_heads, P + N, P + N)``.
    """

    reads_spacing = False  # integer offsets index the table: a grid's spacing is refused (check_spacing)

    def __init__(self, num_heads: int, window_size=(7, 7), prefix_entries: bool = False, grow: str = "error",
                 interpolation: str = "bicubic", antialias: bool = False, init_std: float = 0.02):
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.window_size = to_shape("window_size", window_size)
        if len(self.window_size) > 3:
            raise ValueError(f"window_size={window_size!r} has {len(self.window_size)} axes; allowed: 1, 2 or 3")
        self.ndim = len(self.window_size)
        check_choice("grow", grow, GROWS)
        check_bool("prefix_entries", prefix_entries)
        check_bool("antialias", antialias)
        check_number("init_std", init_std, minimum=0.0)
        check_choice("interpolation", interpolation, TABLE_RESIZES)
        self.prefix_entries, self.grow = prefix_entries, grow
        self.interpolation, self.antialias = interpolation, antialias
        rows = num_offsets(self.window_size) + (3 if prefix_entries else 0)
        self.init_std = float(init_std)
        self.relative_position_bias_table = nn.Parameter(torch.empty(rows, num_heads))
        self.fill_parameters()
        self._bias_cache = TableCache()  # eval / no-grad: the gathered bias per grid, rebuilt after a weight change

    def initial_parameters(self, generator=None) -> dict:
        """The table ``N(0, init_std^2)`` at its current shape."""
        table = self.relative_position_bias_table
        return {"relative_position_bias_table": torch.randn(table.shape, generator=generator) * self.init_std}

    def _offset_table(self) -> torch.Tensor:
        rows = num_offsets(self.window_size)
        return full_tensor(self.relative_position_bias_table)[:rows]

    def _grid_table(self, window) -> torch.Tensor:
        """Offset table resampled to the window ``window``: ``(prod(2 w - 1), heads)``."""
        table = self._offset_table()
        if same_shape(window, self.window_size):
            return table
        spatial = table.reshape(*[2 * w - 1 for w in self.window_size], self.num_heads)
        offsets = [2 * w - 1 for w in window]
        if self.interpolation == "geometric":  # BEiT's, timm resize_rel_pos_bias_table
            return resample_offsets_geometric(spatial, offsets).reshape(-1, self.num_heads)
        return resample_grid(spatial, offsets, self.interpolation, self.antialias).reshape(-1, self.num_heads)

    def _window_for(self, grid: Grid) -> tuple[int, ...]:
        """The window whose offsets ``grid`` reads: ``window_size``, grown to the grid with ``grow="resample"``, the
        grid's own with ``grow="fit"``."""
        check_grid_ndim(grid, self.ndim, type(self).__name__)
        self.check_spacing(grid)
        if self.grow == "fit":
            return tuple(grid.shape)
        window = self.window_size
        if any(isinstance(g, torch.SymInt) for g in grid.shape):  # a traced size (torch.export): no branch on it
            if self.grow == "error":
                for g, w in zip(grid.shape, window):
                    torch._check(g <= w, lambda: self._too_large(grid))  # a runtime assertion of the program
                return window
            return tuple(torch.sym_max(g, w) for g, w in zip(grid.shape, window))
        if any(g > w for g, w in zip(grid.shape, window)):
            if self.grow == "error":
                raise ValueError(self._too_large(grid))
            window = tuple(max(g, w) for g, w in zip(grid.shape, window))
        return window

    def _too_large(self, grid: Grid) -> str:
        return (f"grid {grid.shape} is larger than window_size={self.window_size}; call resize({grid.shape}) first or "
                "build with grow='resample'")

    def _prefix_table(self) -> torch.Tensor | None:
        return full_tensor(self.relative_position_bias_table)[-3:] if self.prefix_entries else None

    def forward(self, grid: Grid) -> torch.Tensor:
        grid = as_grid(grid)
        window = self._window_for(grid)
        key = (grid.shape, grid.prefix, window, self.interpolation, self.antialias,
               str(self.relative_position_bias_table.device))
        return self._bias_cache.get(key, lambda: self._build(grid, window), self.parameters())

    def _build(self, grid: Grid, window) -> torch.Tensor:
        """The bias of ``grid`` read from the offset table resampled to ``window``: ``(heads, P + N, P + N)``."""
        return pair_bias(self._grid_table(window).float(), grid, window, self._prefix_table())

    def score_mod(self, grid: Grid) -> PairScore:
        """The same table read per token pair (:func:`~visionpe.bias._base.offset_table_score`)."""
        grid = as_grid(grid)
        window = self._window_for(grid)
        return offset_table_score(self._grid_table(window).float(), grid, window, self._prefix_table())

    @torch.no_grad()
    def resize(self, new_window, interpolation: str | None = None, antialias: bool | None = None):
        """Resample the table to a new window for good: with the module's interpolation (bicubic: timm
        ``resize_rel_pos_bias_table_simple``), or ``interpolation="geometric"``: BEiT's geometric spacing with
        linear interpolation, timm ``resize_rel_pos_bias_table`` (what timm's Swin ``set_window_size`` calls)."""
        new_window = to_shape("new_window", new_window, self.ndim)
        check_unsharded(self, "resize")
        if interpolation is not None:
            check_choice("interpolation", interpolation, TABLE_RESIZES)
        old = (self.interpolation, self.antialias)
        self.interpolation = interpolation or self.interpolation
        self.antialias = self.antialias if antialias is None else antialias
        table = self._grid_table(new_window)
        self.interpolation, self.antialias = old
        old_table = self.relative_position_bias_table
        extra = old_table[num_offsets(self.window_size):]
        self.relative_position_bias_table = nn.Parameter(torch.cat([table, extra], 0).detach(),
                                                         requires_grad=old_table.requires_grad)  # frozen stays
        self.window_size = new_window
        return self

    def _like(self, window_size) -> "RelativePositionBias":
        """A fresh module of the same class and options on another window."""
        offered = dict(num_heads=self.num_heads, window_size=window_size, grid_shape=window_size,
                       prefix_entries=self.prefix_entries, grow=self.grow, interpolation=self.interpolation,
                       antialias=self.antialias)
        return type(self)(**{k: offered[k] for k in constructor_keywords(type(self)) if k in offered})

    @torch.no_grad()
    def inflate(self, window_size) -> "RelativePositionBias":
        """A 3D window bias of the same class from this 2D one (Video-Swin): the spatial table resized to the
        window's ``(H, W)``, repeated over every time offset."""
        window_size = to_shape("window_size", window_size, 3)
        if self.ndim != 2:
            raise ValueError(f"inflate needs a 2D source bias, got ndim={self.ndim}")
        spatial = self._grid_table(window_size[1:])
        out = self._like(window_size)
        rows = num_offsets(window_size)
        out.relative_position_bias_table[:rows].copy_(spatial.repeat(2 * window_size[0] - 1, 1))
        return out

    def adapt(self, shape, new_shape, scaling: str | None = None) -> tuple["RelativePositionBias", str]:
        """A fixed window (``grow="error"``) too small for ``new_shape`` is resized on a copy; otherwise the
        table is resampled on the fly."""
        pe, label = super().adapt(shape, new_shape, scaling)
        if self.grow == "error" and any(n > w for n, w in zip(new_shape, self.window_size)):
            pe = copy.deepcopy(self).resize(new_shape)
            return pe, f"table resized to window {'x'.join(map(str, new_shape))} ({pe.interpolation})"
        return pe, label

    def adaptation_label(self) -> str:
        return f"table resampled ({self.interpolation})"

    def scriptable(self) -> "ScriptedRelativeBias":
        """The TorchScript form (:class:`ScriptedRelativeBias`): a table that grows to the grid (``grow``
        ``"resample"`` or ``"fit"``) by ``F.interpolate`` or BEiT's geometric resampling; ``grow="error"`` (a fixed
        window) is a ``NotImplementedError`` naming it."""
        self.check_scriptable_class(RelativePositionBias, RelBias)
        name = type(self).__name__
        if self.grow == "error":
            raise TorchScriptRefusal(f"{name} with grow='error'",
                                      "its TorchScript form grows the table to the grid (grow 'resample' or 'fit')")
        return ScriptedRelativeBias(self)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, window_size={self.window_size}, prefix_entries={self.prefix_entries}"


class ScriptedRelativeBias(nn.Module):
    """TorchScript form of :class:`RelativePositionBias` (``grow`` ``"resample"`` or ``"fit"``; :class:`SwinBias`'s
    fixed window, ``grow="error"``): ``forward(shape, prefix) -> (heads, P + N, P + N)`` float32, the bias of the
    input's patch grid computed in the graph as :meth:`RelativePositionBias.forward` computes it (the offset table,
    resampled to the window the grid reads with ``F.interpolate`` or BEiT's geometric weights, gathered by
    :func:`~visionpe.bias._base.pair_index`); a fixed window raises for a grid larger than it, as the eager module
    does."""

    def __init__(self, pe: RelativePositionBias):
        super().__init__()
        self.table = pe.relative_position_bias_table  # (offsets [+ 3 prefix entries], heads), the parameter
        self.window = list(pe.window_size)
        self.offsets, self.prefix_entries = num_offsets(pe.window_size), pe.prefix_entries
        self.fit, self.interpolation, self.antialias = pe.grow == "fit", pe.interpolation, pe.antialias
        self.fixed = pe.grow == "error"

    def forward(self, shape: List[int], prefix: int) -> torch.Tensor:
        window = shape if self.fit else [max(g, w) for g, w in zip(shape, self.window)]
        if self.fixed and window != self.window:
            raise ValueError("the grid is larger than the bias's window_size (grow='error'): resize it first")
        heads = self.table.shape[1]
        table = self.table[:self.offsets]
        if window != self.window:
            source = [2 * w - 1 for w in self.window]
            table = table.reshape(source + [heads])
            if self.interpolation == "geometric":  # BEiT's: every axis resampled when any changes
                table = apply_axis_weights(table, geometric_weights(source, [2 * w - 1 for w in window]))
            else:
                for axis, w in enumerate(window):
                    if table.shape[axis] != 2 * w - 1:
                        table = interpolate_axis(table, axis, 2 * w - 1, self.interpolation, self.antialias, False)
            table = table.reshape(-1, heads)
        table = table.float()
        if self.prefix_entries:
            extra, prefix_rows = self.table[-3:].float(), [0, 1, 2]
        else:
            extra, prefix_rows = table.new_zeros(1, heads), [0, 0, 0]
        index = pair_index(shape, window, prefix, table.shape[0], prefix_rows, table.device)
        return gather_pair_bias(table, extra, index)


class SwinBias(RelativePositionBias):
    """Swin window relative position bias (Liu et al. 2021), any ndim (Video-Swin in 3D).

    Windows are fixed, so the resolution never changes the table; ``resize(new_window)`` adapts it to
    a new window size (bicubic, as timm). A grid larger than the window is an error.
    """

    def __init__(self, num_heads: int, window_size=(7, 7), interpolation: str = "bicubic", antialias: bool = False):
        super().__init__(num_heads, window_size, prefix_entries=False, grow="error",
                         interpolation=interpolation, antialias=antialias)

    @classmethod
    def model_defaults(cls, context) -> dict:
        """The model's grid (a Swin block's window) is ``window_size``."""
        return {"num_heads": context.num_heads, "window_size": tuple(context.grid_shape)}

    def scriptable(self) -> "ScriptedRelativeBias":
        """The TorchScript form (:class:`ScriptedRelativeBias`) of the fixed window: a grid no larger than it reads
        the table as it is, whatever ``interpolation`` (its forward never resamples), a larger one raises."""
        self.check_scriptable_class(SwinBias)
        return ScriptedRelativeBias(self)


class RelBias(RelativePositionBias):
    """Global relative position bias over the whole patch grid (BEiT), with BEiT's prefix entries.

    Resolution change (``grow``): ``"resample"`` (default): a smaller grid uses its offsets directly, a larger one
    resamples the table; ``"fit"``: every other grid resamples it to its own offsets, as timm's BEiT does at another
    size (with ``interpolation="geometric"``, its ``resize_rel_pos_bias_table``).
    """

    def __init__(self, num_heads: int, grid_shape=(14, 14), interpolation: str = "bicubic", antialias: bool = False,
                 grow: str = "resample"):
        shape = check_axes("grid_shape", to_shape("grid_shape", grid_shape), grid_shape)
        check_choice("grow", grow, ("resample", "fit"))
        super().__init__(num_heads, shape, prefix_entries=True, grow=grow,
                         interpolation=interpolation, antialias=antialias)
