"""visionpe: positional encodings for vision transformers, axis-generic over 1D/2D/3D grids.

Three families, by where position enters attention:

- ``tokens`` (``sincos``, ``learned``, ``peg``): ``pe(x, grid) -> x``, added to the patch tokens;
- ``rotary`` (``rope_axial``, ``rope_mixed``): ``pe(q, k, grid) -> (q, k)``, rotating queries and keys;
- ``bias`` (``swin_bias``, ``rel_bias``, ``cpb``, ``alibi``): ``pe(grid) -> (heads, T, T)`` logit bias.
"""
from .attention import Attention, attend
from .checkpoint import load_timm_checkpoint, load_weights, save_weights
from .grid import Grid
from .registry import available, build

__all__ = ["Attention", "Grid", "apply", "attend", "available", "build", "create_model", "encodings_of",
           "load_timm_checkpoint", "load_weights", "save_weights"]
__version__ = "0.1.0"

_LAZY = {"apply": "backbones", "create_model": "backbones", "encodings_of": "backbones"}


def __getattr__(name: str):
    """timm is imported on first use of the backbone helpers, so ``import visionpe`` stays light."""
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'visionpe' has no attribute {name!r}")
