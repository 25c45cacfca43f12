"""The token layout every encoding reads: a grid of patches after a few prefix tokens."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import List, Optional

import torch
from einops import rearrange

from ._checks import check_nonnegative_int, check_number, to_shape
from ._compat import is_compiling


@dataclass(frozen=True)
class Grid:
    """Layout of a token sequence: ``prefix`` tokens (class, registers) then a row-major patch grid.

    Args:
        shape: patches per axis, ``(H, W)`` for images, ``(T, H, W)`` for video, ``(L,)`` for 1D.
            Patches are flattened row-major (last axis fastest), as ``x.flatten(2).transpose(1, 2)`` gives.
        prefix: number of prefix tokens before the patches; they never get a spatial position.
        offset: coordinate of the first patch per axis (a crop or a later clip starts elsewhere);
            defaults to zeros.
        spacing: coordinate step between neighbouring patches per axis: a positive number, or None for the index
            step 1 (default: None on every axis). An axis with a number is *absolute*: its coordinates are
            ``offset + index * step`` whatever the grid's size, so resolution scaling against a reference grid (RoPE's
            ``pi``/``ntk``/``yarn``, sincos's ``ref_shape``) leaves it alone; an axis with None holds index positions
            that scaling may rescale. The frame rate of a clip travels here: Qwen2.5-VL's absolute time gives temporal
            patch ``t`` the position ``t * seconds_per_temporal_patch * tokens_per_second``, i.e.
            ``spacing=(s * tps, None, None)``, so clips at different frame rates share one time axis (the video
            models' ``time_spacing=``). Read by the encodings that read coordinates (RoPE and the learned rotations,
            ALiBi, LookHere's distances, FIRE, CPB, PaPE, sincos); encodings that index a table by integer positions or
            offsets (``learned``, ``peg``, ``swin_bias``, ``rel_bias``, ``bucket_bias``) refuse a grid with a spacing
            (:meth:`~visionpe.encoding.Encoding.check_spacing`).

    A grid is immutable and hashable, so encodings cache their tables per ``(grid, device)``.
    """

    shape: tuple[int, ...]
    prefix: int = 0
    offset: tuple[float, ...] | None = None
    spacing: tuple[float, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", to_shape("shape", self.shape))
        check_nonnegative_int("prefix", self.prefix)
        if self.offset is not None:
            if not isinstance(self.offset, Sequence) or isinstance(self.offset, str) \
                    or len(self.offset) != len(self.shape):
                raise ValueError(f"offset={self.offset!r} must have one value per axis (numbers) of shape={self.shape}")
            offset = tuple(check_number("offset", o) for o in self.offset)
            object.__setattr__(self, "offset", offset if any(offset) else None)
        if self.spacing is not None:
            if not isinstance(self.spacing, Sequence) or isinstance(self.spacing, str) \
                    or len(self.spacing) != len(self.shape):
                raise ValueError(f"spacing={self.spacing!r} must have one positive number (or None) per axis of "
                                 f"shape={self.shape}")
            spacing = tuple(None if s is None else check_number("spacing", s, minimum=0.0, inclusive=False)
                            for s in self.spacing)
            object.__setattr__(self, "spacing", None if all(s is None for s in spacing) else spacing)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def steps(self) -> tuple[float, ...]:
        """The coordinate step per axis: the spacing, 1 where it is None."""
        return tuple(1.0 if s is None else s for s in (self.spacing or (None,) * self.ndim))

    @property
    def absolute_axes(self) -> tuple[bool, ...]:
        """Per axis, whether it has a spacing (absolute coordinates, never rescaled to a reference grid)."""
        return tuple(s is not None for s in (self.spacing or (None,) * self.ndim))

    @property
    def num_patches(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def num_tokens(self) -> int:
        return self.prefix + self.num_patches

    def without_prefix(self) -> "Grid":
        """The same patches (shape, offset, spacing) with no prefix tokens: what position maps and tables cover."""
        return Grid(self.shape, 0, self.offset, self.spacing)

    def with_shape(self, shape) -> "Grid":
        """The same layout (prefix, offset, spacing) on another patch shape."""
        return Grid(tuple(shape), self.prefix, self.offset, self.spacing)

    def coords(self, device=None, dtype=torch.float32) -> torch.Tensor:
        """Patch coordinates, ``(num_patches, ndim)``: ``offset + index * spacing`` per axis, in grid axis order.

        Computed in ``dtype`` when it is a floating type (float64 keeps large offsets exact), else in float32.
        """
        work = dtype if dtype.is_floating_point else torch.float32
        check_exact_positions(self.shape, self.offset, self.spacing, work)
        coords = index_coords(list(self.shape), work, device)
        if self.spacing is not None:
            coords = coords * torch.tensor(self.steps, device=device, dtype=work)
        if self.offset is not None:
            coords = coords + torch.tensor(self.offset, device=device, dtype=work)
        return coords.to(dtype)


def index_coords(shape: List[int], dtype: torch.dtype, device: Optional[torch.device] = None) -> torch.Tensor:
    """Integer patch positions of a grid of ``shape``, ``(N, ndim)`` in ``dtype``, grid axis order, row-major (a
    TorchScript function: the scripted models compute their positions with it from each input's size)."""
    return grid_coordinates([torch.arange(s, device=device, dtype=dtype) for s in shape])


def grid_coordinates(axis_positions: List[torch.Tensor]) -> torch.Tensor:
    """Per-axis coordinates ``[(n_a,)]`` -> ``(N, ndim)`` for every patch, row-major, grid axis order (a TorchScript
    function)."""
    return torch.stack(torch.meshgrid(axis_positions, indexing="ij"), dim=-1).reshape(-1, len(axis_positions))


def check_exact_positions(shape, offset, spacing, dtype: torch.dtype) -> None:
    """Coordinates ``offset + i * spacing`` of a grid of ``shape`` stay where ``dtype`` tells integer neighbours apart
    (``|c| <= 2^(mantissa bits + 1)``: 2^24 in float32, 2^53 in float64); beyond, neighbouring patches would get the
    same position without an error, so it is a ``ValueError``."""
    if offset is None:
        return
    spacing = [1.0 if s is None else s for s in (spacing or (None,) * len(shape))]
    farthest = max(abs(o) + (n - 1) * abs(s) for o, n, s in zip(offset, shape, spacing))
    bits = round(-math.log2(torch.finfo(dtype).eps)) + 1  # mantissa bits + 1: 24 in float32, 53 in float64
    if farthest > 2 ** bits:
        raise ValueError(f"offset={tuple(offset)} places patch coordinates up to {farthest:.6g}, beyond 2^{bits} = "
                         f"{2 ** bits}, where {dtype} positions of neighbouring patches coincide: keep |offset| + "
                         f"(size - 1) * spacing <= 2^{bits} per axis")


def as_grid(grid) -> Grid:
    """Accept a :class:`Grid` or a bare shape tuple."""
    if isinstance(grid, Grid):
        return grid
    if not isinstance(grid, Sequence) or isinstance(grid, str):
        raise ValueError(f"grid must be a visionpe.Grid or a shape tuple like (14, 14), got {grid!r}")
    return Grid(tuple(grid))


@dataclass(frozen=True, eq=False)
class Layout:
    """The tokens of one forward: a :class:`Grid` and, optionally, which of its patches each sample keeps.

    ``keep: (B, K)`` long indices into the grid's patches (row-major, ``0 .. N - 1``: a negative index is an error,
    not counted from the end), per sample: masked image modelling (MAE), patch dropout, token pruning. One row
    (``(1, K)``) is the same patches for every sample of the batch (broadcast, as PyTorch broadcasts a size-1 axis:
    every family takes it). Each kept token keeps its own position: encodings compute their tables on the full
    grid and gather the kept rows (rotary) or rows and columns (bias) per sample; tokens encodings are added before
    dropping. The token sequence is ``P`` prefix tokens then the ``K`` kept patches in ``keep`` order. ``keep`` must
    be on the device of the tokens it selects.
    """

    grid: Grid
    keep: torch.Tensor | None = None

    def __post_init__(self):
        if not isinstance(self.grid, Grid):
            raise ValueError(f"grid must be a visionpe.Grid, got {self.grid!r}")
        keep = self.keep
        if keep is not None:
            if not isinstance(keep, torch.Tensor) or keep.ndim != 2 or keep.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"keep must be a (batch, kept) integer tensor of patch indices, got "
                                 f"{getattr(keep, 'dtype', type(keep).__name__)} {tuple(getattr(keep, 'shape', ()))}")
            check_patch_indices(keep, self.grid)

    @property
    def num_tokens(self) -> int:
        return self.grid.num_tokens if self.keep is None else self.grid.prefix + self.keep.shape[1]

    def unwrap(self) -> "Grid | Layout":
        """The grid itself when every patch is kept (what encodings that know only grids expect), else ``self``."""
        return self.grid if self.keep is None else self

    def check_batch(self, batch: int, device=None) -> None:
        """``keep`` fits a batch of ``batch`` samples on ``device``: one row per sample or one row for all."""
        if self.keep is None:
            return
        if self.keep.shape[0] not in (1, batch):
            raise ValueError(f"keep has {self.keep.shape[0]} rows but the batch has {batch} samples; allowed: one row "
                             "per sample, or 1 row for every sample")
        if device is not None and self.keep.device != torch.device(device):
            raise ValueError(f"keep is on {self.keep.device} but the tokens are on {torch.device(device)}; move keep "
                             "to the tokens' device")

    def token_index(self, device=None, batch: int | None = None) -> torch.Tensor:
        """``(B, P + K)`` indices of this layout's tokens among the full grid's ``P + N`` tokens (``(1, P + K)`` for a
        one-row ``keep``; ``batch`` expands it). ``device``: where the tokens are (checked against ``keep``'s)."""
        self.check_batch(self.keep.shape[0] if batch is None else batch, device)
        prefix = torch.arange(self.grid.prefix, device=self.keep.device).expand(self.keep.shape[0], -1)
        index = torch.cat([prefix, self.keep.long() + self.grid.prefix], dim=1)
        return index if batch is None else index.expand(batch, -1)

    def rows(self, table: torch.Tensor) -> torch.Tensor:
        """Per-token rows of a full-grid table ``(heads, P + N, ...)`` -> ``(B, heads, P + K, ...)`` (``B`` = 1 for a
        one-row ``keep``; unchanged without ``keep``)."""
        if self.keep is None:
            return table
        return rearrange(table[:, self.token_index(table.device)], "h b t ... -> b h t ...")

    def pairs(self, bias: torch.Tensor) -> torch.Tensor:
        """Rows and columns of a full-grid bias ``(heads, P + N, P + N)`` -> ``(B, heads, P + K, P + K)``."""
        if self.keep is None:
            return bias
        index = self.token_index(bias.device)
        return rearrange(bias[:, index[:, :, None], index[:, None, :]], "h b t s -> b h t s")


def check_patch_indices(keep: torch.Tensor, grid: Grid) -> None:
    """Every index of ``keep`` is a patch of ``grid``, ``0 .. N - 1``, at most once per row (skipped while
    ``torch.compile`` traces, where reading values would break the graph, and for a meta tensor, which has none)."""
    if keep.numel() == 0 or keep.device.type == "meta" or is_compiling():
        return
    low, high = (int(v) for v in torch.aminmax(keep))
    if low < 0 or high >= grid.num_patches:
        raise ValueError(f"keep holds patch indices {low} .. {high} but grid {grid.shape} has {grid.num_patches} "
                         f"patches: allowed 0 .. {grid.num_patches - 1} (a negative index is not counted from the end)")
    ordered = keep.sort(dim=1).values
    repeated = (ordered[:, 1:] == ordered[:, :-1]).nonzero()
    if len(repeated):
        row, column = (int(v) for v in repeated[0])
        raise ValueError(f"keep row {row} holds patch {int(ordered[row, column])} more than once; each sample keeps a "
                         "patch at most once (distinct indices per row)")


def as_layout(layout) -> Layout:
    """Accept a :class:`Layout`, a :class:`Grid` or a bare shape tuple."""
    return layout if isinstance(layout, Layout) else Layout(as_grid(layout))


@dataclass(frozen=True, eq=False)
class MixedLayout:
    """The tokens of a mixed-size batch: sample ``b`` has its own grid ``grids[b]`` (its size and aspect ratio) and
    its ``P + N_b`` tokens first, padded to the longest sample (NaFlexViT's setting), or to ``length`` tokens when
    given (a fixed sequence length, as SigLIP 2's NaFlex batches of ``max_num_patches``: at least the longest sample).

    Encodings never see padding: :func:`visionpe.attend` and the models run every encoding once per distinct grid on
    the samples that have it (their real tokens only) and mask padded keys, so each sample gets exactly the positions
    it would get alone.
    """

    grids: tuple[Grid, ...]
    length: int | None = None

    def __post_init__(self):
        grids = tuple(self.grids) if isinstance(self.grids, (list, tuple)) else ()
        if not grids or not all(isinstance(g, Grid) for g in grids):
            raise ValueError(f"grids must be a non-empty sequence of visionpe.Grid, one per sample, got {self.grids!r}")
        if len({g.prefix for g in grids}) != 1 or len({g.ndim for g in grids}) != 1:
            raise ValueError("every sample's grid must have the same prefix and number of axes, got "
                             f"{[(g.shape, g.prefix) for g in grids]}")
        object.__setattr__(self, "grids", grids)
        longest = max(g.num_tokens for g in grids)
        if self.length is not None and (isinstance(self.length, bool) or not isinstance(self.length, int)
                                        or self.length < longest):
            raise ValueError(f"length={self.length!r} must be an integer of at least the longest sample's "
                             f"{longest} tokens (or None: padded to the longest sample)")
        samples: dict[Grid, list[int]] = {}  # distinct grid -> its samples, computed once for every block
        for b, g in enumerate(grids):
            samples.setdefault(g, []).append(b)
        object.__setattr__(self, "_samples", samples)

    @property
    def num_tokens(self) -> int:
        return max(g.num_tokens for g in self.grids) if self.length is None else self.length

    def groups(self, device=None) -> list[tuple[torch.Tensor, Grid]]:
        """``[(sample indices, grid)]``, one entry per distinct grid, in order of first appearance."""
        return [(torch.tensor(idx, device=device), g) for g, idx in self._samples.items()]

    def key_mask(self, device=None) -> torch.Tensor:
        """``(B, T)`` bool, True for real tokens, False for padding."""
        counts = torch.tensor([g.num_tokens for g in self.grids], device=device)
        return torch.arange(self.num_tokens, device=device) < counts[:, None]

    def check_batch(self, batch: int) -> None:
        """One grid per sample: ``batch`` must be the number of grids."""
        if batch != len(self.grids):
            raise ValueError(f"the mixed layout has {len(self.grids)} grids but the batch has {batch} samples; give "
                             "one grid per sample")

    def per_grid(self, x: torch.Tensor, fn) -> torch.Tensor:
        """``x: (B, T, ...)`` with ``fn(x_group, grid) -> same shape`` applied to each group's real tokens; padding
        passes through unchanged."""
        self.check_batch(x.shape[0])
        out = x.clone()
        for index, grid in self.groups(x.device):
            out[index, :grid.num_tokens] = fn(x[index, :grid.num_tokens], grid)
        return out


def time_layout(grid: Grid, time_spacing, batch: int) -> Grid | MixedLayout:
    """The grid of a batch of clips on an absolute time axis (the video models' ``time_spacing=``).

    ``time_spacing``: the coordinate step between neighbouring temporal tokens (axis 0 of a ``(T, H, W)`` grid), e.g.
    ``seconds per temporal token / seconds per time position``: None (index time: ``grid`` itself), a positive number
    for every sample, or a ``(batch,)`` tensor or sequence, one step per sample (a clip at half the frame rate has
    twice the step). The time axis becomes absolute (:attr:`Grid.spacing` ``(step, None, None)``), so clips at
    different frame rates share one time axis. Per-sample steps that differ give a :class:`MixedLayout` of grids of
    one size (every encoding runs once per distinct step on its samples, as for a mixed-size batch); equal ones, one
    grid. The values are read on the host (one sync for a tensor on a device).
    """
    if time_spacing is None:
        return grid
    if grid.ndim != 3:
        raise ValueError(f"time_spacing is the step of a clip's time axis, the first of a (T, H, W) grid; this model's "
                         f"grid {grid.shape} has {grid.ndim} axes (time_spacing is for video models)")
    if isinstance(time_spacing, torch.Tensor):
        if time_spacing.ndim > 1 or time_spacing.is_complex() or time_spacing.dtype == torch.bool:
            raise ValueError(f"time_spacing must be a number or a (batch,) real tensor of positive steps, got "
                             f"{time_spacing.dtype} of shape {tuple(time_spacing.shape)}")
        time_spacing = time_spacing.tolist()
    steps = time_spacing if isinstance(time_spacing, Sequence) and not isinstance(time_spacing, str) \
        else [time_spacing]
    if len(steps) not in (1, batch):
        raise ValueError(f"time_spacing has {len(steps)} values but the batch has {batch} clips; give one step, or "
                         "one per clip")
    steps = [check_number("time_spacing", s, minimum=0.0, inclusive=False) for s in steps]
    grids = [Grid(grid.shape, grid.prefix, grid.offset, (s, None, None)) for s in steps]
    if len(set(grids)) == 1:
        return grids[0]
    return MixedLayout(tuple(grids))
