"""Hugging Face transformers' Qwen3-VL vision tower (``Qwen3VLVisionModel``, transformers 5's, which returns
``BaseModelOutputWithDeepstackFeatures``; 4.57's returns a tuple and is not registered) with visionpe encodings.

The tower takes every image (and video) of a call packed in one sequence: ``hidden_states: (total_patches,
C * temporal_patch_size * patch_size ** 2)`` and ``grid_thw: (num_images, 3)``, each image's ``t * h * w`` patches
frame by frame, each frame in ``spatial_merge_size x spatial_merge_size`` merge windows (the processor's order,
:func:`~visionpe.presets.merge_windows`), and each frame attends to itself only (transformers' ``cu_seqlens``). The
patched model keeps all of it: its forward embeds the patches (``patch_embed``, a Conv3d), and every block's
:class:`~visionpe.backbones.hf.GridAttention` (transformers' fused ``qkv`` and ``proj``) runs once per distinct
frame grid over the frames that have it, gathered into a batch of row-major ``Grid((h, w))`` sequences
(:class:`PackedFrames`): positions travel with the tokens, so the result is that of the model's order, and each
encoding sees the grid of its own frame. The blocks' norms and MLPs, the DeepStack mergers and the final patch
merger run on the packed sequence, unchanged. ``pos_embed`` (a square table) and ``rotary_pos_emb`` are removed.

``pe="native"`` is the ``qwen3_vl`` preset built for the model: ``learned`` taking over ``pos_embed``
(``grid_shape`` its side, bilinear, ``align_corners=True``, no antialias) and ``rope_axial`` with Qwen's conventions
(``theta`` the config's ``rope_theta``, rotate-half, h pairs then w pairs, integer positions): the outputs equal
transformers' at every image size. A ``learned`` table put in resizes as Qwen's does unless told otherwise. Video
frames share the spatial positions and never attend to each other, so no encoding gives time a position here.

Outputs: ``BaseModelOutputWithDeepstackFeatures`` as transformers': ``last_hidden_state`` (the last block's output,
packed, merge-window order), ``pooler_output`` (the merger's ``(total_patches / merge ** 2, out_hidden_size)``),
``deepstack_features`` and, when asked, ``hidden_states`` (the embeddings, then each block's output; indices select,
as transformers' ``output_hidden_states``) and ``attentions`` (``output_attentions=True``: per block, the softmax
probabilities of each distinct frame grid, ``(frames, heads, h * w, h * w)`` over its frames' row-major tokens, the
grids in the order of their first frame; transformers' SDPA attention gives none).
Precomputed ``cu_seqlens``, ``position_ids`` or interpolation indices in the keywords are ignored:
every layout is read from ``grid_thw``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.qwen3_vl.modeling_qwen3_vl import (BaseModelOutputWithDeepstackFeatures,
                                                            Qwen3VLVisionBlock, Qwen3VLVisionModel)

from ..coords import shares_draws
from ..encoding import ModelContext, constructor_keywords
from ..grid import Grid
from ..presets import PRESETS, merge_windows
from ..registry import ENCODINGS
from .adapter import GLOBAL_REFUSES, Adapter, EncodingSet, build_tokens, register_adapter
from .hf import (CheckpointsCarryDraws, GridAttention, init_weights, projections, put_attention, selected_indices,
                 swap_class, unsupported_attention)
from .hf_pretrained import PretrainedPositionalModel, register_conversions

PRESET = "qwen3_vl"
# how Qwen3-VL resizes its table (the preset's conventions less the sizes): a learned table's defaults here
TABLE_RESIZE = {k: v for k, v in PRESETS[PRESET].encodings["tokens"][1].items() if k not in ("grid_shape", "ndim")}


@dataclass(frozen=True, eq=False)
class PackedFrames:
    """The frames of one packed call (one attention segment each), grouped by grid: ``groups`` holds per distinct
    ``(h, w)`` a ``(rows, grid)`` pair, ``rows: (frames, h * w)`` the packed index of each frame's patches in
    row-major order; ``inverse: (total_patches,)`` puts the groups' tokens, concatenated, back in the packed order."""

    groups: tuple[tuple[torch.Tensor, Grid], ...]
    inverse: torch.Tensor

    @classmethod
    def of(cls, grid_thw: torch.Tensor, merge: int, device=None) -> "PackedFrames":
        """The frames of ``grid_thw: (num_images, 3)`` (``t, h, w`` each) whose patches come in ``merge x merge``
        windows, frame by frame (transformers' order)."""
        starts: dict[tuple[int, int], list[int]] = {}  # (h, w) -> the packed start of each frame of that grid
        start = 0
        for t, h, w in grid_thw.tolist():
            for _ in range(t):
                starts.setdefault((h, w), []).append(start)
                start += h * w
        groups = []
        for shape, firsts in starts.items():
            grid = Grid(shape)
            row_major = merge_windows(grid, merge).argsort()  # patch j (row-major) sits at row_major[j] in its frame
            groups.append(((torch.tensor(firsts)[:, None] + row_major).to(device), grid))
        order = torch.cat([rows.flatten() for rows, _ in groups])
        return cls(tuple(groups), order.argsort())

    def per_frame(self, fn, x: torch.Tensor) -> torch.Tensor:
        """``x: (total_patches, D)`` with ``fn(frames, grid) -> (F, h * w, D')`` applied to each group's frames
        ``(F, h * w, D)`` (row-major): ``(total_patches, D')`` in the packed order."""
        return torch.cat([fn(x[rows], grid).flatten(0, 1) for rows, grid in self.groups])[self.inverse]

    def attend(self, attention: GridAttention, x: torch.Tensor, weights: list | None = None) -> torch.Tensor:
        """Each frame's attention over its own tokens, with the block's encodings on the frame's grid; ``weights``
        (a list) gets each group's probabilities ``(frames, heads, h * w, h * w)`` when given."""
        def frame_attention(frames: torch.Tensor, grid: Grid) -> torch.Tensor:
            out, probabilities = attention(frames, grid, output_attentions=weights is not None)
            if weights is not None:
                weights.append(probabilities)
            return out
        return self.per_frame(frame_attention, x)


class GridQwen3VLVisionBlock(CheckpointsCarryDraws, Qwen3VLVisionBlock):
    """transformers ``Qwen3VLVisionBlock`` (``norm1``, attention, residual; ``norm2``, ``mlp``, residual) whose
    attention runs frame by frame: ``block(x, frames, weights=None) -> x`` with ``x: (total_patches, dim)`` packed;
    ``weights`` (a list) gets the attention probabilities of each frame grid."""

    def forward(self, hidden_states: torch.Tensor, frames: PackedFrames, weights: list | None = None) -> torch.Tensor:
        hidden_states = hidden_states + frames.attend(self.attn, self.norm1(hidden_states), weights)
        return hidden_states + self.mlp(self.norm2(hidden_states))


def check_packed(model: Qwen3VLVisionModel, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> None:
    """A clear error for a call the tower cannot take: ``grid_thw`` ``(num_images, 3)`` of positive integers, ``h`` and
    ``w`` multiples of the merge size, ``hidden_states`` ``(sum t * h * w, C * T * p * p)`` floating."""
    merge, embed = model.spatial_merge_size, model.patch_embed
    width = embed.in_channels * embed.temporal_patch_size * embed.patch_size ** 2
    if not isinstance(grid_thw, torch.Tensor) or grid_thw.ndim != 2 or grid_thw.shape[1] != 3 \
            or grid_thw.is_floating_point() or grid_thw.numel() == 0 or bool((grid_thw <= 0).any()):
        raise ValueError(f"grid_thw must be a (num_images, 3) integer tensor of positive (t, h, w) patch counts, got "
                         f"{grid_thw!r}")
    if bool((grid_thw[:, 1:] % merge).any()):
        raise ValueError(f"grid_thw's h and w must be multiples of spatial_merge_size={merge}, got "
                         f"{grid_thw.tolist()}")
    total = int(grid_thw.prod(dim=1).sum())
    if not isinstance(hidden_states, torch.Tensor) or not hidden_states.is_floating_point() \
            or tuple(hidden_states.shape) != (total, width):
        got = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states).__name__
        raise ValueError(f"hidden_states must be the packed patches, a floating (total_patches={total}, "
                         f"C * temporal_patch_size * patch_size ** 2={width}) tensor for grid_thw "
                         f"{grid_thw.tolist()}, got {got}")


class Qwen3VLVisionModelPE(PretrainedPositionalModel, Qwen3VLVisionModel):
    """transformers ``Qwen3VLVisionModel`` with visionpe encodings:
    ``forward(hidden_states, grid_thw, output_hidden_states=None, output_attentions=None, return_dict=None)`` ->
    ``BaseModelOutputWithDeepstackFeatures`` (or its tuple), as transformers' (module docstring)."""

    pe_tokens: nn.Module | None

    def add_tokens(self, x: torch.Tensor, frames: PackedFrames) -> torch.Tensor:
        """The tokens encoding on each frame's grid."""
        return frames.per_frame(self.pe_tokens, x)

    @shares_draws
    def forward(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor, output_hidden_states=None,
                output_attentions: bool | None = None, return_dict: bool | None = None, **kwargs):
        config = self.config
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = config.return_dict if return_dict is None else return_dict
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        check_packed(self, hidden_states, grid_thw)
        frames = PackedFrames.of(grid_thw, self.spatial_merge_size, hidden_states.device)
        x = self.patch_embed(hidden_states)  # (total_patches, dim), transformers' packed order
        tokens = self.pe_tokens
        keep = selected_indices(output_hidden_states, len(self.blocks) + 1)
        states, deepstack = [] if output_hidden_states else None, []
        attentions = [] if output_attentions else None
        for i, block in enumerate(self.blocks):
            if tokens is not None and i == tokens.block_index:
                x = self.add_tokens(x, frames)
            if states is not None:
                states.append(x if keep is None or i in keep else None)
            weights = [] if attentions is not None else None
            x = block(x, frames, weights)
            if attentions is not None:
                attentions.append(tuple(weights))
            if i in self.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)](x))
        if states is not None:
            states.append(x if keep is None or len(self.blocks) in keep else None)
        out = BaseModelOutputWithDeepstackFeatures(last_hidden_state=x, pooler_output=self.merger(x),
                                                   hidden_states=None if states is None else tuple(states),
                                                   attentions=None if attentions is None else tuple(attentions),
                                                   deepstack_features=deepstack)
        return out if return_dict else out.to_tuple()


def native_qwen3_vl(model: Qwen3VLVisionModel) -> tuple[str, dict]:
    """The ``qwen3_vl`` preset for the model's table side and ``rope_theta``."""
    side = model.num_grid_per_side
    return f"preset:{PRESET}", dict(grid_shape=(side, side), theta=float(model.config.rope_parameters["rope_theta"]))


def apply_qwen3_vl(model: Qwen3VLVisionModel, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a transformers Qwen3-VL vision tower in place: the tokens
    encoding (a ``learned`` one taking over ``pos_embed``), each block's attention with its rotary and bias
    encodings."""
    blocks = model.blocks
    for block in blocks:
        if not isinstance(block, Qwen3VLVisionBlock):
            raise ValueError(f"block type {type(block).__name__} is not supported; supported: Qwen3VLVisionBlock")
        if projections(block.attn) is None:
            raise unsupported_attention(block.attn)
    found = projections(blocks[0].attn)
    side = model.num_grid_per_side
    context = ModelContext((side, side), model.config.hidden_size, found.num_heads, found.head_dim,
                           depth=len(blocks))
    table = None if model.pos_embed is None else model.pos_embed.weight[None]  # (1, side * side, dim), row-major
    defaults = {k: v for k, v in TABLE_RESIZE.items()
                if "tokens" in names and k in constructor_keywords(ENCODINGS[names["tokens"]])}
    model.pe_tokens = build_tokens(names, kwargs, context, table, getattr(model, "pe_tokens", None), **defaults)
    model.pos_embed, model.rotary_pos_emb = None, None
    encodings = EncodingSet(names, kwargs)
    for block in blocks:
        swap_class(block, GridQwen3VLVisionBlock)
        put_attention(block, encodings.block("rotary", context, getattr(block.attn, "rotary", None)),
                      encodings.block("bias", context, getattr(block.attn, "bias", None)), name="attn")


register_adapter(Adapter(Qwen3VLVisionModel, Qwen3VLVisionModelPE, apply_qwen3_vl, (GridAttention,),
                         library="transformers", native=native_qwen3_vl, refuses=GLOBAL_REFUSES,
                         init_weights=init_weights))
register_conversions(Qwen3VLVisionModelPE, Qwen3VLVisionModel)
