"""How samples become a batch: stacked when they share a size, a list of images of mixed sizes otherwise (the native
protocol and ``--max-patches``: batches of mixed grids for a model's ``forward_batch``)."""
from __future__ import annotations

import torch
from torch.utils.data import default_collate


def collate_images(batch) -> tuple:
    """A batch of ``(image, label)``: images stacked ``(B, C, H, W)`` when they share a size (torch's
    ``default_collate``, which in a loader worker stacks straight into shared memory), else kept as a list of
    ``(C, H_i, W_i)`` (a batch of mixed grids for ``forward_batch``); labels ``(B,)``."""
    images = [b[0] for b in batch]
    if all(x.shape == images[0].shape for x in images):
        return tuple(default_collate(batch))
    return images, torch.tensor([int(b[1]) for b in batch])
