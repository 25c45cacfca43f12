"""timm ``VisionTransformerRelPos`` (``vit_relpos_*``, ``vit_srelpos_*``: a ViT whose only position is a relative bias
in every attention) with visionpe encodings, at any input size.

timm's blocks (``RelPosBlock``, the post-norm ``ResPostRelPosBlock``), layer scale and heads are kept; each block
becomes :class:`GridRelPosBlock` or :class:`GridResPostRelPosBlock` (its forward takes the token layout) and its
``RelPosAttention`` a :class:`visionpe.Attention` (the same ``qkv``, ``q_norm``, ``k_norm``, ``proj`` under the same
names). The forward is the ViT adapter's (:class:`~visionpe.backbones.vit.GridTransformer`).

The architecture's own encoding (``pe="native"``, the default of ``vpe_vit_relpos_*``; :func:`native_relpos`): timm's
``RelPosMlp`` in its default ``cr`` mode (every registered ``vit_relpos_*``) is ``cpb(mode="cr")`` with the block's MLP
(an MLP on ``sign(d) ln(1 + |d|)`` of the offsets, evaluated on any grid's offsets as timm's ``set_input_size``
does); ``RelPosBias`` (``rel_pos_type="bias"``) is ``rel_bias`` taking over the table, resized to every grid with BEiT's
geometric resize (``grow="fit"``, ``interpolation="geometric"``, timm's ``set_window_size``). No native equivalent,
though any other encoding replaces them: ``RelPosMlp(mode="swin")`` (``rel_pos_type="mlp_swin"``; timm normalises its
offsets by each new grid, visionpe's ``cpb`` by the training window), and a table or MLP shared by all blocks
(``shared_rel_pos=True``: ``vit_srelpos_*``).
"""
from __future__ import annotations

import re

import torch
from timm.layers import RelPosBias, RelPosMlp
from timm.models.vision_transformer_relpos import RelPosBlock, ResPostRelPosBlock, VisionTransformerRelPos
from torch import nn

from ..attention import Attention
from ..bias import ContinuousPositionBias, RelBias
from ..grid import Layout
from ..weights.convert import LoadReport
from .adapter import GLOBAL_REFUSES, Adapter, native_before_patching, recorded_native, register_adapter
from .vit import (GridTransformer, ScriptedBlock, ScriptedGridForward, TablesFromEachGrid, any_size_checked,
                  put_block_encodings, scripted_attention, vit_features)


class GridRelPosBlock(RelPosBlock):
    """timm ``RelPosBlock`` whose forward takes the token layout: ``block(x, layout, attn_mask=None)``."""

    def forward(self, x: torch.Tensor, layout: Layout, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), layout, attn_mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class GridResPostRelPosBlock(ResPostRelPosBlock):
    """timm ``ResPostRelPosBlock`` (post-norm) whose forward takes the token layout."""

    def forward(self, x: torch.Tensor, layout: Layout, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop_path1(self.norm1(self.attn(x, layout, attn_mask)))
        return x + self.drop_path2(self.norm2(self.mlp(x)))


GRID_BLOCKS = {RelPosBlock: GridRelPosBlock, ResPostRelPosBlock: GridResPostRelPosBlock}


class VisionTransformerRelPosPE(TablesFromEachGrid, GridTransformer, VisionTransformerRelPos):
    """timm ``VisionTransformerRelPos`` whose position comes from visionpe encodings, at any input size
    (:class:`GridTransformer`); ``relpos_native`` records the model's own encoding as timm built it (``(pe,
    pe_kwargs)``, or why visionpe cannot reproduce it)."""

    relpos_native: tuple[str, dict] | str | None = None

    def scripted_block(self, block: nn.Module, where: str) -> ScriptedBlock:
        return ScriptedBlock(block, scripted_attention(block.attn, f"{where}.attn"),
                             isinstance(block, GridResPostRelPosBlock))

    def __prepare_scriptable__(self) -> "ScriptedVisionTransformerRelPos":
        return ScriptedVisionTransformerRelPos.of(self)


class ScriptedVisionTransformerRelPos(ScriptedGridForward, VisionTransformerRelPos):
    """What ``torch.jit.script`` compiles for a :class:`VisionTransformerRelPosPE`
    (:class:`~visionpe.backbones.vit.ScriptedGridForward`)."""


SHARED = ("timm's VisionTransformerRelPos with one relative position module shared by all blocks (shared_rel_pos=True, "
          "vit_srelpos_*): visionpe gives each block its own, so it has no native equivalent; use --pe timm_unpatched, or "
          "another pe")
SWIN_MODE = ("timm's RelPosMlp(mode='swin') in a VisionTransformerRelPos normalises its offsets by each new grid, "
             "visionpe's cpb by the training window: no native equivalent; use --pe timm_unpatched, or another pe")


def native_relpos(model: VisionTransformerRelPos) -> tuple[str, dict]:
    """``(pe, pe_kwargs)`` reproducing timm's relative position module of the model's blocks: ``cpb(mode="cr")``
    (``RelPosMlp``, its hidden width), ``rel_bias`` (``RelPosBias``, resized to each grid once taken over:
    :func:`take_over`), or ``none``; a ``ValueError`` saying why for one visionpe cannot reproduce. A patched model
    answers with what it had when it was patched."""
    recorded = recorded_native(model, "relpos_native")
    if recorded is not None:
        return recorded
    if getattr(model, "shared_rel_pos", None) is not None:
        raise ValueError(SHARED)
    rel_pos = model.blocks[0].attn.rel_pos if len(model.blocks) else None
    if rel_pos is None:
        return "none", {}
    if isinstance(rel_pos, RelPosMlp):
        mode = mlp_mode(rel_pos)
        if mode != "cr":
            raise ValueError(SWIN_MODE if mode == "swin" else
                             f"timm's RelPosMlp(mode={mode!r}) has no visionpe equivalent; use --pe timm_unpatched")
        return "cpb", {"mode": "cr", "hidden_dim": rel_pos.mlp.fc1.out_features}
    if isinstance(rel_pos, RelPosBias):
        return "rel_bias", {"grow": "fit"}
    raise ValueError(f"timm's {type(rel_pos).__name__} has no visionpe equivalent; use --pe timm_unpatched, or another pe")


def mlp_mode(rel_pos: RelPosMlp) -> str:
    """The mode of timm's ``RelPosMlp`` (a timm that does not record it: ``swin`` squashes by a sigmoid, ``cr`` does
    not)."""
    mode = getattr(rel_pos, "mode", None)
    return mode or ("swin" if isinstance(rel_pos.bias_act, nn.Sigmoid) else "cr")


@torch.no_grad()
def take_over(bias: nn.Module | None, rel_pos: nn.Module | None) -> None:
    """A block's ``RelPosMlp`` goes into a ``cpb`` of the same mode and widths (``mlp.fc1``/``fc2`` ->
    ``cpb_mlp.0``/``cpb_mlp.2``), its ``RelPosBias`` table into a ``rel_bias`` of the same grid (the offset rows, and
    the class-token rows where it has them), which from then on resizes it geometrically to each grid."""
    if isinstance(rel_pos, RelPosMlp) and isinstance(bias, ContinuousPositionBias) and bias.mode == mlp_mode(rel_pos):
        fc1, fc2 = rel_pos.mlp.fc1, rel_pos.mlp.fc2
        ours = bias.cpb_mlp
        if ours[0].weight.shape == fc1.weight.shape and ours[2].weight.shape == fc2.weight.shape:
            ours[0].weight.copy_(fc1.weight), ours[0].bias.copy_(fc1.bias)
            ours[2].weight.copy_(fc2.weight)
            if ours[2].bias is not None and fc2.bias is not None:
                ours[2].bias.copy_(fc2.bias)
    elif isinstance(rel_pos, RelPosBias) and isinstance(bias, RelBias) \
            and tuple(bias.window_size) == tuple(rel_pos.window_size):
        table = rel_pos.relative_position_bias_table  # ((2H-1)(2W-1) [+ 3], heads)
        bias.relative_position_bias_table[:table.shape[0]].copy_(table)
        bias.interpolation, bias.grow = "geometric", "fit"


def apply_relpos(model: VisionTransformerRelPos, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a timm ``VisionTransformerRelPos`` in place: each block's
    relative position module gives way to the bias encoding (a matching ``cpb`` or ``rel_bias`` takes it over), the
    shared one goes; each attention becomes a :class:`visionpe.Attention`; every other weight is kept."""
    native = native_before_patching(model, native_relpos)
    # what the ViT forward reads and timm's model does not have: no pos_embed, registers, pre-norm, patch dropout,
    # attention pooling or position dropout
    model.pos_embed, model.no_embed_class, model.reg_token = None, False, None
    model.norm_pre, model.pos_drop, model.patch_drop, model.attn_pool = nn.Identity(), nn.Identity(), None, None

    def patch_block(block: nn.Module, rotary, bias) -> None:
        base = next((b for b in GRID_BLOCKS if isinstance(block, b)), None)
        if base is None:
            raise ValueError(f"block type {type(block).__name__} is not supported; supported timm blocks: "
                             f"{', '.join(b.__name__ for b in GRID_BLOCKS)}")
        take_over(bias, getattr(block.attn, "rel_pos", None))
        block.__class__ = GRID_BLOCKS[base]
        block.attn = Attention.from_timm(block.attn, rotary, bias)

    put_block_encodings(model, names, kwargs, patch_block)
    model.shared_rel_pos, model.relpos_native = None, native


RELPOS_MLP = re.compile(r"^(blocks\.\d+\.attn)\.rel_pos\.mlp\.fc([12])\.(weight|bias)$")
RELPOS_TABLE = re.compile(r"^(blocks\.\d+\.attn)\.rel_pos\.relative_position_bias_table$")


def relpos_keys(state: dict, report: LoadReport) -> dict:
    """timm ``VisionTransformerRelPos`` checkpoints: each block's ``attn.rel_pos.mlp.fc1``/``fc2`` -> the
    attention's ``cpb_mlp.0``/``cpb_mlp.2`` and ``attn.rel_pos.relative_position_bias_table`` -> the attention's
    table (three zero class-token rows appended where the model has no class token: ``rel_bias`` keeps BEiT's
    layout), which :func:`~visionpe.load_timm_checkpoint` then puts into the bias."""
    out = {}
    for key, value in state.items():
        mlp, table = RELPOS_MLP.match(key), RELPOS_TABLE.match(key)
        if mlp:
            new_key = f"{mlp.group(1)}.cpb_mlp.{0 if mlp.group(2) == '1' else 2}.{mlp.group(3)}"
        elif table:
            new_key = f"{table.group(1)}.relative_position_bias_table"
            if value.shape[0] % 2:  # (2H-1)(2W-1) rows, no class-token entries
                value = torch.cat([value, value.new_zeros(3, value.shape[1])])
        else:
            out[key] = value
            continue
        report.converted.append(f"{key} -> {new_key}")
        out[new_key] = value
    return out


register_adapter(Adapter(VisionTransformerRelPos, VisionTransformerRelPosPE, apply_relpos, (Attention,),
                         timm_modules=("vision_transformer_relpos",), any_size=any_size_checked, native=native_relpos,
                         refuses=GLOBAL_REFUSES, feature_cfg=vit_features,
                         examples=("vit_relpos_small_patch16_224", "vit_relpos_medium_patch16_cls_224"),
                         unsupported={"vit_srelpos_*": SHARED}, checkpoint_hooks=(relpos_keys,)))
