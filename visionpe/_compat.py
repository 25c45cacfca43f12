"""PyTorch functions that the oldest supported release (torch 2.1) spells differently, one name each."""
import contextlib
import re

import torch

# True while torch.compile traces a function (dynamo folds both to a constant): torch.compiler.is_compiling from
# torch 2.3 on, torch._utils.is_compiling before it.
is_compiling = getattr(torch.compiler, "is_compiling", None) or torch._utils.is_compiling


def _is_autocast_enabled_before_2_4(device_type: str) -> bool:
    return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


# is_autocast_enabled(device_type): whether autocast is on for that device type; torch 2.4 added the argument (before
# it, the function without one answers for CUDA and is_autocast_cpu_enabled for the CPU)
try:
    torch.is_autocast_enabled("cpu")
    is_autocast_enabled = torch.is_autocast_enabled
except TypeError:
    is_autocast_enabled = _is_autocast_enabled_before_2_4


def autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype autocast casts to on ``device_type`` (torch 2.4 added ``torch.get_autocast_dtype``; before it, one
    function per device type)."""
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device_type)
    return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def autocast_off(device) -> contextlib.AbstractContextManager:
    """A region with autocast off on ``device``'s type (tables built in float32 whatever the caller's autocast). A
    device type autocast does not run on (``meta``: timm's shape-only checks) needs no region, and torch.autocast
    refuses it (torch 2.4 added ``torch.amp.is_autocast_available``; before it, only ``meta`` is told apart)."""
    device_type = torch.device(device).type
    available = getattr(torch.amp, "is_autocast_available", lambda t: t != "meta")
    return torch.autocast(device_type=device_type, enabled=False) if available(device_type) else contextlib.nullcontext()


# tree_leaves(tree): the leaves of a pytree (nested tuples, lists, dicts), in tree_flatten's order; torch 2.2 added
# torch.utils._pytree.tree_leaves, tree_flatten has them before it
try:
    from torch.utils._pytree import tree_leaves
except ImportError:
    from torch.utils._pytree import tree_flatten as _tree_flatten

    def tree_leaves(tree) -> list:
        return _tree_flatten(tree)[0]


try:  # torch >= 2.2 (before it, a symbolic size is never provably equal here: the general path runs)
    from torch.fx.experimental.symbolic_shapes import statically_known_true as _statically_known_true
except ImportError:  # pragma: no cover - torch 2.1
    def _statically_known_true(expr) -> bool:
        return isinstance(expr, bool) and expr


def same_shape(a, b) -> bool:
    """Whether two shapes (tuples of sizes) are equal without asking a traced size for its value: plain ints compare;
    a symbolic size (``torch.export`` with a dynamic height and width) counts as equal only where that is provable,
    so a size-equal shortcut (return the table as it is) never specialises an exported graph to the example's size;
    the general path it takes instead computes the same values."""
    a, b = tuple(a), tuple(b)
    return len(a) == len(b) and all(_provably_equal(x, y) for x, y in zip(a, b))


def _provably_equal(x, y) -> bool:
    equal = x == y
    return _statically_known_true(equal) if isinstance(equal, torch.SymBool) else bool(equal)


# True while torch.export traces a function (torch >= 2.5; before it, never): what timm's is_exporting answers
is_exporting = getattr(torch.compiler, "is_exporting", lambda: False)


TORCHSCRIPT_ROUTES = ("export the model with torch.export.export or to ONNX, which serve any resolution, or trace it "
                      "with torch.fx (docs/deploy.md)")


SCRIPTED_ENCODINGS = ("learned", "sincos", "rope_axial", "rope_mixed", "rel_bias", "alibi", "swin_bias", "cpb",
                      "bucket_bias", "fire", "lookhere", "peg", "string", "comrope", "liere", "harope", "spiral_rope")
SCRIPTED_MODELS = ("timm's token transformers (the vpe_ ViT, DeiT, DeiT-III, DINOv2, Eva, BEiT and RelPos ViT models), "
                   "timm's Swin and Swin-V2 (vpe_swin_*, vpe_swinv2_*) and torchvision's VisionTransformer "
                   "(vit_b_16 ... vit_h_14)")


class TorchScriptRefusal(NotImplementedError):
    """``torch.jit.script`` of something visionpe has no TorchScript form for: ``what`` (the model, encoding or
    setting) and ``reason``, with the models and encodings that script and the routes that serve every one."""

    def __init__(self, what: str, reason: str):
        self.what, self.reason = what, reason
        super().__init__(f"torch.jit.script does not support {what}: {reason}; visionpe scripts {SCRIPTED_MODELS} "
                         f"with the encodings {', '.join(SCRIPTED_ENCODINGS)} (no coordinate augmentation; normalised "
                         f"coordinates on the rotary ones); {TORCHSCRIPT_ROUTES}")


def refuse_torchscript(module: torch.nn.Module):
    """``__prepare_scriptable__`` of visionpe's models and encodings that have no TorchScript form: ``torch.jit.script``
    calls it on every module before compiling; it raises one clear error instead of TorchScript's first compile error
    deep in a forward."""
    reason = ("an encoding scripts inside a visionpe model, not alone (its forward takes a visionpe.Grid, a Python "
              "object)" if getattr(module, "family", None) else "this model class has no TorchScript form")
    raise TorchScriptRefusal(type(module).__name__, reason)


def timm_release() -> tuple[int, ...]:
    """The installed timm's release as integers (``1.0.31`` -> ``(1, 0, 31)``; a pre-release suffix dropped)."""
    import timm
    return tuple(int(re.match(r"\d+", part).group()) for part in timm.__version__.split(".")[:3])


# timm releases below which an adapter is not registered: NaFlexVit's pos_embed_antialias and Xcit's forward_cls
# arrived in timm 1.0.31 (tested there; below it the model classes are refused as not supported)
ADAPTER_MIN_TIMM = {"NaFlexVit": (1, 0, 31), "Xcit": (1, 0, 31)}
