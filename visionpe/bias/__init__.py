"""Bias family: per-head biases added to the attention logits."""
from .alibi import ALiBi, alibi_slopes
from .cpb import ContinuousPositionBias
from .relative import RelBias, RelativePositionBias, SwinBias

__all__ = ["ALiBi", "alibi_slopes", "ContinuousPositionBias", "RelBias", "RelativePositionBias", "SwinBias"]
