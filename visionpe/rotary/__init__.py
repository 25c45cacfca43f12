"""Rotary family: rotations of queries and keys inside attention."""
from ._base import RotaryEncoding, rope_kernel, rotation_kernel
from .comrope import ComRoPE
from .learned import LearnedRotation
from .liere import LieRE
from .rope import AxialRoPE, MixedRoPE, RoPE, apply_rotary
from .scaling import SCALINGS
from .string_rope import StringRoPE

__all__ = ["AxialRoPE", "ComRoPE", "LearnedRotation", "LieRE", "MixedRoPE", "RoPE", "RotaryEncoding", "SCALINGS",
           "StringRoPE", "apply_rotary", "rope_kernel", "rotation_kernel"]
