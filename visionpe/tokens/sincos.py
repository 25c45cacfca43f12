"""Fixed sinusoidal position embeddings for any number of grid axes (ViT / MAE, video MAE-ST style)."""
from __future__ import annotations

import math
from typing import List

import torch

from .._checks import angle_dtype, check_choice, check_divisible, check_grid_ndim, check_ndim, check_number, \
    check_positive_int, device_angle_dtype, to_shape
from .._compat import TorchScriptRefusal
from ..cache import TableCache
from ..coords import CoordinateSystem
from ..grid import Grid, Layout, as_grid, as_layout, index_coords
from ._base import ScriptedTokens, TokenEncoding, check_tokens

LAYOUTS = ("mae", "timm")


def sincos_table(coords: torch.Tensor, dim: int, temperature: float = 10000.0, layout: str = "mae",
                 per_turn: bool = False) -> torch.Tensor:
    """Sinusoidal embedding of ``coords`` ``(N, ndim)`` -> ``(N, dim)``, float32.

    Angles are computed in float64 (on any device but MPS), so the table is exact to float32 rounding on
    long axes too (a float32 angle at position 262 144 is off by up to 1.6e-2 rad).

    Each axis gets ``dim / ndim`` channels ``[sin(c * w), cos(c * w)]`` with
    ``w_i = 1 / temperature ** (i / (dim / (2 * ndim)))``. ``layout`` orders the axes:
    ``"mae"`` puts the last axis first (2D: ``[sin x, cos x, sin y, cos y]``, MAE's
    ``get_2d_sincos_pos_embed``); ``"timm"`` keeps grid order (2D: ``[sin y, cos y, sin x, cos x]``,
    timm's ``build_sincos2d_pos_embed(interleave_sin_cos=True)``).

    ``per_turn=True`` (normalised coordinates) reads ``temperature ** (i / bands)`` as *periods*, DINOv3's
    convention: ``w_i = 2 pi / temperature ** (i / bands)``, one full turn per unit for the first band.
    """
    check_choice("layout", layout, LAYOUTS)
    check_divisible("dim", dim, 2 * coords.shape[-1],
                    f"sincos needs sin and cos channels for each of {coords.shape[-1]} axes")
    return sincos_rows(coords, dim, float(temperature), layout == "mae", per_turn)


def sincos_rows(coords: torch.Tensor, dim: int, temperature: float, last_axis_first: bool,
                per_turn: bool) -> torch.Tensor:
    """:func:`sincos_table` without its checks (``last_axis_first``: ``layout="mae"``), a TorchScript function: the
    scripted models compute the table with it at each input's size."""
    ndim = coords.shape[-1]
    bands = dim // (2 * ndim)
    wide = device_angle_dtype(coords.device)
    omega = torch.pow(temperature, -(torch.arange(bands, dtype=wide, device=coords.device) / bands))
    if per_turn:
        omega = 2 * math.pi * omega
    if last_axis_first:
        coords = coords.flip(-1)
    angles = coords.to(wide)[..., None] * omega  # (N, ndim, bands)
    table = torch.stack([angles.sin(), angles.cos()], dim=-2).float()  # (N, ndim, 2, bands)
    return table.reshape(table.shape[0], -1)


class SinCos(TokenEncoding):
    """Fixed sin-cos position vectors added to the patch tokens; prefix tokens get none.

    Coordinates (:mod:`visionpe.coords`): ``coords="index"`` (default) reads integer patch positions, which
    extrapolate on a larger grid; with ``ref_shape`` the coordinates of any grid are stretched onto the reference
    grid's range instead (interpolation, PI). ``coords="normalized"`` reads DINOv3's centred coordinates in
    ``[-1, 1]`` (``normalize_coords`` ``"separate"``, ``"min"``, ``"max"``), where ``temperature ** (i / bands)``
    are periods in normalised units (``w_i = 2 pi / temperature ** (i / bands)``; a small temperature such as
    DINOv3's 100 suits them); it needs no ``ref_shape``, as every grid already spans ``[-1, 1]``.
    ``shift_coords``, ``jitter_coords``, ``rescale_coords``: timm's train-time coordinate augmentation (training
    mode only; a fresh table each training call, the cache serves evaluation).

    Call: ``pe(x, grid)`` with ``x: (B, P + N, dim)`` -> same shape.
    """

    def __init__(self, dim: int, ndim: int = 2, layout: str = "mae", temperature: float = 10000.0,
                 ref_shape=None, coords: str = "index", normalize_coords: str = "separate",
                 shift_coords: float | None = None, jitter_coords: float | None = None,
                 rescale_coords: float | None = None, draw_coords: str = "forward"):
        super().__init__()
        self.ndim = check_ndim(ndim)
        self.dim = check_positive_int("dim", dim)
        check_choice("layout", layout, LAYOUTS)
        check_divisible("dim", dim, 2 * ndim, f"sincos needs sin and cos channels for each of {ndim} axes")
        check_number("temperature", temperature, minimum=0.0, inclusive=False)
        self.layout, self.temperature = layout, float(temperature)
        self.ref_shape = None if ref_shape is None else to_shape("ref_shape", ref_shape, ndim)
        self.coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                            draw_coords)
        if self.coordinates.normalized and self.ref_shape is not None:
            raise ValueError(f"ref_shape={self.ref_shape} applies to coords='index' (interpolation to a reference "
                             f"grid); coords={self.coordinates.coords!r} maps every grid onto [-1, 1] already: drop "
                             "ref_shape")
        self._cache = TableCache()

    def table(self, grid: Grid, device=None, augment: bool = False) -> torch.Tensor:
        """Position vectors of the patches, ``(N, dim)`` float32, cached per grid and device; ``augment=True``
        (the forward in training mode) applies a fresh coordinate augmentation draw, uncached, if one is set."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "sincos")
        transform = self.coordinates.draw(augment, self.ndim, device)
        if transform is not None:
            return self._build(grid, device, transform)
        return self._cache.get((grid.without_prefix(), str(device)), lambda: self._build(grid, device))

    def _build(self, grid: Grid, device, transform=None) -> torch.Tensor:
        coords = self.coordinates.positions(grid, device, angle_dtype(device), ref_shape=self.ref_shape)
        if transform is not None:
            coords = transform(coords)
        return sincos_table(coords, self.dim, self.temperature, self.layout, per_turn=self.coordinates.normalized)

    def forward(self, x: torch.Tensor, grid: Grid | Layout) -> torch.Tensor:
        layout = as_layout(grid)
        check_grid_ndim(layout.grid, self.ndim, "sincos")
        check_tokens(x, layout, self.dim)
        return self.add_to_patches(x, self.table(layout.grid, x.device, augment=self.training), layout)

    def position_vectors(self, grid) -> torch.Tensor:
        grid = as_grid(grid)
        return self.table(grid.without_prefix()).float().cpu()

    def scriptable(self) -> "ScriptedSinCos":
        """The TorchScript form (:class:`ScriptedSinCos`): index coordinates without ``ref_shape``; other settings are
        a ``NotImplementedError`` naming them."""
        self.check_scriptable_class(SinCos)
        self.check_scriptable_coordinates()
        if self.ref_shape is not None:
            raise TorchScriptRefusal(f"SinCos with ref_shape={self.ref_shape}",
                                      "its TorchScript form reads integer patch positions (no ref_shape)")
        return ScriptedSinCos(self)

    def adaptation_label(self) -> str:
        if self.coordinates.normalized:
            return f"recomputed on {self.coordinates.label()}"
        return "recomputed" if self.ref_shape is None else "coordinates stretched to ref_shape"

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        return (f"dim={self.dim}, ndim={self.ndim}, layout={self.layout!r}, temperature={self.temperature}"
                f"{', ' + extra if extra else ''}")


class ScriptedSinCos(ScriptedTokens):
    """TorchScript form of :class:`SinCos` (index coordinates): the table of the input's patch grid computed in the
    graph (:func:`sincos_rows` of :func:`~visionpe.grid.index_coords`)."""

    def __init__(self, pe: SinCos):
        super().__init__()
        self.dim, self.temperature, self.last_axis_first = pe.dim, pe.temperature, pe.layout == "mae"

    def patch_table(self, shape: List[int], device: torch.device) -> torch.Tensor:
        wide = device_angle_dtype(device)
        return sincos_rows(index_coords(shape, wide, device), self.dim, self.temperature, self.last_axis_first,
                           False)
