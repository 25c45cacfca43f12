"""timm ``SwinTransformer`` and ``SwinTransformerV2`` with visionpe encodings inside their (shifted) windows.

A window is a fixed grid, so each block's encodings are built for its window and every window attention
reads ``Grid(window_size)``; nothing travels between calls. A Swin table (``relative_position_bias_table``) or a
Swin-V2 ``cpb_mlp`` is taken over by ``swin_bias`` / ``cpb`` with its weights.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from timm.models._manipulate import checkpoint
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock, SwinTransformerStage
from timm.models.swin_transformer_v2 import SwinTransformerV2, SwinTransformerV2Block, SwinTransformerV2Stage
from torch import nn

from ..attention import attend, merge_heads, split_qkv
from ..bias import ContinuousPositionBias, SwinBias
from ..coords import shares_draws, with_draws
from ..encoding import ModelContext
from ..grid import Grid
from .._checks import to_shape
from .._compat import TorchScriptRefusal
from .adapter import (WINDOW_FAMILIES, WINDOW_REFUSES, Adapter, EncodingSet, PositionalModel, check_img_size,
                      check_model_sizes, register_adapter)
from .vit import scripted_encoding

# called inside a traced forward, each is one call in a torch.fx graph, run on the real tensors (positions at any size)
torch.fx.wrap("attend")


class WindowAttention(nn.Module):
    """Replaces Swin (v1/v2) ``WindowAttention``: same projections, encodings over one window's grid.

    Swin-V2's cosine attention (``logit_scale``, ``q_bias``/``v_bias``) is kept when the source has it.
    ``attention``: :func:`visionpe.attend`'s choice (:func:`visionpe.set_attention`).
    """

    attention: str = "auto"
    table_resize: str | None = "geometric"  # how set_window_size resizes a Swin table: timm's (None: the table's own)

    def __init__(self, source: nn.Module, rotary=None, bias=None):
        super().__init__()
        self.num_heads = source.num_heads
        self.window_size = tuple(source.window_size)
        self.qkv, self.attn_drop, self.proj, self.proj_drop = source.qkv, source.attn_drop, source.proj, source.proj_drop
        self.cosine = hasattr(source, "logit_scale")
        if self.cosine:
            self.logit_scale = source.logit_scale
            self.q_bias, self.v_bias = source.q_bias, source.v_bias
        self.rotary, self.bias = rotary, bias

    def set_window_size(self, window_size) -> None:
        """Called by timm's ``set_input_size``, as timm's window attentions: a Swin table is resized geometrically
        (timm ``resize_rel_pos_bias_table``), a CPB normalises offsets by the new window unless it has a pretrained
        window (timm ``SwinTransformerV2``), another table bias is resized its own way."""
        window_size = tuple(window_size)
        if window_size != self.window_size:
            if isinstance(self.bias, SwinBias):
                self.bias.resize(window_size, interpolation=self.table_resize)
            elif isinstance(self.bias, ContinuousPositionBias):
                self.bias.set_window_size(window_size)
            elif hasattr(self.bias, "resize"):
                self.bias.resize(window_size)
        self.window_size = window_size

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        if self.cosine and self.q_bias is not None:
            return F.linear(x, self.qkv.weight, torch.cat([self.q_bias, torch.zeros_like(self.v_bias), self.v_bias]))
        return self.qkv(x)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x: (num_windows * B, Wh * Ww, C)``; ``mask: (num_windows, N, N)`` shift mask or None."""
        q, k, v = split_qkv(self._qkv(x), self.num_heads)
        scale = None
        if self.cosine:
            logit_scale = torch.clamp(self.logit_scale, max=math.log(1.0 / 0.01)).exp()
            q, k, scale = F.normalize(q, dim=-1) * logit_scale, F.normalize(k, dim=-1), 1.0
        out = attend(q, k, v, Grid(self.window_size), self.rotary, self.bias, per_window_mask(mask, x.shape[0]),
                     dropout_p=self.attn_drop.p if self.training else 0.0, scale=scale, attention=self.attention,
                     tokens=x)
        return self.proj_drop(self.proj(merge_heads(out)))


def per_window_mask(mask: Optional[torch.Tensor], num_windows: int) -> Optional[torch.Tensor]:
    """timm's shift mask ``(nW, N, N)`` (None: unshifted windows) repeated over the batch: ``(B * nW, 1, N, N)`` for
    ``num_windows = B * nW`` windows."""
    if mask is None:
        return None
    return mask.expand(num_windows // mask.shape[0], -1, -1, -1).flatten(0, 1)[:, None]


torch.fx.wrap("per_window_mask")  # the mask is None or not only when the graph runs (a block without a shift)


class ScriptedWindowAttention(nn.Module):
    """TorchScript form of :class:`WindowAttention` (what a scripted Swin's blocks hold): the same modules and
    parameters (shared) and the TorchScript forms of its encodings (``rotary``, ``bias``:
    :meth:`~visionpe.Encoding.scriptable`), read on the window's grid ``[Wh, Ww]`` (no prefix tokens).
    ``forward(x, mask=None)``, as :meth:`WindowAttention.forward`: ``x: (num_windows * B, Wh * Ww, C)``, ``mask``
    timm's shift mask ``(nW, N, N)`` or None; Swin-V2's cosine attention where the source has it; q and k rotated,
    the bias and the mask added to the logits, ``scaled_dot_product_attention`` -> ``(num_windows * B, N, C)``."""

    def __init__(self, attn: WindowAttention, rotary: Optional[nn.Module], bias: Optional[nn.Module]):
        super().__init__()
        self.num_heads, self.window = attn.num_heads, list(attn.window_size)
        self.qkv, self.proj, self.proj_drop = attn.qkv, attn.proj, attn.proj_drop
        self.dropout_p = float(attn.attn_drop.p)
        self.logit_scale = attn.logit_scale if attn.cosine else None  # Swin-V2's cosine attention, or None
        self.q_bias = attn.q_bias if attn.cosine else None  # Swin-V2's separate q and v biases (no k bias), or None
        self.v_bias = attn.v_bias if attn.cosine else None
        self.rotary, self.bias = rotary, bias  # the encodings' TorchScript forms, or None

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        q_bias, v_bias = self.q_bias, self.v_bias
        if q_bias is not None and v_bias is not None:
            qkv = F.linear(x, self.qkv.weight, torch.cat([q_bias, torch.zeros_like(v_bias), v_bias]))
        else:
            qkv = self.qkv(x)
        qkv = qkv.unflatten(-1, [3, self.num_heads, -1]).permute(2, 0, 3, 1, 4)  # (3, B, heads, N, d)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scale: Optional[float] = None
        logit_scale = self.logit_scale
        if logit_scale is not None:
            q = F.normalize(q, dim=-1) * torch.clamp(logit_scale, max=math.log(1.0 / 0.01)).exp()
            k, scale = F.normalize(k, dim=-1), 1.0
        rotary = self.rotary
        if rotary is not None:
            q, k = rotary(q, k, self.window, 0)
        attn_mask = per_window_mask(mask, x.shape[0])
        if attn_mask is not None:
            attn_mask = attn_mask.to(q.dtype)
        bias = self.bias
        if bias is not None:
            logits = bias(self.window, 0)[None].to(q.dtype)  # (1, heads, N, N)
            attn_mask = logits if attn_mask is None else logits + attn_mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout_p if self.training else 0.0, scale=scale)
        return self.proj_drop(self.proj(merge_heads(out)))


class GridStage:
    """Mixin of timm's Swin (v1, v2) stages: their forward, with activation checkpointing per block that carries the
    forward's coordinate augmentation draws into the recomputation (:func:`~visionpe.coords.with_draws`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(with_draws(block), x)
            else:
                x = block(x)
        return x


class GridSwinStage(GridStage, SwinTransformerStage):
    pass


class GridSwinV2Stage(GridStage, SwinTransformerV2Stage):
    pass


GRID_STAGES = {SwinTransformerStage: GridSwinStage, SwinTransformerV2Stage: GridSwinV2Stage}
TIMM_STAGES = {grid: timm for timm, grid in GRID_STAGES.items()}


class GridWindowBlock:
    """Mixin of timm's Swin (v1, v2) blocks: the shift mask of the input's size (timm's ``dynamic_mask``, which
    visionpe's any-size models use) is one call in a torch.fx graph (:func:`window_shift_mask`), so a traced model
    masks the windows of whatever size it is given."""

    def get_attn_mask(self, x: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
        if x is None or kwargs:
            return super().get_attn_mask(x, **kwargs)
        return window_shift_mask(self, x)


def window_shift_mask(block: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """timm's shifted-window mask ``(num_windows, N, N)`` (or None without a shift) of a Swin block for its
    padded input ``x: (B, H, W, C)``."""
    return super(GridWindowBlock, block).get_attn_mask(x)


torch.fx.wrap("window_shift_mask")


class GridSwinBlock(GridWindowBlock, SwinTransformerBlock):
    pass


class GridSwinV2Block(GridWindowBlock, SwinTransformerV2Block):
    pass


GRID_BLOCKS = {SwinTransformerBlock: GridSwinBlock, SwinTransformerV2Block: GridSwinV2Block}
TIMM_BLOCKS = {grid: timm for timm, grid in GRID_BLOCKS.items()}


def retyped(module: nn.Module, cls: type, **modules: nn.Module) -> nn.Module:
    """A new ``cls`` (a class ``module`` can run as) holding ``module``'s attributes, parameters and buffers (shared,
    not copied) in containers of its own, with ``modules`` in place of its submodules of those names; ``module`` is
    left as it is."""
    twin = cls.__new__(cls)
    twin.__dict__.update(module.__dict__)
    for key in ("_parameters", "_buffers", "_modules"):
        twin.__dict__[key] = dict(module.__dict__[key])
    for name, child in modules.items():
        setattr(twin, name, child)
    return twin


class ScriptedSwin:
    """Mixin of what ``torch.jit.script`` compiles for a :class:`SwinTransformerPE` or :class:`SwinTransformerV2PE`
    (a subclass of the timm class): the same modules and parameters (shared), its stages and blocks as timm's own
    classes (which timm scripts: the window partition, padding and shift mask of the input's size computed in the
    graph, timm's ``dynamic_mask``) and each window attention as :class:`ScriptedWindowAttention`; timm's
    ``forward``, ``forward_features`` and ``forward_head``. It serves any input size, as the eager model; what the
    eager model adds (input checks, coordinate augmentation draws) is not part of it."""

    @classmethod
    def of(cls, model: nn.Module) -> nn.Module:
        """The TorchScript form of ``model`` (a new module; ``model`` is left as it is), or a
        :class:`~visionpe._compat.TorchScriptRefusal` naming the encoding or setting that has none and where."""
        stages = []
        try:
            for i, stage in enumerate(model.layers):
                blocks = [retyped(block, TIMM_BLOCKS.get(type(block), type(block)),
                                  attn=scripted_window_attention(block.attn, f"layers.{i}.blocks.{j}.attn"))
                          for j, block in enumerate(stage.blocks)]
                stages.append(retyped(stage, TIMM_STAGES.get(type(stage), type(stage)), blocks=nn.Sequential(*blocks)))
        except TorchScriptRefusal as error:
            raise TorchScriptRefusal(f"{type(model).__name__} with {error.what}", error.reason) from None
        return retyped(model, cls, layers=nn.Sequential(*stages))


def scripted_window_attention(attn: WindowAttention, where: str) -> ScriptedWindowAttention:
    """The TorchScript form of the window attention ``attn`` at ``where`` (``layers.i.blocks.j.attn``), with its
    encodings'."""
    return ScriptedWindowAttention(attn, scripted_encoding(attn.rotary, f"{where}.rotary"),
                                   scripted_encoding(attn.bias, f"{where}.bias"))


class ScriptedSwinTransformer(ScriptedSwin, SwinTransformer):
    """What ``torch.jit.script`` compiles for a :class:`SwinTransformerPE` (:class:`ScriptedSwin`)."""


class ScriptedSwinTransformerV2(ScriptedSwin, SwinTransformerV2):
    """What ``torch.jit.script`` compiles for a :class:`SwinTransformerV2PE` (:class:`ScriptedSwin`)."""


class SwinTransformerPE(PositionalModel, SwinTransformer):
    """timm ``SwinTransformer`` with visionpe encodings inside its windows; coordinate augmentation (training) is
    drawn once per forward, shared by every block. ``torch.jit.script`` compiles its TorchScript form
    (:class:`ScriptedSwinTransformer`)."""

    def __prepare_scriptable__(self) -> ScriptedSwinTransformer:
        return ScriptedSwinTransformer.of(self)

    @shares_draws
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return super().forward_features(x)

    forward_intermediates = shares_draws(SwinTransformer.forward_intermediates)


class SwinTransformerV2PE(PositionalModel, SwinTransformerV2):
    """timm ``SwinTransformerV2`` with visionpe encodings inside its windows; coordinate augmentation (training) is
    drawn once per forward, shared by every block. ``torch.jit.script`` compiles its TorchScript form
    (:class:`ScriptedSwinTransformerV2`)."""

    def __prepare_scriptable__(self) -> ScriptedSwinTransformerV2:
        return ScriptedSwinTransformerV2.of(self)

    @shares_draws
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return super().forward_features(x)

    forward_intermediates = shares_draws(SwinTransformerV2.forward_intermediates)


def apply_swin(model: nn.Module, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into every window attention of a timm Swin, in place."""
    model.patch_embed.strict_img_size = False
    model.dynamic_img_size = True
    encodings = EncodingSet(names, kwargs)
    for stage in model.layers:
        if type(stage) in GRID_STAGES:
            stage.__class__ = GRID_STAGES[type(stage)]
        for block in stage.blocks:
            if type(block) in GRID_BLOCKS:
                block.__class__ = GRID_BLOCKS[type(block)]
            block.dynamic_mask = True
            source = block.attn
            head_dim = source.qkv.weight.shape[0] // 3 // source.num_heads
            context = ModelContext(tuple(source.window_size), source.qkv.in_features, source.num_heads, head_dim)
            rotary = encodings.block("rotary", context, getattr(source, "rotary", None))
            defaults = {}
            pretrained = getattr(source, "pretrained_window_size", None)
            if names.get("bias") == "cpb" and pretrained is not None and any(pretrained):
                defaults["pretrained_window_size"] = tuple(pretrained)
            bias = encodings.block("bias", context, getattr(source, "bias", None), **defaults)
            take_over_bias(bias, source)
            block.attn = WindowAttention(source, rotary, bias)


@torch.no_grad()
def take_over_bias(bias: nn.Module | None, source: nn.Module) -> None:
    """A timm block's own Swin table or Swin-V2 CPB MLP goes into the matching visionpe bias."""
    if isinstance(bias, SwinBias) and hasattr(source, "relative_position_bias_table"):
        bias.relative_position_bias_table.copy_(source.relative_position_bias_table)
    elif isinstance(bias, ContinuousPositionBias) and bias.mode == "swin" and hasattr(source, "cpb_mlp") \
            and source.cpb_mlp[0].in_features == 2 and source.cpb_mlp[0].out_features == bias.cpb_mlp[0].out_features:
        bias.cpb_mlp.load_state_dict(source.cpb_mlp.state_dict())
        bias.initialised_by_backbone = True  # its init is Swin-V2's (visionpe.reset_parameters keeps that)


def any_size_swin(timm_kwargs: dict) -> dict:
    """timm's way of running a Swin at any input size: ``strict_img_size=False`` (the caller's value wins);
    ``img_size`` checked against ``patch_size``, a ``window_size`` of 2 sides, the model sizes
    (:func:`check_model_sizes`, one depth and head count per stage)."""
    timm_kwargs.setdefault("strict_img_size", False)
    check_img_size(timm_kwargs)
    check_model_sizes(timm_kwargs, stages=True)
    if "window_size" in timm_kwargs:
        to_shape("window_size", timm_kwargs["window_size"], 2)
    return timm_kwargs


def swin_features(model: nn.Module) -> dict:
    """timm's ``feature_cfg`` of a Swin: its stages as a feature list, every stage by default."""
    return {"flatten_sequential": True, "out_indices": tuple(range(len(model.layers)))}


WINDOW_RECORD = dict(families=WINDOW_FAMILIES, refuses=WINDOW_REFUSES, any_size=any_size_swin,
                     feature_cfg=swin_features)

register_adapter(Adapter(SwinTransformer, SwinTransformerPE, apply_swin, (WindowAttention,),
                         timm_modules=("swin_transformer",), native="swin_bias",
                         examples=("swin_tiny_patch4_window7_224",), init_weights=lambda model: model.init_weights(),
                         **WINDOW_RECORD))
register_adapter(Adapter(SwinTransformerV2, SwinTransformerV2PE, apply_swin, (WindowAttention,),
                         timm_modules=("swin_transformer_v2",), native="cpb", examples=("swinv2_tiny_window8_256",),
                         **WINDOW_RECORD))
