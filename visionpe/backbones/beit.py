"""timm ``Beit`` (BEiT, BEiT v2: ``beit_*``, ``beitv2_*``) with visionpe encodings, at any input size.

timm's blocks, layer scale (``gamma_1``, ``gamma_2``), q/v biases and heads are kept; each block becomes
:class:`GridBeitBlock` (its forward takes the token layout) and its attention
:class:`~visionpe.backbones.eva.EvaAttentionPE` (BEiT's attention has Eva's fused ``qkv`` with ``q_bias``/``v_bias``
and a zero ``k_bias``: the same modules under the same names, so a timm BEiT state dict loads unchanged). The forward
is the ViT adapter's (:class:`~visionpe.backbones.vit.GridTransformer`): the class token is the prefix, the layout
goes to every block.

The architecture's own encoding (``pe="native"``, the default of ``vpe_beit*``; :func:`native_beit`): each block's
relative position table (``use_rel_pos_bias``) is ``rel_bias`` with BEiT's three class-token entries, taking over the
block's table and resizing it to any other grid, larger or smaller, with BEiT's geometric resize (``grow="fit"``,
``interpolation="geometric"``: timm's ``resize_rel_pos_bias_table``, what timm's ``set_input_size`` and checkpoint
filter call); the absolute ``pos_embed`` (``use_abs_pos_emb``) is ``learned``. A table shared by all blocks
(``use_shared_rel_pos_bias``, BEiT pre-training) has no native equivalent (visionpe gives each block its own), though
any other encoding replaces it.
"""
from __future__ import annotations

import torch
from timm.models.beit import Beit, Block
from torch import nn

from ..bias import RelBias
from ..grid import Layout
from .adapter import GLOBAL_REFUSES, Adapter, native_before_patching, recorded_native, register_adapter
from .eva import EvaAttentionPE, ScriptedEvaAttention
from .vit import (GridTransformer, ScriptedBlock, ScriptedGridForward, TablesFromEachGrid, any_size_checked,
                  put_block_encodings, scripted_attention, vit_features)


class GridBeitBlock(Block):
    """timm BEiT ``Block`` whose forward takes the token layout: ``block(x, layout, attn_mask=None)``; its layer scale
    (``gamma_1``, ``gamma_2``, or none) as timm's."""

    def forward(self, x: torch.Tensor, layout: Layout, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        attn = self.attn(self.norm1(x), rope=layout, attn_mask=attn_mask)  # (B, T, dim)
        x = x + self.drop_path1(attn if self.gamma_1 is None else self.gamma_1 * attn)
        mlp = self.mlp(self.norm2(x))
        return x + self.drop_path2(mlp if self.gamma_2 is None else self.gamma_2 * mlp)


class BeitPE(TablesFromEachGrid, GridTransformer, Beit):
    """timm ``Beit`` whose position comes from visionpe encodings, at any input size (:class:`GridTransformer`:
    ``forward(x, grid_offset=None)``, ``forward_intermediates``, ``forward_masked``, ``forward_batch``); ``beit_native``
    records the model's own encoding as timm built it (``(pe, pe_kwargs)``, or why visionpe cannot reproduce it)."""

    beit_native: tuple[str, dict] | str | None = None

    def scripted_block(self, block: nn.Module, where: str) -> ScriptedBlock:
        return ScriptedBlock(block, scripted_attention(block.attn, f"{where}.attn", ScriptedEvaAttention), False)

    def __prepare_scriptable__(self) -> "ScriptedBeit":
        return ScriptedBeit.of(self)


class ScriptedBeit(ScriptedGridForward, Beit):
    """What ``torch.jit.script`` compiles for a :class:`BeitPE` (:class:`~visionpe.backbones.vit.ScriptedGridForward`;
    its attention :class:`~visionpe.backbones.eva.ScriptedEvaAttention`)."""


SHARED_TABLE = ("timm's Beit with a relative position table shared by all blocks (use_shared_rel_pos_bias, BEiT "
                "pre-training): visionpe gives each block its own table, so it has no native equivalent; use --pe "
                "timm, or another pe")


def native_beit(model: Beit) -> tuple[str, dict]:
    """``(pe, pe_kwargs)`` reproducing timm's position encoding of the Beit ``model``: ``rel_bias`` (its blocks'
    tables, resized geometrically to each grid once taken over: :func:`take_over_table`) and/or ``learned`` (its
    ``pos_embed``), or ``none``; a ``ValueError`` for a shared table. A patched model answers with what it had when
    it was patched."""
    recorded = recorded_native(model, "beit_native")
    if recorded is not None:
        return recorded
    if getattr(model, "rel_pos_bias", None) is not None:
        raise ValueError(SHARED_TABLE)
    names = []
    if any(getattr(b.attn, "relative_position_bias_table", None) is not None for b in model.blocks):
        names.append("rel_bias")
    if getattr(model, "pos_embed", None) is not None:
        names.append("learned")
    return "+".join(names) or "none", {}


@torch.no_grad()
def take_over_table(bias: nn.Module | None, source: nn.Module) -> None:
    """A BEiT attention's relative position table ``((2H-1)(2W-1) + 3, heads)`` goes into a ``rel_bias`` of the
    same shape (BEiT's index and class-token entries are visionpe's), which from then on resizes it to any other grid,
    larger or smaller, with BEiT's geometric resize (``grow="fit"``, ``interpolation="geometric"``), as timm's BEiT
    does at another size."""
    table = getattr(source, "relative_position_bias_table", None)
    if isinstance(bias, RelBias) and table is not None \
            and bias.relative_position_bias_table.shape == table.shape:
        bias.relative_position_bias_table.copy_(table)
        bias.interpolation, bias.grow = "geometric", "fit"


def apply_beit(model: Beit, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a timm Beit in place: its ``pos_embed`` gives way to a tokens
    encoding (a ``learned`` table takes it over), each block's relative table to a bias encoding (a ``rel_bias`` of
    the model's grid takes it over), its shared table goes; each block becomes :class:`GridBeitBlock` with an
    :class:`~visionpe.backbones.eva.EvaAttentionPE`; every other weight is kept."""
    native = native_before_patching(model, native_beit)
    # what the ViT forward reads and timm's Beit does not have: no registers, pre-norm, patch dropout or
    # attention pooling; its pos_embed has the class row
    model.no_embed_class, model.reg_token, model.norm_pre = False, None, nn.Identity()
    model.patch_drop, model.attn_pool = None, None

    def patch_block(block: nn.Module, rotary, bias) -> None:
        if not isinstance(block, Block):
            raise ValueError(f"block type {type(block).__name__} is not supported; supported: timm's BEiT Block")
        take_over_table(bias, block.attn)
        block.__class__ = GridBeitBlock
        block.attn = EvaAttentionPE(block.attn, rotary, bias)

    put_block_encodings(model, names, kwargs, patch_block)
    model.rel_pos_bias, model.beit_native = None, native


register_adapter(Adapter(Beit, BeitPE, apply_beit, (EvaAttentionPE,), timm_modules=("beit",),
                         any_size=any_size_checked, native=native_beit, refuses=GLOBAL_REFUSES,
                         feature_cfg=vit_features, examples=("beit_base_patch16_224", "beitv2_base_patch16_224")))
