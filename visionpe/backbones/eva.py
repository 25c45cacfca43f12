"""timm ``Eva`` (EVA and EVA-02, the rope-vit ports ``vit_*_rope_*``, timm's ``vit_*_rope_reg*_gap_256``, DINOv3,
LingBot, Sapiens2) with visionpe encodings, at any input size.

Every non-positional weight and module is timm's own (q/v biases, q/k norms, the attention's scale norm and gate,
grouped key/value heads, SwiGLU and scaled MLPs, layer scale, post-norm blocks, attention pooling): the blocks stay
timm's, and only their attention becomes :class:`EvaAttentionPE` (the same modules under the same names, attention
through :func:`visionpe.attend`). The forward is the ViT adapter's (:class:`~visionpe.backbones.vit.GridTransformer`):
the token layout goes to every block where timm's Eva passes its RoPE table (``rope=``), so nothing is shared
between calls.

The architecture's own encoding (``pe="native"``, the default of ``vpe_<eva name>``) is timm's, exactly
(:func:`native_eva`): the learned ``pos_embed`` is ``learned``; ``RotaryEmbeddingCat`` is ``rope_axial`` with
``theta`` = its temperature, its ``grid_indexing`` as ``axis_order``, its pair layout, and ``scaling="pi"`` against
``ref_feat_shape`` (EVA-02, the ``*_reg*_gap_256`` ports) or ``"none"`` (integer positions, the rope-vit ports), and
its ``grid_offset`` (Perception Encoder's ``rope_grid_offset=1``: patches counted from 1 beside the unrotated class
token, then scaled to ``ref_feat_shape``); ``RotaryEmbeddingMixed`` is ``rope_mixed`` taking over each block's
learned frequencies; ``RotaryEmbeddingDinoV3`` is ``rope_axial`` on normalised coordinates (``coords="normalized"``);
``RotaryEmbeddingMRope`` (``rope_type="mrope"``) is ``rope_axial`` with M-RoPE's interleaved spectrum over (t, h, w),
time an inert axis (``inert_axes=1``), half pairs; timm's train-time coordinate augmentation (``rope_shift_coords``,
...) comes along. What has no visionpe equivalent is refused with the reason, though any other encoding may replace
it.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn.functional as F
from timm.layers import RotaryEmbeddingCat, RotaryEmbeddingMixed
from timm.models.eva import Eva, EvaBlockPostNorm
from torch import nn

from ..attention import ScriptedAttention, attend, merge_heads, split_heads, split_qkv
from ..rotary import MixedRoPE
from ..weights.convert import LoadReport
from .adapter import GLOBAL_REFUSES, Adapter, native_before_patching, recorded_native, register_adapter
from .vit import (GridTransformer, ScriptedBlock, ScriptedGridForward, any_size_vit, check_not_causal, head_dim_of,
                  put_block_encodings, scripted_attention, split_layer_freqs, vit_features)

# called inside a traced forward, each is one call in a torch.fx graph, run on the real tensors (positions at any size)
torch.fx.wrap("attend")
torch.fx.wrap("check_not_causal")

try:  # timm >= 1.0.20 (DINOv3); the floor's Eva has no such RoPE
    from timm.layers import RotaryEmbeddingDinoV3
except ImportError:
    RotaryEmbeddingDinoV3 = None
try:  # a recent timm's M-RoPE (GenLIP); older ones have none
    from timm.layers.pos_embed_sincos import RotaryEmbeddingMRope
except ImportError:
    RotaryEmbeddingMRope = None

PROJECTIONS = ("qkv", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "attn_drop", "norm", "gate", "proj",
               "proj_drop")  # the modules of timm's EvaAttention and AttentionRope, by their names
NORMS = ("q_norm", "k_norm", "norm")


class EvaAttentionPE(nn.Module):
    """Replaces timm's ``EvaAttention`` and ``AttentionRope``: their modules and parameters under their names (a
    fused ``qkv`` with ``q_bias``/``v_bias`` and a zero ``k_bias`` buffer, or ``q_proj``/``k_proj``/``v_proj`` with
    ``num_kv_heads`` key/value heads; ``q_norm``, ``k_norm``, the scale ``norm``, the output ``gate``, ``proj``), so
    a timm Eva state dict loads unchanged; ``rotary`` and ``bias`` hold the block's encodings. timm's BEiT
    ``Attention`` (the fused form, without norms: identities here) is replaced the same way (``beit.py``).

    Call as timm's Eva block calls it: ``attn(x, rope=layout, attn_mask=None, is_causal=False)`` with
    ``x: (B, T, dim)`` and ``rope`` the call's token :class:`~visionpe.grid.Layout` (where timm passes its RoPE
    table). Grouped key/value heads are repeated to the query heads before the encodings (timm rotates before it
    repeats; a rotation shared by the heads gives the same).
    """

    attention: str = "auto"  # visionpe.attend's choice (visionpe.set_attention)

    def __init__(self, source: nn.Module, rotary: nn.Module | None = None, bias: nn.Module | None = None):
        super().__init__()
        self.num_heads, self.head_dim = source.num_heads, head_dim_of(source)
        self.num_kv_heads = getattr(source, "num_kv_heads", source.num_heads)
        self.qkv_bias_separate = getattr(source, "qkv_bias_separate", False)
        for name in PROJECTIONS:
            module = getattr(source, name, None)  # BEiT's attention has no q/k norms nor a scale norm: identities
            setattr(self, name, nn.Identity() if module is None and name in NORMS else module)
        self.q_bias, self.v_bias = getattr(source, "q_bias", None), getattr(source, "v_bias", None)
        self.register_buffer("k_bias", getattr(source, "k_bias", None), persistent=False)
        self.rotary, self.bias = rotary, bias

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x: (B, T, dim)`` -> q ``(B, heads, T, head_dim)``, k and v ``(B, kv_heads, T, head_dim)``, as timm."""
        if self.qkv is None:
            return tuple(split_heads(proj(x), proj.out_features // self.head_dim)
                         for proj in (self.q_proj, self.k_proj, self.v_proj))
        if self.q_bias is None:
            qkv = self.qkv(x)
        else:
            bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
            qkv = self.qkv(x) + bias if self.qkv_bias_separate else F.linear(x, self.qkv.weight, bias)
        return split_qkv(qkv, self.num_heads)

    def forward(self, x: torch.Tensor, rope=None, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        check_not_causal(is_causal)
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self.project(x)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.num_kv_heads != self.num_heads:  # grouped-query attention: head h reads key/value head h // groups
            groups = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        dropout_p = self.attn_drop.p if self.training else 0.0
        out = attend(q, k, v, rope, self.rotary, self.bias, attn_mask, dropout_p=dropout_p, attention=self.attention,
                     tokens=x)
        out = self.norm(merge_heads(out))
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))


class ScriptedEvaAttention(ScriptedAttention):
    """TorchScript form of :class:`EvaAttentionPE`: its projection (a fused ``qkv`` with ``q_bias``/``v_bias`` and the
    zero ``k_bias``, or ``q_proj``/``k_proj``/``v_proj``; grouped key/value heads repeated to the query heads), then
    :class:`~visionpe.attention.ScriptedAttention`'s encodings and attention."""

    def __init__(self, attn: EvaAttentionPE, rotary: nn.Module | None, bias: nn.Module | None):
        super().__init__(attn, rotary, bias)
        self.head_dim, self.num_kv_heads = attn.head_dim, attn.num_kv_heads
        self.qkv_bias_separate = attn.qkv_bias_separate
        self.q_proj, self.k_proj, self.v_proj = attn.q_proj, attn.k_proj, attn.v_proj
        self.q_bias, self.v_bias = attn.q_bias, attn.v_bias
        self.register_buffer("k_bias", attn.k_bias, persistent=False)

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv is None:
            q = self.q_proj(x).unflatten(-1, [-1, self.head_dim]).transpose(1, 2)
            k = self.k_proj(x).unflatten(-1, [-1, self.head_dim]).transpose(1, 2)
            v = self.v_proj(x).unflatten(-1, [-1, self.head_dim]).transpose(1, 2)
        else:
            q_bias, k_bias, v_bias = self.q_bias, self.k_bias, self.v_bias
            if q_bias is None or k_bias is None or v_bias is None:
                fused = self.qkv(x)
            else:
                bias = torch.cat((q_bias, k_bias, v_bias))
                fused = self.qkv(x) + bias if self.qkv_bias_separate else F.linear(x, self.qkv.weight, bias)
            split = fused.unflatten(-1, [3, self.num_heads, -1]).permute(2, 0, 3, 1, 4)
            q, k, v = split[0], split[1], split[2]
        if self.num_kv_heads != self.num_heads:  # grouped-query attention: head h reads key/value head h // groups
            groups = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return q, k, v


class EvaPE(GridTransformer, Eva):
    """timm ``Eva`` whose position comes from visionpe encodings, at any input size (:class:`GridTransformer`:
    ``forward(x, grid_offset=None)``, ``forward_intermediates``, ``forward_masked``, ``forward_batch``). timm's
    blocks and heads are kept; ``eva_native`` records the model's own encoding as timm built it (``(pe,
    pe_kwargs)``, or why visionpe cannot reproduce it). ``torch.jit.script`` compiles its TorchScript form
    (:class:`ScriptedEva`)."""

    eva_native: tuple[str, dict] | str | None = None

    def scripted_block(self, block: nn.Module, where: str) -> ScriptedBlock:
        return ScriptedBlock(block, scripted_attention(block.attn, f"{where}.attn", ScriptedEvaAttention),
                             isinstance(block, EvaBlockPostNorm))

    def __prepare_scriptable__(self) -> "ScriptedEva":
        return ScriptedEva.of(self)


class ScriptedEva(ScriptedGridForward, Eva):
    """What ``torch.jit.script`` compiles for an :class:`EvaPE` (:class:`~visionpe.backbones.vit.ScriptedGridForward`;
    timm's blocks as :class:`~visionpe.backbones.vit.ScriptedBlock`, their attention :class:`ScriptedEvaAttention`)."""


def native_eva(model: Eva) -> tuple[str, dict]:
    """``(pe, pe_kwargs)`` reproducing timm's position encoding of the Eva ``model`` exactly: its RoPE
    (:func:`native_rope`) and its learned ``pos_embed`` (``learned``), or ``none``. A patched model answers with what
    it had when it was patched (or why it had none visionpe reproduces)."""
    recorded = recorded_native(model, "eva_native")
    if recorded is not None:
        return recorded
    names, kwargs = native_rope_of(model)
    if getattr(model, "pos_embed", None) is not None:
        names.append("learned")
    return "+".join(names) or "none", kwargs


def native_rope_of(model: nn.Module) -> tuple[list[str], dict]:
    """``([rotary name], its keywords)`` reproducing the RoPE timm keeps in ``model.rope`` (Eva, NaFlexVit), or
    ``([], {})`` for a model without one."""
    if getattr(model, "rope", None) is None:
        return [], {}
    rotary, kwargs = native_rope(model.rope)
    return [rotary], kwargs


def native_rope(rope: nn.Module) -> tuple[str, dict]:
    """``(encoding, keywords)`` of visionpe equal to timm's RoPE module ``rope``; a ``ValueError`` saying why for
    one visionpe cannot reproduce. A constant ``grid_offset`` (Perception Encoder's ``rope_grid_offset=1``) is
    ``rope_axial``'s ``grid_offset``: added to every patch coordinate before ``ref_feat_shape``'s scaling, prefix
    tokens unrotated, as timm."""
    augment = {k: getattr(rope, k) for k in ("shift_coords", "jitter_coords", "rescale_coords")
               if getattr(rope, k, None) is not None}
    pairs = "half" if getattr(rope, "rotate_half", False) else "interleaved"
    if isinstance(rope, RotaryEmbeddingCat):
        return "rope_axial", dict(**cat_coordinates(rope), **cat_bands(rope), axis_order=rope.grid_indexing,
                                  pairs=pairs, **augment)
    if isinstance(rope, RotaryEmbeddingMixed):
        return "rope_mixed", dict(theta=float(rope.temperature), axis_order=rope.grid_indexing, scaling="none",
                                  **augment)
    if RotaryEmbeddingDinoV3 is not None and isinstance(rope, RotaryEmbeddingDinoV3):
        if getattr(rope, "grid_offset", 0.0):
            raise ValueError(f"timm's RotaryEmbeddingDinoV3 with grid_offset={rope.grid_offset}: visionpe's normalised "
                             "coordinates take no constant offset; use --pe timm_unpatched, or another pe")
        periods = ({"min_period": rope.min_period, "max_period": rope.max_period}
                   if rope.min_period is not None and rope.max_period is not None else {"theta": rope.temperature})
        return "rope_axial", dict(coords="normalized", normalize_coords=rope.normalize_coords,
                                  axis_order=rope.grid_indexing, pairs=pairs, **periods, **augment)
    if RotaryEmbeddingMRope is not None and isinstance(rope, RotaryEmbeddingMRope):
        return "rope_axial", dict(theta=float(rope.temperature), spectrum="mrope_interleaved", inert_axes=1,
                                  sections=mrope_pair_counts(rope.mrope_section, rope.dim // 2), axis_order="ij",
                                  pairs="half", scaling="none", **augment)
    raise ValueError(f"timm's Eva RoPE {type(rope).__name__} has no visionpe equivalent; use --pe timm_unpatched, or another "
                     "pe")


def mrope_pair_counts(mrope_section, num_pairs: int) -> tuple[int, int, int]:
    """The rotation pairs per (t, h, w) that timm's interleaved M-RoPE gives ``num_pairs`` pairs: h takes pairs
    ``1, 4, 7, ...`` below ``3 * sections[1]``, w ``2, 5, 8, ...`` below ``3 * sections[2]`` (both clamped to the
    head), time (inert on an image) the rest; equal to ``mrope_section`` where it tiles the head exactly."""
    _, sec_h, sec_w = mrope_section
    h = len(range(1, min(3 * sec_h, num_pairs), 3))
    w = len(range(2, min(3 * sec_w, num_pairs), 3))
    return num_pairs - h - w, h, w


def cat_grid_type(rope: RotaryEmbeddingCat) -> str:
    """timm's coordinate grid of an axial RoPE module: ``"index"``, ``"pixel"`` or ``"centered"`` (a timm before
    ``grid_type`` chose by ``in_pixels``)."""
    return getattr(rope, "grid_type", None) or ("pixel" if rope.in_pixels else "index")


def cat_coordinates(rope: RotaryEmbeddingCat) -> dict:
    """``rope_axial``'s coordinates for timm's ``RotaryEmbeddingCat``: integer positions plus its ``grid_offset``,
    interpolated to ``ref_feat_shape`` (``scaling="pi"``) or not; its pixel grid (``coords="pixel"``, which reads no
    offset, as timm's); its centred grid (``coords="normalized"``). A ``ref_feat_shape`` on a ``[-1, 1]`` grid, and
    an offset on the centred one, have no visionpe equivalent."""
    grid_type, ref = cat_grid_type(rope), getattr(rope, "ref_feat_shape", None)
    offset = float(getattr(rope, "grid_offset", 0.0))
    if grid_type == "index":
        scaling = {"scaling": "pi", "ref_shape": tuple(ref)} if ref is not None else {"scaling": "none"}
        return {**scaling, **({"grid_offset": offset} if offset else {})}
    if ref is not None:
        raise ValueError(f"timm's RotaryEmbeddingCat on its {grid_type!r} grid with ref_feat_shape={tuple(ref)} "
                         "rescales [-1, 1] coordinates by ref / size, which visionpe's normalised coordinates do not "
                         "take; use --pe timm_unpatched, or another pe")
    if grid_type == "pixel":
        return {"coords": "pixel", "scaling": "none"}
    if offset:
        raise ValueError(f"timm's RotaryEmbeddingCat on its centred grid with grid_offset={offset}: visionpe's "
                         "normalised coordinates take no constant offset; use --pe timm_unpatched, or another pe")
    return {"coords": "normalized", "normalize_coords": rope.normalize_coords, "scaling": "none"}


def cat_bands(rope: RotaryEmbeddingCat) -> dict:
    """``rope_axial``'s frequencies for timm's ``RotaryEmbeddingCat``: its pixel-frequency bands (``in_pixels=True``:
    ``max_res``, ``linear_bands``), or ``1 / temperature^(i/n)`` radians per unit: ``theta`` on integer positions,
    the same written as periods ``2 pi temperature^(i/n)`` on a ``[-1, 1]`` grid (where ``theta`` alone counts
    turns, DINOv3's way)."""
    if rope.in_pixels:
        if not hasattr(rope, "linear_bands"):
            raise ValueError("this timm's RotaryEmbeddingCat(in_pixels=True) does not record linear_bands (how its "
                             "pixel-frequency bands are spaced); use --pe timm_unpatched, or another pe")
        return {"max_res": float(rope.max_res), "linear_bands": bool(rope.linear_bands)}
    theta = float(rope.temperature)
    if cat_grid_type(rope) == "index":
        return {"theta": theta}
    n = rope.dim // 4
    return {"min_period": 2 * math.pi, "max_period": 2 * math.pi * theta ** ((n - 1) / n)}


@torch.no_grad()
def take_over_mixed(rotary: nn.Module | None, freqs: torch.Tensor, grid_indexing: str) -> None:
    """One block's learned frequencies ``(2, heads, head_dim // 2)`` of timm's mixed RoPE go into the block's
    ``rope_mixed`` of the same shape and axis order."""
    if isinstance(rotary, MixedRoPE) and rotary.freqs.shape == freqs.shape and rotary.axis_order == grid_indexing:
        rotary.freqs.copy_(freqs)


def apply_eva(model: Eva, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a timm Eva in place: timm's RoPE module and ``pos_embed``
    give way (a ``learned`` table takes over ``pos_embed``, a ``rope_mixed`` each block's frequencies of timm's mixed
    RoPE), each attention becomes :class:`EvaAttentionPE`; every other weight is kept."""
    rope = getattr(model, "rope", None)
    native = native_before_patching(model, native_eva)
    mixed = rope.freqs.detach() if isinstance(rope, RotaryEmbeddingMixed) else None
    layers = iter(range(len(model.blocks)))

    def patch_block(block: nn.Module, rotary, bias) -> None:
        layer = next(layers)
        if mixed is not None:
            take_over_mixed(rotary, mixed[:, layer], rope.grid_indexing)
        block.attn = EvaAttentionPE(block.attn, rotary, bias)

    put_block_encodings(model, names, kwargs, patch_block)
    model.rope, model.rope_mixed, model.eva_native = None, False, native


def eva_keys(state: dict, report: LoadReport) -> dict:
    """A timm Eva checkpoint into a patched Eva: the mixed RoPE's ``rope.freqs (2, depth, heads, d/2)`` -> each
    block's ``blocks.i.attn.rotary.freqs``; every other key keeps its name (``pos_embed`` is converted as a ViT's)."""
    state = dict(state)
    freqs = state.pop("rope.freqs", None)
    if freqs is not None and freqs.ndim == 4:
        state.update(split_layer_freqs(freqs, report))
    elif freqs is not None:
        state["rope.freqs"] = freqs
    return state


register_adapter(Adapter(Eva, EvaPE, apply_eva, (EvaAttentionPE,), timm_modules=("eva",),
                         any_size=any_size_vit, native=native_eva, refuses=GLOBAL_REFUSES, feature_cfg=vit_features,
                         examples=("vit_small_patch16_rope_224", "eva02_tiny_patch14_224",
                                   "vit_medium_patch16_rope_reg1_gap_256", "vit_small_patch16_dinov3"),
                         checkpoint_hooks=(eva_keys,)))
