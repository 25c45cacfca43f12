"""Datasets for training and resolution benchmarks: built-in synthetic tasks and real image sets.

``build_dataset(name, split, img_size, ...)`` returns a map-style dataset of ``(image, label)`` with
``image`` a normalized float tensor ``(C, img_size, img_size)``; image data sets also take ``img_size`` as a pair
``(height, width)`` (images ``(C, height, width)``: a synthetic scene is stretched to that aspect, a real image
resized to it). Every dataset has ``num_classes``,
``in_chans``, ``mean``, ``std`` and ``set_epoch(epoch)`` (augmentation is a function of
``(seed, epoch, index)`` only, so runs are reproducible and resumable whatever the loader does).

Built-in tasks (no download; deterministic by ``(seed, split, index)``; **rendered natively**: the
scene is drawn in normalized coordinates and rasterized at the requested size with 4x supersampling
and an area (box) filter, so a resolution change is the same scene with more pixels):

- ``shapes-position``: nine shapes of random kinds on a 3x3 layout (jittered); eight are cool-coloured
  (green to violet), the odd one warm (red to yellow). The label is the cell (0..8, row-major) of the odd
  shape. Finding it is a local colour cue; naming its cell needs absolute position. 9 classes.
- ``shapes-relation``: a warm anchor circle and a cool target (square or triangle) anywhere in the image;
  the label is where the target lies relative to the anchor (0 left, 1 right, 2 above, 3 below; the
  dominant axis is at least 1.5x the other, so no scene is ambiguous). Needs relative position. 4 classes.

Hues, saturation, kinds, sizes and the dark background are random, so only colour family and place carry
the label. Without any positional encoding a ViT is at chance on both (its attention is permutation
invariant); the cues are deliberately easy so that a tiny ViT learns them in a few epochs on a CPU and the
benchmark measures position, not shape recognition.

Real data (images resized with antialiasing from their native size to ``img_size``; train split
augmented with a random translation of up to 1/8 of the side and, except digits, horizontal flips):

- ``fashion-mnist``: torchvision's ``FashionMNIST`` under ``data_dir`` (``download=True`` fetches it),
  else Debian's ``dataset-fashion-mnist`` idx files in ``/usr/share/datasets/fashion-mnist/``
  (``apt-get install dataset-fashion-mnist``). Grayscale, so ``in_chans=1``.
- ``mnist``: torchvision's ``MNIST`` under ``data_dir`` (or idx files there). ``in_chans=1``.
- ``cifar10`` / ``cifar100``: torchvision's ``CIFAR10/100`` under ``data_dir``.
- ``imagefolder``: ``data_dir/train/<class>/*`` and ``data_dir/val/<class>/*`` (torchvision ImageFolder).

Grayscale sets keep one channel (``in_chans=1``; the model is built with ``in_chans=1``) rather than
being copied to three: same information, a third of the patch-embedding input.

Video (``build_dataset(..., num_frames=T)``; clips ``(C, T, img_size, img_size)``): built-in tasks defined in
continuous time ``[0, 1]`` and sampled at ``T`` evenly spaced instants, so more frames is the same clip at a higher
frame rate, and a larger size the same clip with more pixels:

- ``moving-shapes``: one shape crosses the frame in one of 8 directions (E, NE, N, ..., SE); the label is the
  direction. Reversing time swaps opposite classes, so a model blind to frame order cannot solve it (with a
  temporal tubelet of 1 frame: a longer tubelet sees local motion inside itself). 8 classes.
- ``shape-endpoint``: a warm shape moves in a straight line from one cell of a 3x3 layout to another among cool
  still distractors; the label is the cell where it ends. Needs where (space) and when (time order). 9 classes.
- ``videofolder``: ``data_dir/train/<class>/<clip>/*.png|jpg`` (and ``val/``): each clip a folder of frames in
  name order, ``T`` frames sampled evenly, resized with antialiasing.
"""
from __future__ import annotations

import colorsys
import gzip
import math
import os
import random
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

SYNTHETIC = ("shapes-position", "shapes-relation")
REAL = ("fashion-mnist", "mnist", "cifar10", "cifar100", "imagefolder")
VIDEO_SYNTHETIC = ("moving-shapes", "shape-endpoint")
VIDEO = VIDEO_SYNTHETIC + ("videofolder",)
DATASETS = SYNTHETIC + REAL + VIDEO
SPLITS = {"train": 0, "val": 1, "test": 2}
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
SUPERSAMPLE = 4
DEFAULT_SIZES = {"train": 10000, "val": 2000, "test": 2000}  # synthetic tasks


class DataMissing(FileNotFoundError):
    """The data set is not on this machine; the message says how to get it."""


def image_hw(size, name: str = "img_size", minimum: int = 4) -> tuple[int, int]:
    """``(height, width)`` of an image size: an integer ``s`` (square, ``(s, s)``) or a pair ``(height, width)``
    (tuple or list) of integers, each ``>= minimum``; anything else is a ValueError naming ``name``."""
    sides = [size] * 2 if isinstance(size, int) else list(size) if isinstance(size, (tuple, list)) else None
    if (sides is None or len(sides) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in sides)):
        raise ValueError(f"{name} must be an integer >= {minimum} (a square) or a (height, width) pair of integers "
                         f">= {minimum}, got {size!r}")
    return sides[0], sides[1]


def _size_key(size) -> int | tuple[int, int]:
    """An image size in one canonical form: ``s`` for a square (also given as ``(s, s)``), else ``(height, width)``."""
    height, width = image_hw(size)
    return height if height == width else (height, width)


def _check(name: str, split: str):
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose from: {', '.join(DATASETS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from: {', '.join(SPLITS)}")


def info(name: str) -> dict:
    """``{'num_classes', 'in_chans', 'synthetic', 'video'}`` for a named data set, without loading it
    (``imagefolder``'s and ``videofolder``'s class counts are only known once loaded: ``num_classes=None``)."""
    _check(name, "train")
    classes = {"shapes-position": 9, "shapes-relation": 4, "fashion-mnist": 10, "mnist": 10, "cifar10": 10,
               "cifar100": 100, "imagefolder": None, "moving-shapes": 8, "shape-endpoint": 9,
               "videofolder": None}[name]
    chans = 1 if name in ("fashion-mnist", "mnist") else 3
    return {"num_classes": classes, "in_chans": chans, "synthetic": name in SYNTHETIC + VIDEO_SYNTHETIC,
            "video": name in VIDEO}


# --------------------------------------------------------------------------------------------------
# Synthetic scenes: geometry in [0, 1] coordinates, rasterized at any size.
# --------------------------------------------------------------------------------------------------
KINDS = ("circle", "square", "triangle", "diamond", "cross")


def _colour(rng, warm: bool) -> tuple:
    """A bright random colour from the warm (red-orange-yellow) or the cool (green-cyan-blue-violet) family."""
    hue = rng.uniform(-0.06, 0.14) % 1.0 if warm else rng.uniform(0.30, 0.80)
    r, g, b = colorsys.hsv_to_rgb(hue, rng.uniform(0.65, 1.0), rng.uniform(0.8, 1.0))
    return int(255 * r), int(255 * g), int(255 * b)


def scene(task: str, seed: int, index: int, split: str = "train") -> dict:
    """The scene ``index`` of ``task`` for ``(seed, split)``: ``{'label', 'background', 'shapes'}``, each
    shape ``(kind, cx, cy, radius, colour)`` in normalized coordinates (x right, y down). Independent of
    the resolution it is later rendered at."""
    _check(task, split)
    rng = random.Random(f"{task}/{int(seed)}/{split}/{int(index)}")  # str seeds hash with sha512: stable everywhere
    background = tuple(rng.randrange(50) for _ in range(3))
    shapes = []
    if task == "shapes-position":
        label = rng.randrange(9)
        for cell in range(9):
            r, c = divmod(cell, 3)
            # jitter of +-0.065 (more than half a 4 px patch at 24 px) so that where a shape falls inside its
            # patches says nothing about its cell: without an encoding the task stays at chance
            radius = rng.uniform(0.075, 0.1)
            cx = (c + 0.5) / 3 + rng.uniform(-0.065, 0.065)
            cy = (r + 0.5) / 3 + rng.uniform(-0.065, 0.065)
            shapes.append((rng.choice(KINDS), cx, cy, radius, _colour(rng, warm=cell == label)))
    elif task == "shapes-relation":
        while True:
            pts = [(rng.uniform(0.15, 0.85), rng.uniform(0.15, 0.85)) for _ in range(2)]
            dx, dy = pts[1][0] - pts[0][0], pts[1][1] - pts[0][1]
            if max(abs(dx), abs(dy)) > 1.5 * min(abs(dx), abs(dy)) and math.hypot(dx, dy) > 0.3:
                break
        if abs(dx) > abs(dy):
            label = 0 if dx < 0 else 1  # target left / right of the anchor
        else:
            label = 2 if dy < 0 else 3  # target above / below (y grows downwards)
        anchor = colorsys.hsv_to_rgb(rng.uniform(-0.03, 0.03) % 1.0, rng.uniform(0.7, 1.0), rng.uniform(0.85, 1.0))
        target = colorsys.hsv_to_rgb(rng.uniform(0.55, 0.65), rng.uniform(0.7, 1.0), rng.uniform(0.85, 1.0))
        shapes.append(("circle", *pts[0], rng.uniform(0.10, 0.13), tuple(int(255 * v) for v in anchor)))
        shapes.append((rng.choice(("square", "triangle")), *pts[1], rng.uniform(0.10, 0.13),
                       tuple(int(255 * v) for v in target)))
    else:
        raise ValueError(f"{task!r} is not a synthetic task ({', '.join(SYNTHETIC)})")
    return {"label": label, "background": background, "shapes": shapes}


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, x: float, y: float, rx: float, ry: float, colour) -> None:
    """One shape centred at pixel ``(x, y)`` with half-extents ``rx`` (horizontal) and ``ry`` (vertical)."""
    if kind == "circle":
        draw.ellipse([x - rx, y - ry, x + rx, y + ry], fill=colour)
    elif kind == "square":
        sx, sy = rx * 0.85, ry * 0.85
        draw.rectangle([x - sx, y - sy, x + sx, y + sy], fill=colour)
    elif kind == "triangle":
        draw.polygon([(x, y - ry), (x + rx * 0.95, y + ry * 0.75), (x - rx * 0.95, y + ry * 0.75)], fill=colour)
    elif kind == "diamond":
        draw.polygon([(x, y - ry), (x + rx, y), (x, y + ry), (x - rx, y)], fill=colour)
    elif kind == "cross":
        tx, ty = rx * 0.35, ry * 0.35
        draw.rectangle([x - rx, y - ty, x + rx, y + ty], fill=colour)
        draw.rectangle([x - tx, y - ry, x + tx, y + ry], fill=colour)
    else:
        raise ValueError(f"unknown shape kind {kind!r}")


def render(sc: dict, size, supersample: int = SUPERSAMPLE) -> np.ndarray:
    """Rasterize a scene at ``size`` pixels (an integer: square; or ``(height, width)``): draw at ``supersample``
    times the size, then area-average. x scales with the width and y with the height, and so does each shape's
    radius per axis (a non-square size stretches the scene as resizing a photo would). Returns ``uint8 (H, W, 3)``."""
    height, width = image_hw(size, "size", 1)
    big_h, big_w = height * supersample, width * supersample
    img = Image.new("RGB", (big_w, big_h), sc["background"])
    draw = ImageDraw.Draw(img)
    for kind, cx, cy, radius, colour in sc["shapes"]:
        _draw_shape(draw, kind, cx * big_w, cy * big_h, radius * big_w, radius * big_h, colour)
    return np.asarray(img.resize((width, height), Image.BOX))


@lru_cache(maxsize=16)
def _render_split(task: str, split: str, num: int, seed: int, size):
    """``(uint8 images (N, 3, H, W), int64 labels (N,))``: ``num`` scenes rendered at ``size`` (int or ``(H, W)``)."""
    height, width = image_hw(size)
    images = np.empty((num, height, width, 3), dtype=np.uint8)
    labels = np.empty(num, dtype=np.int64)
    for i in range(num):
        sc = scene(task, seed, i, split)
        images[i], labels[i] = render(sc, size), sc["label"]
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels)


# --------------------------------------------------------------------------------------------------
# Real data: read once at native resolution, cached, resized on demand.
# --------------------------------------------------------------------------------------------------
def _read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


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


def _mnist_like(name: str, split: str, data_dir, download: bool):
    import torchvision
    cls = torchvision.datasets.FashionMNIST if name == "fashion-mnist" else torchvision.datasets.MNIST
    train = split == "train"
    if data_dir is not None:
        for folder in (data_dir, os.path.join(data_dir, cls.__name__, "raw")):
            files = _find_idx(folder, split)
            if files:
                return _read_idx(files[0]), _read_idx(files[1])
        if download:
            ds = cls(root=data_dir, train=train, download=True)
            return ds.data.numpy(), ds.targets.numpy()
        # an explicit folder is the data's place: no silent fall back to another copy
        raise DataMissing(f"{name} not found under --data-dir {data_dir!r} (expected the idx files or "
                          f"{cls.__name__}/raw/ there): pass --download to fetch it there with torchvision")
    if name == "fashion-mnist":
        files = _find_idx(DEBIAN_FASHION_MNIST, split)
        if files:
            return _read_idx(files[0]), _read_idx(files[1])
    where = "(no --data-dir given)"
    hint = (f"install Debian's package (apt-get install dataset-fashion-mnist, files in {DEBIAN_FASHION_MNIST}) "
            "or " if name == "fashion-mnist" else "")
    raise DataMissing(f"{name} not found {where}: {hint}pass --data-dir DIR --download to fetch it with torchvision")


def _cifar(name: str, split: str, data_dir, download: bool):
    import torchvision
    cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    if data_dir is None:
        raise DataMissing(f"{name} needs --data-dir DIR (torchvision layout); add --download to fetch it there")
    try:
        ds = cls(root=data_dir, train=split == "train", download=download)
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


def resize(images: torch.Tensor, size, chunk: int = 4096) -> torch.Tensor:
    """Resize uint8 ``(N, C, H, W)`` to ``size`` (an integer: square; or ``(height, width)``): bicubic with
    antialiasing, rounded back to uint8. Returns ``(N, C, height, width)``."""
    height, width = image_hw(size, "size", 1)
    if images.shape[-2] == height and images.shape[-1] == width:
        return images
    out = []
    for part in images.split(chunk):
        x = F.interpolate(part.float(), size=(height, width), mode="bicubic", antialias=True, align_corners=False)
        out.append(x.round_().clamp_(0, 255).to(torch.uint8))
    return torch.cat(out)


def _subset(num_total: int, num, seed: int = 1234) -> torch.Tensor | None:
    """A fixed random subset of ``num`` indices (the same for every run seed), or None for all."""
    if num is None or num >= num_total:
        return None
    return torch.randperm(num_total, generator=torch.Generator().manual_seed(seed))[:num]


# --------------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------------
class ImageTensorDataset(Dataset):
    """uint8 images ``(N, C, H, W)`` in memory, normalized on access, augmented by ``(seed, epoch, index)``.
    ``img_size``: ``H`` for square images, else ``(H, W)``."""

    def __init__(self, images, labels, num_classes, mean, std, augment=False, flip=False, seed=0, name=""):
        self.images, self.labels = images, labels
        self.num_classes, self.in_chans = num_classes, images.shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.augment, self.flip, self.seed, self.epoch, self.name = augment, flip, seed, 0, name
        height, width = images.shape[-2:]
        self.img_size = height if height == width else (height, width)

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def __len__(self):
        return len(self.labels)

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
        x = (x.float() / 255 - self.mean) / self.std
        return x, int(self.labels[index])


class ImageFolderDataset(Dataset):
    """torchvision ImageFolder, decoded lazily, resized to ``img_size`` (int or ``(H, W)``) with antialiasing."""

    def __init__(self, root, img_size, augment=False, seed=0):
        import torchvision
        self.folder = torchvision.datasets.ImageFolder(root)
        self.num_classes, self.in_chans, self.img_size = len(self.folder.classes), 3, img_size
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
        self.augment, self.seed, self.epoch, self.name = augment, seed, 0, "imagefolder"

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def __len__(self):
        return len(self.folder)

    def __getitem__(self, index):
        path, label = self.folder.samples[index]
        with Image.open(path) as im:
            x = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)[None]
        x = resize(x, self.img_size)[0]
        if self.augment and np.random.default_rng([self.seed, self.epoch, index, 7]).random() < 0.5:
            x = x.flip(-1)
        return (x.float() / 255 - self.mean) / self.std, label


MEAN_STD = {
    "shapes-position": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "shapes-relation": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _check_size(name: str, img_size) -> None:
    """``img_size``: an integer >= 4, or for an image data set a ``(height, width)`` pair of them (ValueError)."""
    if name in VIDEO and (isinstance(img_size, bool) or not isinstance(img_size, int) or img_size < 4):
        raise ValueError(f"img_size must be an integer >= 4 for the video data set {name} (clips are square), "
                         f"got {img_size!r}")
    image_hw(img_size)


def build_dataset(name: str, split: str, img_size, data_dir=None, download: bool = False, seed: int = 0,
                  num_samples=None, augment=None, num_frames: int | None = None) -> Dataset:
    """The data set ``name`` (see the module docstring) at ``img_size x img_size`` pixels; an image data set also
    takes ``img_size = (height, width)`` (a square pair is the same as the integer).

    ``num_samples``: synthetic tasks render that many scenes (default 10000 train / 2000 val); real sets use a
    fixed random subset of that size (default all). ``augment``: default True for real train splits, never
    for synthetic tasks (a flip or shift would change their labels). ``seed``: synthetic scenes and the
    augmentation stream; real subsets do not depend on it.
    """
    _check(name, split)
    _check_size(name, img_size)
    if (name in VIDEO) != (num_frames is not None):
        raise ValueError(f"{name} is {'a video' if name in VIDEO else 'an image'} data set: "
                         f"{'give' if name in VIDEO else 'do not give'} num_frames (clips of T frames)")
    if name in VIDEO:
        return build_video_dataset(name, split, img_size, num_frames, data_dir, seed, num_samples)
    img_size = _size_key(img_size)
    if name in SYNTHETIC:
        num = DEFAULT_SIZES[split] if num_samples is None else int(num_samples)
        if num < 1:
            raise ValueError(f"num_samples must be >= 1, got {num}")
        images, labels = _render_split(name, split, num, seed, img_size)
        mean, std = MEAN_STD[name]
        return ImageTensorDataset(images, labels, info(name)["num_classes"], mean, std, augment=False, seed=seed,
                                  name=name)
    augment = (split == "train") if augment is None else augment
    if name == "imagefolder":
        if data_dir is None:
            raise DataMissing("imagefolder needs --data-dir DIR holding train/<class>/ and val/<class>/ folders")
        root = os.path.join(data_dir, "train" if split == "train" else "val")
        if not os.path.isdir(root):
            raise DataMissing(f"imagefolder: {root!r} does not exist (expected DIR/train/<class>/ and DIR/val/<class>/)")
        try:
            return ImageFolderDataset(root, img_size, augment=augment, seed=seed)
        except FileNotFoundError as err:  # torchvision: no class folder, or no image in them
            raise DataMissing(f"imagefolder: {root!r} holds no images in class folders (expected "
                              f"DIR/{os.path.basename(root)}/<class>/*.png|jpg; torchvision: {err})") from None
    images, labels = _native(name, "train" if split == "train" else "test",
                             None if data_dir is None else str(data_dir), bool(download))
    idx = _subset(len(labels), num_samples)
    if idx is not None:
        images, labels = images[idx], labels[idx]
    mean, std = MEAN_STD[name]
    return ImageTensorDataset(resize(images, img_size), labels, info(name)["num_classes"], mean, std,
                              augment=augment, flip=name not in ("mnist",), seed=seed, name=name)


# --------------------------------------------------------------------------------------------------
# Video: clips in continuous time, sampled at any frame count, rasterized at any size.
# --------------------------------------------------------------------------------------------------
DIRECTIONS = 8  # moving-shapes: angle 2 pi k / 8, counter-clockwise from east (y grows downwards)


def clip_scene(task: str, seed: int, index: int, split: str = "train") -> dict:
    """Clip ``index`` of ``task``: ``{'label', 'background', 'shapes'}``, each shape ``(kind, start, end, radius,
    colour)`` with ``start``/``end`` its centre ``(x, y)`` at time 0 and 1 (normalized coordinates)."""
    if task not in VIDEO_SYNTHETIC or split not in SPLITS:
        raise ValueError(f"{task!r}/{split!r}: a synthetic video task is one of {', '.join(VIDEO_SYNTHETIC)}")
    rng = random.Random(f"{task}/{int(seed)}/{split}/{int(index)}")
    background = tuple(rng.randrange(50) for _ in range(3))
    shapes = []
    if task == "moving-shapes":
        label = rng.randrange(DIRECTIONS)
        angle = 2 * math.pi * label / DIRECTIONS
        dx, dy = math.cos(angle), -math.sin(angle)
        length = rng.uniform(0.45, 0.6)
        cx, cy = rng.uniform(0.35, 0.65), rng.uniform(0.35, 0.65)  # path centre: the path stays inside
        start = (cx - dx * length / 2, cy - dy * length / 2)
        end = (cx + dx * length / 2, cy + dy * length / 2)
        shapes.append((rng.choice(KINDS), start, end, rng.uniform(0.08, 0.11), _colour(rng, warm=rng.random() < .5)))
    else:
        label = rng.randrange(9)
        first = rng.choice([c for c in range(9) if c != label])
        cell = lambda c: ((c % 3 + 0.5) / 3 + rng.uniform(-0.05, 0.05), (c // 3 + 0.5) / 3 + rng.uniform(-0.05, 0.05))
        shapes.append((rng.choice(KINDS), cell(first), cell(label), rng.uniform(0.07, 0.09), _colour(rng, warm=True)))
        for c in rng.sample([c for c in range(9) if c not in (first, label)], 3):
            at = cell(c)
            shapes.append((rng.choice(KINDS), at, at, rng.uniform(0.07, 0.09), _colour(rng, warm=False)))
    return {"label": label, "background": background, "shapes": shapes}


def render_clip(sc: dict, size: int, num_frames: int) -> np.ndarray:
    """``uint8 (T, size, size, 3)``: the clip at ``T`` evenly spaced instants of ``[0, 1]``."""
    frames = []
    for k in range(num_frames):
        t = k / (num_frames - 1) if num_frames > 1 else 0.0
        shapes = [(kind, s[0] + (e[0] - s[0]) * t, s[1] + (e[1] - s[1]) * t, r, colour)
                  for kind, s, e, r, colour in sc["shapes"]]
        frames.append(render({"background": sc["background"], "shapes": shapes}, size))
    return np.stack(frames)


@lru_cache(maxsize=8)
def _render_clips(task: str, split: str, num: int, seed: int, size: int, num_frames: int):
    clips = np.empty((num, num_frames, size, size, 3), dtype=np.uint8)
    labels = np.empty(num, dtype=np.int64)
    for i in range(num):
        sc = clip_scene(task, seed, i, split)
        clips[i], labels[i] = render_clip(sc, size, num_frames), sc["label"]
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).contiguous(), torch.from_numpy(labels)


class ClipTensorDataset(Dataset):
    """uint8 clips ``(N, C, T, H, W)`` in memory, normalized on access (no augmentation)."""

    def __init__(self, clips, labels, num_classes, mean, std, name=""):
        self.images, self.labels = clips, labels
        self.num_classes, self.in_chans, self.name = num_classes, clips.shape[1], name
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1, 1)
        self.img_size, self.num_frames, self.epoch = clips.shape[-1], clips.shape[2], 0

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return (self.images[index].float() / 255 - self.mean) / self.std, int(self.labels[index])


FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def read_clip_folder(folder: str, num_frames: int, size: int) -> torch.Tensor:
    """The frames of one clip folder (name order), ``num_frames`` sampled evenly: uint8 ``(3, T, size, size)``."""
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(FRAME_SUFFIXES))
    if not names:
        raise DataMissing(f"videofolder: clip folder {folder!r} holds no frames (*.png|jpg)")
    picks = np.linspace(0, len(names) - 1, num_frames).round().astype(int)
    frames = []
    for k in picks:
        with Image.open(os.path.join(folder, names[k])) as im:
            frames.append(torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1))
    return resize(torch.stack(frames), size).permute(1, 0, 2, 3)


class ClipFolderDataset(Dataset):
    """``root/<class>/<clip>/<frames>``: clips decoded lazily, ``T`` frames sampled evenly, resized."""

    def __init__(self, root: str, img_size: int, num_frames: int):
        if not os.path.isdir(root):
            raise DataMissing(f"videofolder: {root!r} does not exist (expected DIR/train/<class>/<clip>/ frames)")
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, clip), i) for i, c in enumerate(classes)
                        for clip in sorted(os.listdir(os.path.join(root, c)))
                        if os.path.isdir(os.path.join(root, c, clip))]
        if not self.samples:
            raise DataMissing(f"videofolder: {root!r} holds no clips (expected {root}/<class>/<clip>/ folders of "
                              "frames)")
        self.classes, self.num_classes, self.in_chans = classes, len(classes), 3
        self.img_size, self.num_frames, self.epoch, self.name = img_size, num_frames, 0, "videofolder"
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(-1, 1, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(-1, 1, 1, 1)

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        folder, label = self.samples[index]
        clip = read_clip_folder(folder, self.num_frames, self.img_size)
        return (clip.float() / 255 - self.mean) / self.std, label


def build_video_dataset(name: str, split: str, img_size: int, num_frames: int, data_dir=None, seed: int = 0,
                        num_samples=None) -> Dataset:
    """A video data set of clips ``(C, num_frames, img_size, img_size)`` (see the module docstring)."""
    if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1:
        raise ValueError(f"num_frames must be a positive integer, got {num_frames!r}")
    if name == "videofolder":
        if data_dir is None:
            raise DataMissing("videofolder needs --data-dir DIR holding train/<class>/<clip>/ and val/<class>/<clip>/")
        return ClipFolderDataset(os.path.join(data_dir, "train" if split == "train" else "val"), img_size,
                                 num_frames)
    num = DEFAULT_SIZES[split] if num_samples is None else int(num_samples)
    if num < 1:
        raise ValueError(f"num_samples must be >= 1, got {num}")
    clips, labels = _render_clips(name, split, num, seed, img_size, num_frames)
    return ClipTensorDataset(clips, labels, info(name)["num_classes"], (0.5,) * 3, (0.5,) * 3, name=name)


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
    return F.interpolate(image[None].float(), size=size, mode="bicubic", antialias=True, align_corners=False)[0]
