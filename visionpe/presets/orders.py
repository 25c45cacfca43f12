"""Token orders of foundation models whose tokens are not visionpe's (prefix tokens, then patches row-major).

An order is a function of a :class:`~visionpe.Grid`: ``order(grid) -> (P + N,)`` long, the visionpe token index of
each of the model's tokens, so that ``x_model = x[:, order(grid)]`` and ``x = x_model[:, order(grid).argsort()]``.
Positions travel with the tokens: a visionpe encoding on ``Layout(grid, keep=...)`` gives each reordered patch its
own position (:meth:`~visionpe.presets.PresetScheme.layout`).
"""
from __future__ import annotations

import torch

from .._checks import check_positive_int
from ..grid import Grid


def _patch_grid(grid: Grid, merge: int, who: str) -> tuple[int, int, int]:
    """``(frames, H, W)`` of a 2D or 3D grid whose last two axes split into ``merge x merge`` windows."""
    check_positive_int("merge", merge)
    if grid.ndim not in (2, 3):
        raise ValueError(f"{who} orders the patches of (H, W) or (T, H, W) grids, got shape {grid.shape}")
    *lead, height, width = grid.shape
    if height % merge or width % merge:
        raise ValueError(f"{who} needs the grid's height and width to be multiples of merge={merge}, got shape "
                         f"{grid.shape}")
    return (lead[0] if lead else 1), height, width


def _with_prefix(grid: Grid, patch_order: torch.Tensor) -> torch.Tensor:
    """Prefix tokens first (unmoved), then the patches in ``patch_order`` (row-major patch indices)."""
    return torch.cat([torch.arange(grid.prefix), patch_order + grid.prefix])


def merge_windows(grid: Grid, merge: int = 2) -> torch.Tensor:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL: the patches of each ``merge x merge`` window next to each other (the
    windows row-major, row-major inside a window), as the image processor emits them and the patch merger reads
    them; frame by frame on a ``(T, H, W)`` grid (``transformers.vision_utils.get_vision_position_ids``)."""
    frames, height, width = _patch_grid(grid, merge, "merge_windows")
    index = torch.arange(frames * height * width).reshape(frames, height // merge, merge, width // merge, merge)
    return _with_prefix(grid, index.transpose(2, 3).flatten())


def attention_windows(grid: Grid, merge: int = 2, window: int = 8) -> torch.Tensor:
    """Qwen2.5-VL's order inside its vision blocks: the merge windows (:func:`merge_windows`) grouped into attention
    windows of ``window x window`` patches (``window_size // patch_size``: 112 // 14 = 8), the attention windows
    row-major (the last ones in a row or column cut by the grid's edge), merge windows row-major inside each, frame
    by frame (``transformers.vision_utils.get_vision_window_index``)."""
    frames, height, width = _patch_grid(grid, merge, "attention_windows")
    check_positive_int("window", window)
    if window % merge:
        raise ValueError(f"window={window} patches must be a multiple of merge={merge}")
    span = window // merge  # merge windows per attention window side
    rows, cols = height // merge, width // merge
    t, r, c = torch.meshgrid(torch.arange(frames), torch.arange(rows), torch.arange(cols), indexing="ij")
    key = (((t * ((rows + span - 1) // span) + r // span) * ((cols + span - 1) // span) + c // span)
           * span + r % span) * span + c % span  # (frames, rows, cols): attention window, then row and column in it
    unit_order = key.flatten().argsort()  # merge windows in the blocks' order
    patches = merge_windows(grid.without_prefix(), merge).reshape(-1, merge * merge)  # (units, merge^2)
    return _with_prefix(grid, patches[unit_order].flatten())


def prefix_last(grid: Grid) -> torch.Tensor:
    """Llama 4's vision encoder: the patches row-major, then the class token (prefix tokens at the end)."""
    return torch.cat([torch.arange(grid.num_patches) + grid.prefix, torch.arange(grid.prefix)])
