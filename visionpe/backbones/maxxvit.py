"""timm ``MaxxVit`` (MaxViT, MaxxViT, CoAtNet, CoAtNeXt: ``maxvit_*``, ``maxxvit*``, ``coatnet*``) with visionpe bias
and rotary encodings in its attention.

timm's model is kept whole (stem, MBConv/ConvNeXt blocks, block and grid partitions, attention in both layouts, heads):
only each attention's relative position module (``attn.rel_pos``, which timm's attention asks for its bias with
``get_bias()``) becomes a :class:`PartitionBias` holding a visionpe bias and rotary encoding built for the attention's
fixed grid: the partition (``window_size`` for block attention, ``grid_size`` for grid attention, as timm's own
tables) or, in CoAtNet's transformer stages, the feature map timm built its table for.

The bias family fits as in Swin's windows (``swin_bias``, ``cpb``, ``alibi``, ...). The rotary family fits through the
attention's ``qkv`` projection: timm computes the logits itself in two layouts (channels-last ``AttentionCl``, a
``Linear`` on ``(B', h, w, C)``; channels-first ``Attention2d``, a 1x1 ``Conv2d`` on ``(B', C, h, w)``; heads first in
the channels or not), but q, k and v all come out of that one projection, so its class becomes :class:`RotatedLinear`
or :class:`RotatedConv2d` (same weights, same keys), whose output has q and k rotated by the partition's own ``h x w``
grid, row-major as timm flattens it (:func:`rotate_packed_qkv`). The logits timm then computes are the rotated ones.
A partition's grid is its index grid: block attention's window is a patch of neighbours, grid attention's partition
a strided lattice over the whole map, whose index offsets are the offsets timm's own grid-attention tables read.
The tokens family does not fit: MaxxVit has no token sequence to add a table to before its blocks (convolutions
first). Encodings that read the attention's input tokens (PaPE) are refused: timm's attention does not pass
them.

The architecture's own encoding (``pe="native"``; :func:`native_maxxvit`): timm's ``RelPosBias`` (``rel_pos_type=
"bias"``) and TensorFlow's ``RelPosBiasTf`` (``"bias_tf"``, the ``*.tf_*`` ports) are ``swin_bias`` taking over the
table (the TF table ``(heads, 2H - 1, 2W - 1)``, indexed by key minus query, holds Swin's ``((2H - 1)(2W - 1), heads)``
entries flipped on both axes);
``RelPosMlp`` (``"mlp"``, the ``*_rmlp_*`` names) in its ``cr`` mode is ``cpb(mode="cr")`` with the block's MLP.
"""
from __future__ import annotations

import re

import torch
from timm.layers import RelPosBias, RelPosBiasTf, RelPosMlp
from timm.models.maxxvit import Attention2d, AttentionCl, MaxxVit, TransformerBlock2d
from torch import nn

from ..bias import SwinBias
from ..encoding import ModelContext
from ..grid import Grid
from ..registry import ENCODINGS
from ..weights.convert import LoadReport
from .adapter import WINDOW_REFUSES, Adapter, EncodingSet, PositionalModel, recorded_native, register_adapter
from .vit_relpos import mlp_mode, take_over

READS = {"reads_tokens": "input tokens", "reads_queries": "queries"}  # what a bias reads besides positions
TOKENS_REFUSES = {name: f"reads the attention's {what}, which timm's MaxxVit attention does not pass to its relative "
                        "position module or its qkv projection; use swin_bias, cpb or alibi (bias) or rope_axial, "
                        "rope_mixed (rotary)"
                  for name, cls in ENCODINGS.items() for flag, what in READS.items() if getattr(cls, flag, False)}


class PartitionBias(nn.Module):
    """Takes the place of timm's relative position module in a MaxxVit attention: ``get_bias()`` is the visionpe
    ``bias`` on the attention's fixed grid, ``(1, heads, N, N)`` (timm's fused attention adds it as the mask), and
    ``rel_pos(attn)`` adds it to the logits ``attn: (B, heads, N, N)`` (timm's unfused attention). ``rotary`` (or
    None) is the attention's rotary encoding, applied by its ``qkv`` projection (:class:`RotatedLinear`,
    :class:`RotatedConv2d`); both slots are what ``encodings_of`` reads."""

    attention: str = "auto"  # set_attention's slot: timm's attention adds the materialised bias whatever it says

    def __init__(self, bias: nn.Module | None, grid_shape: tuple[int, int], rotary: nn.Module | None = None):
        super().__init__()
        self.bias, self.grid_shape, self.rotary = bias, tuple(grid_shape), rotary

    def get_bias(self) -> torch.Tensor | None:
        return None if self.bias is None else self.bias(Grid(self.grid_shape))[None]

    def forward(self, attn: torch.Tensor, shared_rel_pos: torch.Tensor | None = None) -> torch.Tensor:
        bias = self.get_bias()
        return attn if bias is None else attn + bias.to(attn.dtype)


def rotate_packed_qkv(qkv: torch.Tensor, rotary: nn.Module, num_heads: int, dim_head: int, head_first: bool,
                      channels_last: bool) -> torch.Tensor:
    """timm's packed ``qkv`` projection with q and k rotated by ``rotary`` on the ``h x w`` grid of the input.

    ``qkv``: ``(B, h, w, 3 C)`` (``channels_last``: ``AttentionCl``) or ``(B, 3 C, h, w)`` (``Attention2d``), ``C =
    num_heads * dim_head``; its channels are ``(heads, [q, k, v], dim_head)`` with ``head_first``, else ``([q, k, v],
    heads, dim_head)`` (how timm's two attentions split them). Tokens are the ``h x w`` positions row-major, as timm
    flattens them. Returns the same shape and layout.
    """
    if channels_last:
        batch, h, w, packed = qkv.shape
        tokens = qkv.reshape(batch, h * w, packed)
    else:
        batch, packed, h, w = qkv.shape
        tokens = qkv.reshape(batch, packed, h * w).transpose(1, 2)
    if head_first:
        parts = tokens.unflatten(-1, (num_heads, 3, dim_head))
    else:
        parts = tokens.unflatten(-1, (3, num_heads, dim_head)).transpose(2, 3)  # (B, N, heads, 3, dim_head)
    q, k, v = parts.permute(3, 0, 2, 1, 4).unbind(0)  # each (B, heads, N, dim_head)
    q, k = rotary(q, k, Grid((h, w)))
    parts = torch.stack([q, k, v.to(q.dtype)]).permute(1, 3, 2, 0, 4)  # (B, N, heads, 3, dim_head)
    tokens = (parts if head_first else parts.transpose(2, 3)).flatten(-3)
    return tokens.reshape(batch, h, w, packed) if channels_last else tokens.transpose(1, 2).reshape(batch, packed, h, w)


class RotatedQKV:
    """Mixin of a MaxxVit attention's ``qkv`` projection (its class swapped in place: weights and keys unchanged):
    the projection, then q and k rotated by the attention's ``rel_pos.rotary`` (:func:`rotate_packed_qkv`). The
    attention's :class:`PartitionBias` is held as a plain reference (``positions``), not a submodule, so the state dict
    keeps timm's keys."""

    channels_last: bool

    def rotate_with(self, positions: PartitionBias, num_heads: int, dim_head: int, head_first: bool) -> None:
        object.__setattr__(self, "positions", positions)
        self.num_heads, self.dim_head, self.head_first = num_heads, dim_head, head_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = super().forward(x)
        rotary = self.positions.rotary
        if rotary is None:
            return qkv
        return rotate_packed_qkv(qkv, rotary, self.num_heads, self.dim_head, self.head_first, self.channels_last)


class RotatedLinear(RotatedQKV, nn.Linear):
    """``AttentionCl``'s ``qkv`` (channels last) with q and k rotated; see :class:`RotatedQKV`."""

    channels_last = True


class RotatedConv2d(RotatedQKV, nn.Conv2d):
    """``Attention2d``'s ``qkv`` (a 1x1 convolution, channels first) with q and k rotated; see :class:`RotatedQKV`."""

    channels_last = False


def rotate_through_qkv(attn: nn.Module, positions: PartitionBias) -> None:
    """Swap the class of ``attn.qkv`` for its rotating subclass, reading ``positions.rotary``."""
    qkv = attn.qkv
    if not isinstance(qkv, RotatedQKV):
        qkv.__class__ = RotatedLinear if isinstance(qkv, nn.Linear) else RotatedConv2d
    qkv.rotate_with(positions, attn.num_heads, attn.dim_head, attn.head_first)


class MaxxVitPE(PositionalModel, MaxxVit):
    """timm ``MaxxVit`` whose attention biases are visionpe encodings (:class:`PartitionBias`); timm's forward is
    unchanged. ``maxxvit_native`` records the model's own encoding as timm built it."""

    maxxvit_native: tuple[str, dict] | str | None = None


def attentions(model: MaxxVit) -> list[tuple[nn.Module, tuple[int, int] | None]]:
    """Every attention of the model with the grid it attends over: its partition (block or grid attention), or the
    feature map timm built its table for (CoAtNet's transformer blocks; None without a table)."""
    found = []
    for module in model.modules():
        if isinstance(module, TransformerBlock2d):
            rel_pos = module.attn.rel_pos
            found.append((module.attn, getattr(rel_pos, "grid_shape", getattr(rel_pos, "window_size", None))))
        elif hasattr(module, "partition_size"):
            found += [(attn, tuple(module.partition_size)) for attn in module.children()  # attn, or the parallel
                      if isinstance(attn, (AttentionCl, Attention2d))]  # attn_block and attn_grid
    return found


def native_maxxvit(model: MaxxVit) -> tuple[str, dict]:
    """``(pe, pe_kwargs)`` reproducing timm's relative position modules of the model: ``swin_bias`` (``RelPosBias``,
    ``RelPosBiasTf``), ``cpb(mode="cr")`` (``RelPosMlp`` with its hidden width), or ``none``; a ``ValueError`` for one
    visionpe cannot reproduce. A patched model answers with what it had when it was patched."""
    recorded = recorded_native(model, "maxxvit_native")
    if recorded is not None:
        return recorded
    rel_pos = next((attn.rel_pos for attn, _ in attentions(model) if attn.rel_pos is not None), None)
    if rel_pos is None:
        return "none", {}
    if isinstance(rel_pos, (RelPosBias, RelPosBiasTf)):
        return "swin_bias", {}
    if isinstance(rel_pos, RelPosMlp) and mlp_mode(rel_pos) == "cr":
        return "cpb", {"mode": "cr", "hidden_dim": rel_pos.mlp.fc1.out_features}
    raise ValueError(f"timm's {type(rel_pos).__name__} in a MaxxVit has no visionpe equivalent; use --pe timm_unpatched, or "
                     "another pe")


@torch.no_grad()
def take_over_table(bias: nn.Module | None, rel_pos: nn.Module | None) -> None:
    """A timm ``RelPosBias`` table ``((2H - 1)(2W - 1), heads)`` or TF's ``RelPosBiasTf`` table ``(heads, 2H - 1,
    2W - 1)`` (offsets key minus query: flipped) of the same window goes into a ``swin_bias`` (Swin's order: query minus
    key, the first axis slowest); a ``RelPosMlp`` into a
    ``cpb`` of the same mode and widths."""
    if isinstance(bias, SwinBias) and isinstance(rel_pos, (RelPosBias, RelPosBiasTf)) \
            and tuple(bias.window_size) == tuple(rel_pos.window_size):
        table = rel_pos.relative_position_bias_table
        if isinstance(rel_pos, RelPosBiasTf):
            table = table.flip(1, 2).permute(1, 2, 0).flatten(0, 1)  # TF indexes key - query, Swin query - key
        if table.shape == bias.relative_position_bias_table.shape:
            bias.relative_position_bias_table.copy_(table)
    else:
        take_over(bias, rel_pos)


def apply_maxxvit(model: MaxxVit, names: dict, kwargs: dict) -> None:
    """Put the bias and rotary encodings of ``names`` into every attention of a timm ``MaxxVit`` in place
    (:class:`PartitionBias`; a matching ``swin_bias`` or ``cpb`` takes timm's table or MLP over; a rotary encoding
    turns q and k in the attention's ``qkv`` projection, :class:`RotatedQKV`); every weight is kept."""
    try:  # what timm built, recorded before its modules go
        native = native_maxxvit(model)
    except ValueError as err:
        native = str(err)
    encodings = EncodingSet(names, kwargs)
    for attn, grid_shape in attentions(model):
        if grid_shape is None and {"bias", "rotary"} & set(names):
            raise ValueError("a MaxxVit transformer block without a relative position table (rel_pos_type='') does "
                             "not record the feature map it attends over; build it with rel_pos_type='bias'")
        current = attn.rel_pos  # timm's module, or a PartitionBias on a re-apply
        ours = isinstance(current, PartitionBias)
        bias = rotary = None
        if grid_shape is not None:
            context = ModelContext(grid_shape, attn.qkv.weight.shape[1], attn.num_heads, attn.dim_head)
            bias = encodings.block("bias", context, current.bias if ours else None)
            rotary = encodings.block("rotary", context, current.rotary if ours else None)
            take_over_table(bias, None if ours else current)
        attn.rel_pos = PartitionBias(bias, grid_shape or (1, 1), rotary)
        if rotary is not None or isinstance(attn.qkv, RotatedQKV):
            rotate_through_qkv(attn, attn.rel_pos)
    model.maxxvit_native = native


REL_POS = re.compile(r"^(.*\.attn(?:_block|_grid)?\.rel_pos)\."
                     r"(relative_position_bias_table|mlp\.fc([12])\.(weight|bias))$")


def maxxvit_keys(state: dict, report: LoadReport) -> dict:
    """timm ``MaxxVit`` checkpoints: each attention's ``rel_pos.relative_position_bias_table`` -> its
    :class:`PartitionBias`'s ``swin_bias`` table (TensorFlow's ``(heads, 2H - 1, 2W - 1)`` flipped into Swin's order),
    ``rel_pos.mlp.fc1``/``fc2`` -> its ``cpb``'s ``cpb_mlp.0``/``cpb_mlp.2``."""
    out = {}
    for key, value in state.items():
        match = REL_POS.match(key)
        if not match:
            out[key] = value
            continue
        if match.group(3) is None:
            new_key = f"{match.group(1)}.bias.relative_position_bias_table"
            value = value.flip(1, 2).permute(1, 2, 0).flatten(0, 1) if value.ndim == 3 else value
        else:
            new_key = f"{match.group(1)}.bias.cpb_mlp.{0 if match.group(3) == '1' else 2}.{match.group(4)}"
        report.converted.append(f"{key} -> {new_key}")
        out[new_key] = value
    return out


def maxxvit_features(model: nn.Module) -> dict:
    """timm's ``feature_cfg`` of a MaxxVit: its stem and stages as a feature list."""
    return {"flatten_sequential": True}


register_adapter(Adapter(MaxxVit, MaxxVitPE, apply_maxxvit, (PartitionBias,), timm_modules=("maxxvit",),
                         native=native_maxxvit, families=("bias", "rotary"), refuses={**WINDOW_REFUSES, **TOKENS_REFUSES},
                         checkpoint_hooks=(maxxvit_keys,), feature_cfg=maxxvit_features,
                         examples=("maxvit_tiny_tf_224", "coatnet_0_rw_224", "maxxvit_rmlp_nano_rw_256")))
