"""Put any visionpe encoding into a backbone: :func:`create_model`, :func:`apply`, :func:`encodings_of`.

Supported: timm ``VisionTransformer`` (``vit_*``, ``deit_*``), ``SwinTransformer`` and ``SwinTransformerV2``; a
video ViT on tubelets (:func:`visionpe.create_video_model`). ``apply`` keeps every weight that is not
positional, converts positional weights where that has a meaning (a learned ``pos_embed`` becomes the ``learned``
table, a Swin table or a Swin-V2 CPB MLP stays) and lets the model run at any input size.

How it is wired: the model's class is swapped for a thin subclass (``VisionTransformerPE``, ...) from the
adapter of its family (``vit.py``, ``swin.py``); a new backbone is one more adapter module and one more row
of :data:`ADAPTERS`.
"""
from __future__ import annotations

import timm
from timm.models.swin_transformer import SwinTransformer
from timm.models.swin_transformer_v2 import SwinTransformerV2
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from .._checks import check_bool, check_choice, to_shape
from ..attention import ATTENTIONS, Attention, set_attention
from ..encoding import Encoding
from .adapter import parse_pe, route_kwargs
from .swin import SwinTransformerPE, SwinTransformerV2PE, WindowAttention, apply_swin
from .video_swin import SwinTransformer3d, SwinTransformer3dPE, apply_video_swin
from .vit import VisionTransformerPE, apply_vit

# model class -> (patched subclass, function putting the encodings in place)
ADAPTERS = {
    VisionTransformer: (VisionTransformerPE, apply_vit),
    SwinTransformer: (SwinTransformerPE, apply_swin),
    SwinTransformerV2: (SwinTransformerV2PE, apply_swin),
    SwinTransformer3d: (SwinTransformer3dPE, apply_video_swin),  # torchvision swin3d_t/s/b
}
SUPPORTED = ", ".join(cls.__name__ for cls in ADAPTERS)


def _base_class(model: nn.Module) -> type:
    cls = type(model)
    for base, (patched, _) in ADAPTERS.items():
        if cls in (base, patched):
            return base
    raise ValueError(f"model class {cls.__name__} is not supported; supported timm classes: {SUPPORTED}")


def apply(model: nn.Module, pe: str = "learned", attention: str = "auto", **pe_kwargs) -> nn.Module:
    """Give a backbone the encoding ``pe`` in place and return it; non-positional weights are kept.

    Args:
        model: a timm ``VisionTransformer``, ``SwinTransformer`` or ``SwinTransformerV2`` (patched or not).
        pe: an encoding name from :func:`visionpe.available`, a ``+`` combination of one encoding per family
            (``"rope_mixed+learned"``), or ``"none"``.
        attention: every attention's :func:`visionpe.attend` choice, ``"auto"``, ``"sdpa"`` or ``"flex"``
            (:func:`visionpe.set_attention`).
        pe_kwargs: constructor keywords, each given to the encodings of the combination that take it
            (e.g. ``scaling="pi"``, ``interpolation="bilinear"``, ``theta=10``).
    """
    check_choice("attention", attention, ATTENTIONS)
    names = parse_pe(pe)
    kwargs = route_kwargs(names, pe_kwargs)
    base = _base_class(model)
    patched, put_encodings = ADAPTERS[base]
    put_encodings(model, names, kwargs)
    model.__class__ = patched
    model.pe = pe
    return set_attention(model, attention)


def create_model(model_name: str, pe: str = "learned", pretrained: bool = False, pe_kwargs: dict | None = None,
                 attention: str = "auto", **timm_kwargs) -> nn.Module:
    """``timm.create_model(model_name, **timm_kwargs)`` with the encoding ``pe``, runnable at any input size.

    >>> model = create_model("deit_tiny_patch16_224", pe="rope_mixed", img_size=64, patch_size=8, num_classes=10)
    >>> model(torch.randn(2, 3, 96, 96)).shape
    torch.Size([2, 10])

    ``pe_kwargs`` go to the encodings and ``attention`` to every attention (see :func:`apply`); every other keyword
    goes to timm.
    """
    check_choice("attention", attention, ATTENTIONS)
    route_kwargs(parse_pe(pe), {} if pe_kwargs is None else pe_kwargs)  # bad pe / pe_kwargs fail before timm builds
    if not isinstance(model_name, str) or not timm.is_model(model_name):
        raise ValueError(f"model_name={model_name!r} is not a timm model; use a vit_*, deit_* or swin* name "
                         f"(timm.list_models('vit_*'))")
    check_bool("pretrained", pretrained)
    model = timm.create_model(model_name, pretrained=pretrained, **any_size_kwargs(model_name, timm_kwargs))
    return apply(model, pe, attention, **(pe_kwargs or {}))


def any_size_kwargs(model_name: str, timm_kwargs: dict) -> dict:
    """``timm_kwargs`` plus what makes timm's ``model_name`` run at any input size, the way timm does it
    (``dynamic_img_size`` for ViT/DeiT and Eva, ``strict_img_size=False`` for Swin; the caller's values win),
    checked: ``img_size`` a multiple of ``patch_size``, a Swin ``window_size`` of 2 sides."""
    kwargs = dict(timm_kwargs)
    if timm.models.is_model_in_modules(model_name, ["vision_transformer", "eva"]):
        kwargs.setdefault("dynamic_img_size", True)
        check_img_size(kwargs)
    elif timm.models.is_model_in_modules(model_name, ["swin_transformer", "swin_transformer_v2"]):
        kwargs.setdefault("strict_img_size", False)
        check_img_size(kwargs)
        if "window_size" in kwargs:
            to_shape("window_size", kwargs["window_size"], 2)
    return kwargs


def check_img_size(timm_kwargs: dict) -> None:
    """``img_size`` must be a multiple of ``patch_size`` at construction, not only at the first forward."""
    img, patch = timm_kwargs.get("img_size"), timm_kwargs.get("patch_size")
    if patch is not None:
        patch = to_shape("patch_size", patch, 2)
    if img is None:
        return
    img = to_shape("img_size", img, 2)
    if patch is None:
        return
    if any(i % p for i, p in zip(img, patch)):
        raise ValueError(f"img_size={timm_kwargs['img_size']!r} must be a multiple of "
                         f"patch_size={timm_kwargs['patch_size']!r}")


def encodings_of(model: nn.Module) -> dict[str, list[Encoding]]:
    """The encodings of a patched model: ``{"tokens": [...], "rotary": [one per block], "bias": [one per block]}``."""
    found = {"tokens": [], "rotary": [], "bias": []}
    tokens = getattr(model, "pe_tokens", None)
    if tokens is not None:
        found["tokens"].append(tokens)
    for module in model.modules():
        if isinstance(module, (Attention, WindowAttention)):
            for family, enc in (("rotary", module.rotary), ("bias", module.bias)):
                if enc is not None:
                    found[family].append(enc)
    return found
