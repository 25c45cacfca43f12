"""Bucketed relative position bias on nD grids: T5's log buckets and iRPE's piecewise index, per axis, combined
as a product (one joint table) or a cross sum (one table per axis).

Offsets ``d = c_key - c_query`` per axis (T5's ``memory_position - query_position``) go through a bucket
function; exact for small offsets, logarithmic beyond, saturating at a maximum, so any grid size works without
resampling and the bias is translation invariant by construction.
"""
from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn

from .._checks import check_choice, check_grid_ndim, check_ndim, check_number, check_positive_int
from ..cache import TableCache
from ..grid import Grid, as_grid
from ..sharding import full_tensor
from ._base import BiasEncoding, PairScore, offset_table_score, relative_offsets

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

    def axis_buckets(self, offsets: torch.Tensor) -> torch.Tensor:
        """Bucket ``[0, per_axis)`` of each offset, any shape of integer offsets."""
        if self.bucket == "t5":
            return t5_bucket(offsets, self.num_buckets, self.max_distance)
        return piecewise_index(offsets, self.alpha, self.beta, self.gamma) + int(self.beta)

    def rows(self, offsets: torch.Tensor) -> torch.Tensor:
        """Table rows of query - key offsets ``(..., ndim)``: ``(..., 1)`` (product) or ``(..., ndim)`` (cross, one
        row per axis)."""
        buckets = self.axis_buckets(-offsets)  # key - query
        if self.method == "cross":
            return buckets + torch.arange(self.ndim, device=offsets.device) * self.per_axis
        joint = torch.zeros(buckets.shape[:-1], dtype=torch.long, device=offsets.device)
        for axis in range(self.ndim):
            joint = joint * self.per_axis + buckets[..., axis]
        return joint[..., None]

    def index(self, shape, device=None) -> torch.Tensor:
        """Table rows ``(N, N, 1)`` (product) or ``(N, N, ndim)`` (cross, one row per axis) for a grid ``shape``."""
        return self._index_cache.get((tuple(shape), str(device)), lambda: self.rows(relative_offsets(shape, device)))

    def forward(self, grid: Grid) -> torch.Tensor:
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "bucket_bias")
        table = full_tensor(self.relative_position_bias_table)
        bias = table[self.index(grid.shape, table.device)].sum(-2)  # (N, N, heads)
        return self.pad_prefix(rearrange(bias, "n m h -> h n m").float(), grid)

    def score_mod(self, grid: Grid) -> PairScore:
        """The bias of every offset of the grid (``(prod(2 s - 1), heads)``, Swin's order), read per token pair."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "bucket_bias")
        table = full_tensor(self.relative_position_bias_table)
        axes = [torch.arange(-(s - 1), s, device=table.device) for s in grid.shape]
        offsets = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, grid.ndim)  # query - key
        return offset_table_score(table[self.rows(offsets)].sum(-2).float(), grid, grid.shape)

    def adaptation_label(self) -> str:
        return "buckets on the new grid (saturate beyond the largest)"

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, ndim={self.ndim}, bucket={self.bucket!r}, method={self.method!r}, "
                f"buckets per axis={self.per_axis}")
