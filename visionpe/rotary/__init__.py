"""Rotary family: rotations of queries and keys inside attention."""
from ._base import RotaryEncoding, block_columns, rope_kernel, rotation_kernel
from .comrope import ComRoPE
from .conventions import ChannelLayout, FrequencyBands, ResolutionScaling
from .harope import HARoPE
from .layouts import GOLDEN_ANGLE
from .learned import LearnedRotation
from .liere import LieRE
from .registers import RegisterRoPE
from .riflex import RIFLEx
from .rope import AxialRoPE, MixedRoPE, RoPE, apply_rotary
from .scaling import SCALINGS
from .sections import video_sections
from .spiral import SpiralRoPE
from .string_rope import StringRoPE
from .videorope import VideoRoPE

__all__ = ["AxialRoPE", "ChannelLayout", "ComRoPE", "FrequencyBands", "GOLDEN_ANGLE", "HARoPE", "LearnedRotation",
           "LieRE", "MixedRoPE", "RIFLEx", "RegisterRoPE", "ResolutionScaling", "RoPE", "RotaryEncoding", "SCALINGS",
           "SpiralRoPE", "StringRoPE", "VideoRoPE", "apply_rotary", "block_columns", "rope_kernel", "rotation_kernel",
           "video_sections"]
