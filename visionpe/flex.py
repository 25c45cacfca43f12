"""FlexAttention for the bias family: the bias is read per token pair inside the attention kernel
(``torch.nn.attention.flex_attention`` with a ``score_mod``), so no ``(heads, T, T)`` tensor is materialised.

A bias encoding joins through :meth:`~visionpe.BiasEncoding.score_mod`, which returns a
:class:`~visionpe.bias.PairScore` (a function of token indices and the small tables it reads). This module turns it
into a ``score_mod`` for one forward's token layout:

- a :class:`~visionpe.Grid`: token ``t`` is grid token ``t``;
- a :class:`~visionpe.grid.Layout` with kept patches: token ``t`` of sample ``b`` is grid token
  ``layout.token_index()[b, t]`` (each kept token keeps its position; nothing is masked, since every kept token
  sees every other);
- a :class:`~visionpe.grid.MixedLayout`: the tables of each distinct grid are zero-padded to a common shape and
  stacked, sample ``b`` reads its grid's slice, and a :class:`BlockMask` over each sample's real keys skips the
  padded key blocks (padded query rows attend to the real keys and are ignored downstream, as with SDPA).

Outside ``torch.compile`` the call goes through one compiled ``flex_attention`` (eager ``flex_attention`` is an
unfused reference that materialises the scores); inside a compiled model it is traced into the model's graph. Each
layout kind, score function and (on CPU) shape is one more graph of that function: past dynamo's
``torch._dynamo.config.recompile_limit`` (8 by default) further ones run the unfused reference, so raise the limit
for models with many (a Swin's stages, mixed batches, several resolutions).
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from ._compat import is_compiling
from .bias import PairScore
from .grid import Grid, Layout, MixedLayout, as_layout

BLOCK_SIZE = 128  # flex_attention's default block (tokens per side)
_COMPILED: dict = {}  # device type -> compiled flex_attention
_COMPILED_LOCK = threading.Lock()


def flex_available() -> bool:
    """Whether this torch has ``torch.nn.attention.flex_attention`` (torch >= 2.5)."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _flex_attention(device_type: str):
    """``flex_attention``, compiled once per device type outside ``torch.compile`` (traced as it is inside). Shapes
    become dynamic after the first recompile, except on CPU, compiled per shape: inductor's CPU flex template failed
    to build score_mods that read tables with dynamic shapes (a C++ compile error, torch 2.14). dynamo's recompile
    limit then bounds the shapes compiled on CPU; later shapes run flex_attention's unfused reference."""
    from torch.nn.attention.flex_attention import flex_attention

    if is_compiling():
        return flex_attention
    with _COMPILED_LOCK:
        if device_type not in _COMPILED:
            _COMPILED[device_type] = torch.compile(flex_attention, dynamic=False if device_type == "cpu" else None)
        return _COMPILED[device_type]


def pair_scores(layout: Grid | Layout | MixedLayout, bias,
                tokens: torch.Tensor | None = None) -> list[PairScore] | None:
    """One :class:`PairScore` per distinct grid of the layout (one for a :class:`Layout`), or None when the bias
    encoding has no pair form. ``tokens`` ``(B, T, dim)``: the attention's input, for a bias that reads it (each
    group's samples and real tokens go to its grid's score)."""
    layout = _as_layout(layout)
    if isinstance(layout, MixedLayout):
        groups = [(grid, None if tokens is None else tokens[index, :grid.num_tokens])
                  for index, grid in layout.groups(None if tokens is None else tokens.device)]
    else:
        groups = [(layout.unwrap() if tokens is not None else layout.grid, tokens)]
    scores = []
    for grid, group_tokens in groups:
        score = bias.score_mod(grid) if group_tokens is None else bias.score_mod(grid, group_tokens)
        if score is None:
            return None
        scores.append(score)
    return scores


def check_scores(scores: list[PairScore], heads: int) -> None:
    """The scores' heads must match q's (or be 1); every grid's score must be the same function."""
    first = scores[0]
    if first.num_heads not in (1, heads):
        raise ValueError(f"bias gives {first.num_heads} heads but q, k have {heads}: build the bias with "
                         f"num_heads={heads}")
    if any(s.fn is not first.fn or s.options != first.options or len(s.tables) != len(first.tables)
           or s.per_sample != first.per_sample for s in scores[1:]):
        raise ValueError("the bias gives a different score function per grid of the mixed layout; score_mod must "
                         "return the same fn and options for every grid")


def _as_layout(layout) -> Layout | MixedLayout:
    return layout if isinstance(layout, MixedLayout) else as_layout(layout)


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Grid | Layout | MixedLayout,
                scores: list[PairScore], attn_mask: torch.Tensor | None, scale: float | None) -> torch.Tensor:
    """``softmax(scale * q k^T + bias + attn_mask) v`` with the bias read from ``scores`` per pair.

    Args:
        q, k, v: ``(B, heads, T, d)`` (rotated already), ``T`` the layout's tokens.
        scores: from :func:`pair_scores` on the same layout.
        attn_mask: additive float mask broadcastable to ``(B, heads, T, T)`` (read per pair) or None.
    Returns:
        ``(B, heads, T, v_head_dim)``.
    """
    check_scores(scores, q.shape[1])
    layout = _as_layout(layout)
    block_mask = None
    if scores[0].per_sample:  # tables in the call's token order, one sample per row
        token = group = None
        tables = _sample_tables(layout, scores, q.device) if isinstance(layout, MixedLayout) else scores[0].tables
        if isinstance(layout, MixedLayout):
            block_mask = padding_block_mask(layout, q.device)
    elif isinstance(layout, MixedLayout):
        token, group, tables = _mixed_indices(layout, scores, q.device)
        block_mask = padding_block_mask(layout, q.device)
    else:
        token = None if layout.keep is None else layout.token_index(q.device, q.shape[0])
        group, tables = None, scores[0].tables
    score_mod = _score_mod(scores[0], tables, token, group, attn_mask)
    if q.device.type == "cpu":  # the CPU kernel on q, k, v sliced from a fused qkv: 5x its time on copies (4097 tokens)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return _flex_attention(q.device.type)(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def _score_mod(score: PairScore, tables, token, group, attn_mask):
    """FlexAttention's ``score_mod(score, b, h, q, k)`` for one forward."""
    fn, options, broadcast_heads, per_sample = score.fn, score.options, score.num_heads == 1, score.per_sample
    if attn_mask is not None:
        attn_mask = attn_mask[(None,) * (4 - attn_mask.ndim)]
    mask_sizes = None if attn_mask is None else tuple(attn_mask.shape)

    def score_mod(logit, b, h, q_idx, k_idx):
        head = torch.zeros_like(h) if broadcast_heads else h
        if per_sample:
            value = fn(tables, b, head, q_idx, k_idx, **options)
        else:
            i, j = (q_idx, k_idx) if token is None else (token[b, q_idx], token[b, k_idx])
            read = tables if group is None else tuple(_GroupView(t, group[b]) for t in tables)
            value = fn(read, head, i, j, **options)
        logit = logit + value.to(logit.dtype)
        if attn_mask is not None:
            index = [x if size > 1 else 0 for x, size in zip((b, h, q_idx, k_idx), mask_sizes)]
            logit = logit + attn_mask[index[0], index[1], index[2], index[3]].to(logit.dtype)
        return logit

    return score_mod


class _GroupView:
    """One grid's slice of a stacked table, read by indexing: ``view[i, ...]`` is ``stacked[group, i, ...]``."""

    def __init__(self, stacked: torch.Tensor, group: torch.Tensor):
        self.stacked, self.group = stacked, group

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        return self.stacked[(self.group, *index)]


def _mixed_indices(layout: MixedLayout, scores: list[PairScore], device):
    """Per sample: each token's index in its own grid ``(B, T)`` (padding clamped onto the last real token), its
    grid's group ``(B,)``; and the groups' tables zero-padded to one shape and stacked ``(G, ...)``."""
    groups = layout.groups(device)
    counts = torch.tensor([g.num_tokens for g in layout.grids], device=device)
    token = torch.minimum(torch.arange(layout.num_tokens, device=device), counts[:, None] - 1)
    group = torch.empty(len(layout.grids), dtype=torch.long, device=device)
    for g, (index, _) in enumerate(groups):
        group[index] = g
    tables = []
    for parts in zip(*(s.tables for s in scores)):
        shape = [max(sizes) for sizes in zip(*(p.shape for p in parts))]
        tables.append(torch.stack([F.pad(p, [x for size, have in zip(reversed(shape), reversed(p.shape))
                                             for x in (0, size - have)]) for p in parts]))
    return token, group, tuple(tables)


def _sample_tables(layout: MixedLayout, scores: list[PairScore], device) -> tuple[torch.Tensor, ...]:
    """The per-sample tables of each group (``(samples or 1, ..., n_g, ...)``, the group's tokens on axis 2) placed at
    its samples' rows of zero tables ``(B, ..., T, ...)`` padded to the longest sample."""
    groups = layout.groups(device)
    stacked = []
    for parts in zip(*(s.tables for s in scores)):
        shape = [max(sizes) for sizes in zip(*(p.shape[1:] for p in parts))]
        out = parts[0].new_zeros(len(layout.grids), *shape)
        for (index, _), part in zip(groups, parts):
            out[(index, *(slice(0, n) for n in part.shape[1:]))] = part
        stacked.append(out)
    return tuple(stacked)


def padding_block_mask(layout: MixedLayout, device):
    """The :class:`BlockMask` of a padded mixed batch: sample ``b``'s queries see its ``P + N_b`` real keys. Built
    from the counts, without a dense ``(B, T, T)`` mask: key blocks below ``n_b`` are full, the one holding ``n_b``
    is partial (its ``mask_mod`` masks the padding), the others are skipped."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, tokens = len(layout.grids), layout.num_tokens
    counts = torch.tensor([g.num_tokens for g in layout.grids], device=device)
    q_blocks = kv_blocks = -(-tokens // BLOCK_SIZE)
    full = counts // BLOCK_SIZE  # key blocks holding real keys only
    partial_indices = torch.arange(kv_blocks, device=device).expand(batch, -1).clone()
    partial_indices[:, 0] = full.clamp(max=kv_blocks - 1)  # the block that holds the last real key, first

    def per_query_block(t: torch.Tensor) -> torch.Tensor:  # (B, ...) -> (B, 1, q_blocks, ...) int32
        return t[:, None, None].expand(batch, 1, q_blocks, *t.shape[1:]).to(torch.int32).contiguous()

    def mask_mod(b, h, q_idx, k_idx):
        return k_idx < counts[b]

    return BlockMask.from_kv_blocks(
        per_query_block((counts % BLOCK_SIZE > 0).long()), per_query_block(partial_indices),
        per_query_block(full), per_query_block(torch.arange(kv_blocks, device=device).expand(batch, -1)),
        BLOCK_SIZE=BLOCK_SIZE, mask_mod=mask_mod, seq_lengths=(tokens, tokens))
