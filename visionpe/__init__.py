"""visionpe: positional encodings for vision transformers, axis-generic over 1D/2D/3D grids.

Three families, by where position enters attention:

- ``tokens`` (``sincos``, ``learned``, ``peg``): ``pe(x, grid) -> x``, added to the patch tokens;
- ``rotary`` (``rope_axial``, ``rope_mixed``, ``videorope``, ``string``, ``comrope``, ``liere``):
  ``pe(q, k, grid) -> (q, k)``, rotating queries and keys;
- ``bias`` (``swin_bias``, ``rel_bias``, ``cpb``, ``alibi``, ``bucket_bias``, ``lookhere``, ``fire``):
  ``pe(grid) -> (heads, T, T)`` logit bias.

Foundation models' positional schemes (SigLIP 2, Qwen-VL, DINOv3, V-JEPA 2, Wan, ...) are compositions of these with
the models' exact conventions: :func:`preset`, :func:`presets`, ``pe="preset:NAME"`` (:mod:`visionpe.presets`).

The encodings, :class:`Grid` and :func:`build` import without timm; the backbone helpers (``create_model``,
``apply``, ``create_video_model``, ...) import timm on first use. Once timm is imported (by anyone, before or after
visionpe), its registry has a ``vpe_<timm name>`` model for each supported architecture:
``timm.create_model("vpe_vit_small_patch16_224", pe="rope_mixed")`` (:mod:`visionpe.backbones.timm_registry`).
"""
import importlib

from ._import_hook import when_imported
from .attention import Attention, attend, set_attention
from .bias import FIRE, ALiBi, BiasEncoding, ContinuousPositionBias, LookHere, RelBias, RelativePositionBias, SwinBias
from .weights import load_timm_checkpoint, load_weights, save_weights
from .coords import CoordinateSystem
from .encoding import Encoding, ModelContext
from .grid import Grid, Layout, MixedLayout
from .materialize import reset_parameters
from .presets import preset, presets
from .registry import available, build, register, unregister
from .rotary import AxialRoPE, ComRoPE, LieRE, MixedRoPE, RoPE, RotaryEncoding, StringRoPE, VideoRoPE
from .tokens import PEG, Learned, SinCos, TokenEncoding

__version__ = "0.1.0"  # the one place of the version: pyproject.toml reads it (semantic versioning: CHANGELOG.md)

_LAZY = {"apply": "backbones", "create_model": "backbones", "create_video_model": "backbones",
         "encodings_of": "backbones"}

__all__ = ["ALiBi", "Attention", "AxialRoPE", "BiasEncoding", "ComRoPE", "ContinuousPositionBias", "CoordinateSystem",
           "Encoding", "FIRE", "Grid", "Layout", "Learned", "LieRE", "LookHere", "MixedLayout", "MixedRoPE",
           "ModelContext", "PEG", "RelBias", "RelativePositionBias", "RoPE", "RotaryEncoding", "SinCos", "StringRoPE",
           "SwinBias", "TokenEncoding", "VideoRoPE", "attend", "available", "build", "load_timm_checkpoint",
           "load_weights", "preset", "presets", "register", "reset_parameters", "save_weights", "set_attention",
           "unregister", *_LAZY]


def __getattr__(name: str):
    """timm is imported on first use of the backbone helpers, so ``import visionpe`` stays light."""
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'visionpe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _register_timm_models(_timm) -> None:
    """Add the ``vpe_*`` models to timm's registry; runs once timm is imported, so ``import visionpe`` stays light."""
    importlib.import_module(".backbones.timm_registry", __name__).register_models()


when_imported("timm", _register_timm_models)
