"""Built-in image tasks, rendered natively: the scene is drawn in normalized coordinates and rasterized at the
requested size with 4x supersampling and an area (box) filter, so a resolution change is the same scene with more
pixels (no download; deterministic by ``(seed, split, index)``).

- ``shapes-position``: nine shapes of random kinds on a 3x3 layout (jittered); eight are cool-coloured (green to
  violet), the odd one warm (red to yellow). The label is the cell (0..8, row-major) of the odd shape. Finding it is
  a local colour cue; naming its cell needs absolute position. 9 classes.
- ``shapes-relation``: a warm anchor circle and a cool target (square or triangle) anywhere in the image; the label
  is where the target lies relative to the anchor (0 left, 1 right, 2 above, 3 below; the dominant axis is at least
  1.5x the other, so no scene is ambiguous). Needs relative position. 4 classes.

Hues, saturation, kinds, sizes and the dark background are random, so only colour family and place carry the label.
Without any positional encoding a ViT is at chance on both (its attention is permutation invariant); the cues are
deliberately easy so that a tiny ViT learns them in a few epochs on a CPU and the benchmark measures position, not
shape recognition. A non-square size stretches the scene (x with the width, y with the height).

Resolution protocols (:mod:`.transforms`) mean the same here as for photos, with rendering in place of resampling:
``resize`` renders the whole scene at the size, ``crop`` renders it at ``size / crop_pct`` and centre-crops the size,
``native`` renders it at its own aspect ratio (square) within the patch budget.
"""
from __future__ import annotations

import colorsys
import math
import random
from functools import lru_cache

import numpy as np
import torch
from PIL import Image, ImageDraw

from torchvision.transforms.functional import center_crop

from .base import ImageTensorDataset, image_hw, size_key
from .registry import SPLITS, register_dataset
from .transforms import Transforms

SYNTHETIC = ("shapes-position", "shapes-relation")
SUPERSAMPLE = 4
DEFAULT_SIZES = {"train": 10000, "val": 2000, "test": 2000}  # scenes per split unless num_samples is given
MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


KINDS = ("circle", "square", "triangle", "diamond", "cross")


def random_colour(rng, warm: bool) -> tuple:
    """A bright random colour from the warm (red-orange-yellow) or the cool (green-cyan-blue-violet) family."""
    hue = rng.uniform(-0.06, 0.14) % 1.0 if warm else rng.uniform(0.30, 0.80)
    r, g, b = colorsys.hsv_to_rgb(hue, rng.uniform(0.65, 1.0), rng.uniform(0.8, 1.0))
    return int(255 * r), int(255 * g), int(255 * b)


def scene(task: str, seed: int, index: int, split: str = "train") -> dict:
    """The scene ``index`` of ``task`` for ``(seed, split)``: ``{'label', 'background', 'shapes'}``, each
    shape ``(kind, cx, cy, radius, colour)`` in normalized coordinates (x right, y down). Independent of
    the resolution it is later rendered at."""
    if task not in SYNTHETIC or split not in SPLITS:
        raise ValueError(f"{task!r}/{split!r}: a synthetic image task is one of {', '.join(SYNTHETIC)}, a split one "
                         f"of {', '.join(SPLITS)}")
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
            shapes.append((rng.choice(KINDS), cx, cy, radius, random_colour(rng, warm=cell == label)))
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
    radius per axis (a non-square size stretches the scene as resizing a photo would); a radius may be a pair
    ``(rx, ry)`` of fractions of the width and the height. Returns ``uint8 (H, W, 3)``."""
    height, width = image_hw(size, "size", 1)
    big_h, big_w = height * supersample, width * supersample
    img = Image.new("RGB", (big_w, big_h), sc["background"])
    draw = ImageDraw.Draw(img)
    for kind, cx, cy, radius, colour in sc["shapes"]:
        rx, ry = radius if isinstance(radius, tuple) else (radius, radius)
        _draw_shape(draw, kind, cx * big_w, cy * big_h, rx * big_w, ry * big_h, colour)
    return np.asarray(img.resize((width, height), Image.BOX))


def render_scenes(make_scene, draw, task: str, split: str, num: int, seed: int, size, first: int = 0):
    """``(uint8 images (N, 3, H, W), int64 labels (N,))``: scenes ``first .. first + num - 1`` of
    ``make_scene(task, seed, index, split)`` (a dict with ``label``), each drawn by ``draw(scene, size)`` at ``size``
    (int or ``(H, W)``)."""
    height, width = image_hw(size)
    images = np.empty((num, height, width, 3), dtype=np.uint8)
    labels = np.empty(num, dtype=np.int64)
    for i in range(num):
        sc = make_scene(task, seed, first + i, split)
        images[i], labels[i] = draw(sc, size), sc["label"]
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels)


@lru_cache(maxsize=16)
def _render_split(task: str, split: str, num: int, seed: int, size, first: int = 0):
    """:func:`render_scenes` of this module's tasks."""
    return render_scenes(scene, render, task, split, num, seed, size, first)


def num_scenes(split: str, num_samples) -> int:
    """How many scenes a split renders: ``num_samples``, else :data:`DEFAULT_SIZES`."""
    num = DEFAULT_SIZES[split] if num_samples is None else int(num_samples)
    if num < 1:
        raise ValueError(f"num_samples must be >= 1, got {num}")
    return num


SQUARE_HW = (1024, 1024)  # the nominal pixel size of a square scene: only its aspect ratio matters to the protocols


def scene_builder(task: str, num_classes: int, render_split):
    """The data set builder of a built-in task whose split ``render_split(task, split, num, seed, size, first)``
    renders (as :func:`render_scenes`)."""
    def build(split: str, img_size, seed: int = 0, num_samples=None,
              transforms: Transforms | None = None, first: int = 0) -> ImageTensorDataset:
        """The split rendered at the geometry of its protocol (``transforms``; default: at ``img_size``): ``crop``
        renders at ``size / crop_pct`` and centre-crops, ``native`` renders a square within the patch budget; the
        training split at ``img_size``, or within ``max_patches``. timm's augmentation never applies (a flip or a
        crop would change the label). ``first``: the scenes from that index on."""
        transforms = transforms or Transforms()
        render_hw, crop = transforms.render_size(SQUARE_HW, size_key(img_size), train=split == "train")
        images, labels = render_split(task, split, num_scenes(split, num_samples), seed, size_key(render_hw),
                                      first)
        if crop is not None:
            images = center_crop(images, list(crop))
        return ImageTensorDataset(images, labels, num_classes, *MEAN_STD, augment=False, seed=seed, name=task)
    build.__name__ = task.replace("-", "_")
    return build


for _task, _classes in (("shapes-position", 9), ("shapes-relation", 4)):
    register_dataset(_task, num_classes=_classes, mean=MEAN_STD[0], std=MEAN_STD[1], synthetic=True)(
        scene_builder(_task, _classes, _render_split))
