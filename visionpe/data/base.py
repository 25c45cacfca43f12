"""What every data set shares: the :class:`PositionDataset` base (normalisation, ``set_epoch``, length), the
in-memory image and clip sets, sets whose samples differ in size (:class:`ImageListDataset`), image sizes, antialiased resizing and fixed subsets."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


def image_hw(size, name: str = "img_size", minimum: int = 4) -> tuple[int, int]:
    """``(height, width)`` of an image size: an integer ``s`` (square, ``(s, s)``) or a pair ``(height, width)``
    (tuple or list) of integers, each ``>= minimum``; anything else is a ValueError naming ``name``."""
    sides = [size] * 2 if isinstance(size, int) else list(size) if isinstance(size, (tuple, list)) else None
    if (sides is None or len(sides) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in sides)):
        raise ValueError(f"{name} must be an integer >= {minimum} (a square) or a (height, width) pair of integers "
                         f">= {minimum}, got {size!r}")
    return sides[0], sides[1]


def size_key(size) -> int | tuple[int, int]:
    """An image size in one canonical form: ``s`` for a square (also given as ``(s, s)``), else ``(height, width)``."""
    height, width = image_hw(size)
    return height if height == width else (height, width)


def resize_bicubic(images: torch.Tensor, size) -> torch.Tensor:
    """Float images ``(N, C, H, W)`` resized to ``size`` (an integer: square; or ``(height, width)``): bicubic with
    antialiasing (``F.interpolate``, ``align_corners=False``), the one resize of visionpe's data and of multi-resolution
    training. Returns ``(N, C, height, width)``."""
    return F.interpolate(images, size=image_hw(size, "size", 1), mode="bicubic", antialias=True, align_corners=False)


def resize(images: torch.Tensor, size, chunk: int = 4096) -> torch.Tensor:
    """Resize uint8 ``(N, C, H, W)`` to ``size`` (an integer: square; or ``(height, width)``): :func:`resize_bicubic`,
    rounded back to uint8. Returns ``(N, C, height, width)``."""
    height, width = image_hw(size, "size", 1)
    if images.shape[-2] == height and images.shape[-1] == width:
        return images
    return torch.cat([resize_bicubic(part.float(), (height, width)).round_().clamp_(0, 255).to(torch.uint8)
                      for part in images.split(chunk)])


def fixed_subset(num_total: int, num, seed: int = 1234) -> torch.Tensor | None:
    """A fixed random subset of ``num`` indices (the same for every run seed), or None for all."""
    if num is None or num >= num_total:
        return None
    return torch.randperm(num_total, generator=torch.Generator().manual_seed(seed))[:num]


class PositionDataset(Dataset):
    """Base of every visionpe data set: ``(sample, label)`` with the sample a normalised float tensor, ``(C, H, W)``
    (images) or ``(C, T, H, W)`` (clips).

    Holds ``name``, ``num_classes``, ``in_chans``, ``mean``/``std`` (shaped to broadcast over a sample), ``seed`` and
    ``epoch``: augmentation is a function of ``(seed, epoch, index)`` only, so runs are reproducible and resumable
    whatever the loader does. Subclasses set ``labels`` (a sequence with one label per sample) and implement
    ``__getitem__``, normalising with :meth:`normalize`.
    """

    labels = ()

    def __init__(self, name: str, num_classes: int, mean, std, sample_dims: int = 2, seed: int = 0):
        self.name, self.num_classes, self.seed, self.epoch = name, num_classes, seed, 0
        view = (-1,) + (1,) * sample_dims
        self.mean = torch.tensor(mean, dtype=torch.float32).view(view)
        self.std = torch.tensor(std, dtype=torch.float32).view(view)
        self.in_chans = self.mean.shape[0]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.labels)

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels -> ``(pixels / 255 - mean) / std``, float32."""
        return (pixels.float() / 255 - self.mean) / self.std


class ImageTensorDataset(PositionDataset):
    """uint8 images ``(N, C, H, W)`` in memory, normalized on access, augmented by ``(seed, epoch, index)``
    (a random translation of up to 1/8 of each side and, with ``flip``, a horizontal flip).
    ``img_size``: ``H`` for square images, else ``(H, W)``."""

    def __init__(self, images, labels, num_classes, mean, std, augment=False, flip=False, seed=0, name=""):
        super().__init__(name, num_classes, mean, std, seed=seed)
        self.images, self.labels = images, labels
        self.augment, self.flip = augment, flip
        height, width = images.shape[-2:]
        self.img_size = height if height == width else (height, width)
        if images.shape[1] != self.in_chans:
            raise ValueError(f"{name}: images have {images.shape[1]} channels, mean/std {self.in_chans}")

    @staticmethod
    def _shifts(rng, pad_h: int, pad_w: int) -> tuple[int, int]:
        """``(dy, dx)`` uniform in ``[-pad_h, pad_h] x [-pad_w, pad_w]``; equal pads draw both at once, as square
        images always have (the same stream, so their augmentation is unchanged)."""
        if pad_h == pad_w:
            dy, dx = (int(v) for v in rng.integers(-pad_h, pad_h + 1, 2))
            return dy, dx
        return int(rng.integers(-pad_h, pad_h + 1)), int(rng.integers(-pad_w, pad_w + 1))

    def _augment(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """A random translation of ``x (C, H, W)`` by up to 1/8 of each side (zero fill), then maybe a flip."""
        rng = np.random.default_rng([self.seed, self.epoch, index, 7])
        height, width = x.shape[-2:]
        ph, pw = max(1, height // 8), max(1, width // 8)
        dy, dx = self._shifts(rng, ph, pw)
        x = torch.roll(F.pad(x, (pw, pw, ph, ph)), shifts=(dy, dx), dims=(-2, -1))[..., ph:ph + height, pw:pw + width]
        if self.flip and rng.random() < 0.5:
            x = x.flip(-1)
        return x

    def __getitem__(self, index):
        x = self.images[index]
        if self.augment:
            x = self._augment(x, index)
        return self.normalize(x), int(self.labels[index])


class ClipTensorDataset(PositionDataset):
    """uint8 clips ``(N, C, T, H, W)`` in memory, normalized on access (no augmentation)."""

    def __init__(self, clips, labels, num_classes, mean, std, name=""):
        super().__init__(name, num_classes, mean, std, sample_dims=3)
        self.images, self.labels = clips, labels
        self.img_size, self.num_frames = clips.shape[-1], clips.shape[2]

    def __getitem__(self, index):
        return self.normalize(self.images[index]), int(self.labels[index])


class ImageListDataset(PositionDataset):
    """uint8 images of different sizes (a list of ``(C, H_i, W_i)``), normalized on access (no augmentation): a
    rendered set shown at each image's own aspect ratio."""

    def __init__(self, images, labels, num_classes, mean, std, name=""):
        super().__init__(name, num_classes, mean, std)
        self.images, self.labels = list(images), labels
        if any(x.shape[0] != self.in_chans for x in self.images):
            raise ValueError(f"{name}: every image must have {self.in_chans} channels (mean/std)")

    def __getitem__(self, index):
        return self.normalize(self.images[index]), int(self.labels[index])

