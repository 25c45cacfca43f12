"""visionpe models in timm's model registry: ``timm.create_model("vpe_" + timm_name, pe=..., pe_kwargs=...)``.

The scheme: every timm architecture that a registered adapter patches is registered once more under ``vpe_`` + its
timm name, with timm's pretrained tags (``vpe_vit_small_patch16_224.augreg_in21k_ft_in1k``). The names come from the
adapters (:data:`~visionpe.backbones.adapter.ADAPTERS`): every model of each adapter's ``timm_modules`` (ViT, DeiT
and DeiT-III in ``vision_transformer`` and ``deit``, ``swin_transformer``, ``swin_transformer_v2``, ``eva``, a
user's), except the names its ``unsupported`` patterns leave out (:func:`unsupported_timm_names` says why). An
adapter registered later (a user's) joins at once. A registered name takes

- ``pe``: any encoding or combination :func:`visionpe.create_model` takes; by default ``"native"``: the
  architecture's own, as its adapter's ``native`` gives it (``learned`` for a ViT, ``swin_bias`` for Swin, ``cpb``
  for Swin-V2, an Eva's RoPE with timm's conventions), so ``vpe_<name>`` is timm's ``<name>`` running at any input
  size;
- ``pe_kwargs``: the encoding's keywords (a dict);
- every timm keyword (``num_classes``, ``img_size``, ``drop_path_rate``, ``pretrained_cfg_overlay``, ...), and
  ``features_only=True`` with ``out_indices`` / ``feature_cls``: timm's own feature wrapper of the family (its
  adapter's ``feature_cfg``: the intermediate-layer getter for ViT and Eva, the stage list for Swin) around the
  visionpe model, as timm builds it for its own.

``pretrained=True`` loads timm's weights for the tag (or the ``file`` of ``pretrained_cfg_overlay``) the way timm
does (its download, checkpoint filter, classifier and input-channel adaptation) into a plain timm model, then
converts them into the visionpe model with :func:`visionpe.load_timm_checkpoint` from that model's grid (its report
is logged). Both models exist while the weights are converted: twice the model's memory, for that moment. The
pretrained cfgs are timm's, with ``fixed_input_size=False``: every ``vpe_*`` model runs at any input size.

``import visionpe`` registers the names as soon as timm is imported (before or after visionpe), without importing
timm itself (see :mod:`visionpe._import_hook`).
"""
from __future__ import annotations

import re
import sys
from collections import deque
from dataclasses import replace

import timm
from timm.models import (
    DefaultCfg,
    get_arch_pretrained_cfgs,
    get_pretrained_cfg,
    register_model,
    resolve_pretrained_cfg,
    split_model_name_tag,
)
from torch import nn

from ..weights.convert import load_timm_checkpoint, pos_embed_reader
from .adapter import ADAPTERS, NATIVE, Adapter

PREFIX = "vpe_"

# the registry's pretrained cfgs of each registered name, read by timm's register_model (as a timm model module's)
default_cfgs: dict[str, DefaultCfg] = {}


def timm_names() -> dict[str, Adapter]:
    """``{timm name: adapter}`` of every model in the registered adapters' ``timm_modules``, in the installed timm."""
    return {name: adapter for adapter in ADAPTERS.values() for module in adapter.timm_modules
            for name in timm.list_models(module=module)}


def supported_timm_names() -> dict[str, Adapter]:
    """``{timm name: adapter}`` of every architecture the registry covers (:func:`timm_names` less the
    unsupported)."""
    return {name: a for name, a in timm_names().items() if a.unsupported_reason(name) is None}


def unsupported_timm_names() -> dict[str, str]:
    """``{timm name: why}`` of the models in the adapters' timm modules that visionpe does not patch."""
    return {name: why for name, a in timm_names().items() if (why := a.unsupported_reason(name)) is not None}


def register_models() -> list[str]:
    """Register ``vpe_<name>`` for each of :func:`supported_timm_names` (once; later calls change nothing but add
    the names of adapters registered since) and return the registered names."""
    module = sys.modules[__name__]
    names = []
    for timm_name in supported_timm_names():
        name = PREFIX + timm_name
        names.append(name)
        if hasattr(module, name):
            continue
        cfgs = pretrained_cfgs(timm_name)
        if cfgs.tags:  # an architecture without cfgs gets timm's default one, as timm's own would
            default_cfgs[name] = cfgs
        entrypoint = make_entrypoint(timm_name, name)
        setattr(module, name, entrypoint)  # where timm's register_model lists it (this module's __all__)
        register_model(entrypoint)
    return names


def pretrained_cfgs(timm_name: str) -> DefaultCfg:
    """timm's pretrained cfgs of ``timm_name`` (every tag, the default first) for its registered name; they keep
    timm's weight sources (``hf_hub_id``, ``url``), and timm's ``register_model`` renames their architecture; a
    visionpe model runs at any input size that is a multiple of its patch (``fixed_input_size=False``), and a patch
    that does not divide timm's usual test sizes (96, 128, 224, 384; e.g. 14) gets a ``min_input_size`` that is a
    multiple of it, the size timm's tools take below the cfg's ``input_size``."""
    cfgs = {split_model_name_tag(name)[1]: replace(cfg, fixed_input_size=False, **size_floor(timm_name, cfg))
            for name, cfg in get_arch_pretrained_cfgs(timm_name).items()}
    return DefaultCfg(tags=deque(cfgs), cfgs=cfgs, is_pretrained=any(c.has_weights for c in cfgs.values()))


SMALLEST_SIDE = 96  # px: the smallest side timm's model tests ask for (their feature size)


def size_floor(timm_name: str, cfg) -> dict:
    """``{"min_input_size": (C, m, m)}`` with ``m`` the first multiple of the patch (``patch<p>`` in the timm name) at
    or above :data:`SMALLEST_SIDE`, where the patch does not divide 96, 128, 224 and 384; else nothing."""
    match = re.search(r"patch(\d+)", timm_name)
    patch = int(match.group(1)) if match else None
    if patch is None or cfg.min_input_size is not None or all(s % patch == 0 for s in (96, 128, 224, 384)):
        return {}
    side = -(-SMALLEST_SIDE // patch) * patch
    return {"min_input_size": (cfg.input_size[0], side, side)}


def make_entrypoint(timm_name: str, name: str):
    """The timm entrypoint function of the registered ``name``."""

    def entrypoint(pretrained: bool = False, pe: str = NATIVE, pe_kwargs: dict | None = None,
                   **timm_kwargs) -> nn.Module:
        return create_registered(timm_name, name, pe, pe_kwargs, pretrained, **timm_kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__doc__ = (f"timm ``{timm_name}`` with the visionpe encoding ``pe`` (default ``\"native\"``: the "
                          f"architecture's own) and its ``pe_kwargs``; every other keyword goes to timm.")
    return entrypoint


def create_registered(timm_name: str, name: str, pe: str, pe_kwargs: dict | None, pretrained: bool,
                      pretrained_cfg=None, pretrained_cfg_overlay: dict | None = None, cache_dir=None,
                      **timm_kwargs) -> nn.Module:
    """The model of the registered ``name``: :func:`visionpe.create_model` of ``timm_name``, with the registered
    name's pretrained cfg (a tag, a dict or None, plus the overlay) as its ``pretrained_cfg``; with ``pretrained``,
    timm's weights through :func:`visionpe.load_timm_checkpoint`; with ``features_only``, timm's feature wrapper of
    the family around it (:func:`features_model`)."""
    from .api import FEATURE_KEYWORDS, create_model, features_model

    features = {k: timm_kwargs.pop(k) for k in FEATURE_KEYWORDS if k in timm_kwargs}
    cfg = resolve_pretrained_cfg(name, pretrained_cfg, pretrained_cfg_overlay).to_dict()
    if timm_fixes_input_size(timm_name, cfg) and cfg.get("input_size"):  # as timm builds it: at its weights' size
        timm_kwargs.setdefault("img_size", tuple(cfg["input_size"][-2:]))
    if cache_dir is not None:
        timm_kwargs["cache_dir"] = cache_dir
    model = create_model(timm_name, pe=pe, pe_kwargs=pe_kwargs, pretrained=False, pretrained_cfg=cfg, **timm_kwargs)
    if pretrained:
        state, grid = timm_pretrained_state(timm_name, cfg, timm_kwargs)
        reads_grid = pos_embed_reader(model) is not None and "pos_embed" in state  # a pos_embed into a learned table
        load_timm_checkpoint(model, state, source_grid=grid if reads_grid else None)
    return features_model(model, name, features) if features.pop("features_only", False) else model


def timm_fixes_input_size(timm_name: str, cfg: dict) -> bool:
    """timm's own cfg of ``timm_name`` with ``cfg``'s tag says ``fixed_input_size``: timm then builds the model at
    the cfg's ``input_size`` (where the registered cfg, saying the truth of a visionpe model, says False)."""
    own = get_pretrained_cfg(f"{timm_name}.{cfg['tag']}" if cfg.get("tag") else timm_name)
    return bool(getattr(own, "fixed_input_size", False))


def timm_pretrained_state(timm_name: str, cfg: dict, timm_kwargs: dict) -> tuple[dict, tuple[int, ...] | None]:
    """The state dict timm's ``timm_name`` has after timm loads the pretrained weights of ``cfg`` into it (timm's
    source resolution, checkpoint filter, input-channel adaptation), less the classifier when timm discarded the
    checkpoint's (``num_classes`` other than the weights'), so the visionpe model keeps its own fresh head; and the
    patch grid of its ``pos_embed`` (the model's, where timm's filter resampled it), None for a model without one."""
    reference = timm.create_model(timm_name, pretrained=True, pretrained_cfg=cfg, **timm_kwargs)
    state = reference.state_dict()
    classifiers = cfg.get("classifier") or ()
    if getattr(reference, "num_classes", None) != cfg.get("num_classes"):
        for classifier in (classifiers,) if isinstance(classifiers, str) else classifiers:
            state.pop(f"{classifier}.weight", None)
            state.pop(f"{classifier}.bias", None)
    grid = getattr(getattr(reference, "patch_embed", None), "grid_size", None)
    return state, (tuple(grid) if grid is not None and "pos_embed" in state else None)
