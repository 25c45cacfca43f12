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

Augmentation (timm ``_apply_coord_augs``, DINOv3's ``RopePositionEmbedding``), in training mode only
(``module.training``): one transform of all positions, ``c' = (c + shift) * jitter * rescale`` with
``shift_a ~ U[-S, S]`` per axis (``shift_coords=S``, in the coordinates' own units: patches for ``"index"``,
normalised units for ``"normalized"``), ``log jitter_a ~ U[-log J, log J]`` per axis (``jitter_coords=J >= 1``)
and ``log rescale ~ U[-log R, log R]`` shared by all axes (``rescale_coords=R >= 1``). Draws are taken in that
order, in float32 from torch's default generator on the coordinates' device, once per forward call and shared
by every head (and by q and k), so a ``torch.manual_seed`` reproduces them and the same RNG state gives timm's
draws. Relative encodings (``alibi``, ``cpb``) see only the scales (a shift leaves offsets unchanged, but is
still drawn, keeping the RNG sequence).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._checks import check_choice, check_number
from .grid import Grid

COORDS = ("index", "normalized")
NORMALIZE_COORDS = ("separate", "min", "max")


def denominators(shape, normalize_coords: str = "separate") -> tuple[float, ...]:
    """Per-axis denominators ``d_a`` of normalised coordinates: each side, the shortest or the longest."""
    check_choice("normalize_coords", normalize_coords, NORMALIZE_COORDS)
    if normalize_coords == "separate":
        return tuple(float(s) for s in shape)
    side = float(min(shape) if normalize_coords == "min" else max(shape))
    return (side,) * len(shape)


def axis_positions(shape, offset=None, coords: str = "index", normalize_coords: str = "separate", ref_shape=None,
                   device=None, dtype=torch.float32) -> list[torch.Tensor]:
    """Per-axis coordinates ``[(size_a,)]`` of a grid's patches, in grid axis order (see the module docstring).

    ``ref_shape`` (``coords="index"`` only) interpolates onto a reference grid's index range (PI).
    """
    offset = offset or (0.0,) * len(shape)
    if coords == "normalized":  # timm's order of operations: (i + 0.5 + offset) / d, then 2 c - 1
        return [(torch.arange(s, device=device, dtype=dtype) + 0.5 + o) / d * 2.0 - 1.0
                for s, o, d in zip(shape, offset, denominators(shape, normalize_coords))]
    axes = [torch.arange(s, device=device, dtype=dtype) + o for s, o in zip(shape, offset)]
    if ref_shape is not None:
        axes = [a * (r / s) for a, r, s in zip(axes, ref_shape, shape)]
    return axes


def axis_offsets(positions: torch.Tensor) -> torch.Tensor:
    """Offsets ``c_i - c_j`` along one axis for ``i - j = -(n-1) .. n-1``, ``(2 n - 1,)``, from its ``n`` evenly
    spaced positions (every coordinate system here spaces them evenly)."""
    return torch.cat([positions[0] - positions.flip(0)[:-1], positions - positions[0]])


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
        coords: ``"index"`` (integer patch positions) or ``"normalized"`` (DINOv3's centred ``[-1, 1]``).
        normalize_coords: with ``"normalized"``, the denominator per axis: ``"separate"`` (each side),
            ``"min"`` or ``"max"`` (the shortest or longest side, for all axes).
        shift_coords, jitter_coords, rescale_coords: timm's augmentation factors (``None``: off); see the module
            docstring. Applied by the encodings in training mode only.
    """

    coords: str = "index"
    normalize_coords: str = "separate"
    shift_coords: float | None = None
    jitter_coords: float | None = None
    rescale_coords: float | None = None

    def __post_init__(self):
        check_choice("coords", self.coords, COORDS)
        check_choice("normalize_coords", self.normalize_coords, NORMALIZE_COORDS)
        for name, minimum in (("shift_coords", 0.0), ("jitter_coords", 1.0), ("rescale_coords", 1.0)):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_number(name, value, minimum=minimum))

    @property
    def normalized(self) -> bool:
        return self.coords == "normalized"

    @property
    def augments(self) -> bool:
        """Whether any augmentation is configured (it runs in training mode only)."""
        return any(v is not None for v in (self.shift_coords, self.jitter_coords, self.rescale_coords))

    def axis_positions(self, shape, offset=None, ref_shape=None, device=None,
                       dtype=torch.float32) -> list[torch.Tensor]:
        """Per-axis coordinates of a grid of ``shape`` (see :func:`axis_positions`)."""
        return axis_positions(shape, offset, self.coords, self.normalize_coords, ref_shape, device, dtype)

    def positions(self, grid: Grid, device=None, dtype=torch.float32, ref_shape=None) -> torch.Tensor:
        """Coordinates of the grid's patches ``(N, ndim)``, grid axis order, row-major; ``ref_shape`` (index
        coordinates only): interpolated onto that grid's range (PI)."""
        if not self.normalized and ref_shape is None:
            return grid.coords(device, dtype)
        axes = self.axis_positions(grid.shape, grid.offset, ref_shape, device, dtype)
        return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, grid.ndim)

    def draw(self, training: bool, ndim: int, device=None) -> CoordTransform | None:
        """One augmentation draw for ``ndim`` coordinate channels (None when not ``training`` or none is set):
        shift, then jitter, then rescale, in float32 from torch's default generator on ``device``."""
        if not (training and self.augments):
            return None
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
        return ", ".join(parts)

    def label(self) -> str:
        """A short phrase naming the coordinates, for adaptation labels."""
        if not self.normalized:
            return "index coordinates"
        return f"normalised coordinates ({self.normalize_coords})"
