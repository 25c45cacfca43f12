"""Decomposed relative positions (MViTv2, Li et al. 2022, arXiv 2112.01526; ViTDet and Segment Anything's image
encoder, ``use_rel_pos``): a learned table per grid axis, read by the query.

Per axis ``a`` a table ``R_a: (2 S_a - 1, head_dim)`` holds one vector per offset along that axis; the bias of query
``i`` on key ``j`` is the query's dot product with the vector of each axis's offset,

    bias_h(i, j) = sum_a  q_hi . R_a[c_ia - c_ja + S_a - 1],

``q_hi`` head ``h``'s query of token ``i`` as attention has it (after a ``q_norm``, before any rotary encoding, not
scaled by ``head_dim^-1/2``: the logits' scale does not reach the bias). One table per axis is shared by the heads. The
bias is a function of the offset per axis and of the query's content, so it is defined on any grid: on a grid of
``S'_a`` patches along an axis whose table has another length, the table is resampled linearly to ``2 S'_a - 1`` rows
(half-pixel centres, no antialiasing: the convention of ViTDet's and timm's ``get_rel_pos``), a smaller grid's too.
Prefix tokens get zero bias rows and columns.

This bias reads the queries: it is called ``pe(grid, queries) -> (B, heads, T, T)`` with ``queries: (B, T, heads *
head_dim)`` (the heads merged, in the layout's token order), and :func:`visionpe.attend` passes them to every bias that
declares ``reads_queries`` (every visionpe attention goes through it); an attention that computes its bias without the
queries (timm's MaxxVit relative position module) refuses it.
"""
from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from .._checks import check_axes, check_grid_ndim, check_number, check_positive_int, to_shape
from ..grid import Grid, Layout, as_grid, as_layout
from ..resample import resample_axis
from ..sharding import full_tensor
from ._base import BiasEncoding, PairScore

AXIS_NAMES = ("t", "h", "w")  # the tables' names, the last ndim of these: rel_pos_h, rel_pos_w (timm, ViTDet)


def table_names(ndim: int) -> tuple[str, ...]:
    """The per-axis table names of an ``ndim``-axis grid, grid order: ``("rel_pos_h", "rel_pos_w")`` in 2D."""
    return tuple(f"rel_pos_{a}" for a in AXIS_NAMES[len(AXIS_NAMES) - ndim:])


def offset_rows(table: torch.Tensor, size: int) -> torch.Tensor:
    """A per-offset table ``(L, C)`` read by an axis of ``size`` patches: ``(2 size - 1, C)``, resampled linearly
    along the offsets (half-pixel centres, no antialiasing) where ``L`` differs."""
    return resample_axis(table, 0, 2 * size - 1, "bilinear", antialias=False)


def axis_codes(layout: Layout, device) -> list[torch.Tensor]:
    """Each token's patch index along each grid axis, ``(B or 1, T)`` long per axis in the layout's token order;
    prefix tokens read ``-1``."""
    grid = layout.grid
    axes = [torch.arange(s, device=device) for s in grid.shape]
    coords = [c.reshape(-1) for c in torch.meshgrid(*axes, indexing="ij")]  # per axis, (N,)
    prefix = torch.full((grid.prefix,), -1, dtype=torch.long, device=device)
    codes = [torch.cat([prefix, c])[None] for c in coords]  # (1, P + N)
    if layout.keep is None:
        return codes
    index = layout.token_index(device)
    return [c[0][index] for c in codes]


class DecomposedRelPos(BiasEncoding):
    """Decomposed relative positions: ``pe(grid, queries) -> (B, heads, T, T)``, ``queries: (B, T, heads * head_dim)``.

    Args:
        num_heads, head_dim: the attention's (the queries are split into ``num_heads`` heads of ``head_dim``).
        grid_shape: the patch grid (a window's, in a windowed block) the tables are built for: ``2 S_a - 1`` rows per
            axis; 1, 2 or 3 axes.
        init_std: the tables' initial ``N(0, init_std^2)`` (default 0.02, MViTv2's scale); ``0.0``: zeros, as
            ViTDet's ``rel_pos_zero_init`` and Segment Anything's.

    Parameters (excluded from weight decay): ``rel_pos_h``, ``rel_pos_w`` (2D; ``rel_pos_t``, ``rel_pos_h``,
    ``rel_pos_w`` in 3D as MViTv2's, ``rel_pos_w`` in 1D), each ``(2 S_a - 1, head_dim)``: timm's and ViTDet's names
    and layout, so their weights load as they are.
    """

    reads_queries = True
    reads_spacing = False  # integer offsets index the tables: a grid's spacing is refused (check_spacing)

    def __init__(self, *, num_heads: int, head_dim: int, grid_shape=(14, 14), init_std: float = 0.02):
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.grid_shape = check_axes("grid_shape", to_shape("grid_shape", grid_shape), grid_shape)
        self.ndim = len(self.grid_shape)
        self.init_std = check_number("init_std", init_std, minimum=0.0)
        for name, size in zip(table_names(self.ndim), self.grid_shape):
            self.register_parameter(name, nn.Parameter(torch.empty(2 * size - 1, head_dim)))
        self.fill_parameters()

    def initial_parameters(self, generator=None) -> dict:
        """Every table ``N(0, init_std^2)`` (zeros with ``init_std=0``) at its current shape."""
        return {name: torch.randn(self.get_parameter(name).shape, generator=generator) * self.init_std
                for name in table_names(self.ndim)}

    def tables(self, shape) -> list[torch.Tensor]:
        """The per-axis tables as a grid of ``shape`` reads them: ``(2 S'_a - 1, head_dim)`` float32 each."""
        return [offset_rows(full_tensor(self.get_parameter(name)).float(), size)
                for name, size in zip(table_names(self.ndim), shape)]

    def axis_scores(self, grid, queries: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per axis, every query's dot product with every offset's vector, ``(B, heads, T, 2 S'_a)`` float32 (a first
        zero column for the pairs with a prefix token), and the tokens' patch index along the axis ``(B or 1, T)``
        long (``-1`` for a prefix token): a patch pair ``(i, j)`` reads column ``c_i - c_j + S'_a`` of its query's
        row (:func:`pair_columns`)."""
        layout = as_layout(grid)
        check_grid_ndim(layout.grid, self.ndim, type(self).__name__)
        self.check_spacing(layout.grid)
        self._check_queries(queries, layout)
        heads = rearrange(queries.float(), "b t (h d) -> b h t d", h=self.num_heads)
        scores = [torch.cat([heads.new_zeros(*heads.shape[:-1], 1), heads @ table.t()], dim=-1)
                  for table in self.tables(layout.grid.shape)]
        return scores, axis_codes(layout, queries.device)

    def forward(self, grid: Grid | Layout, queries: torch.Tensor | None = None) -> torch.Tensor:
        """The bias of every query on every key of the layout, ``(B, heads, T, T)`` float32."""
        if queries is None:
            raise ValueError(f"{type(self).__name__} reads the attention's queries: call pe(grid, queries) with "
                             f"queries (batch, T, num_heads * head_dim = {self.num_heads * self.head_dim}) "
                             f"(visionpe.attend passes them)")
        scores, codes = self.axis_scores(grid, queries)
        bias = 0
        for score, code in zip(scores, codes):
            column = pair_columns(code, score.shape[-1] // 2)  # (B or 1, T, T)
            bias = bias + score.gather(-1, column[:, None].expand(score.shape[0], score.shape[1], -1, -1))
        return bias

    def score_mod(self, grid, queries: torch.Tensor | None = None) -> PairScore:
        """The bias per pair as a :class:`PairScore` over the call's token sequence (``per_sample``): each axis's
        score of the query at the pair's offset."""
        if queries is None:
            raise ValueError(f"{type(self).__name__}.score_mod reads the attention's queries: pass queries")
        scores, codes = self.axis_scores(grid, queries)
        batch = scores[0].shape[0]
        tables = []
        for score, code in zip(scores, codes):  # the query's code holds the axis's S', so every grid has one fn
            query = torch.where(code < 0, code, code + score.shape[-1] // 2)
            tables += [score, query.expand(batch, -1), code.expand(batch, -1)]
        return PairScore(_decomposed_score, tuple(tables), self.num_heads, per_sample=True)

    def table_bytes(self, grid: Grid) -> int:
        """The ``(heads, T, T)`` float32 bias, one gathered term and a ``(T, T)`` column index per sample."""
        tokens = as_grid(grid.grid if isinstance(grid, Layout) else grid).num_tokens
        return tokens * tokens * (8 * self.num_heads + 8)

    def _check_queries(self, queries, layout: Layout) -> None:
        width = self.num_heads * self.head_dim
        if not isinstance(queries, torch.Tensor) or queries.ndim != 3 or not queries.is_floating_point() \
                or queries.shape[1:] != (layout.num_tokens, width):
            got = f"{tuple(queries.shape)} {queries.dtype}" if isinstance(queries, torch.Tensor) else repr(queries)
            raise ValueError(f"queries must be the attention's floating queries (batch, {layout.num_tokens}, "
                             f"num_heads * head_dim = {width}) for grid {layout.grid.shape} with prefix="
                             f"{layout.grid.prefix}, got {got}")
        layout.check_batch(queries.shape[0], queries.device)

    @torch.no_grad()
    def pair_map(self, grid) -> torch.Tensor:
        """The bias of a query of ones in every head (each offset's table vector summed over its channels) on the
        grid's patches, ``(heads, N, N)``: what the tables hold before a query's content weighs their channels."""
        grid = as_grid(grid).without_prefix()
        ones = torch.ones(1, grid.num_tokens, self.num_heads * self.head_dim, device=self.get_parameter(
            table_names(self.ndim)[0]).device)
        return self(grid, ones)[0].float().cpu()

    def similarity_label(self, head: int | None = None) -> str:
        return f"bias of a query of ones, {'mean over heads' if head is None else f'head {head}'}"

    def similarity_note(self) -> str:
        return "bias row of each query for a query of ones"

    def adaptation_label(self) -> str:
        return "tables resampled linearly (ViTDet)"

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, grid_shape={self.grid_shape}"


def pair_columns(code: torch.Tensor, size: int) -> torch.Tensor:
    """The column of every token pair in a ``2 S``-column score row (a zero column, then the ``2 S - 1`` offsets):
    ``code[i] - code[j] + S`` for patches, the zero column 0 where either token is a prefix token (code ``-1``):
    ``(B or 1, T, T)`` long."""
    column = code[:, :, None] - code[:, None, :] + size
    prefix = (code[:, :, None] < 0) | (code[:, None, :] < 0)
    return column.masked_fill(prefix, 0)


def _decomposed_score(tables, batch, head, q, k):
    """The :meth:`DecomposedRelPos.score_mod` function: ``sum_a score_a[b, h, q, column_a(q, k)]``, per axis the
    tables ``(score, query code c + S', key code c)``, prefix codes ``-1`` reading the zero column."""
    total = 0
    for axis in range(len(tables) // 3):
        score, query_code, key_code = tables[3 * axis:3 * axis + 3]
        query, key = query_code[batch, q], key_code[batch, k]
        total = total + score[batch, head, q, torch.where((query < 0) | (key < 0), 0, query - key)]
    return total
