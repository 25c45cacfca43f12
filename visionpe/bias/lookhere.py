"""LookHere (Fuller et al., NeurIPS 2024, "LookHere: Vision Transformers with Directed Attention Generalize and
Extrapolate"; official code ``GreenCUBIC/lookhere``): each head sees a 2D field of view with a distance penalty.

Head ``h`` of query ``q`` sees key ``k`` iff the offset ``d = c_k - c_q`` (``dx`` along the columns, ``dy`` along the
rows, rows growing downwards as in the image) satisfies ``n . d >= 0`` for each of the head's normals ``n``; what it
sees gets ``-slope_h * global_slope * dist(q, k)``, what it does not ``-inf``. The query itself is always seen
(``d = 0``), so no row is empty. Prefix tokens see every patch and are seen by all, with zero bias (the official
model's zero class-token row and column).

Directions, slopes and distances follow the official ``create_lh_bias_tensor`` (read, not copied):

- ``head_directions`` is a direction set of the official shorthand naming four heads, e.g. ``"halves"`` (look up,
  down, left, right: 180 degrees each), ``"corners"`` (the four quadrants: 90), ``"triangles"`` (the 90-degree
  cones around up, down, left, right), ``"diagonals"`` (the four diagonal half-planes: 180),
  ``"eighths1"``/``"eighths2"`` (45-degree wedges), ``"none"`` (no mask, distance only), ``"zero"`` (no bias at
  all), ``"center"`` (distance of the key from the grid centre), ``"none1zero3"``, ``"none2zero2"``,
  ``"none3zero1"``, ``"zerohalves"``, ``"zerocorners"``, ``"zerotriangles"`` (masks without distance).
  ``"halves-diagonals"`` joins sets; each set is one block of 4 heads, blocks shared out in order
  (``ceil(heads / 4)`` blocks, spread evenly over the sets, the first sets taking the extra ones; a last partial
  block takes the first heads of its set), so 6 heads with ``"halves-none"`` are up, down, left, right, none, none
  as in the official code;
- boundaries belong to the view (a "right" head sees its own column; a cone its diagonals);
- slopes per run of heads of one set: a directional run of ``n`` heads has ``2^-(1 + j // 4)`` for its ``j``-th
  head (official ``np.repeat(exp2(-arange(1, n / 4 + 1)), 4)``); a run of ``none``/``zero``/``center`` heads has
  ``[1/4, 1/16, 1/64, 1/256]`` (``n <= 4``: the first ``n``; more: each repeated ``n / 4`` times, official
  ``get_none_slopes``). The official code covers runs of multiples of 4 (and a run of 2 of the no-mask kinds);
  other head counts are this generalisation;
- ``distance``: ``"linear"`` (Euclidean, default), ``"sqrt"`` or ``"square"`` of it, in the coordinates of
  ``coords`` (patches by default); ``center`` heads use the plain distance to the centre ``((W-1)/2, (H-1)/2)``
  whatever ``distance`` says, as the official code does.

Not reproduced: the official per-layer factor ``linspace(layer_slopes[0], layer_slopes[1], depth)`` (a model here
shares one parameter-free bias module across blocks); ``global_slope`` scales every head. Masked logits are
``-inf`` where the official code writes ``-max(bfloat16)``: both give attention weight 0.
"""
from __future__ import annotations

import itertools
import math
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_choice, check_grid_ndim, check_number, check_positive_int
from ..cache import TableCache
from ..encoding import Knob
from ..coords import CoordinateSystem
from ..grid import Grid, as_grid, index_coords
from ._base import BiasEncoding, PairScore

# visible iff n . (dx, dy) >= 0 for every normal n of a primitive (dx: key column - query column, dy: rows, down)
PRIMITIVES = {
    "up": ((0, -1),), "down": ((0, 1),), "left": ((-1, 0),), "right": ((1, 0),),
    "tri_up": ((1, -1), (-1, -1)), "tri_down": ((-1, 1), (1, 1)),
    "tri_left": ((-1, 1), (-1, -1)), "tri_right": ((1, -1), (1, 1)),
    "diag_up_right": ((1, -1),), "diag_up_left": ((-1, -1),),
    "diag_down_right": ((1, 1),), "diag_down_left": ((-1, 1),),
}
_HALVES = [("up",), ("down",), ("left",), ("right",)]
_CORNERS = [("up", "left"), ("up", "right"), ("down", "left"), ("down", "right")]
_TRIANGLES = [("tri_up",), ("tri_down",), ("tri_left",), ("tri_right",)]
# the official shorthand: four heads each, a head being its primitives plus "zero" (no distance) or "center"
DIRECTION_SETS = {
    "none": [()] * 4,
    "zero": [("zero",)] * 4,
    "none1zero3": [()] + [("zero",)] * 3,
    "none2zero2": [()] * 2 + [("zero",)] * 2,
    "none3zero1": [()] * 3 + [("zero",)],
    "center": [("center",)] * 4,
    "halves": _HALVES,
    "corners": _CORNERS,
    "triangles": _TRIANGLES,
    "diagonals": [("diag_up_right",), ("diag_up_left",), ("diag_down_right",), ("diag_down_left",)],
    "eighths1": [("tri_up", "left"), ("tri_down", "left"), ("tri_left", "up"), ("tri_right", "up")],
    "eighths2": [("tri_up", "right"), ("tri_down", "right"), ("tri_left", "down"), ("tri_right", "down")],
    "zerohalves": [("zero",) + h for h in _HALVES],
    "zerocorners": [("zero",) + c for c in _CORNERS],
    "zerotriangles": [("zero",) + t for t in _TRIANGLES],
}
DISTANCES = ("linear", "sqrt", "square")
POWERS = {"linear": 1.0, "sqrt": 0.5, "square": 2.0}  # each distance's power of the Euclidean distance
NONE_SLOPES = (0.25, 0.0625, 0.015625, 0.00390625)


def assign_directions(head_directions: str, num_heads: int) -> tuple[list[str], list[tuple[str, ...]]]:
    """The set name and the direction entries of every head of ``head_directions`` (``"halves-diagonals"``)."""
    if not isinstance(head_directions, str) or not head_directions:
        raise ValueError(f"head_directions={head_directions!r} must be a direction set name or names joined by '-', "
                         f"from: {', '.join(DIRECTION_SETS)}")
    names = head_directions.split("-")
    for name in names:
        check_choice("head_directions", name, DIRECTION_SETS)
    blocks = math.ceil(num_heads / 4)
    if len(names) > blocks:
        raise ValueError(f"head_directions={head_directions!r} names {len(names)} sets of 4 heads but "
                         f"num_heads={num_heads} has {blocks} block(s) of 4")
    share, extra = divmod(blocks, len(names))
    set_names, entries = [], []
    for g, name in enumerate(names):
        for _ in range(share + (g < extra)):
            set_names += [name] * 4
            entries += DIRECTION_SETS[name]
    return set_names[:num_heads], entries[:num_heads]


def head_slopes(set_names: list[str]) -> list[float]:
    """Official slopes per run of consecutive heads of one set (see the module docstring)."""
    slopes = []
    for name, run in itertools.groupby(set_names):
        n = len(list(run))
        if any(kind in name for kind in ("zero", "center", "none")):
            slopes += list(NONE_SLOPES[:n]) if n <= 4 else [NONE_SLOPES[j * 4 // n] for j in range(n)]
        else:
            slopes += [2.0 ** -(1 + j // 4) for j in range(n)]
    return slopes


def fields_of_view(shape: List[int], normals: torch.Tensor) -> torch.Tensor:
    """``(heads, N, N)`` bool, True where head ``h``'s query (row) sees the key (column) of a 2D grid ``shape``: every
    normal ``n = normals[h, j]`` (``(heads, width, 2)`` long ``(nx, ny)``; ``(0, 0)`` pads, seeing everything) has
    ``n . (dx, dy) >= 0``, ``d = c_key - c_query`` on the patch lattice (a TorchScript function, as
    :func:`lookhere_penalty`)."""
    lattice = index_coords(shape, torch.long, normals.device)  # (N, 2) rows, columns
    dy, dx = lattice[None, :, 0] - lattice[:, None, 0], lattice[None, :, 1] - lattice[:, None, 1]  # (N, N)
    masks: List[torch.Tensor] = []
    for h in range(normals.shape[0]):
        mask = torch.ones_like(dx, dtype=torch.bool)
        for j in range(normals.shape[1]):
            mask = mask & (normals[h, j, 0] * dx + normals[h, j, 1] * dy >= 0)
        masks.append(mask)
    return torch.stack(masks)


def lookhere_penalty(coords: torch.Tensor, kinds: torch.Tensor, slopes: torch.Tensor, power: float) -> torch.Tensor:
    """``-slopes[h]`` times each head's value on the patches at ``coords`` ``(N, 2)``: ``(heads, N, N)``; the value
    is the pairwise distance to the power ``power`` (``kinds[h] == 0``), none (1: ``zero`` heads), or the key's
    plain distance from the grid centre (2: ``center`` heads, as the official code)."""
    distance = (coords[:, None] - coords[None]).norm(p=2, dim=-1)  # (N, N), exact 0 on the diagonal
    from_centre = (coords - coords.mean(0)).norm(p=2, dim=-1)  # (N,): the grid centre is the mean position
    if power != 1.0:  # the official code powers pairwise distances only, not those to the centre
        distance = distance ** power
    kind = kinds[:, None, None]
    value = torch.where(kind == 0, distance, torch.where(kind == 2, from_centre.expand_as(distance), 0.0))
    return -slopes[:, None, None] * value


class LookHere(BiasEncoding):
    """LookHere directional masks and distance penalties: ``pe(grid) -> (num_heads, P + N, P + N)``.

    Args:
        num_heads: heads of the attention.
        ndim: must be 2 (LookHere's fields of view are directions in the image plane).
        head_directions: a direction set of the official shorthand or several joined by ``-`` (module docstring;
            the official config's ``head_directions``); default ``"halves"``.
        global_slope: factor on every head's slope (the official ``global_slope``).
        distance: ``"linear"``, ``"sqrt"``, ``"square"`` of the Euclidean distance.
        coords, normalize_coords, shift_coords, jitter_coords, rescale_coords: the coordinates distances are measured
            in (:mod:`visionpe.coords`); augmentation (training mode only) scales the distances, while the fields of
            view stay those of the patch lattice.

    Parameter-free: one module serves every block; masks are cached per grid shape, the bias per grid (a
    resolution change needs no adaptation: masks and distances are defined on any grid). The bias is a function of
    ``(head, query coordinates, key coordinates)`` and the small tables ``normals``/``slopes``.
    """

    knob = Knob("global_slope", (0.5, 0.75, 1.0, 1.25, 1.6, 2.0, 2.5), relative=True)  # tuned per test size
    masks_pairs = True  # keys outside a head's field of view get -inf (pictures: NaN, drawn blank)

    ndims = (2,)

    def __init__(self, num_heads: int, ndim: int = 2, head_directions: str = "halves", global_slope: float = 1.0,
                 distance: str = "linear", coords: str = "index", normalize_coords: str = "separate",
                 shift_coords: float | None = None, jitter_coords: float | None = None,
                 rescale_coords: float | None = None, draw_coords: str = "forward"):
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        if ndim != 2:
            raise ValueError(f"lookhere is defined on 2D grids (fields of view in the image plane): ndim must be 2, "
                             f"got ndim={ndim!r}")
        self.ndim = ndim
        check_choice("distance", distance, DISTANCES)
        self.head_directions, self.distance = head_directions, distance
        self.global_slope = check_number("global_slope", global_slope, minimum=0.0)
        entries = assign_directions(head_directions, num_heads)[1]
        self.head_entries = tuple(entries)
        self.coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                            draw_coords)
        self.register_derived_buffers()
        self._masks = TableCache(max_bytes=None)  # shared by every block: one table per grid shape in all
        self._cache = TableCache(max_bytes=None)

    def derived_buffers(self) -> dict:
        """The official slope of every head."""
        set_names = assign_directions(self.head_directions, self.num_heads)[0]
        return {"slopes": torch.tensor(head_slopes(set_names), dtype=torch.float32)}

    def normals(self, head: int) -> list[tuple[int, int]]:
        """The normals ``(nx, ny)`` of a head's field of view (empty: it sees everything)."""
        return [n for entry in self.head_entries[head] if entry in PRIMITIVES for n in PRIMITIVES[entry]]

    def head_tables(self, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's kind ``(heads,)`` long (0: distance, 1: ``zero``, 2: ``center``) and normals ``(heads, width,
        2)`` long, padded with ``(0, 0)`` (sees everything)."""
        kinds = torch.tensor([1 if "zero" in e else 2 if "center" in e else 0 for e in self.head_entries])
        per_head = [self.normals(h) for h in range(self.num_heads)]
        width = max(1, max(len(n) for n in per_head))
        normals = torch.tensor([n + [(0, 0)] * (width - len(n)) for n in per_head], dtype=torch.long)
        return kinds.to(device), normals.to(device)  # built on the host, one copy each

    def masks(self, shape, device=None) -> torch.Tensor:
        """``(heads, N, N)`` bool, True where head ``h``'s query (row) sees the key (column); cached per shape."""
        return self._masks.get((tuple(shape), str(device)),
                               lambda: fields_of_view(list(shape), self.head_tables(device)[1]))

    def forward(self, grid: Grid) -> torch.Tensor:
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "lookhere")
        device = self.slopes.device
        transform = self.coordinates.draw(self.training, self.ndim, device)
        if transform is not None:
            return self._build(grid, device, transform)
        return self._cache.get((grid, str(device)), lambda: self._build(grid, device))

    def score_mod(self, grid: Grid) -> PairScore:
        """The bias per token pair (equal to ``self(grid)``; one augmentation draw per call, as ``forward``): the
        fields of view from each head's normals on the patch lattice, the penalty from the coordinates; prefix pairs
        read zero."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "lookhere")
        device = self.slopes.device
        coords = self.coordinates.positions(grid, device)
        transform = self.coordinates.draw(self.training, self.ndim, device)
        if transform is not None:
            coords = transform(coords)
        lattice = torch.stack(torch.meshgrid(*(torch.arange(s, device=device) for s in grid.shape), indexing="ij"),
                              dim=-1).reshape(-1, 2)  # (N, 2) rows, columns
        from_centre = (coords - coords.mean(0)).norm(dim=-1)
        pad = (0, 0, grid.prefix, 0)
        kinds, normals = self.head_tables(device)
        tables = (F.pad(coords, pad), F.pad(lattice, pad), F.pad(from_centre, pad[2:]), kinds, normals,
                  self.global_slope * self.slopes)
        return PairScore(_lookhere_bias, tables, self.num_heads,
                         {"prefix": grid.prefix, "width": normals.shape[1], "power": POWERS[self.distance]})

    def _build(self, grid: Grid, device, transform=None) -> torch.Tensor:
        coords = self.coordinates.positions(grid, device)
        if transform is not None:
            coords = transform(coords)
        penalty = lookhere_penalty(coords, self.head_tables(device)[0], self.global_slope * self.slopes,
                                   POWERS[self.distance])
        bias = penalty.masked_fill(~self.masks(grid.shape, device), float("-inf"))
        return self.pad_prefix(bias, grid)

    @torch.no_grad()
    def pair_map(self, grid) -> torch.Tensor:
        """The bias on the grid's patches, ``(heads, N, N)``, keys outside a head's field of view NaN (drawn
        blank)."""
        bias = super().pair_map(grid)
        return bias.masked_fill(torch.isneginf(bias), float("nan"))

    def similarity_label(self, head: int | None = None) -> str:
        return f"attention bias, {'mean over the heads that see the key' if head is None else f'head {head}'}"

    def similarity_note(self) -> str:
        return "bias row of each query; blank: outside the field of view"

    def adaptation_label(self) -> str:
        return "fields of view and distances on the new grid (no adaptation)"

    def scriptable(self) -> "ScriptedLookHere":
        """The TorchScript form (:class:`ScriptedLookHere`): index coordinates, no coordinate augmentation."""
        self.check_scriptable_class(LookHere)
        self.check_scriptable_coordinates()
        return ScriptedLookHere(self)

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        return (f"num_heads={self.num_heads}, head_directions={self.head_directions!r}, "
                f"global_slope={self.global_slope}, distance={self.distance!r}{', ' + extra if extra else ''}")


class ScriptedLookHere(nn.Module):
    """TorchScript form of :class:`LookHere` (index coordinates): ``forward(shape, prefix) -> (heads, P + N, P +
    N)`` float32, each head's penalty (:func:`lookhere_penalty`) on the input's patch grid with ``-inf`` outside its
    field of view (:func:`fields_of_view`), computed in the graph; zero prefix rows and columns."""

    def __init__(self, pe: LookHere):
        super().__init__()
        kinds, normals = pe.head_tables(pe.slopes.device)
        self.register_buffer("slopes", pe.slopes, persistent=False)  # (heads,), the encoding's
        self.register_buffer("kinds", kinds, persistent=False)
        self.register_buffer("normals", normals, persistent=False)
        self.global_slope, self.power = float(pe.global_slope), POWERS[pe.distance]

    def forward(self, shape: List[int], prefix: int) -> torch.Tensor:
        coords = index_coords(shape, torch.float32, self.slopes.device)
        penalty = lookhere_penalty(coords, self.kinds, self.global_slope * self.slopes, self.power)
        bias = penalty.masked_fill(~fields_of_view(shape, self.normals), float("-inf"))
        return F.pad(bias, [prefix, 0, prefix, 0])


def _lookhere_bias(tables, head, q, k, prefix: int, width: int, power: float):
    """The :meth:`LookHere.score_mod` function: ``-slope_head * distance`` where head ``head`` of query ``q`` sees
    key ``k`` (every ``n . (c_k - c_q) >= 0``), ``-inf`` elsewhere, zero for prefix pairs."""
    positions, lattice, from_centre, kinds, normals, slopes = tables
    squared = (positions[q, 0] - positions[k, 0]) ** 2 + (positions[q, 1] - positions[k, 1]) ** 2
    distance = squared if power == 2.0 else squared.sqrt() if power == 1.0 else squared.sqrt() ** power
    kind = kinds[head]
    value = torch.where(kind == 0, distance, torch.where(kind == 2, from_centre[k], 0.0))
    dy, dx = lattice[k, 0] - lattice[q, 0], lattice[k, 1] - lattice[q, 1]
    sees = (normals[head, 0, 0] * dx + normals[head, 0, 1] * dy) >= 0
    for j in range(1, width):
        sees = sees & ((normals[head, j, 0] * dx + normals[head, j, 1] * dy) >= 0)
    bias = torch.where(sees, -slopes[head] * value, float("-inf"))
    return torch.where((q < prefix) | (k < prefix), 0.0, bias) if prefix else bias
