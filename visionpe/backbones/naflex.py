"""timm ``NaFlexVit`` (``naflexvit_*``: a ViT whose embedding module ``embeds`` holds the patch projection, the class
and register tokens and the position table) with visionpe encodings, on image batches at any input size.

timm's blocks (a ViT ``Block``, or Eva's ``EvaBlock`` for RoPE, SwiGLU, grouped heads, gates), heads and pooling are
kept; a ViT block becomes :class:`~visionpe.backbones.vit.GridBlock`, an Eva block keeps its class with an
:class:`~visionpe.backbones.eva.EvaAttentionPE`. The forward is the ViT adapter's
(:class:`~visionpe.backbones.vit.GridTransformer`: ``forward_masked``, ``forward_batch`` for images of different sizes,
``forward_intermediates``), reading ``embeds``' projection (convolution or linear on patchified pixels) as its patch
embedding; prefix tokens never get a position, as timm's. timm's NaFlex inputs (a dict, or pre-patchified patches
with ``patch_coord``/``patch_valid``) are refused with what to use instead: ``forward_batch`` runs images of mixed
sizes and aspect ratios in one padded batch, each on its own grid.

The architecture's own encoding (``pe="native"``; :func:`native_naflex`): the learned ``pos_embed`` (``(1, H, W, D)``,
patches only) is ``learned`` with timm's resampling (its ``pos_embed_interp_mode``, ``pos_embed_antialias``,
``pos_embed_align_corners``); the factorized ``pos_embed_y``/``pos_embed_x`` are ``learned(factorized=True)``, resampled
linearly per axis without antialiasing, as timm; its RoPE (``rope_type`` ``axial``, ``mixed``, ``dinov3``, ``mrope``)
is the Eva adapter's (:func:`~visionpe.backbones.eva.native_rope`), mixed RoPE taking over each block's frequencies.
With ``pos_embed_ar_preserving`` (the ``par``, ``parfac`` and RADIO models: timm resamples the table to a square of the
grid's longer side and crops it) either table is ``learned(fit="square_crop")``.
"""
from __future__ import annotations

import torch
from timm.models.eva import EvaBlock
from timm.models.naflexvit import NaFlexVit, batch_patchify
from torch import nn

from ..attention import Attention
from ..encoding import ModelContext
from ..weights.convert import LoadReport
from .._compat import ADAPTER_MIN_TIMM, timm_release
from .adapter import (GLOBAL_REFUSES, Adapter, EncodingSet, build_tokens, check_input, check_model_sizes,
                      native_before_patching, recorded_native, register_adapter)
from .eva import EvaAttentionPE, native_rope_of, take_over_mixed
from .vit import GridTransformer, grid_block, split_layer_freqs, vit_features

NAFLEX_INPUT = ("the visionpe NaFlexVit takes image batches (B, C, H, W); for images of different sizes and aspect "
                "ratios in one batch use model.forward_batch(list of (C, H, W) images), each on its own grid "
                "(timm's NaFlex dict / patch_coord inputs are not taken)")


class NaFlexPatches:
    """What the ViT forward reads as its patch embedding, over timm's ``NaFlexEmbeds``: images ``(B, C, H, W)`` ->
    ``(B, H / p, W / p, D)`` through its convolution, or its patchify, input norm and linear projection, then its
    norm (the module's own weights; nothing of its own)."""

    def __init__(self, embeds: nn.Module):
        self.embeds = embeds
        self.patch_size = tuple(embeds.patch_size)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        embeds = self.embeds
        if embeds.is_linear:
            patches, grid = batch_patchify(x, self.patch_size, pad=False, channels_last=embeds.channels_last)
            if embeds.norm_input is not None:
                patches = embeds.norm_input(patches)
            x = embeds.proj(patches).unflatten(1, grid)  # (B, H, W, D)
        else:
            x = embeds.proj(x).permute(0, 2, 3, 1)
        return embeds.norm(x)


class NaFlexVitPE(GridTransformer, NaFlexVit):
    """timm ``NaFlexVit`` whose position comes from visionpe encodings, at any input size (:class:`GridTransformer`);
    ``naflex_native`` records the model's own encoding as timm built it (``(pe, pe_kwargs)``, or why visionpe cannot
    reproduce it)."""

    naflex_native: tuple[str, dict] | str | None = None

    @property
    def patch_embed(self) -> NaFlexPatches:
        return NaFlexPatches(self.embeds)

    @property
    def pos_drop(self) -> nn.Module:
        return self.embeds.pos_drop

    def prefix_tokens(self) -> list[torch.Tensor]:
        return [t for t in (self.embeds.cls_token, self.embeds.reg_token) if t is not None]

    def check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{NAFLEX_INPUT}; got a {type(x).__name__}")
        proj = self.embeds.proj
        in_chans = proj.in_channels if isinstance(proj, nn.Conv2d) else self.in_chans
        check_input(x, self.patch_embed.patch_size, in_chans, type(self).__name__, proj.weight.dtype)

    def forward(self, x, *args, patch_coord=None, patch_valid=None, **kwargs) -> torch.Tensor:
        if patch_coord is not None or patch_valid is not None:
            raise ValueError(NAFLEX_INPUT)
        return super().forward(x, *args, **kwargs)


def native_naflex(model: NaFlexVit) -> tuple[str, dict]:
    """``(pe, pe_kwargs)`` reproducing timm's position encoding of the NaFlexVit ``model``: its RoPE
    (:func:`~visionpe.backbones.eva.native_rope`) and its learned table (``learned``, joint or factorized, with timm's
    resampling: ``fit="square_crop"`` for ``pos_embed_ar_preserving``), or ``none``; a ``ValueError`` saying why for
    one visionpe cannot reproduce. A patched model answers
    with what it had when it was patched."""
    recorded = recorded_native(model, "naflex_native")
    if recorded is not None:
        return recorded
    names, kwargs = native_rope_of(model)
    embeds = model.embeds
    if embeds.pos_embed_type in ("learned", "factorized"):
        names.append("learned")
        kwargs.update(dict(factorized=True, interpolation="bilinear", antialias=False)
                      if embeds.pos_embed_type == "factorized" else
                      dict(interpolation=embeds.pos_embed_interp_mode, antialias=embeds.pos_embed_antialias,
                           align_corners=bool(embeds.pos_embed_align_corners)))
        if embeds.pos_embed_ar_preserving:
            kwargs["fit"] = "square_crop"
    return "+".join(names) or "none", kwargs


def apply_naflex(model: NaFlexVit, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a timm ``NaFlexVit`` in place: ``embeds``' table gives way to
    the tokens encoding (a ``learned`` table of its form takes it over), timm's RoPE to each block's rotary encoding (a
    ``rope_mixed`` takes each block's frequencies of timm's mixed RoPE); every other weight is kept."""
    native = native_before_patching(model, native_naflex)
    embeds = model.embeds
    if embeds.pos_embed_grid_size is None:
        raise ValueError("NaFlexVit built without img_size (or pos_embed_grid_size) has no training grid for the "
                         "encodings; build it with img_size=...")
    first = model.blocks[0].attn
    head_dim = first.head_dim if hasattr(first, "head_dim") else first.proj.in_features // first.num_heads
    context = ModelContext(tuple(embeds.pos_embed_grid_size), model.embed_dim, first.num_heads, head_dim,
                           depth=len(model.blocks), num_registers=model.num_reg_tokens)
    joint = embeds.pos_embed.flatten(1, 2) if isinstance(embeds.pos_embed, nn.Parameter) else None
    model.pe_tokens = build_tokens(names, kwargs, context, joint, getattr(model, "pe_tokens", None))
    take_over_factorized(model.pe_tokens, embeds)
    embeds.pos_embed = embeds.pos_embed_y = embeds.pos_embed_x = None
    embeds.pos_embed_type = "none"
    rope = getattr(model, "rope", None)
    mixed = rope.freqs.detach() if getattr(model, "rope_is_mixed", False) else None
    encodings = EncodingSet(names, kwargs)
    for layer, block in enumerate(model.blocks):
        rotary = encodings.block("rotary", context, getattr(block.attn, "rotary", None))
        bias = encodings.block("bias", context, getattr(block.attn, "bias", None))
        if mixed is not None:
            take_over_mixed(rotary, mixed[:, layer], rope.grid_indexing)
        if isinstance(block, EvaBlock):
            block.attn = EvaAttentionPE(block.attn, rotary, bias)
        else:
            grid_block(block, rotary, bias)
    model.rope, model.rope_is_mixed, model.naflex_native = None, False, native


@torch.no_grad()
def take_over_factorized(tokens: nn.Module | None, embeds: nn.Module) -> None:
    """timm's factorized ``pos_embed_y (1, H, D)`` and ``pos_embed_x (1, W, D)`` go into a factorized ``learned``
    table of the same grid (its ``axis_tables``)."""
    if embeds.pos_embed_y is None or not hasattr(tokens, "axis_tables"):
        return
    for table, source in zip(tokens.axis_tables, (embeds.pos_embed_y[0], embeds.pos_embed_x[0])):
        if table.shape == source.shape:
            table.copy_(source)


def naflex_keys(state: dict, report: LoadReport) -> dict:
    """timm ``NaFlexVit`` checkpoints: ``embeds.pos_embed (1, H, W, D)`` -> the ``pos_embed`` rows that
    :func:`~visionpe.load_timm_checkpoint` reads into a ``learned`` table, the factorized ``embeds.pos_embed_y``/``_x``
    -> its ``axis_tables``, a mixed RoPE's ``rope.freqs`` -> each block's."""
    out = {}
    for key, value in state.items():
        if key == "embeds.pos_embed":
            out["pos_embed"] = value.flatten(1, 2)
            report.converted.append(f"{key} {tuple(value.shape)} -> pos_embed {tuple(out['pos_embed'].shape)}")
        elif key in ("embeds.pos_embed_y", "embeds.pos_embed_x"):
            new_key = f"pe_tokens.axis_tables.{0 if key.endswith('y') else 1}"
            out[new_key] = value[0]
            report.converted.append(f"{key} -> {new_key}")
        elif key == "rope.freqs" and value.ndim == 4:
            out.update(split_layer_freqs(value, report))
        else:
            out[key] = value
    return out


def any_size_naflex(timm_kwargs: dict) -> dict:
    """A patched NaFlexVit runs at any size by itself; its model sizes are checked (:func:`check_model_sizes`)."""
    check_model_sizes(timm_kwargs)
    return timm_kwargs


if timm_release() >= ADAPTER_MIN_TIMM["NaFlexVit"]:  # older timm lacks what the adapter reads
    register_adapter(Adapter(NaFlexVit, NaFlexVitPE, apply_naflex, (Attention, EvaAttentionPE),
                             timm_modules=("naflexvit",), any_size=any_size_naflex, native=native_naflex,
                             refuses=GLOBAL_REFUSES, feature_cfg=vit_features, checkpoint_hooks=(naflex_keys,),
                             examples=("naflexvit_base_patch16_gap", "naflexvit_base_patch16_siglip")))
