"""Rotary family: rotations of queries and keys inside attention."""
from ._base import RotaryEncoding, rope_kernel
from .rope import AxialRoPE, MixedRoPE, RoPE, apply_rotary
from .scaling import SCALINGS
from .sections import video_sections

__all__ = ["AxialRoPE", "MixedRoPE", "RoPE", "RotaryEncoding", "SCALINGS", "apply_rotary", "rope_kernel",
           "video_sections"]
