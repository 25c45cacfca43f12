"""Bias family: per-head biases added to the attention logits."""
from ._base import BiasEncoding, PairScore, grid_offset_index, offset_table_score
from .alibi import ALiBi, alibi_slopes
from .bucketed import BucketedBias, piecewise_index, t5_bucket
from .cpb import ContinuousPositionBias
from .decomposed import DecomposedRelPos
from .fire import FIRE
from .lookhere import LookHere
from .pape import PaPE, PaPERI
from .relative import RelBias, RelativePositionBias, SwinBias

__all__ = ["ALiBi", "BiasEncoding", "BucketedBias", "ContinuousPositionBias", "DecomposedRelPos", "FIRE", "LookHere",
           "PaPE", "PaPERI", "PairScore", "RelBias", "RelativePositionBias", "SwinBias", "alibi_slopes",
           "grid_offset_index", "offset_table_score", "piecewise_index", "t5_bucket"]
