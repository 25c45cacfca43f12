"""Rotary family: rotations of queries and keys inside attention."""
from ._base import RotaryEncoding, block_columns, rope_kernel, rotation_kernel
from .circle_rope import CircleRoPE
from .comrope import ComRoPE
from .conventions import ChannelLayout, FrequencyBands, ResolutionScaling
from .dype import DyPE
from .geope import GeoPE
from .harope import HARoPE
from .hope import HoPE
from .layouts import GOLDEN_ANGLE
from .learned import LearnedRotation
from .liere import LieRE
from .mhrope import MHRoPE
from .registers import RegisterRoPE
from .riflex import RIFLEx
from .rope import AxialRoPE, MixedRoPE, RoPE, apply_rotary
from .scaling import SCALINGS
from .sections import video_sections
from .spherical import SphericalRoPE
from .spiral import SpiralRoPE
from .string_rope import StringRoPE
from .v2pe import V2PE
from .videorope import VideoRoPE

__all__ = ["AxialRoPE", "ChannelLayout", "CircleRoPE", "ComRoPE", "DyPE", "FrequencyBands", "GOLDEN_ANGLE", "GeoPE",
           "HARoPE", "HoPE", "LearnedRotation", "LieRE", "MHRoPE", "MixedRoPE", "RIFLEx", "RegisterRoPE", "ResolutionScaling",
           "RoPE", "RotaryEncoding", "SCALINGS", "SphericalRoPE", "SpiralRoPE", "StringRoPE", "V2PE", "VideoRoPE",
           "apply_rotary", "block_columns", "rope_kernel", "rotation_kernel", "video_sections"]
