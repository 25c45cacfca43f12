"""Learned absolute position tables (ViT/DeiT), joint or factorized per axis, resampled on resolution change."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from .._checks import (check_bool, check_choice, check_grid_ndim, check_ndim, check_nonnegative_int, check_number,
                       check_positive_int, to_shape)
from .._compat import TorchScriptRefusal, same_shape
from ..cache import TableCache
from ..coords import CoordinateSystem, normalized_to_index
from ..encoding import Knob
from ..grid import Grid, Layout, as_grid, as_layout
from ..resample import INTERPOLATIONS, SAMPLING, interpolate_axis, resample_grid, sample_grid
from ..sharding import check_unsharded, full_tensor
from ._base import ScriptedTokens, TokenEncoding, check_tokens


FACTORIZATIONS = (False, True, "space_time")
FITS = ("resample", "window", "tile", "square_crop")
RMS_EPS = 1e-6  # Cosmos' eps of the per-patch RMS normalisation (rms_norm=True)


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
        align_corners: ``F.interpolate``'s flag for that resampling (bicubic, bilinear): ``False`` (default, timm
            and PyTorch) samples at half-pixel centres, ``True`` maps the end patches onto the end patches (Qwen3-VL:
            bilinear, ``align_corners=True``, no antialias).
        fit: how a grid of another shape meets the table: ``"resample"`` (default), ``"window"``, ``"tile"`` or
            ``"square_crop"``.
            ``"window"``: the table is never resampled, a grid reads the window ``[offset, offset + shape)`` of it
            (offset 0 without one), the first rows of each axis (Cosmos' per-axis tables cut to the clip); a grid
            beyond the table is a ``ValueError``. ``"tile"``: the table repeated along each axis as far as the grid
            goes, patch ``i`` reading row ``(offset + i) mod size`` (SAM 3's ``_tile_position_embeddings``); a grid
            within the table reads the same window as ``"window"``. ``"square_crop"``: each table resampled to a
            square (a cube in 3D) of the grid's longest side, then cut to the grid, its first rows on each axis, so
            the grid's aspect ratio is kept (timm's NaFlexVit ``pos_embed_ar_preserving``: the ``par``, ``parfac``
            and RADIO models).
        rms_norm: each patch's position vector (the sum of the factor tables) divided by ``1e-6 + `` its root mean
            square over the ``dim`` channels, in float32 (Cosmos' ``CosmosLearnablePositionalEmbed``); prefix
            vectors are left as they are.

        coords, normalize_coords: where a grid's patches read the table (:mod:`visionpe.coords`).
            ``"index"`` (default): a grid of another shape reads the table resampled to it (``F.interpolate``, i.e.
            interpolation onto the training grid's index range: patch ``j`` of ``n`` reads table position
            ``(j + 0.5) S / n - 0.5``); a grid with an ``offset`` selects the window ``[offset, offset + shape)``.
            ``"normalized"``: the table sits at its own grid's normalised coordinates (DINOv3's centred ``[-1, 1]``,
            ``normalize_coords`` ``"separate"``, ``"min"``, ``"max"``) and each patch reads it at its normalised
            coordinate (offset included), sampled (bicubic, bilinear or nearest ``F.grid_sample``,
            ``align_corners=False``, border padding; no antialias). With ``"separate"`` this is ``F.interpolate``
            without antialias; ``"min"``/``"max"`` keep the aspect ratio of distances. At the training grid both
            read the table itself.
        shift_coords, jitter_coords, rescale_coords: timm's train-time coordinate augmentation (training mode
            only): the table is sampled at the augmented positions (in table patches for ``"index"``, in normalised
            units for ``"normalized"``), uncached, with gradients to the table.

    Resolution change: called on a grid of another shape, each factor table is resampled to its axes' new sizes
    (``"index"``) or sampled at the grid's normalised positions (``"normalized"``).

    Call: ``pe(x, grid)`` with ``x: (B, P + N, dim)`` -> same shape.

    Tuned per test size (:attr:`knob`, ``visionpe sweep --tune``): the ``interpolation`` mode of the resampling.
    """

    reads_spacing = False  # integer grid positions index the table: a grid's spacing is refused (check_spacing)

    @property
    def knob(self) -> Knob:
        sampled = self.coordinates.normalized or self.coordinates.augments
        return Knob("interpolation", tuple(SAMPLING if sampled else INTERPOLATIONS))

    def __init__(self, dim: int, ndim: int = 2, grid_shape=(14, 14), num_prefix_tokens: int = 0,
                 factorized: bool | str = False, interpolation: str = "bicubic", antialias: bool = True,
                 init_std: float = 0.02, coords: str = "index", normalize_coords: str = "separate",
                 shift_coords: float | None = None, jitter_coords: float | None = None,
                 rescale_coords: float | None = None, draw_coords: str = "forward", align_corners: bool = False,
                 fit: str = "resample", rms_norm: bool = False):
        super().__init__()
        self.ndim = check_ndim(ndim)
        self.dim = check_positive_int("dim", dim)
        self.grid_shape = to_shape("grid_shape", grid_shape, ndim)
        check_nonnegative_int("num_prefix_tokens", num_prefix_tokens)
        if not (isinstance(factorized, bool) or factorized == "space_time") or \
                (factorized == "space_time" and self.ndim != 3):
            raise ValueError(f"factorized={factorized!r} is not supported; allowed values: True or False, or "
                             f"'space_time' (space_time needs ndim=3, got ndim={self.ndim})")
        check_bool("antialias", antialias)
        check_number("init_std", init_std, minimum=0.0)
        check_choice("interpolation", interpolation, INTERPOLATIONS)
        self.coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                            draw_coords)
        if (self.coordinates.normalized or self.coordinates.augments) and interpolation not in SAMPLING:
            raise ValueError(f"interpolation={interpolation!r} cannot sample a table at points (coords="
                             f"{coords!r}{', coordinate augmentation' if self.coordinates.augments else ''}); "
                             f"allowed values: {', '.join(map(repr, SAMPLING))}")
        check_choice("fit", fit, FITS)
        if fit != "resample" and self.coordinates.normalized:
            raise ValueError(f"fit={fit!r} reads the table at index positions; coords={self.coordinates.coords!r} "
                             "samples it at normalised coordinates instead: use fit='resample' or coords='index'")
        self.num_prefix_tokens = num_prefix_tokens
        self.factorized = factorized
        self.interpolation, self.antialias, self.init_std = interpolation, antialias, float(init_std)
        self.align_corners, self.fit = check_bool("align_corners", align_corners), fit
        self.rms_norm = check_bool("rms_norm", rms_norm)
        tables = [nn.Parameter(torch.empty(*[self.grid_shape[a] for a in axes], dim)) for axes in self.factor_axes()]
        if factorized is True:
            self.axis_tables = nn.ParameterList(tables)
        else:
            self.table = tables[0]
            if factorized == "space_time":
                self.time_table = tables[1]
        self.prefix = nn.Parameter(torch.empty(num_prefix_tokens, dim)) if num_prefix_tokens else None
        self.fill_parameters()
        self._cache = TableCache(maxsize=4)

    def initial_parameters(self, generator=None) -> dict:
        """Every table (then the prefix vectors) ``N(0, init_std^2)``, at their current shapes."""
        return {name: torch.randn(p.shape, generator=generator) * self.init_std
                for name, p in self.named_parameters()}

    # -- tables ---------------------------------------------------------------------------------------
    def factor_axes(self) -> list[tuple[int, ...]]:
        """The grid axes each factor table spans, in the order of :meth:`factor_tables`."""
        if self.factorized is True:
            return [(axis,) for axis in range(self.ndim)]
        return [(1, 2), (0,)] if self.factorized == "space_time" else [tuple(range(self.ndim))]

    def factor_tables(self) -> list[torch.Tensor]:
        """The factor tables as whole tensors (sharded ones gathered: :mod:`visionpe.sharding`)."""
        if self.factorized is True:
            tables = list(self.axis_tables)
        else:
            tables = [self.table, self.time_table] if self.factorized == "space_time" else [self.table]
        return [full_tensor(t) for t in tables]

    def resampled_shape(self, shape) -> tuple[int, ...]:
        """The shape the tables are resampled to for a grid of ``shape``: ``shape`` itself, or with
        ``fit="square_crop"`` its longest side on every axis (then cut to ``shape``)."""
        return (max(shape),) * len(shape) if self.fit == "square_crop" else tuple(shape)

    def _grid_table(self, shape, interpolation: str | None = None, antialias: bool | None = None) -> torch.Tensor:
        """The sum of the factor tables, each resampled to its axes of :meth:`resampled_shape` and cut to ``shape``
        (its first rows): ``(*shape, dim)``."""
        interpolation = interpolation or self.interpolation
        antialias = self.antialias if antialias is None else antialias
        sizes = self.resampled_shape(shape)
        total = 0
        for axes, table in zip(self.factor_axes(), self.factor_tables()):
            view = [1] * self.ndim + [self.dim]
            for a in axes:
                view[a] = shape[a]
            resampled = resample_grid(table, [sizes[a] for a in axes], interpolation, antialias, self.align_corners)
            total = total + resampled[tuple(slice(shape[a]) for a in axes)].reshape(view)
        return total

    def patch_table(self, grid: Grid, augment: bool = False) -> torch.Tensor:
        """Position vectors of the grid's patches, ``(N, dim)``.

        Cached when gradients are off (evaluation at a new size does not resample every batch). ``augment=True``
        (the forward in training mode) samples the table at a fresh coordinate augmentation draw, uncached, if one
        is set. With ``rms_norm`` each row is divided by its RMS.
        """
        rows = self._patch_rows(as_grid(grid), augment)
        if not self.rms_norm:
            return rows
        rms = rows.float().pow(2).mean(-1, keepdim=True).sqrt()  # (N, 1)
        return (rows.float() / (RMS_EPS + rms)).to(rows.dtype)

    def _patch_rows(self, grid: Grid, augment: bool) -> torch.Tensor:
        """:meth:`patch_table` before the RMS normalisation."""
        check_grid_ndim(grid, self.ndim, "learned")
        if self._reads_window(grid):
            self._check_window(grid)
        transform = self.coordinates.draw(augment, self.ndim, next(self.parameters()).device)
        if transform is not None:
            return self._sampled_table(grid, transform).reshape(-1, self.dim)
        if self.coordinates.normalized and (not same_shape(grid.shape, self.grid_shape) or grid.offset is not None):
            key = ("sampled", grid.shape, grid.offset, self.interpolation, str(next(self.parameters()).device))
            return self._cache.get(key, lambda: self._sampled_table(grid).reshape(-1, self.dim), self.parameters())
        if self._reads_window(grid):
            return self._window(grid)
        if same_shape(grid.shape, self.grid_shape) and self.factorized is False:
            return self.factor_tables()[0].reshape(-1, self.dim)
        key = (grid.shape, self.interpolation, self.antialias, self.align_corners, str(next(self.parameters()).device))
        return self._cache.get(key, lambda: self._grid_table(grid.shape).reshape(-1, self.dim), self.parameters())

    def table_positions(self, grid: Grid, transform=None) -> list[torch.Tensor]:
        """Where the grid's patches read the table: per grid axis, fractional table indices ``(size_a,)`` (float64),
        after the augmentation ``transform`` if given (see the class docstring)."""
        grid = as_grid(grid)
        device = next(self.parameters()).device
        if self.coordinates.normalized:
            axes = self.coordinates.axis_positions(grid.shape, grid.offset, device=device, dtype=torch.float64)
            if transform is not None:
                axes = [transform.on_axis(a, p) for a, p in enumerate(axes)]
            # the table's own patch i sits at its normalised coordinate on the training grid
            coords = self.coordinates
            return normalized_to_index(axes, self.grid_shape, coords.coords, coords.normalize_coords)
        if self._reads_window(grid):  # a window of the table (tiled: modulo its size)
            axes = [index.to(torch.float64) for index in self._window_rows(grid, device)]
        elif self.align_corners:  # F.interpolate's source positions with align_corners=True (to the resampled size)
            axes = [torch.arange(n, device=device, dtype=torch.float64) * ((m - 1) / max(r - 1, 1))
                    for n, m, r in zip(grid.shape, self.grid_shape, self.resampled_shape(grid.shape))]
        else:  # F.interpolate's source positions (align_corners=False): j itself on the training grid
            axes = [(torch.arange(n, device=device, dtype=torch.float64) + 0.5) * (m / r) - 0.5
                    for n, m, r in zip(grid.shape, self.grid_shape, self.resampled_shape(grid.shape))]
        return axes if transform is None else [transform.on_axis(a, p) for a, p in enumerate(axes)]

    def _sampled_table(self, grid: Grid, transform=None) -> torch.Tensor:
        """The sum of the factor tables, each sampled at :meth:`table_positions` on its axes: ``(*shape, dim)``."""
        positions = self.table_positions(grid, transform)
        total = 0
        for axes, table in zip(self.factor_axes(), self.factor_tables()):
            view = [1] * self.ndim + [self.dim]
            for a in axes:
                view[a] = grid.shape[a]
            total = total + sample_grid(table, [positions[a] for a in axes], self.interpolation).reshape(view)
        return total

    def _reads_window(self, grid: Grid) -> bool:
        """The grid reads a window of the table (an offset, or ``fit="window"``/``"tile"`` on another shape), not a
        resampled table."""
        if self.coordinates.normalized:
            return False
        windowed = self.fit in ("window", "tile") and not same_shape(grid.shape, self.grid_shape)
        return grid.offset is not None or windowed

    def _check_window(self, grid: Grid) -> None:
        offset = grid.offset or (0.0,) * self.ndim
        start = [int(o) for o in offset]
        if any(o != int(o) or o < 0 for o in offset):
            raise ValueError(f"grid window offset={grid.offset} must be non-negative integers (the first table row "
                             f"each axis reads, inside the learned {self.grid_shape} table)")
        if self.fit != "tile" and any(s + n > m for s, n, m in zip(start, grid.shape, self.grid_shape)):
            raise ValueError(f"grid window offset={grid.offset} shape={grid.shape} must lie inside the learned "
                             f"grid {self.grid_shape} (fit='tile' repeats the table instead)")

    def _window_rows(self, grid: Grid, device) -> list[torch.Tensor]:
        """Per grid axis, the table row each patch reads: ``(size_a,)`` long, ``offset + i``, modulo the table's size
        with ``fit="tile"``."""
        start = [int(o) for o in grid.offset or (0.0,) * self.ndim]
        rows = [torch.arange(s, s + n, device=device) for s, n in zip(start, grid.shape)]
        return [r % m for r, m in zip(rows, self.grid_shape)] if self.fit == "tile" else rows

    def _window(self, grid: Grid) -> torch.Tensor:
        """The rows :meth:`_window_rows` names of each factor table, summed: ``(N, dim)``."""
        rows = self._window_rows(grid, next(self.parameters()).device)
        total = 0
        for axes, table in zip(self.factor_axes(), self.factor_tables()):
            view = [1] * self.ndim + [self.dim]
            for i, a in enumerate(axes):
                view[a] = grid.shape[a]
                table = table.index_select(i, rows[a])
            total = total + table.reshape(view)
        return total.reshape(-1, self.dim)

    def forward(self, x: torch.Tensor, grid: Grid | Layout) -> torch.Tensor:
        layout = as_layout(grid)
        grid = layout.grid
        check_grid_ndim(grid, self.ndim, "learned")
        self.check_spacing(grid)
        check_tokens(x, layout, self.dim)
        prefix_table = None
        if self.prefix is not None:
            if grid.prefix != self.num_prefix_tokens:
                raise ValueError(f"grid has prefix={grid.prefix} but the table owns "
                                 f"num_prefix_tokens={self.num_prefix_tokens} vectors")
            prefix_table = full_tensor(self.prefix)
        return self.add_to_patches(x, self.patch_table(grid, augment=self.training), layout, prefix_table)

    def position_vectors(self, grid) -> torch.Tensor:
        grid = as_grid(grid)
        with torch.no_grad():
            return self.patch_table(grid.without_prefix()).detach().float().cpu()

    def adaptation_label(self) -> str:
        if self.coordinates.normalized:
            return f"table sampled at {self.coordinates.label()} ({self.interpolation})"
        if self.fit in ("window", "tile"):
            return "window of the table" if self.fit == "window" else "table tiled"
        if self.fit == "square_crop":
            return f"table resampled to a square of the longer side and cropped ({self.interpolation})"
        return (f"table resampled ({self.interpolation}{', antialias' if self.antialias else ''}"
                f"{', align_corners' if self.align_corners else ''})")

    @torch.no_grad()
    def resize(self, new_shape, interpolation: str | None = None, antialias: bool | None = None) -> "Learned":
        """Resample the stored table to ``new_shape`` for good (fine-tuning at a new resolution)."""
        new_shape = to_shape("new_shape", new_shape, self.ndim)
        check_unsharded(self, "resize")
        interpolation = interpolation or self.interpolation
        antialias = self.antialias if antialias is None else antialias
        check_choice("interpolation", interpolation, INTERPOLATIONS)
        names = [f"axis_tables.{a}" for a in range(self.ndim)] if self.factorized is True else ["table", "time_table"]
        for name, axes, table in zip(names, self.factor_axes(), self.factor_tables()):
            resized = nn.Parameter(resample_grid(table, [new_shape[a] for a in axes], interpolation, antialias,
                                                 self.align_corners), requires_grad=table.requires_grad)
            if name.startswith("axis_tables."):
                self.axis_tables[int(name.split(".")[1])] = resized
            else:
                setattr(self, name, resized)
        self.grid_shape = new_shape
        self._cache.clear()
        return self

    def scriptable(self) -> "ScriptedLearned":
        """The TorchScript form (:class:`ScriptedLearned`): one joint table, ``fit="resample"``, index coordinates,
        no RMS normalisation; other settings are a ``NotImplementedError`` naming them."""
        self.check_scriptable_class(Learned)
        self.check_scriptable_coordinates()
        settings = {"factorized": (self.factorized, False), "fit": (self.fit, "resample"),
                    "rms_norm": (self.rms_norm, False)}
        other = [f"{name}={value!r}" for name, (value, plain) in settings.items() if value != plain]
        if other:
            raise TorchScriptRefusal(f"Learned with {', '.join(other)}",
                                      "its TorchScript form resamples one joint table (factorized=False, "
                                      "fit='resample', rms_norm=False)")
        return ScriptedLearned(self)

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        return (f"dim={self.dim}, grid_shape={self.grid_shape}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"factorized={self.factorized}, interpolation={self.interpolation!r}, antialias={self.antialias}"
                f"{', align_corners=True' if self.align_corners else ''}"
                f"{', fit=' + repr(self.fit) if self.fit != 'resample' else ''}"
                f"{', rms_norm=True' if self.rms_norm else ''}{', ' + extra if extra else ''}")


class ScriptedLearned(ScriptedTokens):
    """TorchScript form of :class:`Learned` (one joint table): the table (the encoding's parameter) resampled to the
    input's patch grid one axis at a time, as :meth:`Learned.patch_table` resamples it."""

    def __init__(self, pe: Learned):
        super().__init__(pe.prefix)
        self.table = pe.table  # (*grid_shape, dim)
        self.interpolation, self.antialias, self.align_corners = pe.interpolation, pe.antialias, pe.align_corners

    def patch_table(self, shape: List[int], device: torch.device) -> torch.Tensor:
        table = self.table
        for axis, size in enumerate(shape):
            if table.shape[axis] != size:
                table = interpolate_axis(table, axis, size, self.interpolation, self.antialias, self.align_corners)
        return table.reshape(-1, table.shape[-1])
