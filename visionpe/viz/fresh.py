"""An encoding built on its own for a grid, the way a model would build it: what ``visionpe visualize`` draws
when no trained run is given."""
from __future__ import annotations

import torch

from ..encoding import Encoding, ModelContext
from ..registry import check_keywords, check_name


def fresh_encoding(name: str, grid_shape, dim: int = 384, num_heads: int = 6, head_dim: int | None = None,
                   seed: int = 0, **kwargs) -> Encoding:
    """The encoding ``name`` (any registered one) built by :meth:`~visionpe.Encoding.for_model` for a model whose
    patch grid is ``grid_shape``, with token width ``dim``, ``num_heads`` heads of ``head_dim`` channels (default 64
    on 1D and 2D grids, 96 on 3D ones, so that every axis gets whole rotation pairs) and random parameters from
    ``seed``; ``kwargs`` go to the encoding's constructor (a keyword it does not take is a ValueError)."""
    cls = check_name(name, "pe")
    check_keywords(name, kwargs)
    grid_shape = tuple(grid_shape)
    context = ModelContext(grid_shape, dim=dim, num_heads=num_heads, head_dim=head_dim or (96 if len(grid_shape) == 3
                                                                                           else 64))
    torch.manual_seed(seed)
    return cls.for_model(context, **kwargs)
