"""ALiBi on nD grids: a per-head linear penalty on the Euclidean distance between patches."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import check_grid_ndim, check_ndim, check_positive_int
from ..cache import TableCache
from ..coords import CoordinateSystem
from ..grid import Grid, as_grid
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
    rescale scale them.

    Call: ``pe(grid) -> (num_heads, P + N, P + N)``.
    """

    def __init__(self, num_heads: int, ndim: int = 2, coords: str = "index", normalize_coords: str = "separate",
                 shift_coords: float | None = None, jitter_coords: float | None = None,
                 rescale_coords: float | None = None, draw_coords: str = "forward"):
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.ndim = check_ndim(ndim)
        self.coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                            draw_coords)
        self.register_derived_buffers()
        # one module serves every block (parameter-free), so its table is kept whatever its size: built once per grid
        self._cache = TableCache(max_bytes=None)

    def derived_buffers(self) -> dict:
        return {"slopes": alibi_slopes(self.num_heads)}

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

    def adaptation_label(self) -> str:
        if self.coordinates.normalized:
            return f"distances in {self.coordinates.label()}"
        return "distances on the new grid (no adaptation)"

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        return f"num_heads={self.num_heads}, ndim={self.ndim}{', ' + extra if extra else ''}"


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
