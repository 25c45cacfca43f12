"""Real image sets read through torchvision's layouts (or Debian's idx files): Fashion-MNIST, MNIST, CIFAR-10/100.
One table, :data:`TORCHVISION_SETS`, as timm's ``create_dataset`` keeps one; each row one registration.

Images are read once at native resolution (cached) and go through timm's transforms per sample
(:class:`~visionpe.data.transforms.Transforms`): the train split timm's training transform (random-resized crop,
horizontal flips except for digits, colour jitter, ... as set), the val split the eval transform of its resolution
protocol. Grayscale sets keep one channel (timm's transforms run on ``L`` images with a 1-channel mean/std) (``in_chans=1``; the model is built with ``in_chans=1``) rather than being copied to
three: same information, a third of the patch-embedding input.

- ``fashion-mnist``: torchvision's ``FashionMNIST`` under ``data_dir`` (``download=True`` fetches it), else Debian's
  ``dataset-fashion-mnist`` idx files in ``/usr/share/datasets/fashion-mnist/`` (``apt-get install
  dataset-fashion-mnist``).
- ``mnist``: torchvision's ``MNIST`` under ``data_dir`` (or idx files there).
- ``cifar10`` / ``cifar100``: torchvision's ``CIFAR10/100`` under ``data_dir``.
"""
from __future__ import annotations

import gzip
import os
from functools import lru_cache

import numpy as np
import torch

from .base import fixed_subset, size_key
from .registry import DataDamaged, DataMissing, register_dataset
from .transforms import TransformedDataset, Transforms, to_pil

DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
# name: (torchvision class, classes, mean, std, default horizontal flip probability of the training transform)
TORCHVISION_SETS = {
    "fashion-mnist": ("FashionMNIST", 10, (0.2860,), (0.3530,), 0.5),
    "mnist": ("MNIST", 10, (0.1307,), (0.3081,), 0.0),
    "cifar10": ("CIFAR10", 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 0.5),
    "cifar100": ("CIFAR100", 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 0.5),
}


def _read_idx(path: str) -> np.ndarray:
    """An idx file (LeCun's MNIST format, gzipped or not) of unsigned bytes; a truncated or malformed file is a
    :class:`DataDamaged` naming it and the expected and actual sizes."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as err:  # a truncated .gz: EOFError; not gzip: BadGzipFile (an OSError)
        raise DataDamaged(f"cannot read the idx file {path}: {type(err).__name__}: {err}") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or not 1 <= data[3] <= 4:
        raise DataDamaged(f"{path} is not an idx file of unsigned bytes (its header is {data[:4].hex() or 'empty'}, "
                          "expected 000008 then the number of dimensions)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataDamaged(f"the idx file {path} is truncated: {len(data)} bytes, its header alone is {header}")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(data) != expected:
        raise DataDamaged(f"the idx file {path} is {'truncated' if len(data) < expected else 'too long'}: "
                          f"{len(data)} bytes, expected {expected} (a {ndim}-dimensional array "
                          f"{'x'.join(map(str, dims))} after a {header}-byte header)")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _read_idx_pair(images_path: str, labels_path: str, num_classes: int):
    """Images ``(N, H, W)`` and labels ``(N,)`` from their idx files, checked: 3-dimensional images, as many labels
    as images, each label in ``[0, num_classes)``; a :class:`DataDamaged` naming the file otherwise."""
    images, labels = _read_idx(images_path), _read_idx(labels_path)
    if images.ndim != 3:
        raise DataDamaged(f"the idx file {images_path} holds a {images.ndim}-dimensional array; images are 3 "
                          "(count, height, width)")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataDamaged(f"the idx file {labels_path} holds {'x'.join(map(str, labels.shape))} labels for the "
                          f"{len(images)} images of {images_path}")
    bad = np.flatnonzero(labels >= num_classes)
    if len(bad):
        raise DataDamaged(f"the idx file {labels_path} holds labels out of range [0, {num_classes}): "
                          f"{int(labels[bad[0]])} at index {int(bad[0])} ({len(bad)} such labels)")
    return images, labels


def _find_idx(folder: str, split: str):
    stem = "train" if split == "train" else "t10k"
    out = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        for ext in ("", ".gz"):
            path = os.path.join(folder, f"{stem}-{kind}{ext}")
            if os.path.isfile(path):
                out.append(path)
                break
    return out if len(out) == 2 else None


def fetched(name: str, data_dir, make):
    """``make()``: a torchvision data set built with ``download=True``; a download that fails (no network, a server
    that refuses, a corrupt file) is a :class:`DataMissing` of one line naming the set, the folder and the reason."""
    import urllib.error
    try:
        return make()
    except (urllib.error.URLError, OSError, RuntimeError) as err:
        reason = " ".join(str(err).split())[:240]
        raise DataMissing(f"{name}: --download could not fetch it into {str(data_dir)!r} ({type(err).__name__}: "
                          f"{reason}); without a network, copy its files there (torchvision's layout) and run "
                          "without --download") from None


def _mnist_like(name: str, split: str, data_dir, download: bool):
    import torchvision
    classes = TORCHVISION_SETS[name][1]
    cls = torchvision.datasets.FashionMNIST if name == "fashion-mnist" else torchvision.datasets.MNIST
    train = split == "train"
    if data_dir is not None:
        for folder in (data_dir, os.path.join(data_dir, cls.__name__, "raw")):
            files = _find_idx(folder, split)
            if files:
                return _read_idx_pair(*files, classes)
        if download:
            ds = fetched(name, data_dir, lambda: cls(root=data_dir, train=train, download=True))
            return ds.data.numpy(), ds.targets.numpy()
        # an explicit folder is the data's place: no silent fall back to another copy
        raise DataMissing(f"{name} not found under --data-dir {data_dir!r} (expected the idx files or "
                          f"{cls.__name__}/raw/ there): pass --download to fetch it there with torchvision")
    if name == "fashion-mnist":
        files = _find_idx(DEBIAN_FASHION_MNIST, split)
        if files:
            return _read_idx_pair(*files, classes)
    where = "(no --data-dir given)"
    hint = (f"install Debian's package (apt-get install dataset-fashion-mnist, files in {DEBIAN_FASHION_MNIST}) "
            "or " if name == "fashion-mnist" else "")
    raise DataMissing(f"{name} not found {where}: {hint}pass --data-dir DIR --download to fetch it with torchvision")


def _cifar(name: str, split: str, data_dir, download: bool):
    import torchvision
    cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    if data_dir is None:
        raise DataMissing(f"{name} needs --data-dir DIR (torchvision layout); add --download to fetch it there")
    make = lambda: cls(root=data_dir, train=split == "train", download=download)
    try:
        ds = fetched(name, data_dir, make) if download else make()
    except RuntimeError:
        raise DataMissing(f"{name} not found under {data_dir!r}: add --download to fetch it with torchvision") from None
    return np.asarray(ds.data), np.asarray(ds.targets, dtype=np.int64)


@lru_cache(maxsize=8)
def _native(name: str, split: str, data_dir, download: bool):
    """``(uint8 images (N, C, H, W), int64 labels (N,))`` at native resolution."""
    if name in ("fashion-mnist", "mnist"):
        images, labels = _mnist_like(name, split, data_dir, download)
        images = torch.from_numpy(np.array(images))[:, None]
    else:
        images, labels = _cifar(name, split, data_dir, download)
        images = torch.from_numpy(np.array(images)).permute(0, 3, 1, 2).contiguous()
    return images, torch.from_numpy(np.array(labels, dtype=np.int64))


class TransformedImages(TransformedDataset):
    """uint8 images ``(N, C, H, W)`` in memory at native resolution, each through ``transform`` as a PIL image."""

    def __init__(self, images, labels, num_classes, mean, std, transform, seed=0, name=""):
        super().__init__(name, num_classes, mean, std, transform, seed=seed)
        if images.shape[1] != self.in_chans:
            raise ValueError(f"{name}: images have {images.shape[1]} channels, mean/std {self.in_chans}")
        self.images, self.labels = images, labels

    def image(self, index):
        return to_pil(self.images[index])


def _builder(name: str):
    _, num_classes, mean, std, hflip = TORCHVISION_SETS[name]

    def build(split: str, img_size, data_dir=None, download: bool = False, seed: int = 0, num_samples=None,
              augment=None, transforms: Transforms | None = None) -> TransformedImages:
        augment = (split == "train") if augment is None else augment
        transforms = transforms or Transforms()
        images, labels = _native(name, "train" if split == "train" else "test",
                                 None if data_dir is None else str(data_dir), bool(download))
        idx = fixed_subset(len(labels), num_samples)
        if idx is not None:
            images, labels = images[idx], labels[idx]
        size = size_key(img_size)
        transform = transforms.train(size, mean, std, hflip) if augment else transforms.eval(size, mean, std)
        return TransformedImages(images, labels, num_classes, mean, std, transform, seed=seed, name=name)
    build.__name__ = name.replace("-", "_")
    return build


for _name, (_, _classes, _mean, _std, _) in TORCHVISION_SETS.items():
    register_dataset(_name, num_classes=_classes, in_chans=len(_mean), mean=_mean, std=_std)(_builder(_name))
