"""Axis-generic resampling of tables laid out on a grid (learned position tables, relative-bias tables).

One code path for 1D, 2D and 3D: the table is resampled one axis at a time with a 1-pixel-high
``F.interpolate`` call. Bicubic, bilinear and area kernels are separable, so on a 2D table this equals
``F.interpolate(mode="bicubic")`` over both axes (timm's ``resample_abs_pos_embed``) to float rounding,
and it gives true bicubic resampling in 3D, where ``F.interpolate`` has no bicubic mode.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange

from ._checks import check_choice

INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "area")


def resample_axis(table: torch.Tensor, axis: int, size: int, interpolation: str = "bicubic",
                  antialias: bool = True) -> torch.Tensor:
    """Resample ``table`` (any shape) along ``axis`` to ``size`` samples; computed in float32."""
    check_choice("interpolation", interpolation, INTERPOLATIONS)
    if table.shape[axis] == size:
        return table
    moved = table.movedim(axis, -1)
    lead = moved.shape[:-1]
    flat = rearrange(moved.float(), "... n -> (...) 1 1 n")
    kwargs = {"antialias": antialias} if interpolation in ("bicubic", "bilinear") else {}
    if interpolation in ("bicubic", "bilinear"):
        kwargs["align_corners"] = False
    out = F.interpolate(flat, size=(1, size), mode=interpolation, **kwargs)
    return out.reshape(*lead, size).movedim(-1, axis).to(table.dtype)


def resample_grid(table: torch.Tensor, new_shape, interpolation: str = "bicubic",
                  antialias: bool = True) -> torch.Tensor:
    """Resample a grid table ``(*old_shape, C)`` to ``(*new_shape, C)``, one spatial axis at a time."""
    new_shape = tuple(new_shape)
    if table.ndim != len(new_shape) + 1:
        raise ValueError(f"table of shape {tuple(table.shape)} cannot be resampled to {new_shape}")
    for axis, size in enumerate(new_shape):
        table = resample_axis(table, axis, size, interpolation, antialias)
    return table
