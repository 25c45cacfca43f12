"""visionpe: positional encodings for vision transformers, axis-generic over 1D/2D/3D grids.

Three families, by where position enters attention:

- ``tokens`` (``sincos``, ``learned``, ``peg``): ``pe(x, grid) -> x``, added to the patch tokens;
- ``rotary`` (``rope_axial``, ``rope_mixed``): ``pe(q, k, grid) -> (q, k)``, rotating queries and keys;
- ``bias`` (``swin_bias``, ``rel_bias``, ``cpb``, ``alibi``): ``pe(grid) -> (heads, T, T)`` logit bias.

The encodings, :class:`Grid` and :func:`build` import without timm; the backbone helpers (``create_model``,
``apply``, ``create_video_model``, ...) import timm on first use.
"""
import importlib

from .attention import Attention, attend, set_attention
from .bias import ALiBi, BiasEncoding, ContinuousPositionBias, RelBias, RelativePositionBias, SwinBias
from .weights import load_timm_checkpoint, load_weights, save_weights
from .coords import CoordinateSystem
from .encoding import Encoding, ModelContext
from .grid import Grid, Layout, MixedLayout
from .registry import available, build, register, unregister
from .rotary import AxialRoPE, MixedRoPE, RoPE, RotaryEncoding
from .tokens import PEG, Learned, SinCos, TokenEncoding

__version__ = "0.1.0"

_LAZY = {"apply": "backbones", "create_model": "backbones", "create_video_model": "backbones",
         "encodings_of": "backbones"}

__all__ = ["ALiBi", "Attention", "AxialRoPE", "BiasEncoding", "ContinuousPositionBias", "CoordinateSystem", "Encoding",
           "Grid", "Layout", "Learned", "MixedLayout", "MixedRoPE", "ModelContext", "PEG", "RelBias", "RelativePositionBias", "RoPE",
           "RotaryEncoding", "SinCos", "SwinBias", "TokenEncoding", "attend", "available", "build",
           "load_timm_checkpoint", "load_weights", "register", "save_weights", "set_attention", "unregister", *_LAZY]


def __getattr__(name: str):
    """timm is imported on first use of the backbone helpers, so ``import visionpe`` stays light."""
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'visionpe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
