"""timm ``VisionTransformerSAM`` (ViTDet / Segment Anything's image encoder: ``samvit_*``) with visionpe encodings,
at any input size.

timm's blocks are kept, with their window partition: a block with ``window_size > 0`` attends inside padded
``window_size`` x ``window_size`` windows, the others (``global_attn_indexes``) over the whole feature map. Each
block's attention becomes :class:`SamAttentionPE` (a :class:`visionpe.Attention` on the same ``qkv``, ``q_norm``,
``k_norm`` and ``proj``) whose grid is the map it is given: the window in a windowed block (as a Swin window, fixed),
the patch grid in a global one (any size). The tokens encoding replaces ``pos_embed`` on the ``(H, W)`` patch grid;
the forward (:class:`VisionTransformerSAMPE`), its neck and head are timm's otherwise.

The architecture's own encoding (``pe="native"``; :func:`native_sam`): the absolute ``pos_embed`` (``use_abs_pos``,
resampled bicubically with antialiasing at other sizes, as timm's ``resample_abs_pos_embed_nhwc``) is ``learned``;
timm's ``use_rope`` (a ``RotaryEmbeddingCat`` for the global blocks and one for the windows) is ``rope_axial`` with
the same temperature and layout, each block with its own ``ref_feat_shape`` (``scaling="pi"``); ViTDet's decomposed
relative positions (``use_rel_pos``, every registered ``samvit_*``: the query times a learned table per axis, ``q .
R_h[dh] + q . R_w[dw]``) are ``decomposed_rel_pos`` (:class:`~visionpe.bias.DecomposedRelPos`, a bias that reads the
queries), each block's ``rel_pos_h`` and ``rel_pos_w`` taken over as they are (a windowed block's for its window, a
global block's for the patch grid, resampled linearly at other sizes as timm's ``get_rel_pos``). Any fitting encoding
replaces them instead, every other weight kept.
"""
from __future__ import annotations

import torch
from timm.models._features import feature_take_indices
from timm.models.vision_transformer_sam import Block, VisionTransformerSAM
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..attention import Attention
from ..bias import DecomposedRelPos
from ..coords import shares_draws, with_draws
from ..encoding import ModelContext
from ..grid import Grid
from ..weights.convert import LoadReport
from .adapter import (Adapter, EncodingSet, PositionalModel, build_tokens, check_img_size, check_model_sizes,
                      native_before_patching, recorded_native, register_adapter)
from .eva import native_rope
from .vit import check_block_indices, vit_features

SAM_REFUSES = {"swin_bias": "needs window attention (Swin); a VisionTransformerSAM's global blocks see the whole map "
                            "at any size: use rel_bias, cpb or alibi"}


class SamAttentionPE(Attention):
    """timm's SAM ``Attention`` as a :class:`visionpe.Attention` (its modules under their names) that takes timm's
    ``(B, H, W, dim)`` map (a window, or the whole feature map) and gives its encodings ``Grid((H, W))``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (B, H, W, dim)`` -> ``(B, H, W, dim)``."""
        grid = Grid(tuple(x.shape[1:3]))
        return super().forward(x.flatten(1, 2), grid).unflatten(1, grid.shape)


class VisionTransformerSAMPE(PositionalModel, VisionTransformerSAM):
    """timm ``VisionTransformerSAM`` whose position comes from visionpe encodings, at any input size; the tokens
    encoding (``pe_tokens``) is added on the patch grid (a late one, PEG's, before its block). ``sam_native`` records
    the model's own encoding as timm built it (``(pe, pe_kwargs)``, or why visionpe cannot reproduce it)."""

    pe_tokens: nn.Module | None
    sam_native: tuple[str, dict] | str | None = None

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        groups = super().group_matcher(coarse)
        return {**groups, "stem": groups["stem"] + "|^pe_tokens"}

    def add_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (B, H, W, D)`` with the tokens encoding added on its ``(H, W)`` grid."""
        return self.pe_tokens(x.flatten(1, 2), Grid(tuple(x.shape[1:3]))).unflatten(1, x.shape[1:3])

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` -> the first block's input ``(B, H / p, W / p, D)`` with position."""
        self.check_input(x)
        x = self.patch_embed(x)
        if self.pe_tokens is not None and self.pe_tokens.block_index == 0:
            x = self.add_tokens(x)
        return self.norm_pre(self.patch_drop(self.pos_drop(x)))

    def run_blocks(self, x: torch.Tensor, blocks=None):
        """Run ``blocks`` (default all) on ``x: (B, H, W, D)``, yielding the map after each."""
        for i, block in enumerate(self.blocks if blocks is None else blocks):
            if self.pe_tokens is not None and 0 < self.pe_tokens.block_index == i:
                x = self.add_tokens(x)
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(with_draws(block), x, use_reentrant=False)
            else:
                x = block(x)
            yield x

    @shares_draws
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for x in self.run_blocks(self.embed(x)):
            pass
        return self.neck(x.permute(0, 3, 1, 2))

    @shares_draws
    def forward_intermediates(self, x: torch.Tensor, indices=None, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False):
        """timm's ``forward_intermediates`` of a SAM ViT (same arguments and outputs: ``(B, D, H, W)`` maps, the
        neck applied with ``norm``)."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt={output_fmt!r} is not supported; allowed values: 'NCHW'")
        check_block_indices(indices, len(self.blocks))
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        blocks = self.blocks[:max_index + 1] if stop_early else self.blocks
        intermediates = []
        for i, x in enumerate(self.run_blocks(self.embed(x), blocks)):
            if i in take_indices:
                y = x.permute(0, 3, 1, 2)
                intermediates.append(self.neck(y) if norm else y)
        if intermediates_only:
            return intermediates
        return self.neck(x.permute(0, 3, 1, 2)), intermediates


def native_sam(model: VisionTransformerSAM) -> tuple[str, dict]:
    """``(pe, pe_kwargs)`` reproducing timm's position encoding of the SAM ``model``: its RoPE (``rope_axial`` with
    timm's conventions, :func:`~visionpe.backbones.eva.native_rope`; each block's ``ref_feat_shape`` is given per
    block by :func:`apply_sam`), ViTDet's decomposed relative positions (``decomposed_rel_pos``; each block's tables
    taken over by :func:`apply_sam`) and its ``pos_embed`` (``learned``), or ``none``. A patched model answers with
    what it had when it was patched."""
    recorded = recorded_native(model, "sam_native")
    if recorded is not None:
        return recorded
    names, kwargs = [], {}
    if any(getattr(block.attn, "use_rel_pos", False) for block in model.blocks):
        names.append("decomposed_rel_pos")
    rope = getattr(model, "rope_global", None) or getattr(model, "rope_window", None)
    if rope is not None:
        rotary, kwargs = native_rope(rope)
        kwargs.pop("ref_shape", None)  # the global blocks' and the windows' differ: given per block
        names.append(rotary)
    if getattr(model, "pos_embed", None) is not None:
        names.append("learned")
    return "+".join(names) or "none", kwargs


def block_grid(block: Block, grid_shape: tuple[int, int]) -> tuple[int, int]:
    """The grid a SAM block's attention sees at the training size: its window, or the patch grid (a global block)."""
    return (block.window_size, block.window_size) if block.window_size > 0 else tuple(grid_shape)


def apply_sam(model: VisionTransformerSAM, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a timm ``VisionTransformerSAM`` in place: ``pos_embed``
    gives way to the tokens encoding (a ``learned`` table takes it over), the RoPE modules and decomposed tables to
    each block's rotary and bias encodings (a ``rope_axial`` with ``scaling="pi"`` takes timm's ``ref_feat_shape`` of
    the block's kind), each attention becomes :class:`SamAttentionPE`; every other weight is kept."""
    native = native_before_patching(model, native_sam)
    model.patch_embed.strict_img_size = False
    grid_shape = tuple(model.patch_embed.grid_size)
    first = model.blocks[0].attn
    context = ModelContext(grid_shape, model.embed_dim, first.num_heads, first.head_dim, depth=len(model.blocks))
    table = model.pos_embed.flatten(1, 2) if isinstance(getattr(model, "pos_embed", None), nn.Parameter) else None
    model.pe_tokens = build_tokens(names, kwargs, context, table, getattr(model, "pe_tokens", None))
    model.pos_embed = None
    encodings = EncodingSet(names, kwargs)
    pi = names.get("rotary") == "rope_axial" and kwargs.get("rope_axial", {}).get("scaling") == "pi"
    for block in model.blocks:
        if not isinstance(block, Block):
            raise ValueError(f"block type {type(block).__name__} is not supported; supported: timm's SAM Block")
        source = block.attn
        block_context = ModelContext(block_grid(block, grid_shape), model.embed_dim, source.num_heads,
                                     source.head_dim, depth=len(model.blocks))
        ref = getattr(getattr(source, "rope", None), "ref_feat_shape", None)
        rotary = encodings.block("rotary", block_context, getattr(source, "rotary", None),
                                 **({"ref_shape": tuple(ref)} if pi and ref is not None else {}))
        bias = encodings.block("bias", block_context, getattr(source, "bias", None))
        take_decomposed(bias, source)
        block.attn = SamAttentionPE.from_timm(source, rotary, bias)
    model.rope_global = model.rope_window = None
    model.sam_native = native


def take_decomposed(bias: nn.Module | None, source: nn.Module) -> None:
    """A :class:`~visionpe.bias.DecomposedRelPos` takes over timm's ``rel_pos_h`` and ``rel_pos_w`` of the attention
    ``source`` (ViTDet's ``use_rel_pos``) where they have its tables' shapes (built for the same grid)."""
    if not isinstance(bias, DecomposedRelPos) or not getattr(source, "use_rel_pos", False):
        return
    tables = {name: getattr(source, name) for name in ("rel_pos_h", "rel_pos_w")}
    if all(bias.get_parameter(name).shape == table.shape for name, table in tables.items()):
        bias.load_state_dict({name: table.detach() for name, table in tables.items()})


def sam_keys(state: dict, report: LoadReport) -> dict:
    """timm SAM checkpoints: the ``(1, H, W, D)`` ``pos_embed`` -> the ``(1, H * W, D)`` rows (row-major) that
    :func:`~visionpe.load_timm_checkpoint` reads into a ``learned`` table (from a state dict, whose ``pos_embed``
    it then takes for a square grid unless ``source_grid`` says otherwise)."""
    value = state.get("pos_embed")
    if value is None or value.ndim != 4:
        return state
    report.converted.append(f"pos_embed {tuple(value.shape)} -> {(1, value.shape[1] * value.shape[2], value.shape[3])}")
    return {**state, "pos_embed": value.flatten(1, 2)}


def sam_rel_pos_keys(state: dict, report: LoadReport) -> dict:
    """timm SAM checkpoints: each attention's ``rel_pos_h`` and ``rel_pos_w`` (ViTDet's decomposed tables) -> the
    attention's ``decomposed_rel_pos`` bias, ``attn.bias.rel_pos_h`` and ``attn.bias.rel_pos_w``, as they are."""
    renamed = {}
    for key, value in state.items():
        prefix, _, name = key.rpartition(".")
        if name in ("rel_pos_h", "rel_pos_w") and prefix.endswith(".attn"):
            renamed[f"{prefix}.bias.{name}"] = value
            report.converted.append(f"{key} -> {prefix}.bias.{name}")
        else:
            renamed[key] = value
    return renamed


def any_size_sam(timm_kwargs: dict) -> dict:
    """A SAM ViT runs at any size once patched (its patch embedding is not strict); ``img_size`` checked against
    ``patch_size``, the model sizes (:func:`check_model_sizes`)."""
    check_img_size(timm_kwargs)
    check_model_sizes(timm_kwargs)
    return timm_kwargs


register_adapter(Adapter(VisionTransformerSAM, VisionTransformerSAMPE, apply_sam, (SamAttentionPE,),
                         timm_modules=("vision_transformer_sam",), any_size=any_size_sam, native=native_sam,
                         refuses=SAM_REFUSES, feature_cfg=vit_features, checkpoint_hooks=(sam_keys, sam_rel_pos_keys),
                         examples=("samvit_base_patch16", "samvit_base_patch16_224")))
