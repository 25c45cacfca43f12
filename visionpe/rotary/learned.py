"""What the learned rotations (STRING, ComRoPE, LieRE) share: coordinates, resolution scaling, the table cache and
the forward; a subclass builds the rotations of a grid's patches from per-axis coordinates.

``R(c) = exp(sum_a c_a L_a)`` with learned skew-symmetric generators ``L_a`` (one per coordinate axis). When they
commute, ``R(c_i)^T R(c_j) = R(c_j - c_i)`` and scores depend only on coordinate differences (STRING, ComRoPE);
LieRE's need not commute.

Coordinates are one of the systems of :mod:`visionpe.coords` (``coords="index"``: integer patch positions, which
``scaling="pi"`` interpolates to ``ref_shape`` on another grid; ``"normalized"``: centred ``[-1, 1]`` on every
grid), with the same train-time augmentation keywords as RoPE (``shift_coords``, ``jitter_coords``,
``rescale_coords``: one draw per forward shared by q, k and all heads, applied per grid axis; augmented rotations
are never cached). Tables are built in float64 (float32 where the device has none; LieRE's per-position exponentials
in float32), stored in float32, cached per grid in evaluation (and whenever no gradient must reach the generators)
and rebuilt per call in training; the rotation is applied in float32 and cast back to the input's dtype.
"""
from __future__ import annotations

import copy
import inspect
from typing import List, Tuple

import torch
from torch import nn

from .._checks import (angle_dtype, check_choice, check_divisible, check_grid_ndim, check_ndim, check_positive_int,
                       device_angle_dtype, to_shape)
from .._compat import autocast_off, same_shape
from ..cache import TableCache
from ..coords import CoordinateSystem, CoordTransform, patch_positions
from ..grid import Grid, Layout, as_grid, as_layout
from ._base import RotaryEncoding
from .blocks import apply_blocks, multiply_blocks, pack_blocks, packing, unpack_blocks, with_identity_prefix
from .rope import check_scaling

LEARNED_SCALINGS = ("none", "pi")


def check_block_size(head_dim: int, block_size: int) -> None:
    """``block_size`` (checked a positive integer) splits ``head_dim`` into whole skew-symmetric blocks of at least
    2 x 2 (a 1 x 1 one is 0)."""
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2 (a 1x1 skew-symmetric block is 0), got {block_size!r}")
    check_divisible("head_dim", head_dim, block_size, f"whole {block_size}x{block_size} blocks (block_size)")


class LearnedRotation(RotaryEncoding):
    """Base class of rotations from learned generators; use :class:`~visionpe.rotary.StringRoPE`,
    :class:`~visionpe.rotary.ComRoPE` or :class:`~visionpe.rotary.LieRE`.

    Call: ``pe(q, k, grid) -> (q, k)``, ``q, k: (B, num_heads, P + N, head_dim)`` (``P + K`` tokens for a
    :class:`~visionpe.Layout` keeping ``K`` patches, each rotated by its own position); prefix tokens are not rotated.
    ``num_heads=1`` shares one set of generators by all heads. A subclass implements :meth:`_patch_rotations` (the
    rotations of a grid's patches, ``b x b`` blocks with ``b = self.block_size``) and, when its rotations are not
    blocks, :meth:`_finish`, :meth:`_rotate` and :meth:`rotation_blocks`.
    """

    scalings = LEARNED_SCALINGS  # the adaptations to a new grid it takes (the sweep reads them)

    def __init__(self, head_dim: int, num_heads: int, ndim: int, scaling: str, ref_shape,
                 coordinates: CoordinateSystem):
        super().__init__()
        check_ndim(ndim)
        check_positive_int("head_dim", head_dim)
        check_positive_int("num_heads", num_heads)
        check_choice("scaling", scaling, LEARNED_SCALINGS)
        check_scaling(scaling, coordinates)
        self.head_dim, self.num_heads, self.ndim, self.scaling = head_dim, num_heads, ndim, scaling
        self.coordinates = coordinates
        self.ref_shape = None if ref_shape is None else to_shape("ref_shape", ref_shape, ndim)
        if scaling != "none" and self.ref_shape is None:
            raise ValueError(f"scaling={scaling!r} needs ref_shape, the training grid (e.g. ref_shape=(14, 14))")
        self._cache = TableCache(maxsize=16)

    # -- coordinates ------------------------------------------------------------------------------------------------
    def axis_positions(self, grid: Grid, device, dtype, transform: CoordTransform | None = None) -> list:
        """Coordinates of the grid's patches per grid axis ``[(n_a,)]``: the coordinate system, position
        interpolation to ``ref_shape`` (``scaling="pi"``), then the augmentation draw ``transform``."""
        interpolate = self.scaling == "pi" and not same_shape(grid.shape, self.ref_shape)
        if interpolate and grid.offset is not None:
            raise ValueError(f"grid offset {grid.offset} places a {grid.shape} grid in a longer one, but "
                             f"scaling={self.scaling!r} would rescale it as a whole input against ref_shape="
                             f"{self.ref_shape}; for streaming clips build {type(self).__name__} with scaling='none'")
        axes = self.coordinates.axis_positions(grid.shape, grid.offset, self.ref_shape if interpolate else None,
                                               device, dtype, grid.spacing)
        if transform is not None:
            axes = [transform.on_axis(a, positions) for a, positions in enumerate(axes)]
        return axes

    # -- tables -----------------------------------------------------------------------------------------------------
    def _patch_rotations(self, axis_positions, dtype) -> torch.Tensor:
        """The rotations of the patches at these coordinates ``(heads or 1, N, ...)``, computed in ``dtype``."""
        raise NotImplementedError

    def _finish(self, rows: torch.Tensor, prefix: int) -> torch.Tensor:
        """The table the forward applies: ``prefix`` identity rows before the patches' rotations (default: ``b x b``
        blocks, packed into larger block-diagonal blocks by :func:`~visionpe.rotary.blocks.pack_blocks`)."""
        return pack_blocks(with_identity_prefix(rows, prefix))

    def _rotate(self, tensors, rows: torch.Tensor) -> tuple:
        """Each of ``tensors (B, heads, T, head_dim)`` rotated by ``rows``, the table's rows of its tokens (default:
        block rotations, :func:`~visionpe.rotary.blocks.apply_blocks`)."""
        return tuple(apply_blocks(x, rows) for x in tensors)

    def _device(self):
        return next(self.parameters()).device

    def rotations(self, grid: Grid, device=None, augment: bool = False) -> torch.Tensor:
        """The table of every token's rotation ``(heads or 1, P + N, ...)`` float32, prefix rows the identity;
        ``augment=True`` (:meth:`forward` in training mode) applies a fresh coordinate augmentation draw, uncached."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, type(self).__name__)
        self.check_table(grid, what="rotation table")
        device = device or self._device()
        transform = self.coordinates.draw(augment, self.ndim, device)
        if transform is not None:
            return self._build(grid, device, transform)
        key = (grid, str(device), self.scaling, self.ref_shape)
        return self._cache.get(key, lambda: self._build(grid, device), tuple(self.parameters()))

    def table_bytes(self, grid: Grid) -> int:
        """Rotations as ``b x b`` blocks, packed (:func:`~visionpe.rotary.blocks.pack_blocks`): ``g b`` values per
        channel (2x2 pairs, ``(cos, sin)``, where there are no blocks)."""
        block = getattr(self, "block_size", None)
        return super().table_bytes(grid) * (1 if block is None else packing(self.num_blocks, block) * block)

    def _build(self, grid: Grid, device, transform: CoordTransform | None = None) -> torch.Tensor:
        wide = angle_dtype(device)
        with autocast_off(device):
            axes = self.axis_positions(grid.without_prefix(), device, wide, transform)
            rows = self._patch_rotations(axes, wide).float()
        return self._finish(rows, grid.prefix).contiguous()

    def rotation_blocks(self, grid, device=None) -> torch.Tensor:
        """The patches' rotations as blocks ``(heads or 1, N, num_blocks, b, b)`` (see
        :meth:`RotaryEncoding.rotation_blocks`)."""
        return unpack_blocks(self.rotations(as_grid(grid).without_prefix(), device), self.block_size)

    # -- the forward ------------------------------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, grid: Grid | Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k by one table (in training mode with augmentation set: one fresh draw for both)."""
        layout = as_layout(grid)
        self.check_input("q", q, layout, self.num_heads)
        self.check_input("k", k, layout, self.num_heads)
        rows = layout.rows(self.rotations(layout.grid, q.device, augment=self.training))
        return self._rotate((q, k), rows)

    def rotate(self, x: torch.Tensor, grid: Grid | Layout) -> torch.Tensor:
        """Rotate one tensor ``(B, heads, P + N, head_dim)`` by the grid's rotations (never augmented)."""
        layout = as_layout(grid)
        self.check_input("x", x, layout, self.num_heads)
        return self._rotate((x,), layout.rows(self.rotations(layout.grid, x.device)))[0]

    # -- building for a model and adapting to a grid -----------------------------------------------------------------
    @classmethod
    def model_defaults(cls, context) -> dict:
        """The model's training grid is the reference of position interpolation (used with ``scaling="pi"``)."""
        return {**super().model_defaults(context), "ref_shape": tuple(context.grid_shape)}

    @classmethod
    def for_model(cls, context, **kwargs) -> "LearnedRotation":
        """In a model, index coordinates interpolate to the model's grid by default (``scaling="pi"``, as RoPE's);
        normalised coordinates take none."""
        default_coords = inspect.signature(cls.__init__).parameters["coords"].default
        if kwargs.get("coords", default_coords) == "index":
            kwargs = {"scaling": "pi", **kwargs}
        return super().for_model(context, **kwargs)

    def with_scaling(self, scaling: str, ref_shape=None) -> "LearnedRotation":
        """A copy with the same generators that adapts to other grids by ``scaling`` against ``ref_shape`` (default:
        this module's)."""
        check_choice("scaling", scaling, LEARNED_SCALINGS)
        check_scaling(scaling, self.coordinates)
        ref_shape = self.ref_shape if ref_shape is None else to_shape("ref_shape", ref_shape, self.ndim)
        if scaling != "none" and ref_shape is None:
            raise ValueError(f"scaling={scaling!r} needs ref_shape, the training grid (e.g. ref_shape=(14, 14))")
        other = copy.deepcopy(self)
        other.scaling, other.ref_shape = scaling, ref_shape
        return other

    def adapt(self, shape, new_shape, scaling: str | None = None) -> tuple["LearnedRotation", str]:
        """``scaling=None`` keeps this module's own ``scaling``/``ref_shape``; ``"none"`` or ``"pi"`` choose one,
        with ``ref_shape`` = this module's or else ``shape``."""
        pe = self if scaling is None else self.with_scaling(scaling, self.ref_shape or tuple(shape))
        return pe, "native grid" if tuple(new_shape) == tuple(shape) else pe.adaptation_label()

    def adaptation_label(self) -> str:
        name = type(self).__name__
        if self.coordinates.normalized:
            return f"{name} on {self.coordinates.label()}"
        if self.scaling == "none":
            return f"{name} extrapolated (integer positions)"
        return f"{name} scaling={self.scaling}, ref_shape={'x'.join(map(str, self.ref_shape))}"

    def similarity_label(self, head: int | None = None) -> str:
        return f"rotation kernel tr(Ri^T Rj)/d, {'mean over heads' if head is None else f'head {head}'}"

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        return (f"head_dim={self.head_dim}, num_heads={self.num_heads}, ndim={self.ndim}, scaling={self.scaling!r}, "
                f"ref_shape={self.ref_shape}{', ' + extra if extra else ''}")


class ScriptedBlockRotation(nn.Module):
    """TorchScript form of a learned rotation whose rotations are ``b x b`` blocks (ComRoPE, LieRE):
    ``forward(q, k, shape, prefix)`` rotates ``q, k: (B, heads, P + N, head_dim)`` by the blocks of the input's patch
    grid ``shape``, computed in the graph as :meth:`LearnedRotation.rotations` computes them: the coordinates
    (:func:`~visionpe.coords.patch_positions`, times ``ref / size`` per axis for ``scaling="pi"``) in float64 (float32
    on MPS), the subclass's :meth:`patch_rotations` (from the encoding's parameters, shared), identity prefix rows,
    applied in float32 (:func:`~visionpe.rotary.blocks.multiply_blocks`). Coordinate augmentation has no form here
    (the encodings' :meth:`~visionpe.Encoding.scriptable` refuse it)."""

    def __init__(self, pe: LearnedRotation):
        super().__init__()
        self.coords, self.normalize_coords = pe.coordinates.coords, pe.coordinates.normalize_coords
        self.scaled = pe.scaling == "pi"
        self.ref = list(pe.ref_shape) if self.scaled else [1] * pe.ndim  # grid order

    def axis_positions(self, shape: List[int], dtype: torch.dtype, device: torch.device) -> List[torch.Tensor]:
        """Coordinates per grid axis ``[(n_a,)]`` in ``dtype`` (:meth:`LearnedRotation.axis_positions`)."""
        axes = patch_positions(shape, self.coords, self.normalize_coords, dtype, device)
        if self.scaled:  # interpolated onto the reference grid (a factor 1 on an axis of its size)
            axes = [a * (float(r) / float(s)) for a, r, s in zip(axes, self.ref, shape)]
        return axes

    def patch_rotations(self, axis_positions: List[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The patches' blocks ``(heads or 1, N, num_blocks, b, b)`` in ``dtype`` (the subclass's)."""
        raise NotImplementedError

    def forward(self, q: torch.Tensor, k: torch.Tensor, shape: List[int],
                prefix: int) -> Tuple[torch.Tensor, torch.Tensor]:
        wide = device_angle_dtype(q.device)
        rows = self.patch_rotations(self.axis_positions(shape, wide, q.device), wide).float()
        blocks = with_identity_prefix(rows, prefix)
        return multiply_blocks(q, blocks), multiply_blocks(k, blocks)
