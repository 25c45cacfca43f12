"""Tokens family: position vectors added to the patch tokens before the blocks."""
from ._base import TokenEncoding
from .fourier import Fourier
from .learned import Learned
from .peg import PEG
from .sincos import SinCos, sincos_table

__all__ = ["Fourier", "Learned", "PEG", "SinCos", "TokenEncoding", "sincos_table"]
