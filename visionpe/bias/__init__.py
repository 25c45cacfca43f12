"""Bias family: per-head biases added to the attention logits."""
from ._base import BiasEncoding
from .alibi import ALiBi, alibi_slopes
from .cpb import ContinuousPositionBias
from .relative import RelBias, RelativePositionBias, SwinBias

__all__ = ["ALiBi", "BiasEncoding", "ContinuousPositionBias", "RelBias", "RelativePositionBias", "SwinBias",
           "alibi_slopes"]
