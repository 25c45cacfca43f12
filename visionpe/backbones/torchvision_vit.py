"""torchvision's image ``VisionTransformer`` (``vit_b_16``, ``vit_b_32``, ``vit_l_16``, ``vit_l_32``, ``vit_h_14``) with
visionpe encodings, at any input size.

:func:`~visionpe.apply` keeps every weight: the patch projection ``conv_proj`` (or a conv stem), the class token, each
``EncoderBlock``'s norms and MLP, and its ``nn.MultiheadAttention``, whose class becomes
:class:`GridMultiheadAttention`: the same ``in_proj_weight``/``in_proj_bias``/``out_proj`` parameters under the same
names (a torchvision state dict's attention keys load unchanged), the same math (q, k, v are the thirds of the packed
projection, scale ``head_dim ** -0.5``), through SDPA, with the block's rotary and bias encodings.
``encoder.pos_embedding`` (the class token's row, then the patch grid) is removed; ``pe="learned"`` takes it over (the
class row becomes the table's prefix vector), so the patched model gives torchvision's logits at its ``image_size``.

The grid travels with the call: :meth:`TorchvisionViTPE.forward` builds the :class:`~visionpe.Grid` from the patch
projection's output (``grid_offset`` shifts it) and passes it to every block; no state is shared between calls.
torchvision asserts the image size; the patched model takes any size that is a multiple of the patch.
``torch.jit.script`` compiles its TorchScript form (:class:`ScriptedTorchvisionViT`), which serves any size too.

Resolution change: torchvision runs one size. Its ``interpolate_embeddings`` (used to load a checkpoint into a model
of another ``image_size``, square grids) resamples bicubic with ``align_corners=True``; visionpe's learned table is
resampled per input grid as timm does it (bicubic, ``align_corners=False``, antialias when shrinking; ``antialias`` is a
``pe_kwargs`` keyword), so at other sizes the two differ.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from types import SimpleNamespace
from typing import List

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.vision_transformer import Encoder, EncoderBlock, VisionTransformer

from .._checks import check_positive_int, to_shape
from .._compat import TorchScriptRefusal
from ..attention import ScriptedAttention, attend, merge_heads, split_qkv
from ..coords import shares_draws
from ..encoding import ModelContext
from ..grid import Grid, Layout
from .adapter import (GLOBAL_REFUSES, Adapter, EncodingSet, PositionalModel, build_tokens, check_input,
                      register_adapter)
from .vit import (ScriptedBlock, add_tokens, kept_layout, refuse_late_tokens, scripted_attention, scripted_encoding,
                  token_grid)

# called inside a traced forward, each is one call in a torch.fx graph, run on the real tensors (positions at any size)
torch.fx.wrap("attend")
torch.fx.wrap("check_input")
torch.fx.wrap("token_grid")
torch.fx.wrap("add_tokens")
torch.fx.wrap("kept_layout")


class GridMultiheadAttention(nn.MultiheadAttention):
    """A ViT block's ``nn.MultiheadAttention`` (self-attention, ``batch_first``, packed projection) whose call takes
    the token layout: ``attn(x, layout) -> (B, P + N, D)`` with ``x: (B, P + N, D)``. ``rotary`` and ``bias`` hold
    the block's encodings; parameters and their names are ``nn.MultiheadAttention``'s."""

    rotary: nn.Module | None
    bias: nn.Module | None
    attention: str = "auto"  # visionpe.attend's choice (visionpe.set_attention)

    def forward(self, x: torch.Tensor, layout: Grid | Layout) -> torch.Tensor:
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = split_qkv(qkv, self.num_heads)
        out = attend(q, k, v, layout, self.rotary, self.bias, dropout_p=self.dropout if self.training else 0.0,
                     attention=self.attention, tokens=x)
        return self.out_proj(merge_heads(out))


def check_attention(attn: nn.Module) -> None:
    """The ``nn.MultiheadAttention`` configurations a ViT block has (packed, batch first, no extra key/value)."""
    if not isinstance(attn, nn.MultiheadAttention) or not attn._qkv_same_embed_dim or not attn.batch_first \
            or attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError(f"attention {type(attn).__name__} is not supported: the adapter takes torchvision's "
                         "nn.MultiheadAttention(dim, heads, batch_first=True) with one packed in_proj, no "
                         "bias_k/bias_v and add_zero_attn=False")


class GridEncoderBlock(EncoderBlock):
    """torchvision ``EncoderBlock`` whose forward takes the token layout: ``block(x, layout)``."""

    def forward(self, input: torch.Tensor, layout: Grid | Layout) -> torch.Tensor:
        x = self.dropout(self.self_attention(self.ln_1(input), layout)) + input
        return x + self.mlp(self.ln_2(x))


def in_channels(module: nn.Module) -> int:
    """Input channels of a patch projection: a conv, or a conv stem (its first conv)."""
    return next(m for m in module.modules() if isinstance(m, nn.Conv2d)).in_channels


class TorchvisionViTPE(PositionalModel, VisionTransformer):
    """torchvision ``VisionTransformer`` whose position comes from visionpe encodings, at any input size.

    ``forward(x, grid_offset=None)``: ``x: (B, C, H, W)``, each side a positive multiple of ``patch_size``;
    ``grid_offset`` is the coordinate of the first patch per axis (a crop of a larger image). Returns the logits
    ``(B, num_classes)``. A tokens encoding with ``block_index = i > 0`` (PEG after the first block, as CPVT) is
    added before block ``i``.
    """

    pe_tokens: nn.Module | None

    def check_input(self, x: torch.Tensor) -> None:
        check_input(x, (self.patch_size, self.patch_size), in_channels(self.conv_proj), type(self).__name__)

    def embed(self, x: torch.Tensor, grid_offset=None) -> tuple[torch.Tensor, Layout]:
        """Images -> tokens ``(B, 1 + N, D)`` (class token first) with position, and their layout."""
        self.check_input(x)
        x = self.conv_proj(x).movedim(1, -1)  # (B, h, w, D)
        grid = token_grid(x, 1, grid_offset)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x.flatten(1, -2)], dim=1)  # (B, 1 + N, D)
        if self.pe_tokens is not None and self.pe_tokens.block_index == 0:
            x = add_tokens(self.pe_tokens, x, grid)
        return self.encoder.dropout(x), kept_layout(grid, None)

    @shares_draws
    def forward_features(self, x: torch.Tensor, grid_offset=None) -> torch.Tensor:
        """Normed tokens ``(B, 1 + N, D)`` after the encoder."""
        x, layout = self.embed(x, grid_offset)
        late = self.pe_tokens if self.pe_tokens is not None and self.pe_tokens.block_index > 0 else None
        for i, block in enumerate(self.encoder.layers):
            if late is not None and i == late.block_index:
                x = add_tokens(late, x, layout)
            x = block(x, layout)
        return self.encoder.ln(x)

    def forward(self, x: torch.Tensor, grid_offset=None) -> torch.Tensor:
        return self.heads(self.forward_features(x, grid_offset)[:, 0])

    def __prepare_scriptable__(self) -> "ScriptedTorchvisionViT":
        return ScriptedTorchvisionViT.of(self)


class ScriptedMultiheadAttention(ScriptedAttention):
    """TorchScript form of :class:`GridMultiheadAttention`: :class:`~visionpe.attention.ScriptedAttention` over
    torchvision's weights (shared): the packed ``in_proj_weight``/``in_proj_bias`` as its ``qkv`` projection,
    ``out_proj`` as ``proj``, ``nn.MultiheadAttention``'s attention dropout; no q/k norms, no gate."""

    def __init__(self, attn: GridMultiheadAttention, rotary: nn.Module | None, bias: nn.Module | None):
        qkv = nn.Linear(attn.embed_dim, 3 * attn.embed_dim, bias=attn.in_proj_bias is not None, device="meta")
        qkv.weight, qkv.bias = attn.in_proj_weight, attn.in_proj_bias  # (3 * dim, dim), (3 * dim,) or None
        timm_names = SimpleNamespace(num_heads=attn.num_heads, qkv=qkv, q_norm=nn.Identity(), k_norm=nn.Identity(),
                                     norm=nn.Identity(), proj=attn.out_proj, proj_drop=nn.Identity(), gate=None,
                                     attn_drop=nn.Dropout(attn.dropout), training=attn.training)
        super().__init__(timm_names, rotary, bias)


class ScriptedEncoder(nn.Module):
    """TorchScript form of a patched torchvision ``Encoder`` (no ``pos_embedding``): its dropout, its blocks
    ``layers`` (a dict of ``encoder_layer_i``, each a :class:`~visionpe.backbones.vit.ScriptedBlock`; a dict, as
    torchvision's ``nn.Sequential`` would compile a one-argument forward) and its final norm ``ln``:
    ``forward(x, shape, prefix)`` with ``x: (B, 1 + N, D)``, ``shape`` the patch grid ``[h, w]``, ``prefix = 1``
    -> ``(B, 1 + N, D)``."""

    def __init__(self, encoder: Encoder, *, layers: nn.ModuleDict):
        super().__init__()
        self.dropout, self.layers, self.ln = encoder.dropout, layers, encoder.ln

    def forward(self, x: torch.Tensor, shape: List[int], prefix: int) -> torch.Tensor:
        x = self.dropout(x)
        for layer in self.layers.values():
            x = layer(x, shape, prefix)
        return self.ln(x)


def scripted_encoder_block(block: GridEncoderBlock, where: str) -> ScriptedBlock:
    """The TorchScript form of a :class:`GridEncoderBlock` at ``where`` (``encoder.layers.encoder_layer_i``):
    torchvision's pre-norm block in :class:`~visionpe.backbones.vit.ScriptedBlock`'s names (``ln_1`` -> ``norm1``,
    the dropout after attention -> ``drop_path1``, ``ln_2`` -> ``norm2``), the weights shared."""
    attn = scripted_attention(block.self_attention, f"{where}.self_attention", ScriptedMultiheadAttention)
    timm_names = SimpleNamespace(norm1=block.ln_1, drop_path1=block.dropout, norm2=block.ln_2, mlp=block.mlp)
    return ScriptedBlock(timm_names, attn, post_norm=False)


class ScriptedTorchvisionViT(nn.Module):
    """What ``torch.jit.script`` compiles for a :class:`TorchvisionViTPE`: its modules and parameters (shared, not
    copied: ``conv_proj``, ``class_token``, ``heads``), its encoder as a :class:`ScriptedEncoder` and its encodings in
    their TorchScript forms (:meth:`~visionpe.Encoding.scriptable`), and a forward that reads the patch grid
    ``[h, w]`` from the patch projection's output and computes every position from it inside the graph: the scripted
    model serves any input size, as the eager one.

    ``forward(x)``: ``(B, C, H, W)``, each side a multiple of the patch -> logits ``(B, num_classes)``;
    ``forward_features(x)`` -> normed tokens ``(B, 1 + N, D)``. The eager model's ``grid_offset`` is not part of it,
    nor a tokens encoding after the first block (refused when scripting)."""

    def __init__(self, model: TorchvisionViTPE, *, pe_tokens: nn.Module | None, encoder: ScriptedEncoder):
        super().__init__()
        self.conv_proj, self.class_token, self.heads = model.conv_proj, model.class_token, model.heads
        self.pe_tokens, self.encoder = pe_tokens, encoder
        self.training = model.training

    @classmethod
    def of(cls, model: TorchvisionViTPE) -> "ScriptedTorchvisionViT":
        """The TorchScript form of ``model`` (a new module; ``model`` is left as it is), or a
        :class:`~visionpe._compat.TorchScriptRefusal` (``NotImplementedError``) naming what has none."""
        refuse_late_tokens(model)
        try:
            pe_tokens = scripted_encoding(model.pe_tokens, "pe_tokens")
            layers = OrderedDict((name, scripted_encoder_block(block, f"encoder.layers.{name}"))
                                 for name, block in model.encoder.layers.named_children())
        except TorchScriptRefusal as error:
            raise TorchScriptRefusal(f"{type(model).__name__} with {error.what}", error.reason) from None
        return cls(model, pe_tokens=pe_tokens, encoder=ScriptedEncoder(model.encoder, layers=nn.ModuleDict(layers)))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x)  # (B, D, h, w)
        shape = [x.shape[2], x.shape[3]]
        x = x.flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        pe_tokens = self.pe_tokens
        if pe_tokens is not None:
            x = pe_tokens(x, shape, 1)
        return self.encoder(x, shape, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(self.forward_features(x)[:, 0])


def apply_torchvision_vit(model: VisionTransformer, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a torchvision ViT in place; weights kept."""
    blocks = list(model.encoder.layers)
    if not blocks or not all(isinstance(b, EncoderBlock) for b in blocks):
        raise ValueError(f"a torchvision VisionTransformer needs at least one EncoderBlock and no other blocks, got "
                         f"{[type(b).__name__ for b in blocks]}")
    for block in blocks:
        check_attention(block.self_attention)
    side = model.image_size // model.patch_size
    heads = blocks[0].self_attention.num_heads
    context = ModelContext((side, side), model.hidden_dim, heads, model.hidden_dim // heads, num_prefix_tokens=1,
                           depth=len(blocks))
    model.pe_tokens = build_tokens(names, kwargs, context, model.encoder.pos_embedding,
                                   getattr(model, "pe_tokens", None))
    model.encoder.pos_embedding = None
    encodings = EncodingSet(names, kwargs)
    for block in blocks:
        block.__class__ = GridEncoderBlock
        attn = block.self_attention
        rotary = encodings.block("rotary", context, getattr(attn, "rotary", None))
        bias = encodings.block("bias", context, getattr(attn, "bias", None))
        attn.__class__ = GridMultiheadAttention
        attn.rotary, attn.bias = rotary, bias


# torchvision's sizes (vit_b_16 ...) in timm's words; a model's own keywords override any of them
TV_VIT_SIZES = {"tv_vit_b_16": dict(patch_size=16, depth=12, num_heads=12, embed_dim=768, mlp_ratio=4.0),
                "tv_vit_l_16": dict(patch_size=16, depth=24, num_heads=16, embed_dim=1024, mlp_ratio=4.0),
                "tv_vit_h_14": dict(patch_size=14, depth=32, num_heads=16, embed_dim=1280, mlp_ratio=4.0)}
TV_VIT_SIZES["tv_vit_b_32"] = {**TV_VIT_SIZES["tv_vit_b_16"], "patch_size": 32}
TV_VIT_SIZES["tv_vit_l_32"] = {**TV_VIT_SIZES["tv_vit_l_16"], "patch_size": 32}
TV_VIT_KEYWORDS = ("embed_dim", "depth", "num_heads", "mlp_ratio", "dropout", "attention_dropout",
                   "representation_size")


def torchvision_vit_constructor(name: str):
    """``build(**kwargs)`` of torchvision's ``name[3:]`` (``vit_b_16``, ...) with random weights, in timm's keyword
    names: ``num_classes``, ``img_size`` (torchvision's ``image_size``: the grid of the position table; square),
    ``patch_size``, ``in_chans`` (torchvision's patch projection takes 3 channels; another count gets a fresh
    projection initialised as torchvision does), ``embed_dim`` (``hidden_dim``), ``depth`` (``num_layers``),
    ``num_heads``, ``mlp_ratio`` (``mlp_dim = embed_dim * mlp_ratio``), plus torchvision's ``dropout``,
    ``attention_dropout``, ``representation_size``. ``drop_path_rate`` must be 0 (torchvision has no stochastic
    depth)."""
    def build(num_classes: int = 1000, img_size=224, patch_size=None, in_chans: int = 3,
              drop_path_rate: float = 0.0, **sizes) -> VisionTransformer:
        unknown = sorted(set(sizes) - set(TV_VIT_KEYWORDS))
        if unknown:
            raise ValueError(f"{name} (torchvision VisionTransformer) takes the keywords {', '.join(TV_VIT_KEYWORDS)}, "
                             f"not {', '.join(unknown)} (e.g. embed_dim=32 depth=2 num_heads=2)")
        if drop_path_rate:
            raise ValueError(f"{name}: torchvision's VisionTransformer has no stochastic depth; drop_path_rate must "
                             f"be 0, got {drop_path_rate}")
        height, width = to_shape("img_size", img_size, 2)
        if height != width:
            raise ValueError(f"{name} takes a square img_size (torchvision's image_size), got {img_size!r}")
        cfg = {**TV_VIT_SIZES[name], **({} if patch_size is None else {"patch_size": patch_size}), **sizes}
        patch = check_positive_int("patch_size", cfg["patch_size"])
        if height % patch:
            raise ValueError(f"{name}: img_size={img_size!r} must be a positive multiple of patch_size={patch!r}")
        for key in ("embed_dim", "depth", "num_heads"):
            check_positive_int(key, cfg[key])
        if cfg["embed_dim"] % cfg["num_heads"]:
            raise ValueError(f"{name}: embed_dim={cfg['embed_dim']} must be divisible by num_heads={cfg['num_heads']}")
        model = VisionTransformer(image_size=height, patch_size=patch, num_layers=cfg["depth"],
                                  num_heads=cfg["num_heads"], hidden_dim=cfg["embed_dim"],
                                  mlp_dim=int(cfg["embed_dim"] * cfg["mlp_ratio"]), num_classes=num_classes,
                                  **{k: cfg[k] for k in ("dropout", "attention_dropout", "representation_size")
                                     if k in cfg})
        if in_chans != 3:
            model.conv_proj = nn.Conv2d(in_chans, cfg["embed_dim"], patch, patch)
            nn.init.trunc_normal_(model.conv_proj.weight, std=math.sqrt(1 / (in_chans * patch * patch)))
            nn.init.zeros_(model.conv_proj.bias)
        return model
    build.__name__ = name
    return build


register_adapter(Adapter(VisionTransformer, TorchvisionViTPE, apply_torchvision_vit, (GridMultiheadAttention,),
                         library="torchvision",
                         constructors={name: torchvision_vit_constructor(name) for name in TV_VIT_SIZES},
                         native="learned", refuses=GLOBAL_REFUSES, examples=tuple(TV_VIT_SIZES)))
