"""Mixed-size batches: each image at its own aspect ratio within a token budget (NaFlex)."""
from __future__ import annotations

import math

import torch

from .base import resize_bicubic


def native_aspect_size(height: int, width: int, patch_size: int, max_patches: int) -> tuple[int, int]:
    """``(H, W)``, multiples of ``patch_size``, within ``max_patches`` patches (NaFlexViT's token budget): both sides
    scaled by the one factor that fills the budget, then floored to whole patches (at least one a side), so the
    aspect ratio is kept up to that rounding."""
    for name, value in (("height", height), ("width", width), ("patch_size", patch_size), ("max_patches", max_patches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    scale = math.sqrt(max_patches / (height * width / patch_size ** 2))
    rows, cols = max(1, int(height * scale / patch_size)), max(1, int(width * scale / patch_size))
    while rows * cols > max_patches:  # rounding a side up to one patch can exceed the budget
        rows, cols = (rows - 1, cols) if rows >= cols else (rows, cols - 1)
    return rows * patch_size, cols * patch_size


def resize_to_budget(image: torch.Tensor, patch_size: int, max_patches: int) -> torch.Tensor:
    """A ``(C, H, W)`` image resized (bicubic, antialias) to :func:`native_aspect_size`: for mixed-size batches
    (``model.forward_batch([...])``), every image keeps its aspect ratio within the token budget."""
    size = native_aspect_size(image.shape[-2], image.shape[-1], patch_size, max_patches)
    return resize_bicubic(image[None].float(), size)[0]
