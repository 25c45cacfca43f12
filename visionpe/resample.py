"""Axis-generic resampling of tables laid out on a grid (learned position tables, relative-bias tables): the one
module that reads a grid table at other positions, in two ways.

- :func:`resample_grid` resizes a table to a new grid (``F.interpolate`` semantics, antialiasing when it shrinks):
  timm's ``resample_abs_pos_embed``.
- :func:`sample_grid` reads a table at fractional per-axis positions (``F.grid_sample`` semantics), differentiable
  in the table: a learned table read at normalised or augmented coordinates.

One code path for 1D, 2D and 3D: the table is resampled one axis at a time with a 1-pixel-high
``F.interpolate`` call, or multiplied by a per-axis interpolation matrix. Bicubic, bilinear and area kernels are
separable, so on a 2D table this equals
``F.interpolate(mode="bicubic")`` over both axes (timm's ``resample_abs_pos_embed``) to float rounding,
and it gives true bicubic resampling in 3D, where ``F.interpolate`` has no bicubic mode.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from ._checks import check_choice
from ._compat import same_shape
from .cache import TableCache

INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "area")  # resample_grid
TABLE_RESIZES = INTERPOLATIONS + ("geometric",)  # a relative table's: torch's, or BEiT's geometric offsets
SAMPLING = ("bicubic", "bilinear", "nearest")  # sample_grid


def resample_axis(table: torch.Tensor, axis: int, size: int, interpolation: str = "bicubic",
                  antialias: bool = True, align_corners: bool = False) -> torch.Tensor:
    """Resample ``table`` (any shape) along ``axis`` to ``size`` samples; computed in float32.

    ``align_corners`` (bicubic and bilinear, as ``F.interpolate``): ``False`` reads output ``j`` of ``n`` at source
    position ``(j + 0.5) m / n - 0.5`` (half-pixel centres, timm's and PyTorch's default); ``True`` at ``j (m - 1) /
    (n - 1)``, the end samples on the end samples (Qwen3-VL's learned grid)."""
    check_choice("interpolation", interpolation, INTERPOLATIONS)
    if same_shape((table.shape[axis],), (size,)):
        return table
    return interpolate_axis(table, axis, size, interpolation, antialias, align_corners)


def interpolate_axis(table: torch.Tensor, axis: int, size: int, interpolation: str, antialias: bool,
                     align_corners: bool) -> torch.Tensor:
    """:func:`resample_axis` without its checks: ``F.interpolate`` of ``table`` along ``axis`` to ``size``, in float32
    (a TorchScript function: the scripted models resample their tables with it at each input's size)."""
    moved = table.movedim(axis, -1)
    lead = list(moved.shape[:-1])
    flat = moved.float().reshape(-1, 1, 1, moved.shape[-1])
    corners: Optional[bool] = None
    if interpolation in ("bicubic", "bilinear"):
        corners = align_corners
    else:
        antialias = False
    out = F.interpolate(flat, size=[1, size], mode=interpolation, align_corners=corners, antialias=antialias)
    return out.reshape(lead + [size]).movedim(-1, axis).to(table.dtype)


def resample_grid(table: torch.Tensor, new_shape, interpolation: str = "bicubic",
                  antialias: bool = True, align_corners: bool = False) -> torch.Tensor:
    """Resample a grid table ``(*old_shape, C)`` to ``(*new_shape, C)``, one spatial axis at a time
    (``align_corners``: see :func:`resample_axis`)."""
    new_shape = tuple(new_shape)
    if table.ndim != len(new_shape) + 1:
        raise ValueError(f"table of shape {tuple(table.shape)} cannot be resampled to {new_shape}")
    for axis, size in enumerate(new_shape):
        table = resample_axis(table, axis, size, interpolation, antialias, align_corners)
    return table


def _cubic_weights(t: torch.Tensor, a: float = -0.75) -> torch.Tensor:
    """Keys' cubic convolution weights of the taps at ``-1, 0, 1, 2`` for fractions ``t: (n,)`` -> ``(n, 4)`` (the
    kernel of ``F.interpolate`` and ``F.grid_sample`` bicubic, ``a = -0.75``)."""
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return torch.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], dim=-1)


def axis_weights(positions: torch.Tensor, size: int, interpolation: str = "bicubic") -> torch.Tensor:
    """Interpolation matrix ``(n, size)`` reading a length-``size`` axis at fractional indices ``positions: (n,)``.

    Border handling is ``F.grid_sample``'s ``padding_mode="border"``: bilinear and nearest clamp the position to
    ``[0, size - 1]``, bicubic clamps each of its four taps, so positions outside the table read its edge.
    """
    check_choice("interpolation", interpolation, SAMPLING)
    n = positions.shape[0]
    weights = torch.zeros(n, size, dtype=positions.dtype, device=positions.device)
    rows = torch.arange(n, device=positions.device)
    if interpolation == "nearest":
        weights[rows, positions.clamp(0, size - 1).round().long()] = 1.0  # round half to even, as grid_sample
        return weights
    if interpolation == "bilinear":
        p = positions.clamp(0, size - 1)
        low = p.floor().clamp(max=max(size - 2, 0))
        t = p - low
        low = low.long()
        weights.index_put_((rows, low), 1 - t, accumulate=True)
        weights.index_put_((rows, (low + 1).clamp(max=size - 1)), t, accumulate=True)
        return weights
    low = positions.floor()
    taps = _cubic_weights(positions - low)  # (n, 4)
    for k in range(4):
        weights.index_put_((rows, (low.long() + k - 1).clamp(0, size - 1)), taps[:, k], accumulate=True)
    return weights


def sample_grid(table: torch.Tensor, positions, interpolation: str = "bicubic") -> torch.Tensor:
    """Sample a grid table ``(S_0, ..., S_{k-1}, C)`` at the tensor product of per-axis fractional indices
    ``positions[a]: (n_a,)`` -> ``(n_0, ..., n_{k-1}, C)``, differentiable in ``table``.

    Equals ``F.grid_sample(..., align_corners=False, padding_mode="border")`` at the normalised points
    ``u_a = 2 (p_a + 0.5) / S_a - 1`` (its bilinear and bicubic kernels are separable), in 1D, 2D and 3D alike,
    bicubic in 3D included (``grid_sample`` has none); weights are computed in the positions' dtype.
    """
    for axis, p in enumerate(positions):
        weights = axis_weights(p, table.shape[axis], interpolation).to(table.dtype)
        table = torch.tensordot(weights, table.movedim(axis, 0), dims=1).movedim(0, axis)
    return table


# -- BEiT's geometric resize of a relative position table (timm resize_rel_pos_bias_table) -------------------------
GEOMETRIC_RATIO = (1.01, 1.5)  # the ratios the source spacing may take (BEiT's search interval)
RATIO_POINTS, RATIO_ROUNDS = 256, 7  # the ratio's search: 256 intervals a round, 7 rounds narrow [1.01, 1.5] to
# 0.49 / 256^7 = 7e-18, below float64's spacing there
GEOMETRIC_WEIGHTS = TableCache(maxsize=32, max_bytes=None)  # per (source, new) shape, shared by every table


def resample_offsets_geometric(table: torch.Tensor, new_shape) -> torch.Tensor:
    """A relative offset table ``(2 w_1 - 1, ..., 2 w_n - 1, C)`` resized to ``new_shape`` (offsets per axis, odd)
    as BEiT and timm's Swin ``set_window_size`` do: the source offsets spread geometrically over the new range
    (:func:`geometric_offsets`), values interpolated linearly per axis at the new integer offsets, computed in
    float32 (as timm) and returned in the table's dtype. ``new_shape`` may hold symbolic sizes (``torch.export``
    with a dynamic height and width): the weights (:func:`geometric_weights`) are then computed in the graph."""
    source = tuple(table.shape[:-1])
    if same_shape(source, new_shape):
        return table
    key = (source, tuple(new_shape))
    return apply_axis_weights(table, GEOMETRIC_WEIGHTS.get(key, lambda: geometric_weights(source, new_shape)))


def apply_axis_weights(table: torch.Tensor, weights: List[torch.Tensor]) -> torch.Tensor:
    """``table`` ``(s_1, ..., s_n, C)`` multiplied along each axis ``a`` by ``weights[a]`` ``(new_a, s_a)``, in
    float32, returned in the table's dtype (a TorchScript function, as :func:`geometric_weights`: the scripted
    models resize their tables with them at each input's size)."""
    out = table.float()
    for axis, w in enumerate(weights):
        out = torch.movedim(torch.tensordot(w.to(out.device), out, dims=([1], [axis])), 0, axis)
    return out.to(table.dtype)


def geometric_weights(source: List[int], new_shape: List[int]) -> List[torch.Tensor]:
    """Per axis, the ``(new_a, source_a)`` float32 matrix that resizes a relative offset table of ``source`` offsets
    per axis to ``new_shape`` (:func:`resample_offsets_geometric`): linear interpolation at the new integer offsets
    of the source offsets spread geometrically (:func:`geometric_offsets`); every axis is resampled when any changes
    (an unchanged one spread at ``r = 1.01``, as timm's), and the identity on every axis when none does. Computed
    from tensors only, so symbolic sizes in ``new_shape`` stay free in a traced graph."""
    resized: List[torch.Tensor] = []
    identities: List[torch.Tensor] = []
    unchanged: List[torch.Tensor] = []
    for src, dst in zip(source, new_shape):
        half = dst // 2
        targets = torch.arange(-half, half + 1).float()  # (dst,): the new integer offsets
        resized.append(linear_weights(geometric_offsets(src, targets[-1].double()).float(), targets))
        identities.append((targets[:, None] == torch.arange(-(src // 2), src // 2 + 1).float()).float())
        unchanged.append(targets[-1] == src // 2)
    none_changes = torch.stack(unchanged).all()  # a 0-d bool: a traced graph selects at run time
    return [torch.where(none_changes, identity, weights) for identity, weights in zip(identities, resized)]


def geometric_reach(ratio: torch.Tensor, n: int) -> torch.Tensor:
    """Where the outermost of ``n`` source offsets sits at ratio ``ratio > 1``: ``1 + r + ... + r^(n-1)``."""
    return (ratio ** n - 1) / (ratio - 1)


def geometric_ratio(n: int, target: torch.Tensor, interval: Tuple[float, float] = GEOMETRIC_RATIO,
                    points: int = RATIO_POINTS, rounds: int = RATIO_ROUNDS) -> torch.Tensor:
    """The ratio ``r`` that puts the outermost of ``n`` source offsets at ``target`` (a 0-d float64 tensor,
    :func:`geometric_reach`), taken in ``interval`` (default ``[1.01, 1.5]``; its end when the root lies outside
    it): 0-d float64. Searched on ``points`` intervals a round, ``rounds`` rounds, with no branch on ``target``'s
    value."""
    low, high = torch.tensor(interval[0], dtype=torch.float64), torch.tensor(interval[1], dtype=torch.float64)
    steps = torch.linspace(0, 1, points + 1, dtype=torch.float64)
    for _ in range(rounds):
        ratios = low + (high - low) * steps
        short = (geometric_reach(ratios, n) < target).sum() - 1  # the last ratio that falls short
        index = short.clamp(0, points - 1)
        low, high = ratios[index], ratios[index + 1]
    return (low + high) / 2


def geometric_offsets(src: int, target: torch.Tensor) -> torch.Tensor:
    """Where the ``src`` offsets ``-(n-1) .. n-1`` of a table (``src = 2 n - 1``) sit on the axis of a table whose
    outermost offset is ``target`` (``dst // 2`` of a table of ``dst`` offsets, a 0-d float64 tensor) (BEiT, timm
    ``resize_rel_pos_bias_table``): the centre at 0, the ``k``-th offset either side at ``1 + r + ... + r^(k-1)``,
    with the ratio ``r`` of :func:`geometric_ratio`. ``(src,)`` float64."""
    n = src // 2
    if n == 0:
        return torch.zeros(1, dtype=torch.float64)
    side = (geometric_ratio(n, target) ** torch.arange(n, dtype=torch.float64)).cumsum(0)
    return torch.cat([-side.flip(0), torch.zeros(1, dtype=torch.float64), side])


def linear_weights(points: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``(len(targets), len(points))`` piecewise-linear interpolation of values at increasing ``points`` at
    ``targets``; a target beyond the ends takes the end value. Each point's weight is its hat function (1 there, 0
    at its neighbours), evaluated densely, with no search, so ``targets`` may have a symbolic length."""
    if len(points) == 1:
        return torch.ones_like(targets)[:, None]
    t = targets.clamp(points[0], points[-1])[:, None]  # (dst, 1)
    gaps = points[1:] - points[:-1]
    ones = torch.ones_like(t)
    rising = torch.cat([ones, (t - points[:-1]) / gaps], 1)  # towards each point from its left neighbour
    falling = torch.cat([(points[1:] - t) / gaps, ones], 1)  # away from it to its right neighbour
    return torch.minimum(rising, falling).clamp(0.0, 1.0)
