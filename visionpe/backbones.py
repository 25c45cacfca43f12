"""Put any visionpe encoding into timm backbones: ``create_model()`` and ``apply()``.

Supported: timm ``VisionTransformer`` (``vit_*``, ``deit_*``: class and register tokens, ``no_embed_class``,
every ``global_pool``), ``SwinTransformer`` and ``SwinTransformerV2``. ``apply`` keeps every weight that is not
positional, converts positional weights where that has a meaning (a learned ``pos_embed`` becomes the
``learned`` table, a Swin table or a Swin-V2 CPB MLP stays) and lets the model run at any input size.

How it is wired: the model's class is swapped for a thin subclass (``VisionTransformerPE``, ...) that
builds the token grid from the patch embedding's output, adds the tokens-family encoding, and shares the
grid with every block's attention. Each attention is replaced by one that keeps timm's projection
weights (same parameter names) and calls :func:`visionpe.attend` with the block's rotary and bias modules.
"""
from __future__ import annotations

import inspect
import math

import timm
import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import Format
from timm.models.swin_transformer import SwinTransformer
from timm.models.swin_transformer_v2 import SwinTransformerV2
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from .attention import attend
from .checkpoint import pos_embed_tensors
from .grid import Grid
from .registry import ENCODINGS, build, check_name
from .tokens import PEG


# -- parsing "rope_mixed+learned" ----------------------------------------------------------------------
def parse_pe(pe: str) -> dict[str, str]:
    """``"rope_mixed+learned"`` -> ``{"rotary": "rope_mixed", "tokens": "learned"}``; ``"none"`` -> ``{}``.

    At most one encoding per family.
    """
    if not isinstance(pe, str) or not pe:
        raise ValueError(f"pe must be a name like 'rope_mixed' or 'rope_mixed+learned', got {pe!r}")
    if pe == "none":
        return {}
    by_family: dict[str, str] = {}
    for name in pe.split("+"):
        family = check_name(name, "pe").family
        if family in by_family:
            raise ValueError(f"pe={pe!r} combines {by_family[family]!r} and {name!r}, both of family {family!r}; "
                             f"combine at most one tokens, one rotary and one bias encoding")
        by_family[family] = name
    return by_family


def _route_kwargs(names: dict[str, str], pe_kwargs: dict) -> dict[str, dict]:
    """Give each keyword to every encoding of the combination whose constructor takes it."""
    routed = {name: {} for name in names.values()}
    for key, value in pe_kwargs.items():
        takers = [n for n in routed if key in inspect.signature(ENCODINGS[n].__init__).parameters]
        if not takers:
            raise ValueError(f"pe keyword {key!r} is not taken by {' + '.join(routed) or 'none'}")
        for n in takers:
            routed[n][key] = value
    return routed


# -- shared grid ---------------------------------------------------------------------------------------
class GridState:
    """The patch grid of the batch in flight, set by the model and read by every block's attention."""

    grid: Grid | None = None


def _check_input_size(x: torch.Tensor, multiple, model_name: str) -> None:
    sizes = tuple(x.shape[2:])
    if any(s % m or s < m for s, m in zip(sizes, multiple)):
        raise ValueError(f"input size {sizes} does not fit {model_name}: each side must be a positive multiple of "
                         f"{tuple(multiple)} (e.g. {tuple(m * 4 for m in multiple)} or {tuple(m * 6 for m in multiple)})")


# -- attention modules that carry encodings ------------------------------------------------------------
class GridAttention(nn.Module):
    """Replaces timm's ``Attention``: same projections (``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``proj``),
    plus the block's ``rotary`` and ``bias`` encodings, on the grid held by ``grid_state``."""

    def __init__(self, source: nn.Module, grid_state: GridState, rotary=None, bias=None):
        super().__init__()
        self.num_heads, self.head_dim = source.num_heads, source.head_dim
        self.attn_dim = getattr(source, "attn_dim", self.num_heads * self.head_dim)
        for name in ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop"):
            setattr(self, name, getattr(source, name, nn.Identity()))
        self.gate = getattr(source, "gate", None)
        self.rotary, self.bias = rotary, bias
        self.grid_state = grid_state

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False):
        if is_causal:
            raise ValueError("is_causal=True is not supported with positional encodings over a grid")
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = rearrange(self.qkv(x), "b t (three h d) -> three b h t d", three=3, h=self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        x = attend(q, k, v, self.grid_state.grid, self.rotary, self.bias, attn_mask,
                   dropout_p=self.attn_drop.p if self.training else 0.0)
        x = self.norm(rearrange(x, "b h t d -> b t (h d)"))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


class WindowGridAttention(nn.Module):
    """Replaces Swin (v1/v2) ``WindowAttention``: same projections, encodings over one window's grid.

    Swin-V2's cosine attention (``logit_scale``, ``q_bias``/``v_bias``) is kept when the source has it.
    """

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
        """Called by timm's ``set_input_size``: a new window resizes a table bias (as timm does)."""
        window_size = tuple(window_size)
        if window_size != self.window_size and hasattr(self.bias, "resize"):
            self.bias.resize(window_size)
        self.window_size = window_size

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        if self.cosine and self.q_bias is not None:
            return F.linear(x, self.qkv.weight, torch.cat([self.q_bias, torch.zeros_like(self.v_bias), self.v_bias]))
        return self.qkv(x)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x: (num_windows * B, Wh * Ww, C)``; ``mask: (num_windows, N, N)`` shift mask or None."""
        q, k, v = rearrange(self._qkv(x), "b t (three h d) -> three b h t d", three=3, h=self.num_heads)
        scale = None
        if self.cosine:
            logit_scale = torch.clamp(self.logit_scale, max=math.log(1.0 / 0.01)).exp()
            q, k, scale = F.normalize(q, dim=-1) * logit_scale, F.normalize(k, dim=-1), 1.0
        if mask is not None:
            num_windows = mask.shape[0]
            mask = rearrange(mask.expand(x.shape[0] // num_windows, -1, -1, -1), "b w n m -> (b w) 1 n m")
        out = attend(q, k, v, Grid(self.window_size), self.rotary, self.bias, mask,
                     dropout_p=self.attn_drop.p if self.training else 0.0, scale=scale)
        return self.proj_drop(self.proj(rearrange(out, "b h t d -> b t (h d)")))


# -- model subclasses ----------------------------------------------------------------------------------
class PositionalModel:
    """Mixin of the patched model classes: encoding bookkeeping shared by ViT and Swin."""

    pe: str = "none"

    def no_weight_decay(self) -> set[str]:
        """timm's set plus every encoding parameter (tables, learned frequencies, CPB MLPs), PEG convs excepted."""
        names = set(super().no_weight_decay())
        for prefix, module in self.named_modules():
            if getattr(module, "family", None) and not isinstance(module, PEG):
                names |= {f"{prefix}.{n}" for n, _ in module.named_parameters()}
        return names


class VisionTransformerPE(PositionalModel, VisionTransformer):
    """timm ``VisionTransformer`` whose position comes from visionpe encodings, at any input size."""

    pe_tokens: nn.Module | None

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (B, *grid, C)`` from the patch embedding -> ``(B, P + N, C)`` with prefix tokens and position."""
        grid = Grid(tuple(x.shape[1:-1]), prefix=self.num_prefix_tokens)
        self.grid_state.grid = grid
        x = rearrange(x, "b ... c -> b (...) c")
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        x = torch.cat(prefix + [x], dim=1)
        if self.pe_tokens is not None:
            x = self.pe_tokens(x, grid)
        return self.pos_drop(x)

    def forward_features(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        _check_input_size(x, self.patch_embed.patch_size, type(self).__name__)
        return super().forward_features(x, *args, **kwargs)

    def forward_intermediates(self, x: torch.Tensor, *args, **kwargs):
        _check_input_size(x, self.patch_embed.patch_size, type(self).__name__)
        return super().forward_intermediates(x, *args, **kwargs)


class SwinTransformerPE(PositionalModel, SwinTransformer):
    """timm ``SwinTransformer`` with visionpe encodings inside its windows."""

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        _check_input_size(x, self.patch_embed.patch_size, type(self).__name__)
        return super().forward_features(x)


class SwinTransformerV2PE(PositionalModel, SwinTransformerV2):
    """timm ``SwinTransformerV2`` with visionpe encodings inside its windows."""

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        _check_input_size(x, self.patch_embed.patch_size, type(self).__name__)
        return super().forward_features(x)


PATCHED = {VisionTransformer: VisionTransformerPE, SwinTransformer: SwinTransformerPE,
           SwinTransformerV2: SwinTransformerV2PE}
SUPPORTED = ", ".join(cls.__name__ for cls in PATCHED)


def _base_class(model: nn.Module) -> type:
    cls = type(model)
    if cls in PATCHED.values():
        return next(base for base, patched in PATCHED.items() if patched is cls)
    if cls not in PATCHED:
        raise ValueError(f"model class {cls.__name__} is not supported; supported timm classes: {SUPPORTED}")
    return cls


# -- apply ---------------------------------------------------------------------------------------------
def apply(model: nn.Module, pe: str = "learned", **pe_kwargs) -> nn.Module:
    """Give a timm backbone the encoding ``pe`` in place and return it; non-positional weights are kept.

    Args:
        model: a timm ``VisionTransformer``, ``SwinTransformer`` or ``SwinTransformerV2`` (patched or not).
        pe: an encoding name from :func:`visionpe.available`, a ``+`` combination of one encoding per family
            (``"rope_mixed+learned"``), or ``"none"``.
        pe_kwargs: constructor keywords, each given to the encodings of the combination that take it
            (e.g. ``scaling="pi"``, ``interpolation="bilinear"``, ``theta=10``).
    """
    names = parse_pe(pe)
    kwargs = _route_kwargs(names, pe_kwargs)
    base = _base_class(model)
    if base is VisionTransformer:
        _apply_vit(model, names, kwargs)
    else:
        _apply_swin(model, names, kwargs)
    model.__class__ = PATCHED[base]
    model.pe = pe
    return model


def _apply_vit(model: VisionTransformer, names: dict, kwargs: dict) -> None:
    if names.get("bias") == "swin_bias":
        raise ValueError("swin_bias needs window attention (Swin); for a ViT use rel_bias (BEiT's global table), "
                         "cpb or alibi")
    patch_embed = model.patch_embed
    patch_embed.strict_img_size, patch_embed.flatten, patch_embed.output_fmt = False, False, Format.NHWC
    model.dynamic_img_size = True
    grid_shape = tuple(patch_embed.grid_size)
    dim = model.embed_dim
    old_table = model.pos_embed.detach() if isinstance(getattr(model, "pos_embed", None), nn.Parameter) else None
    tokens = None
    if "tokens" in names:
        name = names["tokens"]
        defaults = {"dim": dim, "ndim": len(grid_shape)}
        if name == "learned":
            prefix = 0 if model.no_embed_class else model.num_prefix_tokens
            defaults.update(grid=grid_shape, num_prefix_tokens=prefix)
        tokens = build(name, **{**defaults, **kwargs[name]})
        existing = getattr(model, "pe_tokens", None)
        if name == "learned" and isinstance(existing, ENCODINGS["learned"]) and existing.grid_shape == grid_shape:
            tokens.load_state_dict(existing.state_dict())
        elif name == "learned" and old_table is not None and old_table.shape[1] == \
                tokens.num_prefix_tokens + math.prod(grid_shape):
            tokens.load_state_dict(pos_embed_tensors(tokens, old_table, grid_shape))
    model.pos_embed = None
    model.pe_tokens = tokens
    model.grid_state = getattr(model, "grid_state", None) or GridState()
    shared = {}  # parameter-free encodings are shared by all blocks: one cache
    for block in model.blocks:
        source = block.attn
        num_heads = source.num_heads
        rotary = bias = None
        if "rotary" in names:
            rotary = _block_encoding(names["rotary"], shared, head_dim=source.head_dim, num_heads=num_heads,
                                     ndim=len(grid_shape), ref_shape=grid_shape, **kwargs[names["rotary"]])
            _carry_over(rotary, getattr(source, "rotary", None))
        if "bias" in names:
            name = names["bias"]
            defaults = {"num_heads": num_heads}
            defaults.update({"rel_bias": {"grid": grid_shape}, "cpb": {"window_size": grid_shape},
                             "alibi": {"ndim": len(grid_shape)}}[name])
            bias = _block_encoding(name, shared, **{**defaults, **kwargs[name]})
            _carry_over(bias, getattr(source, "bias", None))
        block.attn = GridAttention(source, model.grid_state, rotary, bias)


def _carry_over(new: nn.Module, old: nn.Module | None) -> None:
    """Re-applying an encoding to a patched model keeps its learned weights (same type and shapes)."""
    if type(old) is type(new):
        old_state, new_state = old.state_dict(), new.state_dict()
        if old_state.keys() == new_state.keys() and all(old_state[k].shape == v.shape for k, v in new_state.items()):
            new.load_state_dict(old_state)


def _block_encoding(name: str, shared: dict, **kw) -> nn.Module:
    """Build one block's encoding; parameter-free ones (axial RoPE, ALiBi) are shared when identical."""
    module = build(name, **kw)
    if any(True for _ in module.parameters()):
        return module
    key = (name, tuple(sorted((k, repr(v)) for k, v in kw.items())))
    return shared.setdefault(key, module)


def _apply_swin(model: nn.Module, names: dict, kwargs: dict) -> None:
    if "tokens" in names:
        raise ValueError(f"{type(model).__name__} takes bias and rotary encodings (swin_bias, cpb, rel_bias, alibi, "
                         f"rope_axial, rope_mixed); tokens encodings ({names['tokens']}) need a ViT")
    model.patch_embed.strict_img_size = False
    model.dynamic_img_size = True
    shared = {}
    for stage in model.layers:
        for block in stage.blocks:
            block.dynamic_mask = True
            source = block.attn
            window = tuple(source.window_size)
            head_dim = source.qkv.weight.shape[0] // 3 // source.num_heads
            rotary = bias = None
            if "rotary" in names:
                rotary = _block_encoding(names["rotary"], shared, head_dim=head_dim, num_heads=source.num_heads,
                                         ndim=2, ref_shape=window, **kwargs[names["rotary"]])
                _carry_over(rotary, getattr(source, "rotary", None))
            if "bias" in names:
                bias = _swin_bias(names["bias"], source, window, shared, kwargs[names["bias"]])
            block.attn = WindowGridAttention(source, rotary, bias)


def _swin_bias(name: str, source: nn.Module, window, shared: dict, kw: dict) -> nn.Module:
    """A window bias for one Swin block, taking over the block's own table or CPB MLP when it has one."""
    if name == "rel_bias":
        raise ValueError("rel_bias is a global (whole-image) table for ViTs; in Swin windows use swin_bias")
    defaults = {"num_heads": source.num_heads}
    if name in ("swin_bias", "cpb"):
        defaults["window_size"] = window
    else:
        defaults["ndim"] = 2
    if name == "cpb":
        pretrained = getattr(source, "pretrained_window_size", None)
        if pretrained is not None and any(pretrained):
            defaults["pretrained_window_size"] = tuple(pretrained)
    bias = _block_encoding(name, shared, **{**defaults, **kw})
    if type(getattr(source, "bias", None)) is type(bias):  # already patched: keep its module's weights
        _carry_over(bias, source.bias)
    elif name == "swin_bias" and hasattr(source, "relative_position_bias_table"):
        with torch.no_grad():
            bias.relative_position_bias_table.copy_(source.relative_position_bias_table)
    elif name == "cpb" and hasattr(source, "cpb_mlp") and source.cpb_mlp[0].in_features == 2 \
            and source.cpb_mlp[0].out_features == bias.cpb_mlp[0].out_features:
        bias.cpb_mlp.load_state_dict(source.cpb_mlp.state_dict())
    return bias


# -- create_model --------------------------------------------------------------------------------------
def create_model(model_name: str, pe: str = "learned", pretrained: bool = False, pe_kwargs: dict | None = None,
                 **timm_kwargs) -> nn.Module:
    """``timm.create_model(model_name, **timm_kwargs)`` with the encoding ``pe``, runnable at any input size.

    >>> model = create_model("deit_tiny_patch16_224", pe="rope_mixed", img_size=64, patch_size=8, num_classes=10)
    >>> model(torch.randn(2, 3, 96, 96)).shape
    torch.Size([2, 10])

    ``pe_kwargs`` go to the encodings (see :func:`apply`); every other keyword goes to timm.
    """
    parse_pe(pe)
    if not timm.is_model(model_name):
        raise ValueError(f"model_name={model_name!r} is not a timm model; use a vit_*, deit_* or swin* name "
                         f"(timm.list_models('vit_*'))")
    if timm.models.is_model_in_modules(model_name, ["vision_transformer"]):
        timm_kwargs.setdefault("dynamic_img_size", True)
    elif timm.models.is_model_in_modules(model_name, ["swin_transformer", "swin_transformer_v2"]):
        timm_kwargs.setdefault("strict_img_size", False)
    model = timm.create_model(model_name, pretrained=pretrained, **timm_kwargs)
    return apply(model, pe, **(pe_kwargs or {}))


def encodings_of(model: nn.Module) -> dict[str, list[nn.Module]]:
    """The encodings of a patched model: ``{"tokens": [...], "rotary": [one per block], "bias": [one per block]}``."""
    found = {"tokens": [], "rotary": [], "bias": []}
    tokens = getattr(model, "pe_tokens", None)
    if tokens is not None:
        found["tokens"].append(tokens)
    for module in model.modules():
        if isinstance(module, (GridAttention, WindowGridAttention)):
            for family, enc in (("rotary", module.rotary), ("bias", module.bias)):
                if enc is not None:
                    found[family].append(enc)
    return found
