"""What the shifted-window adapters share (torchvision's Video Swin, transformers' Swin): the attention mask of a
cyclically shifted window partition of a ``(T, H, W)`` map (an image is one frame: ``T = 1``)."""
from __future__ import annotations

import torch
from einops import rearrange

MASK_VALUE = -100.0  # Swin's shift-mask logit (official, timm, torchvision, transformers)


def shift_mask(padded, window, shift, device=None, dtype=torch.float32) -> torch.Tensor:
    """Additive mask ``(num_windows, N, N)`` of a cyclically shifted, padded map: ``0`` inside a region, ``-100``
    across regions. Along a shifted axis of length ``P`` the regions are ``[0, P - w)``, ``[P - w, P - s)`` and
    ``[P - s, P)``; an unshifted axis is one region."""
    labels = torch.zeros((), dtype=torch.long, device=device)
    for size, w, s in zip(padded, window, shift):
        pos = torch.arange(size, device=device)
        axis = (pos >= size - w).long() + (pos >= size - s).long() if s else torch.zeros_like(pos)
        labels = labels[..., None] * 3 + axis
    wt, wh, ww = window
    labels = rearrange(labels, "(nt wt) (nh wh) (nw ww) -> (nt nh nw) (wt wh ww)", wt=wt, wh=wh, ww=ww)
    different = labels[:, :, None] != labels[:, None, :]
    return torch.zeros(different.shape, dtype=dtype, device=device).masked_fill(different, MASK_VALUE)
