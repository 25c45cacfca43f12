"""A built-in task whose scenes have their own aspect ratios, for training and testing at native aspect ratios:

- ``shapes-relation-aspect``: ``shapes-relation`` (where a cool target lies relative to a warm anchor circle: 0 left,
  1 right, 2 above, 3 below) on a canvas whose width / height is log-uniform in [1/2, 2]. Positions, sizes and the
  label live in the canvas's true geometry (the shapes are round there; the dominant axis of the target's offset is
  at least 1.5x the other). Squashing the canvas to a square (the ``resize`` protocol) stretches one axis by up to
  2x, which turns circles into ellipses and can make the other axis look dominant; the ``native`` protocol keeps the
  geometry. 4 classes.

Each scene has a nominal pixel size (about 256 x 256 in area, at its aspect ratio), which only the protocols'
geometry reads (:meth:`visionpe.data.transforms.Transforms.render_size`): the scene is rendered natively at whatever
size a protocol asks for (4x supersampling, area filter), so a resolution change is the same scene with more pixels.
"""
from __future__ import annotations

import colorsys
import math
import random
from functools import lru_cache

import numpy as np
import torch
from torchvision.transforms.functional import center_crop

from .base import ImageListDataset, size_key
from .registry import SPLITS, register_dataset
from .scenes import MEAN_STD, num_scenes, render
from .transforms import Transforms

TASK = "shapes-relation-aspect"
MAX_ASPECT = 2.0  # width / height in [1 / MAX_ASPECT, MAX_ASPECT], log-uniform
NOMINAL_AREA = 256 * 256


def aspect_scene(seed: int, index: int, split: str = "train") -> dict:
    """Scene ``index`` of ``(seed, split)``: ``{'label', 'background', 'shapes', 'aspect', 'native_hw'}``; shapes are
    ``(kind, cx, cy, (rx, ry), colour)`` in coordinates normalised per axis (x right, y down), their radii per axis,
    so that a render at the native aspect ratio draws them round."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    rng = random.Random(f"{TASK}/{int(seed)}/{split}/{int(index)}")
    aspect = math.exp(rng.uniform(-math.log(MAX_ASPECT), math.log(MAX_ASPECT)))
    width, height = (aspect, 1.0) if aspect >= 1 else (1.0, 1 / aspect)  # true geometry, shorter side 1
    background = tuple(rng.randrange(50) for _ in range(3))
    margin = 0.15
    while True:
        pts = [(rng.uniform(margin, width - margin), rng.uniform(margin, height - margin)) for _ in range(2)]
        dx, dy = pts[1][0] - pts[0][0], pts[1][1] - pts[0][1]
        if max(abs(dx), abs(dy)) > 1.5 * min(abs(dx), abs(dy)) and math.hypot(dx, dy) > 0.3:
            break
    label = (0 if dx < 0 else 1) if abs(dx) > abs(dy) else (2 if dy < 0 else 3)
    anchor = colorsys.hsv_to_rgb(rng.uniform(-0.03, 0.03) % 1.0, rng.uniform(0.7, 1.0), rng.uniform(0.85, 1.0))
    target = colorsys.hsv_to_rgb(rng.uniform(0.55, 0.65), rng.uniform(0.7, 1.0), rng.uniform(0.85, 1.0))
    shapes = []
    for kind, (x, y), colour in (("circle", pts[0], anchor), (rng.choice(("square", "triangle")), pts[1], target)):
        radius = rng.uniform(0.10, 0.13)
        shapes.append((kind, x / width, y / height, (radius / width, radius / height),
                       tuple(int(255 * v) for v in colour)))
    native_hw = (round(math.sqrt(NOMINAL_AREA / aspect)), round(math.sqrt(NOMINAL_AREA * aspect)))
    return {"label": label, "background": background, "shapes": shapes, "aspect": aspect, "native_hw": native_hw}


@lru_cache(maxsize=16)
def _render_split(split: str, num: int, seed: int, transforms: Transforms, size, train: bool):
    """``([uint8 (3, H_i, W_i)], int64 labels (N,))``: each scene at the geometry of ``transforms`` at ``size``."""
    images, labels = [], np.empty(num, dtype=np.int64)
    for i in range(num):
        sc = aspect_scene(seed, i, split)
        render_hw, crop = transforms.render_size(sc["native_hw"], size, train=train)
        x = torch.from_numpy(render(sc, render_hw).copy()).permute(2, 0, 1).contiguous()
        images.append(x if crop is None else center_crop(x, list(crop)))
        labels[i] = sc["label"]
    return images, torch.from_numpy(labels)


@register_dataset(TASK, num_classes=4, mean=MEAN_STD[0], std=MEAN_STD[1], synthetic=True)
def shapes_relation_aspect(split: str, img_size, seed: int = 0, num_samples=None,
                           transforms: Transforms | None = None) -> ImageListDataset:
    """The split at the geometry of its protocol: ``resize`` squashes each scene to ``img_size``, ``crop`` and
    ``native`` keep its aspect ratio; the training split at ``img_size``, or natively within ``max_patches``."""
    transforms = transforms or Transforms()
    images, labels = _render_split(split, num_scenes(split, num_samples), seed, transforms, size_key(img_size),
                                   split == "train")
    return ImageListDataset(images, labels, 4, *MEAN_STD, name=TASK)
