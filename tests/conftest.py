"""Shared fixtures and helpers for the core tests: tiny tensors, fixed seeds."""
import pytest
import torch

# Small keyword sets that build every encoding at a given number of grid axes (used by several files).
HEAD_DIM, NUM_HEADS, DIM = 12, 2, 24  # head_dim 12 is divisible by 2*ndim for ndim in 1..3
SHAPES = {2: (3, 4), 3: (2, 3, 4)}


def build_kwargs(name: str, ndim: int) -> dict:
    """Constructor keywords for ``visionpe.build(name, **kw)`` on an ``ndim``-axis grid of ``SHAPES[ndim]``."""
    shape = SHAPES[ndim]
    return {
        "sincos": dict(dim=DIM, ndim=ndim),
        "learned": dict(dim=DIM, ndim=ndim, grid_shape=shape, num_prefix_tokens=1),
        "peg": dict(dim=DIM, ndim=ndim),
        "rope_axial": dict(head_dim=HEAD_DIM, num_heads=NUM_HEADS, ndim=ndim),
        "rope_mixed": dict(head_dim=HEAD_DIM, num_heads=NUM_HEADS, ndim=ndim),
        "swin_bias": dict(num_heads=NUM_HEADS, window_size=shape),
        "rel_bias": dict(num_heads=NUM_HEADS, grid_shape=shape),
        "cpb": dict(num_heads=NUM_HEADS, window_size=shape, hidden_dim=16),
        "alibi": dict(num_heads=NUM_HEADS, ndim=ndim),
    }[name]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
