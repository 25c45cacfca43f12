"""Rotary family: rotations of queries and keys inside attention."""
from ._base import RotaryEncoding, block_columns, rope_kernel, rotation_kernel
from .comrope import ComRoPE
from .layouts import GOLDEN_ANGLE
from .learned import LearnedRotation
from .liere import LieRE
from .rope import AxialRoPE, MixedRoPE, RoPE, apply_rotary
from .scaling import SCALINGS
from .sections import video_sections
from .string_rope import StringRoPE
from .videorope import VideoRoPE

__all__ = ["AxialRoPE", "ComRoPE", "GOLDEN_ANGLE", "LearnedRotation", "LieRE", "MixedRoPE", "RoPE", "RotaryEncoding",
           "SCALINGS", "StringRoPE", "VideoRoPE", "apply_rotary", "block_columns", "rope_kernel", "rotation_kernel",
           "video_sections"]
