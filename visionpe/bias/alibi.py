"""ALiBi on nD grids: a per-head linear penalty on the Euclidean distance between patches."""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_grid_ndim, check_ndim, check_number, check_positive_int
from ..cache import TableCache
from ..coords import CoordinateSystem
from ..grid import Grid, as_grid, index_coords
from ..encoding import Knob
from ._base import BiasEncoding, PairScore


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """``2 ** (-8 h / num_heads)`` for ``h = 1..num_heads`` (Press et al. 2022), float32 ``(num_heads,)``."""
    return 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float32) / num_heads)


class ALiBi(BiasEncoding):
    """ALiBi (Press et al. 2022) on a grid, 2D as in CROMA: ``bias[h, i, j] = -slope_h * ||c_i - c_j||_2``.

    No parameters; defined for any grid, so a resolution change needs no adaptation. Prefix rows and columns are
    zero. A grid's ``offset`` cancels in distances and is not read (exact at any offset); its ``spacing`` is. One
    table is cached per shape, prefix, spacing and device.

    Coordinates (:mod:`visionpe.coords`): ``coords="index"`` (default) measures distances in patches, which grow
    with the grid; ``"normalized"`` in DINOv3's centred coordinates (``normalize_coords`` ``"separate"``: each axis
    spans ``[-1, 1]``, so a distance of 1 is half the grid's extent on every grid; ``"min"``/``"max"``: half the
    shortest/longest side, keeping distances isotropic). ``shift_coords``, ``jitter_coords``, ``rescale_coords``:
    timm's train-time augmentation (training mode only, uncached); a shift cancels in distances, jitter and
    rescale scale them. ``slope_scale``: a factor on every slope (1: Press et al.'s), the knob tuned per test size
    (:attr:`knob`; LookHere's protocol tunes it on held-out images, 1.0 -> 1.6 at 1024 px from 224).

    Call: ``pe(grid) -> (num_heads, P + N, P + N)``.
    """

    knob = Knob("slope_scale", (0.5, 0.75, 1.0, 1.25, 1.6, 2.0, 2.5), relative=True)

    def __init__(self, num_heads: int, ndim: int = 2, coords: str = "index", normalize_coords: str = "separate",
                 shift_coords: float | None = None, jitter_coords: float | None = None,
                 rescale_coords: float | None = None, draw_coords: str = "forward", slope_scale: float = 1.0):
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.ndim = check_ndim(ndim)
        self.slope_scale = check_number("slope_scale", slope_scale, minimum=0.0)
        self.coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                            draw_coords)
        self.register_derived_buffers()
        # one module serves every block (parameter-free), so its table is kept whatever its size: built once per grid
        self._cache = TableCache(max_bytes=None)

    def derived_buffers(self) -> dict:
        return {"slopes": alibi_slopes(self.num_heads) * self.slope_scale}

    def forward(self, grid: Grid) -> torch.Tensor:
        grid = unshifted(grid, self.ndim)
        device = self.slopes.device
        transform = self.coordinates.draw(self.training, self.ndim, device)
        if transform is not None:
            return self._build(grid, device, transform)
        return self._cache.get((grid, str(device)), lambda: self._build(grid, device))

    def _positions(self, grid: Grid, device, transform=None) -> torch.Tensor:
        coords = self.coordinates.positions(grid, device)
        return coords if transform is None else transform(coords)

    def _build(self, grid: Grid, device, transform=None) -> torch.Tensor:
        coords = self._positions(grid, device, transform)
        distance = (coords[:, None] - coords[None]).norm(dim=-1)  # (N, N), exact 0 on the diagonal
        return self.pad_prefix(-self.slopes[:, None, None] * distance, grid)

    def score_mod(self, grid: Grid) -> PairScore:
        """The distance computed per token pair from the patch coordinates (one augmentation draw per call, as
        ``forward``); prefix pairs read zero."""
        grid = unshifted(grid, self.ndim)
        device = self.slopes.device
        coords = self._positions(grid, device, self.coordinates.draw(self.training, self.ndim, device))
        positions = F.pad(coords, (0, 0, grid.prefix, 0))  # (P + N, ndim), prefix rows unused
        return PairScore(_alibi_bias, (positions, self.slopes), self.num_heads,
                         {"prefix": grid.prefix, "ndim": self.ndim})

    def scriptable(self) -> "ScriptedALiBi":
        """The TorchScript form (:class:`ScriptedALiBi`): index coordinates, no coordinate augmentation."""
        self.check_scriptable_class(ALiBi)
        self.check_scriptable_coordinates()
        return ScriptedALiBi(self)

    def adaptation_label(self) -> str:
        if self.coordinates.normalized:
            return f"distances in {self.coordinates.label()}"
        return "distances on the new grid (no adaptation)"

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        scale = f", slope_scale={self.slope_scale:g}" if self.slope_scale != 1 else ""
        return f"num_heads={self.num_heads}, ndim={self.ndim}{scale}{', ' + extra if extra else ''}"


class ScriptedALiBi(nn.Module):
    """TorchScript form of :class:`ALiBi` (index coordinates): ``forward(shape, prefix) -> (heads, P + N, P + N)``,
    ``-slope_h`` times the distances of the input's patch grid computed in the graph, zero prefix rows and columns."""

    def __init__(self, pe: ALiBi):
        super().__init__()
        self.register_buffer("slopes", pe.slopes, persistent=False)  # (heads,), the encoding's

    def forward(self, shape: List[int], prefix: int) -> torch.Tensor:
        coords = index_coords(shape, torch.float32, self.slopes.device)
        distance = (coords[:, None] - coords[None]).norm(p=2, dim=-1)  # (N, N)
        return F.pad(-self.slopes[:, None, None] * distance, [prefix, 0, prefix, 0])


def unshifted(grid, ndim: int) -> Grid:
    """``grid`` (checked: ``ndim`` axes) without its offset: distances do not change with a shift, and measured from
    the first patch they stay exact in float32 at any offset (``offset + index`` is not, past 2^24)."""
    grid = as_grid(grid)
    check_grid_ndim(grid, ndim, "alibi")
    return Grid(grid.shape, grid.prefix, None, grid.spacing)


def _alibi_bias(tables, head, q, k, prefix: int, ndim: int):
    """The :meth:`ALiBi.score_mod` function: ``-slope_head * ||c_q - c_k||``, zero for prefix pairs."""
    positions, slopes = tables
    squared = sum((positions[q, a] - positions[k, a]) ** 2 for a in range(ndim))
    bias = -slopes[head] * squared.sqrt()
    return torch.where((q < prefix) | (k < prefix), 0.0, bias) if prefix else bias
