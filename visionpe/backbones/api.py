"""Put any visionpe encoding into a backbone: :func:`create_model`, :func:`apply`, :func:`encodings_of`.

Supported: every registered adapter (:data:`~visionpe.backbones.adapter.ADAPTERS`): timm ``VisionTransformer``
(``vit_*``, ``deit_*``), ``VisionTransformerDistilled`` (``deit_*_distilled_*``), ``SwinTransformer`` and
``SwinTransformerV2``, ``Eva`` (EVA-02, the rope-vit ports, DINOv3), torchvision's ``SwinTransformer3d`` and
``VisionTransformer``, transformers' ViT/DeiT/DINOv2/Swin, and a video ViT on tubelets
(:func:`visionpe.create_video_model`). ``apply`` keeps every weight that is not positional,
converts positional weights where that has a meaning (a learned ``pos_embed`` becomes the ``learned`` table, a Swin
table or a Swin-V2 CPB MLP stays) and lets the model run at any input size.

How it is wired: the model's class is swapped for the thin subclass of its adapter (``VisionTransformerPE``, ...);
a new backbone is one adapter module with one :func:`~visionpe.backbones.adapter.register_adapter` call.
"""
from __future__ import annotations

import itertools

import timm
import torch
from timm.models import build_model_with_cfg
from torch import nn

from .._checks import check_bool, check_choice
from ..attention import ATTENTIONS, set_attention
from ..encoding import Encoding
from .adapter import (ADAPTERS, NATIVE, adapter_for, check_encodings, check_grid_fits, parse_pe, route_kwargs,
                      timm_adapter)


FEATURE_KEYWORDS = ("features_only", "out_indices", "feature_cls")  # timm's feature extraction keywords


def apply(model: nn.Module, pe: str = "learned", attention: str = "auto", **pe_kwargs) -> nn.Module:
    """Give a backbone the encoding ``pe`` in place and return it; non-positional weights are kept.

    Args:
        model: a model of a registered adapter's class (patched or not): timm ``VisionTransformer``,
            ``VisionTransformerDistilled``, ``SwinTransformer``, ``SwinTransformerV2``, ``Eva``, torchvision
            ``SwinTransformer3d``, ...
        pe: an encoding name from :func:`visionpe.available`, a ``+`` combination of one encoding per family
            (``"rope_mixed+learned"``), ``"none"``, or ``"native"``: the architecture's own encoding with its
            keywords (its adapter's ``native``: ``learned`` for a ViT, ``swin_bias`` for Swin, an Eva's RoPE as timm
            builds it), so the model computes what the original does, at any input size.
        attention: every attention's :func:`visionpe.attend` choice, ``"auto"``, ``"sdpa"`` or ``"flex"``
            (:func:`visionpe.set_attention`).
        pe_kwargs: constructor keywords, each given to the encodings of the combination that take it
            (e.g. ``scaling="pi"``, ``interpolation="bilinear"``, ``theta=10``); with ``pe="native"`` they override
            the native ones.
    """
    check_choice("attention", attention, ATTENTIONS)
    if pe == NATIVE:
        pe, native_kwargs = adapter_for(model).native_pe(model)
        pe_kwargs = {**native_kwargs, **pe_kwargs}
    names = parse_pe(pe)
    kwargs = route_kwargs(names, pe_kwargs)
    adapter = adapter_for(model)
    check_encodings(adapter, names, type(model).__name__)
    with torch.device(model_device(model)):  # the encodings' tables and parameters are made where the model is
        adapter.put_encodings(model, names, kwargs)
    for module in model.modules():  # what apply built takes the model's mode (in evaluation: no augmentation draw,
        if isinstance(module, Encoding):  # no attention dropout)
            module.train(model.training)
        elif isinstance(module, adapter.attention):
            module.training = model.training
    model.__class__ = adapter.patched
    model.applied(pe, pe_kwargs)
    return set_attention(model, attention)


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s weights are (its first parameter or buffer; the CPU for a model without any): ``meta`` for
    timm's ``create_model(..., device="meta")``."""
    tensor = next(itertools.chain(model.parameters(), model.buffers()), None)
    return torch.device("cpu") if tensor is None else tensor.device


def create_model(model_name: str, pe: str = "learned", pretrained: bool = False, pe_kwargs: dict | None = None,
                 attention: str = "auto", **timm_kwargs) -> nn.Module:
    """``timm.create_model(model_name, **timm_kwargs)`` with the encoding ``pe``, runnable at any input size.

    >>> model = create_model("deit_tiny_patch16_224", pe="rope_mixed", img_size=64, patch_size=8, num_classes=10)
    >>> model(torch.randn(2, 3, 96, 96)).shape
    torch.Size([2, 10])

    ``pe_kwargs`` go to the encodings and ``attention`` to every attention (see :func:`apply`; ``pe="native"``: the
    architecture's own encoding); every other keyword goes to timm.
    """
    check_choice("attention", attention, ATTENTIONS)
    if pe != NATIVE:  # bad pe / pe_kwargs fail before timm builds
        route_kwargs(parse_pe(pe), {} if pe_kwargs is None else pe_kwargs)
    if not isinstance(model_name, str) or not timm.is_model(model_name):
        examples = [name for adapter in ADAPTERS.values() if adapter.timm_modules for name in adapter.examples]
        raise ValueError(f"model_name={model_name!r} is not a timm model; use a name of a timm module visionpe "
                         f"adapts, e.g. {', '.join(examples[:6])} (timm.list_models('vit_*'))")
    reason = unsupported_reason(model_name)
    if reason is not None:
        raise ValueError(f"model_name={model_name!r}: {reason}")
    check_bool("pretrained", pretrained)
    check_grid_fits(timm_kwargs)
    features = {k: timm_kwargs.pop(k) for k in FEATURE_KEYWORDS if k in timm_kwargs}
    model = timm.create_model(model_name, pretrained=pretrained, **any_size_kwargs(model_name, timm_kwargs))
    model = apply(model, pe, attention, **(pe_kwargs or {}))
    return features_model(model, model_name, features) if features.pop("features_only", False) else model


def features_model(model: nn.Module, name: str, features: dict) -> nn.Module:
    """timm's ``features_only`` model of a patched ``model``: timm's own wrapper (``build_model_with_cfg`` with the
    family's ``feature_cfg`` from its adapter), ``features``' ``out_indices`` / ``feature_cls`` winning."""
    adapter = adapter_for(model)
    if adapter.feature_cfg is None:
        raise ValueError(f"{name}: {adapter.name} has no feature extraction (its adapter gives no feature_cfg)")
    return build_model_with_cfg(lambda **_: model, name, pretrained=False, pretrained_cfg=model.pretrained_cfg,
                                feature_cfg=adapter.feature_cfg(model), features_only=True, **features)


def any_size_kwargs(model_name: str, timm_kwargs: dict) -> dict:
    """``timm_kwargs`` plus what makes timm's ``model_name`` run at any input size, the way timm does it: its
    adapter's ``any_size`` (``dynamic_img_size`` for ViT/DeiT and Eva, ``strict_img_size=False`` for Swin; the
    caller's values win), checked; other models' keywords unchanged."""
    adapter = timm_adapter(model_name)
    kwargs = dict(timm_kwargs)
    return adapter.any_size(kwargs) if adapter is not None and adapter.any_size is not None else kwargs


def unsupported_reason(model_name: str) -> str | None:
    """Why visionpe does not take timm's ``model_name`` (its adapter's ``unsupported`` patterns: ``"<adapter> does
    not take <pattern> models: <why>"``), else None."""
    adapter = timm_adapter(model_name)
    why = None if adapter is None else adapter.unsupported_reason(model_name)
    return None if why is None else f"{adapter.name} does not take it: {why}"


def native_timm_modules() -> tuple[str, ...]:
    """timm modules whose models run at any input size as timm builds them (every adapter's ``timm_modules``)."""
    return tuple(dict.fromkeys(m for a in ADAPTERS.values() for m in a.timm_modules))


def encodings_of(model: nn.Module) -> dict[str, list[Encoding]]:
    """The encodings of a patched model: ``{"tokens": [...], "rotary": [one per block], "bias": [one per block]}``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module patched by visionpe.apply, got {type(model).__name__}")
    attention = tuple(cls for adapter in ADAPTERS.values() for cls in adapter.attention)
    found = {"tokens": [], "rotary": [], "bias": []}
    tokens = getattr(model, "pe_tokens", None)
    if tokens is not None:
        found["tokens"].append(tokens)
    for module in model.modules():
        if isinstance(module, attention):
            for family, enc in (("rotary", module.rotary), ("bias", module.bias)):
                if enc is not None:
                    found[family].append(enc)
    return found
