"""Rotary family: rotations of queries and keys inside attention."""
from .rope import AxialRoPE, MixedRoPE, RoPE, apply_rotary
from .scaling import SCALINGS

__all__ = ["AxialRoPE", "MixedRoPE", "RoPE", "apply_rotary", "SCALINGS"]
