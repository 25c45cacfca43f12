"""visionpe models in timm's model registry: ``timm.create_model("vpe_" + timm_name, pe=..., pe_kwargs=...)``.

The scheme: every timm architecture that visionpe patches is registered once more under ``vpe_`` + its timm name,
with timm's pretrained tags (``vpe_vit_small_patch16_224.augreg_in21k_ft_in1k``). That is every model of timm's
modules ``vision_transformer`` and ``deit`` (ViT, DeiT, DeiT-III, ...), ``swin_transformer`` and
``swin_transformer_v2``, except the architectures in :data:`UNSUPPORTED`. A registered name takes

- ``pe``: any encoding or combination :func:`visionpe.create_model` takes; by default the architecture's own
  (:data:`NATIVE_PE`: ``learned`` for a ViT, ``swin_bias`` for Swin, ``cpb`` for Swin-V2), so ``vpe_<name>`` is timm's
  ``<name>`` running at any input size;
- ``pe_kwargs``: the encoding's keywords (a dict);
- every timm keyword (``num_classes``, ``img_size``, ``drop_path_rate``, ``pretrained_cfg_overlay``, ...).

``pretrained=True`` loads timm's weights for the tag (or the ``file`` of ``pretrained_cfg_overlay``) the way timm
does (its download, checkpoint filter, classifier and input-channel adaptation) into a plain timm model, then
converts them into the visionpe model with :func:`visionpe.load_timm_checkpoint` (its report is logged). Both
models exist while the weights are converted: twice the model's memory, for that moment.

``import visionpe`` registers the names as soon as timm is imported (before or after visionpe), without importing
timm itself (see :mod:`visionpe._import_hook`).
"""
from __future__ import annotations

import fnmatch
import sys
from collections import deque

import timm
from timm.models import (
    DefaultCfg,
    get_arch_pretrained_cfgs,
    register_model,
    resolve_pretrained_cfg,
    split_model_name_tag,
)
from torch import nn

from ..weights.convert import load_timm_checkpoint

PREFIX = "vpe_"

# timm module -> the encoding its architectures have natively (the default ``pe`` of a registered name)
NATIVE_PE = {"vision_transformer": "learned", "deit": "learned", "swin_transformer": "swin_bias",
             "swin_transformer_v2": "cpb"}

# timm names (fnmatch patterns) in those modules whose architecture visionpe does not patch, and why
UNSUPPORTED = {
    "*_distilled_*": "DeiT's distillation token (VisionTransformerDistilled)",
    "vit_*_18x2_*": "parallel blocks (ParallelThingsBlock)",
    "vit_*_xp_*": "parallel blocks (ParallelScalingBlock)",
    "vit_*pwee_*": "parallel blocks (ParallelScalingBlock, DiffParallelScalingBlock)",
}

# the registry's pretrained cfgs of each registered name, read by timm's register_model (as a timm model module's)
default_cfgs: dict[str, DefaultCfg] = {}


def supported_timm_names() -> dict[str, str]:
    """``{timm name: timm module}`` of every architecture the registry covers, in the installed timm."""
    return {name: module for module in NATIVE_PE for name in timm.list_models(module=module)
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in UNSUPPORTED)}


def register_models() -> list[str]:
    """Register ``vpe_<name>`` for each of :func:`supported_timm_names` (once; later calls change nothing) and
    return the registered names."""
    module = sys.modules[__name__]
    names = []
    for timm_name, timm_module in supported_timm_names().items():
        name = PREFIX + timm_name
        names.append(name)
        if hasattr(module, name):
            continue
        cfgs = pretrained_cfgs(timm_name)
        if cfgs.tags:  # an architecture without cfgs gets timm's default one, as timm's own would
            default_cfgs[name] = cfgs
        entrypoint = make_entrypoint(timm_name, name, NATIVE_PE[timm_module])
        setattr(module, name, entrypoint)  # where timm's register_model lists it (this module's __all__)
        register_model(entrypoint)
    return names


def pretrained_cfgs(timm_name: str) -> DefaultCfg:
    """timm's pretrained cfgs of ``timm_name`` (every tag, the default first) for its registered name; they keep
    timm's weight sources (``hf_hub_id``, ``url``), and timm's ``register_model`` renames their architecture."""
    cfgs = {split_model_name_tag(name)[1]: cfg for name, cfg in get_arch_pretrained_cfgs(timm_name).items()}
    return DefaultCfg(tags=deque(cfgs), cfgs=cfgs, is_pretrained=any(c.has_weights for c in cfgs.values()))


def make_entrypoint(timm_name: str, name: str, native_pe: str):
    """The timm entrypoint function of the registered ``name``."""

    def entrypoint(pretrained: bool = False, pe: str | None = None, pe_kwargs: dict | None = None,
                   **timm_kwargs) -> nn.Module:
        return create_registered(timm_name, name, native_pe if pe is None else pe, pe_kwargs, pretrained,
                                 **timm_kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__doc__ = (f"timm ``{timm_name}`` with the visionpe encoding ``pe`` (default {native_pe!r}, the "
                          f"architecture's own) and its ``pe_kwargs``; every other keyword goes to timm.")
    return entrypoint


def create_registered(timm_name: str, name: str, pe: str, pe_kwargs: dict | None, pretrained: bool,
                      pretrained_cfg=None, pretrained_cfg_overlay: dict | None = None, cache_dir=None,
                      **timm_kwargs) -> nn.Module:
    """The model of the registered ``name``: :func:`visionpe.create_model` of ``timm_name``, with the registered
    name's pretrained cfg (a tag, a dict or None, plus the overlay) as its ``pretrained_cfg`` and, with
    ``pretrained``, timm's weights through :func:`visionpe.load_timm_checkpoint`."""
    from .api import create_model

    cfg = resolve_pretrained_cfg(name, pretrained_cfg, pretrained_cfg_overlay).to_dict()
    if cache_dir is not None:
        timm_kwargs["cache_dir"] = cache_dir
    model = create_model(timm_name, pe=pe, pe_kwargs=pe_kwargs, pretrained=False, pretrained_cfg=cfg, **timm_kwargs)
    if pretrained:
        load_timm_checkpoint(model, timm_pretrained_state(timm_name, cfg, timm_kwargs))
    return model


def timm_pretrained_state(timm_name: str, cfg: dict, timm_kwargs: dict) -> dict:
    """The state dict timm's ``timm_name`` has after timm loads the pretrained weights of ``cfg`` into it (timm's
    source resolution, checkpoint filter, input-channel adaptation), less the classifier when timm discarded the
    checkpoint's (``num_classes`` other than the weights'), so the visionpe model keeps its own fresh head."""
    reference = timm.create_model(timm_name, pretrained=True, pretrained_cfg=cfg, **timm_kwargs)
    state = reference.state_dict()
    classifiers = cfg.get("classifier") or ()
    if getattr(reference, "num_classes", None) != cfg.get("num_classes"):
        for classifier in (classifiers,) if isinstance(classifiers, str) else classifiers:
            state.pop(f"{classifier}.weight", None)
            state.pop(f"{classifier}.bias", None)
    return state
