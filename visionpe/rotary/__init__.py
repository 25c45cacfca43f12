"""Rotary family: rotations of queries and keys inside attention."""
from ._base import RotaryEncoding, rope_kernel
from .layouts import GOLDEN_ANGLE
from .rope import AxialRoPE, MixedRoPE, RoPE, apply_rotary
from .scaling import SCALINGS
from .sections import video_sections
from .videorope import VideoRoPE

__all__ = ["AxialRoPE", "GOLDEN_ANGLE", "MixedRoPE", "RoPE", "RotaryEncoding", "SCALINGS", "VideoRoPE", "apply_rotary",
           "rope_kernel", "video_sections"]
