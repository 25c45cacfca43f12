"""Coordinate systems and train-time coordinate augmentation, shared by every encoding that reads positions
(``sincos``, ``learned``, ``rope_axial``, ``rope_mixed``, ``alibi``, ``cpb``).

Every coordinate system here is a per-axis affine map of the integer patch index ``i_a``, so one grid's
coordinates are the product of per-axis vectors (:func:`axis_positions`) and offsets between patches are
multiples of one step per axis.

- ``coords="index"`` (the default): integer patch positions ``c_a = i_a + offset_a``. On a larger grid the
  coordinates grow past the training range (extrapolation).
- interpolation to a reference grid (position interpolation, PI): ``c_a = (i_a + offset_a) * ref_a / size_a``,
  so every grid spans the reference (training) grid's index range. This is RoPE's ``scaling="pi"`` and sincos's
  ``ref_shape``; a learned table resampled to a new grid (``F.interpolate``) reads it at these positions too.
- ``coords="normalized"`` (DINOv3; timm ``RotaryEmbeddingDinoV3``, ``_build_grid(grid_type="centered")``):
  patch centres divided by a per-axis denominator ``d_a`` and mapped to ``[-1, 1]``:
  ``c_a = 2 (i_a + 0.5 + offset_a) / d_a - 1``, with ``d_a = size_a`` (``normalize_coords="separate"``: each
  axis spans ``[-1, 1]``), ``d_a = min(shape)`` (``"min"``: the shortest side spans ``[-1, 1]``, longer ones
  extend past 1) or ``d_a = max(shape)`` (``"max"``: the longest side spans ``[-1, 1]``, shorter ones stop
  before 1). Distances are in units of half the grid extent (``"separate"``), of half the shortest or longest
  side. Normalised coordinates are a form of interpolation without a reference grid: PI maps any grid onto the
  training grid's index range, normalised coordinates map every grid (the training grid included) onto
  ``[-1, 1]``, so a model trained on normalised coordinates never sees a coordinate out of its range.
- ``coords="pixel"`` (timm ``_build_grid(grid_type="pixel")``, the grid of its pixel-frequency RoPE): the end patches
  on ``-1`` and ``1``, ``c_a = 2 (i_a + offset_a) / (d_a - 1) - 1`` (``torch.linspace(-1, 1, size_a)``; ``c_a = -1``
  on an axis of one patch), ``d_a`` as for ``"normalized"``. The other normalised system: every encoding treats it as
  ``"normalized"`` (spans ``[-1, 1]``, takes no resolution scaling), only the positions differ.

Augmentation (timm ``_apply_coord_augs``, DINOv3's ``RopePositionEmbedding``), in training mode only
(``module.training``): one transform of all positions, ``c' = (c + shift) * jitter * rescale`` with
``shift_a ~ U[-S, S]`` per axis (``shift_coords=S``, in the coordinates' own units: patches for ``"index"``,
normalised units for ``"normalized"``), ``log jitter_a ~ U[-log J, log J]`` per axis (``jitter_coords=J >= 1``)
and ``log rescale ~ U[-log R, log R]`` shared by all axes (``rescale_coords=R >= 1``). Draws are taken in that
order, in float32 from torch's default generator on the coordinates' device, once per forward call and shared
by every head (and by q and k), so a ``torch.manual_seed`` reproduces them and the same RNG state gives timm's
draws. Inside a model forward (:func:`coordinate_draws`, opened by every backbone's forward) the draw is shared by
every block: the first encoding that draws takes it, every later one with the same settings reuses it, so a token
has one position in all layers, as in timm's Eva (``self.rope.get_embed()`` once per forward, passed to every
block). ``draw_coords="block"`` asks for a fresh draw in each block instead. Relative encodings (``alibi``,
``cpb``) see only the scales (a shift leaves offsets unchanged, but is
still drawn, keeping the RNG sequence).
"""
from __future__ import annotations

import contextvars
import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import List

import torch

from ._checks import check_choice, check_number
from ._compat import is_compiling
from .grid import Grid, check_exact_positions

COORDS = ("index", "normalized", "pixel")
NORMALIZED_COORDS = ("normalized", "pixel")  # the systems that span [-1, 1] on every grid
NORMALIZE_COORDS = ("separate", "min", "max")
DRAW_COORDS = ("forward", "block")

# The draws of the model forward running in this context (thread, task): ``None`` outside a forward. A context
# variable, not module state, so concurrent forwards (threads) never see each other's draws.
_DRAWS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("visionpe_coordinate_draws", default=None)
# While torch.compile traces a forward: dynamo cannot set a ContextVar, but traces a module dict's mutations into
# the graph (the compiled code does not read it at run time), so a traced forward's scope lives here.
_TRACED: dict = {"draws": None}


@contextmanager
def coordinate_draws(draws: dict | None = None):
    """Share coordinate augmentation draws for the duration of one model forward (timm's Eva convention).

    Inside, :meth:`CoordinateSystem.draw` (with ``draw_coords="forward"``) returns one transform per coordinate
    settings, channel count and device: the first call draws it, later ones reuse it. A nested call joins the open
    scope (``forward`` calling ``forward_features``). ``draws``: re-enter a scope with these draws (what
    :func:`with_draws` does for activation checkpointing's recomputation). Yields the scope's dict.
    """
    current = _DRAWS.get()
    if draws is None and current is not None:
        yield current
        return
    token = _DRAWS.set({} if draws is None else draws)
    try:
        yield _DRAWS.get()
    finally:
        _DRAWS.reset(token)


def _open_draws() -> dict | None:
    return _TRACED["draws"] if is_compiling() else _DRAWS.get()


def forward_draw(key, draw):
    """``draw()`` once per model forward for ``key``: inside an open scope (:func:`coordinate_draws`, a model's
    training forward) the first call draws and later ones (every block's) reuse it; outside any, a fresh draw per
    call."""
    draws = _open_draws()
    if draws is None:
        return draw()
    if key not in draws:
        draws[key] = draw()
    return draws[key]


def shares_draws(method):
    """Decorator of a model's forward methods: one coordinate augmentation draw per forward, shared by every block
    (:func:`coordinate_draws`). In evaluation mode nothing is drawn, so nothing is opened."""
    @functools.wraps(method)
    def forward(self, *args, **kwargs):
        if not self.training:
            return method(self, *args, **kwargs)
        if is_compiling():
            if _TRACED["draws"] is not None:  # nested in a traced forward
                return method(self, *args, **kwargs)
            _TRACED["draws"] = {}
            try:
                return method(self, *args, **kwargs)
            finally:
                _TRACED["draws"] = None
        with coordinate_draws():
            return method(self, *args, **kwargs)
    return forward


def with_draws(fn):
    """``fn`` bound to a snapshot of the open scope's draws, for ``torch.utils.checkpoint``: its recomputation runs
    in the backward pass, outside the forward's scope; with the snapshot (the draws taken before ``fn`` ran) it
    reuses the shared draws and redraws, from the restored RNG state, exactly those ``fn`` drew first. ``fn`` itself
    when no (eager) scope is open."""
    current = None if is_compiling() else _DRAWS.get()
    if current is None:
        return fn
    snapshot = dict(current)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if _DRAWS.get() is current:  # the first (forward) call: draw into the live scope
            return fn(*args, **kwargs)
        with coordinate_draws(dict(snapshot)):  # the recomputation: the draws as they were before fn
            return fn(*args, **kwargs)
    return run


def _device_key(device) -> str:
    """One name per device (``"cuda"`` and ``"cuda:0"`` are the same one), so encodings share a draw however they
    name it."""
    device = torch.device("cpu" if device is None else device)
    if device.type != "cpu" and device.index is None and device.type == "cuda" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def denominators(shape, normalize_coords: str = "separate") -> tuple[float, ...]:
    """Per-axis denominators ``d_a`` of normalised coordinates: each side, the shortest or the longest."""
    check_choice("normalize_coords", normalize_coords, NORMALIZE_COORDS)
    if normalize_coords == "separate":
        return tuple(_as_float(s) for s in shape)
    side = functools.reduce(torch.sym_min if normalize_coords == "min" else torch.sym_max, shape)
    return (_as_float(side),) * len(shape)


def _as_float(size):
    """A size as a float denominator; a traced size (torch.export) stays symbolic, so the graph is not specialised to
    the example's value."""
    return size if isinstance(size, torch.SymInt) else float(size)


def normalized_steps(shape, coords: str = "normalized", normalize_coords: str = "separate") -> list:
    """The step between neighbouring patches on each axis in a normalised system (``coords="normalized"``:
    ``2 / d_a``; ``"pixel"``: ``2 / (d_a - 1)``)."""
    denoms = denominators(shape, normalize_coords)
    if coords == "pixel":
        return [2.0 / _corner_span(d) for d in denoms]
    return [2.0 / d for d in denoms]


def normalized_to_index(positions, shape, coords: str = "normalized", normalize_coords: str = "separate") -> list:
    """Per-axis normalised ``positions`` (a list of tensors, grid axis order) as fractional patch indices of a grid of
    ``shape`` (the inverse of :func:`axis_positions` on that grid): ``(p + 1) d / 2 - 0.5`` (``"normalized"``),
    ``(p + 1) (d - 1) / 2`` (``"pixel"``)."""
    denoms = denominators(shape, normalize_coords)
    if coords == "pixel":
        return [(p + 1) * (_corner_span(d) / 2) for p, d in zip(positions, denoms)]
    return [(p + 1) * (d / 2) - 0.5 for p, d in zip(positions, denoms)]


def _corner_span(denominator):
    """``d - 1``, the steps between the end patches of ``d`` on ``[-1, 1]`` (at least 1: one patch sits on -1)."""
    if isinstance(denominator, torch.SymInt):
        return torch.sym_max(denominator - 1, 1)
    return max(denominator - 1.0, 1.0)


def axis_positions(shape, offset=None, coords: str = "index", normalize_coords: str = "separate", ref_shape=None,
                   device=None, dtype=torch.float32, spacing=None) -> list[torch.Tensor]:
    """Per-axis coordinates ``[(size_a,)]`` of a grid's patches, in grid axis order (see the module docstring).

    ``ref_shape`` (``coords="index"`` only) interpolates onto a reference grid's index range (PI). ``spacing``
    (:attr:`Grid.spacing`, ``coords="index"`` only) is the step per axis: ``offset + i * spacing``; an axis with a
    spacing is absolute, and ``ref_shape`` leaves it alone (its step says where its patches are).
    """
    check_exact_positions(shape, offset, spacing, dtype)
    offset = offset or (0.0,) * len(shape)
    if coords in NORMALIZED_COORDS:
        if spacing is not None:
            raise ValueError(f"a grid with spacing={spacing} (e.g. absolute time) needs coords='index': normalised "
                             "coordinates map every axis onto [-1, 1] whatever its step")
        denoms = denominators(shape, normalize_coords)
        if coords == "pixel":  # timm's linspace(-1, 1, s): steps of 2 / (d - 1)
            return [(torch.arange(s, device=device, dtype=dtype) + o) * (2.0 / _corner_span(d)) - 1.0
                    for s, o, d in zip(shape, offset, denoms)]
        # timm's order of operations: (i + 0.5 + offset) / d, then 2 c - 1
        return [(torch.arange(s, device=device, dtype=dtype) + 0.5 + o) / d * 2.0 - 1.0
                for s, o, d in zip(shape, offset, denoms)]
    spacing = spacing or (None,) * len(shape)
    axes = [torch.arange(s, device=device, dtype=dtype) * (1.0 if step is None else step) + o
            for s, o, step in zip(shape, offset, spacing)]
    if ref_shape is not None:
        axes = [a if step is not None else a * (r / s) for a, r, s, step in zip(axes, ref_shape, shape, spacing)]
    return axes


def patch_positions(shape: List[int], coords: str, normalize_coords: str, dtype: torch.dtype,
                    device: torch.device) -> List[torch.Tensor]:
    """Per-axis coordinates ``[(size_a,)]`` of a grid of ``shape`` without offset, spacing or reference grid, in
    ``dtype``, grid axis order: what :func:`axis_positions` gives such a grid, as a TorchScript function (the scripted
    models' encodings compute their positions with it from each input's size)."""
    if coords == "index":
        return [torch.arange(s, dtype=dtype, device=device) for s in shape]
    side = min(shape) if normalize_coords == "min" else max(shape)
    positions: List[torch.Tensor] = []
    for s in shape:
        d = float(s) if normalize_coords == "separate" else float(side)
        steps = torch.arange(s, dtype=dtype, device=device)
        if coords == "pixel":
            positions.append(steps * (2.0 / max(d - 1.0, 1.0)) - 1.0)
        else:
            positions.append((steps + 0.5) / d * 2.0 - 1.0)
    return positions


def axis_offsets(positions: torch.Tensor) -> torch.Tensor:
    """Offsets ``c_i - c_j`` along one axis for ``i - j = -(n-1) .. n-1``, ``(2 n - 1,)``, from its ``n`` evenly
    spaced positions (every coordinate system here spaces them evenly)."""
    both = torch.cat([positions[0] - positions.flip(0), positions - positions[0]])  # (2 n,): offset 0 twice
    index = torch.arange(both.shape[0] - 1, device=positions.device)  # (2 n - 1,)
    # skip the first 0 by index, not by an (n - 1,) slice, whose size torch.export would guard to be >= 2
    return both[index + (index >= positions.shape[0] - 1)]


@dataclass(frozen=True)
class CoordTransform:
    """One augmentation draw: ``c' = (c + shift) * jitter * rescale`` per coordinate channel, as timm."""

    shift: torch.Tensor | None = None    # (ndim,)
    jitter: torch.Tensor | None = None   # (ndim,)
    rescale: torch.Tensor | None = None  # (1,)

    def __call__(self, coords: torch.Tensor) -> torch.Tensor:
        """Transform ``coords: (..., ndim)`` (channels in the order the draw was taken for) in their dtype."""
        if self.shift is not None:
            coords = coords + self.shift.to(coords)
        if self.jitter is not None:
            coords = coords * self.jitter.to(coords)
        if self.rescale is not None:
            coords = coords * self.rescale.to(coords)
        return coords

    def on_axis(self, axis: int, positions: torch.Tensor) -> torch.Tensor:
        """Transform the 1D positions of one channel ``axis``."""
        if self.shift is not None:
            positions = positions + self.shift[axis].to(positions)
        if self.jitter is not None:
            positions = positions * self.jitter[axis].to(positions)
        if self.rescale is not None:
            positions = positions * self.rescale[0].to(positions)
        return positions


@dataclass(frozen=True)
class CoordinateSystem:
    """The coordinates an encoding reads and their train-time augmentation (one per encoding module).

    Args (the same keywords in every coordinate-reading encoding):
        coords: ``"index"`` (integer patch positions), ``"normalized"`` (DINOv3's centred ``[-1, 1]``) or ``"pixel"``
            (timm's pixel grid: the end patches on -1 and 1).
        normalize_coords: with ``"normalized"``, the denominator per axis: ``"separate"`` (each side),
            ``"min"`` or ``"max"`` (the shortest or longest side, for all axes).
        shift_coords, jitter_coords, rescale_coords: timm's augmentation factors (``None``: off); see the module
            docstring. Applied by the encodings in training mode only.
        draw_coords: ``"forward"`` (default, timm's Eva): one draw per model forward, shared by every block;
            ``"block"``: a fresh draw in every block (every call of the encoding).
    """

    coords: str = "index"
    normalize_coords: str = "separate"
    shift_coords: float | None = None
    jitter_coords: float | None = None
    rescale_coords: float | None = None
    draw_coords: str = "forward"

    def __post_init__(self):
        check_choice("coords", self.coords, COORDS)
        check_choice("draw_coords", self.draw_coords, DRAW_COORDS)
        check_choice("normalize_coords", self.normalize_coords, NORMALIZE_COORDS)
        for name, minimum in (("shift_coords", 0.0), ("jitter_coords", 1.0), ("rescale_coords", 1.0)):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_number(name, value, minimum=minimum))

    @property
    def normalized(self) -> bool:
        return self.coords in NORMALIZED_COORDS

    @property
    def augments(self) -> bool:
        """Whether any augmentation is configured (it runs in training mode only)."""
        return any(v is not None for v in (self.shift_coords, self.jitter_coords, self.rescale_coords))

    def axis_positions(self, shape, offset=None, ref_shape=None, device=None,
                       dtype=torch.float32, spacing=None) -> list[torch.Tensor]:
        """Per-axis coordinates of a grid of ``shape`` (see :func:`axis_positions`)."""
        return axis_positions(shape, offset, self.coords, self.normalize_coords, ref_shape, device, dtype, spacing)

    def positions(self, grid: Grid, device=None, dtype=torch.float32, ref_shape=None) -> torch.Tensor:
        """Coordinates of the grid's patches ``(N, ndim)``, grid axis order, row-major; ``ref_shape`` (index
        coordinates only): interpolated onto that grid's range (PI)."""
        if not self.normalized and ref_shape is None:
            return grid.coords(device, dtype)
        axes = self.axis_positions(grid.shape, grid.offset, ref_shape, device, dtype, grid.spacing)
        return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, grid.ndim)

    def draw(self, training: bool, ndim: int, device=None) -> CoordTransform | None:
        """One augmentation draw for ``ndim`` coordinate channels (None when not ``training`` or none is set):
        shift, then jitter, then rescale, in float32 from torch's default generator on ``device``. Inside a model
        forward (:func:`coordinate_draws`) with ``draw_coords="forward"``, the forward's one draw for these settings
        (taken by the first block that asks)."""
        if not (training and self.augments):
            return None
        if self.draw_coords != "forward":
            return self._draw(ndim, device)
        return forward_draw((self, ndim, _device_key(device)), lambda: self._draw(ndim, device))

    def _draw(self, ndim: int, device=None) -> CoordTransform:
        like = dict(device=device, dtype=torch.float32)
        shift = jitter = rescale = None
        if self.shift_coords is not None:
            shift = torch.empty(ndim, **like).uniform_(-self.shift_coords, self.shift_coords)
        if self.jitter_coords is not None:
            bound = math.log(self.jitter_coords)
            jitter = torch.empty(ndim, **like).uniform_(-bound, bound).exp()
        if self.rescale_coords is not None:
            bound = math.log(self.rescale_coords)
            rescale = torch.empty(1, **like).uniform_(-bound, bound).exp()
        return CoordTransform(shift, jitter, rescale)

    def describe(self) -> str:
        """The settings that differ from the defaults, for ``extra_repr`` (empty for plain index coordinates)."""
        parts = [f"coords={self.coords!r}"] if self.normalized else []
        if self.normalized and self.normalize_coords != "separate":
            parts.append(f"normalize_coords={self.normalize_coords!r}")
        parts += [f"{name}={getattr(self, name)}" for name in ("shift_coords", "jitter_coords", "rescale_coords")
                  if getattr(self, name) is not None]
        if self.augments and self.draw_coords != "forward":
            parts.append(f"draw_coords={self.draw_coords!r}")
        return ", ".join(parts)

    def label(self) -> str:
        """A short phrase naming the coordinates, for adaptation labels."""
        if not self.normalized:
            return "index coordinates"
        kind = "normalised" if self.coords == "normalized" else "pixel"
        return f"{kind} coordinates ({self.normalize_coords})"
