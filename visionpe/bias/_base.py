"""Shared pieces of the bias family: relative offsets on a grid, prefix padding, and the pair-function form of a bias
(:class:`PairScore`) that FlexAttention reads instead of a materialised ``(heads, T, T)`` tensor."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F

from .._compat import is_compiling
from ..cache import TableCache
from ..encoding import Encoding
from ..grid import Grid, as_grid

# pair indices depend on shapes only: one cache for every block and model, so a large grid's (T, T) index is built
# once per forward, not once per block
PAIR_INDEX = TableCache(maxsize=16, max_bytes=None)


@dataclass(frozen=True, eq=False)
class PairScore:
    """A bias on one grid as a function of token pairs: what FlexAttention's ``score_mod`` adds to each logit, so the
    ``(heads, T, T)`` bias is never materialised.

    ``fn(tables, head, q, k, **options)`` returns ``bias[head, q, k]`` for scalar integer tensors ``head``, ``q`` and
    ``k``, where ``q`` and ``k`` index the grid's ``P + N`` tokens (prefix first, then the patches row-major). ``fn``
    reads each of ``tables`` by indexing only (``tables[i][...]``), so attention can give it a token subset's indices
    (:class:`~visionpe.grid.Layout`) or stack the tables of several grids (a
    :class:`~visionpe.grid.MixedLayout`); tables may carry gradients to the encoding's parameters. ``options`` are
    Python constants of ``fn`` (equal for every grid of one encoding). ``num_heads``: the bias's heads.

    ``per_sample=True``: a bias that reads the tokens (:attr:`BiasEncoding.reads_tokens`, PaPE) differs per sample;
    its ``fn(tables, batch, head, q, k, **options)`` reads tables that hold one sample per row in the call's token
    order (``q``, ``k``: positions in the sequence attention sees, a :class:`~visionpe.grid.Layout`'s kept tokens
    included), so attention indexes them by sample and position and stacks a mixed batch's groups sample by sample.
    """

    fn: Callable
    tables: tuple[torch.Tensor, ...]
    num_heads: int
    options: dict = field(default_factory=dict)
    per_sample: bool = False

    def __call__(self, *index):
        """The bias of one pair, read from this grid's tables: ``score(head, q, k)``, or ``score(batch, head, q, k)``
        with ``per_sample``."""
        return self.fn(self.tables, *index, **self.options)


class BiasEncoding(Encoding):
    """Base class: ``pe(grid) -> (num_heads, P + N, P + N)`` float32 bias added to attention logits.

    An encoding whose bias is a function of coordinates or of a small table also implements :meth:`score_mod`, and
    ``attention="flex"`` (:func:`visionpe.attend`) then reads it inside the attention kernel.

    ``reads_tokens = True``: the bias depends on the attention's input tokens too (PaPE's per-query parabolas), and is
    called ``pe(grid, tokens) -> (B, heads, T, T)`` with ``tokens: (B, T, dim)`` in the layout's token order (grid or
    :class:`~visionpe.grid.Layout`); :func:`visionpe.attend` passes them (``tokens=``) and ``score_mod(grid, tokens)``
    gives a ``per_sample`` :class:`PairScore`.

    ``reads_queries = True``: the bias depends on the attention's queries (decomposed relative positions), and is
    called ``pe(grid, queries) -> (B, heads, T, T)`` with ``queries: (B, T, heads * head_dim)``, q's heads merged;
    :func:`visionpe.attend` passes q itself, in the same slot as a token-reading bias's tokens.
    """

    family = "bias"
    reads_tokens: bool = False
    reads_queries: bool = False

    def __init_subclass__(cls, **kwargs):
        """Every bias's ``forward(grid)`` checks first that the table fits in memory (:meth:`check_table`)."""
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__:
            cls.forward = checked_forward(cls.forward)

    def table_bytes(self, grid: Grid) -> int:
        """The ``(heads, T, T)`` float32 bias of ``grid`` and a ``(T, T)`` index or distance (8 bytes a pair) it is
        built from."""
        tokens = as_grid(grid).num_tokens
        return tokens * tokens * (4 * getattr(self, "num_heads", 1) + 8)

    def score_mod(self, grid) -> PairScore | None:
        """The bias of ``grid`` as a :class:`PairScore` (equal to ``self(grid)`` entry for entry), or None when this
        encoding has no such form (attention then materialises ``self(grid)``). Table encodings return
        :func:`offset_table_score`; coordinate functions write their own ``fn`` (see :class:`~visionpe.ALiBi`)."""
        return None

    @torch.no_grad()
    def pair_map(self, grid) -> torch.Tensor:
        """The bias on the grid's patches (no prefix rows or columns), ``(heads, N, N)`` float32."""
        grid = as_grid(grid)
        return self(grid.without_prefix()).detach().float().cpu()

    def similarity_label(self, head: int | None = None) -> str:
        return f"attention bias, {'mean over heads' if head is None else f'head {head}'}"

    def similarity_note(self) -> str:
        return "bias row of each query"

    @staticmethod
    def pad_prefix(bias: torch.Tensor, grid: Grid) -> torch.Tensor:
        """Zero rows and columns for the prefix tokens: ``(H, N, N) -> (H, P + N, P + N)``."""
        return F.pad(bias, (grid.prefix, 0, grid.prefix, 0)) if grid.prefix else bias


def checked_forward(forward):
    """A bias's ``forward(grid, ...)`` that checks the table fits in memory before building it (not while
    ``torch.compile`` traces)."""
    @functools.wraps(forward)
    def checked(self, grid, *args, **kwargs):
        if not is_compiling():
            flex = type(self).score_mod is not BiasEncoding.score_mod
            self.check_table(grid, what="bias table", advice="use a smaller grid" + (
                ", or attention='flex' (FlexAttention reads the bias per token pair without building the table)"
                if flex else ""))
        return forward(self, grid, *args, **kwargs)

    return checked


def relative_offsets(shape, device=None) -> torch.Tensor:
    """Pairwise offsets ``c_i - c_j`` of a grid's patches, ``(N, N, ndim)`` long, grid axis order."""
    axes = [torch.arange(s, device=device) for s in shape]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(shape))
    return coords[:, None, :] - coords[None, :, :]


def grid_offset_index(shape: List[int], window: List[int], device: Optional[torch.device] = None) -> torch.Tensor:
    """Index of each pairwise offset ``c_i - c_j`` of a grid's patches in a ``prod(2 W_a - 1)`` table, first axis
    slowest (Swin's convention: ``(dh + Wh - 1) * (2 Ww - 1) + (dw + Ww - 1)`` in 2D, Video-Swin's in 3D):
    ``(N, N)`` long. Built one axis at a time from the per-axis patch indices, so no ``(N, N, ndim)`` offsets
    tensor is held (at 4096 tokens that would be 268 MB). A TorchScript function, as :func:`pair_index` and
    :func:`gather_pair_bias` (the scripted models build their bias with them)."""
    axes = [torch.arange(s, device=device) for s in shape]
    coords = [c.reshape(-1) for c in torch.meshgrid(axes, indexing="ij")]  # per axis, (N,)
    index = torch.zeros(coords[0].shape[0], coords[0].shape[0], dtype=torch.long, device=device)
    for c, w in zip(coords, window):
        index = index.mul_(2 * w - 1).add_(c[:, None] - c[None, :] + (w - 1))
    return index


def pair_index(shape: List[int], window: List[int], prefix: int, offset_rows: int, prefix_rows: List[int],
               device: Optional[torch.device] = None) -> torch.Tensor:
    """Row of every token pair in a per-offset table followed by prefix rows: ``(P + N, P + N)`` long.

    Patch pairs read :func:`grid_offset_index`; prefix->patch, patch->prefix and prefix->prefix pairs read rows
    ``offset_rows + prefix_rows[i]`` (BEiT's three learned entries, or one zero row for all three).
    """
    patches = grid_offset_index(shape, window, device)
    if not prefix:
        return patches
    total = prefix + patches.shape[0]
    index = torch.full([total, total], offset_rows + prefix_rows[2], dtype=patches.dtype, device=device)
    index[:prefix, prefix:] = offset_rows + prefix_rows[0]
    index[prefix:, :prefix] = offset_rows + prefix_rows[1]
    index[prefix:, prefix:] = patches
    return index


def gather_pair_bias(table: torch.Tensor, extra: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows ``index: (T, T)`` of ``[table; extra]`` (``(offset rows, heads)``, then the prefix rows), one gather:
    ``(heads, T, T)``, contiguous."""
    by_head = torch.cat([table, extra]).t().contiguous()  # (heads, rows + 1 or 3): each head's row contiguous
    return by_head.index_select(1, index.view(-1)).view(by_head.shape[0], index.shape[0], index.shape[1])


def offset_pair_bias(table: torch.Tensor, shape: List[int], window: List[int], prefix: int) -> torch.Tensor:
    """The bias of every token pair of a grid ``shape`` with ``prefix`` tokens read from a per-offset table
    ``(prod(2 W_a - 1), heads)`` (Swin's order, window ``window``), zero prefix rows and columns: ``(heads, P + N,
    P + N)``, uncached (:func:`pair_bias`'s values; a TorchScript function, the scripted biases' last step)."""
    index = pair_index(shape, window, prefix, table.shape[0], [0, 0, 0], table.device)
    return gather_pair_bias(table, table.new_zeros(1, table.shape[1]), index)


def pair_bias(table: torch.Tensor, grid: Grid, window, prefix_entries: torch.Tensor | None = None) -> torch.Tensor:
    """The bias of every token pair of ``grid``, read in one gather from a per-offset table.

    Args:
        table: ``(prod(2 W_a - 1), heads)``, one row per offset in a window ``window`` (Swin's order).
        prefix_entries: ``(3, heads)`` biases prefix->patch, patch->prefix, prefix->prefix (BEiT), or None for zero
            prefix rows and columns.
    Returns:
        ``(heads, P + N, P + N)``, contiguous. The index is cached for all blocks; no padding or concatenation of
        the ``(T, T)`` result (at 4096 tokens those copies cost more than the gather).
    """
    rows, heads = table.shape
    extra = table.new_zeros(1, heads) if prefix_entries is None else prefix_entries.to(table.dtype)
    prefix_rows = [0, 0, 0] if prefix_entries is None else [0, 1, 2]
    key = (grid.shape, grid.prefix, tuple(window), rows, tuple(prefix_rows), str(table.device))
    index = PAIR_INDEX.get(key, lambda: pair_index(list(grid.shape), list(window), grid.prefix, rows, prefix_rows,
                                                   table.device))
    return gather_pair_bias(table, extra, index)


def offset_codes(shape, window, prefix: int, prefix_columns: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token codes whose difference is a pair's column in a prefix-first per-offset table: ``query[i] - key[j]``
    is ``prefix_columns + grid_offset_index[i, j]`` for patches ``i``, ``j`` (Swin's index is linear in the
    coordinates: ``sum_a (c_ia - c_ja + W_a - 1) * stride_a``). ``(P + N,)`` long each; prefix tokens read 0."""
    strides, stride = [], 1
    for w in reversed(window):
        strides.insert(0, stride)
        stride *= 2 * w - 1
    axes = [torch.arange(s, device=device) for s in shape]
    coords = [c.reshape(-1) for c in torch.meshgrid(*axes, indexing="ij")]  # per axis, (N,)
    key = F.pad(sum(c * stride for c, stride in zip(coords, strides)), (prefix, 0))
    centre = prefix_columns + sum((w - 1) * s for w, s in zip(window, strides))
    query = key + centre
    query[:prefix] = 0
    return query, key


def offset_table_score(table: torch.Tensor, grid: Grid, window,
                       prefix_entries: torch.Tensor | None = None) -> PairScore:
    """:func:`pair_bias` of the same table as a :class:`PairScore`: a patch pair reads its offset's row of ``table``
    (``(prod(2 W_a - 1), heads)``, Swin's order), prefix pairs read ``prefix_entries`` (``(3, heads)``: prefix->patch,
    patch->prefix, prefix->prefix, BEiT) or zero. Every table encoding (a learned table, an MLP or buckets evaluated
    per offset) joins FlexAttention through this."""
    heads = table.shape[1]
    extra = table.new_zeros(1, heads) if prefix_entries is None else prefix_entries.to(table.dtype)
    prefix_rows = (0, 0, 0) if prefix_entries is None else (0, 1, 2)
    by_head = torch.cat([extra, table]).t().contiguous()  # (heads, prefix columns + offsets): prefix columns first
    key = ("codes", grid.shape, grid.prefix, tuple(window), extra.shape[0], str(table.device))
    query_code, key_code = PAIR_INDEX.get(
        key, lambda: offset_codes(grid.shape, window, grid.prefix, extra.shape[0], table.device))
    return PairScore(_offset_table_bias, (by_head, query_code, key_code), heads,
                     {"prefix": grid.prefix, "prefix_rows": prefix_rows})


def _offset_table_bias(tables, head, q, k, prefix: int, prefix_rows: tuple[int, int, int]):
    """The :func:`offset_table_score` function: one read of the prefix-first table."""
    by_head, query_code, key_code = tables
    column = query_code[q] - key_code[k]
    if prefix:
        to_patch, from_patch, between = prefix_rows
        column = torch.where(q < prefix, torch.where(k < prefix, between, to_patch),
                             torch.where(k < prefix, from_patch, column))
    return by_head[head, column]
