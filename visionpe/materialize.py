"""A model built on the meta device (``with torch.device("meta"): model = vpe.create_model(...)``), materialised
with ``model.to_empty(device=...)`` (before or after sharding it), then initialised: :func:`reset_parameters`."""
from __future__ import annotations

import torch
from torch import nn

from ._checks import check_module
from .encoding import Encoding
from .sharding import built_class, reset_module


def reset_parameters(model: nn.Module) -> nn.Module:
    """Initialise every parameter of ``model`` and recompute every derived buffer, in place; returns ``model``.

    In the order a model is built: every module outside the encodings that has ``reset_parameters`` (``Linear``,
    ``LayerNorm``, convolutions, ...: PyTorch's rule, drawn on whole tensors and written into shards when the model is
    sharded), then the model's own scheme where it has one (``init_weights()``: timm's trunc-normal ``Linear`` layers
    and class token, transformers' ``_init_weights``), then each encoding's :meth:`~visionpe.Encoding.reset_parameters`
    (as ``visionpe.apply`` builds them, after the backbone). Draws from torch's global RNG: seed it alike on every rank.
    A patched model whose backbone initialises inside its constructors only (timm's Swin-V2, torchvision's ViT and
    Video Swin: their adapter has no ``init_weights``) is a ``ValueError``: build it on a device. A model of no adapter
    (a user's own) gets the module rules and the encodings'.
    """
    from .backbones.adapter import ADAPTERS  # noqa: PLC0415  (the backbones import this module's package)
    check_module("model", model)
    adapter = next((a for a in ADAPTERS.values() if built_class(model) in (a.base, a.patched)), None)
    if adapter is not None and adapter.init_weights is None:
        supported = ", ".join(a.name for a in ADAPTERS.values() if a.init_weights is not None)
        raise ValueError(f"{adapter.name} initialises its weights inside its constructors, which a meta-device build "
                         f"skips: build it on a device (meta-device builds: {supported})")
    encodings = [m for m in model.modules() if isinstance(m, Encoding)]
    own = {id(m) for e in encodings if not e.initialised_by_backbone for m in e.modules()}
    for module in model.modules():
        if id(module) in own or module is model:
            continue
        if hasattr(module, "reset_parameters"):
            reset_module(module)
        elif isinstance(module, nn.MultiheadAttention):  # its rule has a private name
            with torch.no_grad():
                module._reset_parameters()
    if adapter is not None:
        adapter.init_weights(model)
    for encoding in encodings:
        if encoding.initialised_by_backbone:
            encoding.reset_buffers()
        else:
            encoding.reset_parameters()
    return model
