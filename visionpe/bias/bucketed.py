"""Bucketed relative position bias on nD grids: T5's log buckets and iRPE's piecewise index, per axis, combined
as a product (one joint table) or a cross sum (one table per axis).

Offsets ``d = c_key - c_query`` per axis (T5's ``memory_position - query_position``) go through a bucket
function; exact for small offsets, logarithmic beyond, saturating at a maximum, so any grid size works without
resampling and the bias is translation invariant by construction.
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch
from einops import rearrange
from torch import nn

from .._checks import check_choice, check_grid_ndim, check_ndim, check_number, check_positive_int
from ..cache import TableCache
from ..grid import Grid, as_grid
from ..sharding import full_tensor
from ._base import BiasEncoding, PairScore, offset_pair_bias, offset_table_score, relative_offsets

BUCKETS = ("t5", "piecewise")
METHODS = ("product", "cross")


def t5_bucket(offset: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bidirectional bucket of integer offsets (Raffel et al. 2020), ``[0, num_buckets)``.

    Half the buckets for ``offset > 0``; in each half, ``|d| < n/4`` (``n/2`` buckets per side, half of them exact)
    is its own bucket, larger ``|d|`` fall in log-spaced buckets up to ``max_distance``, beyond which they saturate.
    """
    half = num_buckets // 2
    exact = half // 2
    bucket = (offset > 0).long() * half
    distance = offset.abs()
    # float32 as T5 (Mesh TensorFlow) and its ports compute it: bucket edges follow their rounding
    log_part = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                        * (half - exact)).long()
    log_part = log_part.clamp(max=half - 1)
    return bucket + torch.where(distance < exact, distance, log_part)


def piecewise_index(offset: torch.Tensor, alpha: float = 1.9, beta: float = 3.8, gamma: float = 15.2) -> torch.Tensor:
    """iRPE's piecewise index ``g(d)`` (Wu et al. 2021): ``d`` for ``|d| <= alpha``, else
    ``sign(d) * min(beta, round(alpha + ln(|d|/alpha) / ln(gamma/alpha) * (beta - alpha)))``; values in
    ``[-int(beta), int(beta)]``."""
    d = offset.double()
    far = torch.sign(d) * (alpha + torch.log(d.abs().clamp(min=1e-12) / alpha) / math.log(gamma / alpha)
                           * (beta - alpha)).round().clamp(max=beta)
    return torch.where(d.abs() <= alpha, d.round(), far).long()


def axis_buckets(offsets: torch.Tensor, bucket: str, num_buckets: int, max_distance: int, alpha: float, beta: float,
                 gamma: float) -> torch.Tensor:
    """Bucket ``[0, per_axis)`` of each integer offset (any shape): :func:`t5_bucket` (``bucket="t5"``) or
    :func:`piecewise_index` shifted by ``int(beta)`` (``"piecewise"``)."""
    if bucket == "t5":
        return t5_bucket(offsets, num_buckets, max_distance)
    return piecewise_index(offsets, alpha, beta, gamma) + int(beta)


def bucket_rows(buckets: torch.Tensor, per_axis: int, cross: bool) -> torch.Tensor:
    """Table rows of per-axis buckets ``(..., ndim)``: ``(..., ndim)``, one row per axis in its own block of
    ``per_axis`` (``cross``), or ``(..., 1)``, the joint bucket, first axis slowest (product)."""
    ndim = buckets.shape[-1]
    if cross:
        return buckets + torch.arange(ndim, device=buckets.device) * per_axis
    joint = torch.zeros(buckets.shape[:-1], dtype=torch.long, device=buckets.device)
    for axis in range(ndim):
        joint = joint * per_axis + buckets[..., axis]
    return joint.unsqueeze(-1)


def grid_offsets(shape: List[int], device: Optional[torch.device] = None) -> torch.Tensor:
    """Every offset ``c_query - c_key`` of a grid ``shape``, ``(prod(2 s - 1), ndim)`` long, first axis slowest
    (Swin's order, the rows :func:`~visionpe.bias._base.pair_index` reads)."""
    axes = [torch.arange(-(s - 1), s, device=device) for s in shape]
    return torch.stack(torch.meshgrid(axes, indexing="ij"), dim=-1).reshape(-1, len(shape))


class BucketedBias(BiasEncoding):
    """A learned bias per head for every bucket of relative offsets, on grids of any size.

    Args:
        num_heads: heads.
        ndim: grid axes.
        bucket: ``"t5"`` (per axis, ``num_buckets`` buckets up to ``max_distance``; T5/Mesh-TF) or ``"piecewise"``
            (iRPE's index with ``alpha``, ``beta``, ``gamma``; ``2 int(beta) + 1`` buckets per axis).
        method: ``"product"``: one table over the joint bucket of all axes (iRPE's product method);
            ``"cross"``: one table per axis, summed (iRPE's cross method).

    ``relative_position_bias_table``: ``(num_entries, num_heads)``. Prefix rows and columns are zero.

    Call: ``pe(grid) -> (num_heads, P + N, P + N)``.
    """

    reads_spacing = False  # integer offsets index the buckets: a grid's spacing is refused (check_spacing)

    def __init__(self, num_heads: int, ndim: int = 2, bucket: str = "t5", method: str = "product",
                 num_buckets: int = 32, max_distance: int = 128, alpha: float = 1.9, beta: float = 3.8,
                 gamma: float = 15.2, init_std: float = 0.02):
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.ndim = check_ndim(ndim)
        check_choice("bucket", bucket, BUCKETS)
        check_choice("method", method, METHODS)
        self.bucket, self.method = bucket, method
        self.num_buckets = check_positive_int("num_buckets", num_buckets)
        self.max_distance = check_positive_int("max_distance", max_distance)
        if bucket == "t5" and (num_buckets < 4 or num_buckets % 2 or max_distance <= num_buckets // 4):
            raise ValueError(f"t5 buckets need an even num_buckets >= 4 and max_distance > num_buckets / 4, got "
                             f"num_buckets={num_buckets!r}, max_distance={max_distance!r}")
        self.alpha = check_number("alpha", alpha, minimum=0.0, inclusive=False)
        self.beta = check_number("beta", beta, minimum=self.alpha)
        self.gamma = check_number("gamma", gamma, minimum=self.alpha, inclusive=False)
        self.per_axis = num_buckets if bucket == "t5" else 2 * int(beta) + 1
        entries = self.per_axis ** ndim if method == "product" else self.per_axis * ndim
        self.init_std = check_number("init_std", init_std, minimum=0.0)
        self.relative_position_bias_table = nn.Parameter(torch.empty(entries, num_heads))
        self.fill_parameters()
        self._index_cache = TableCache(maxsize=16)

    def initial_parameters(self, generator=None) -> dict:
        """The table ``N(0, init_std^2)``."""
        table = self.relative_position_bias_table
        return {"relative_position_bias_table": torch.randn(table.shape, generator=generator) * self.init_std}

    def rows(self, offsets: torch.Tensor) -> torch.Tensor:
        """Table rows of query - key offsets ``(..., ndim)``: ``(..., 1)`` (product) or ``(..., ndim)`` (cross, one
        row per axis)."""
        buckets = axis_buckets(-offsets, self.bucket, self.num_buckets, self.max_distance, self.alpha, self.beta,
                               self.gamma)  # key - query
        return bucket_rows(buckets, self.per_axis, self.method == "cross")

    def index(self, shape, device=None) -> torch.Tensor:
        """Table rows ``(N, N, 1)`` (product) or ``(N, N, ndim)`` (cross, one row per axis) for a grid ``shape``."""
        return self._index_cache.get((tuple(shape), str(device)), lambda: self.rows(relative_offsets(shape, device)))

    def forward(self, grid: Grid) -> torch.Tensor:
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "bucket_bias")
        self.check_spacing(grid)
        table = full_tensor(self.relative_position_bias_table)
        bias = table[self.index(grid.shape, table.device)].sum(-2)  # (N, N, heads)
        return self.pad_prefix(rearrange(bias, "n m h -> h n m").float(), grid)

    def score_mod(self, grid: Grid) -> PairScore:
        """The bias of every offset of the grid (``(prod(2 s - 1), heads)``, Swin's order), read per token pair."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "bucket_bias")
        self.check_spacing(grid)
        table = full_tensor(self.relative_position_bias_table)
        return offset_table_score(table[self.rows(grid_offsets(grid.shape, table.device))].sum(-2).float(), grid,
                                  grid.shape)

    def scriptable(self) -> "ScriptedBucketedBias":
        """The TorchScript form (:class:`ScriptedBucketedBias`)."""
        self.check_scriptable_class(BucketedBias)
        return ScriptedBucketedBias(self)

    def adaptation_label(self) -> str:
        return "buckets on the new grid (saturate beyond the largest)"

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, ndim={self.ndim}, bucket={self.bucket!r}, method={self.method!r}, "
                f"buckets per axis={self.per_axis}")


class ScriptedBucketedBias(nn.Module):
    """TorchScript form of :class:`BucketedBias`: ``forward(shape, prefix) -> (heads, P + N, P + N)`` float32, the
    table (the encoding's parameter) read at the buckets of every offset of the input's patch grid, computed in the
    graph, and gathered per token pair (the values of :meth:`BucketedBias.forward`), zero prefix rows and columns."""

    def __init__(self, pe: BucketedBias):
        super().__init__()
        self.table = pe.relative_position_bias_table  # (entries, heads), the parameter
        self.bucket, self.cross, self.per_axis = pe.bucket, pe.method == "cross", pe.per_axis
        self.num_buckets, self.max_distance = pe.num_buckets, pe.max_distance
        self.alpha, self.beta, self.gamma = float(pe.alpha), float(pe.beta), float(pe.gamma)

    def forward(self, shape: List[int], prefix: int) -> torch.Tensor:
        offsets = grid_offsets(shape, self.table.device)  # (offsets, ndim), query - key
        buckets = axis_buckets(-offsets, self.bucket, self.num_buckets, self.max_distance, self.alpha, self.beta,
                               self.gamma)  # key - query
        table = self.table[bucket_rows(buckets, self.per_axis, self.cross)].sum(-2).float()  # (offsets, heads)
        return offset_pair_bias(table, shape, shape, prefix)
