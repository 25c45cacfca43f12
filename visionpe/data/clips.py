"""Built-in video tasks, defined in continuous time ``[0, 1]`` and sampled at ``T`` evenly spaced instants, so more
frames is the same clip at a higher frame rate, and a larger size the same clip with more pixels:

- ``moving-shapes``: one shape crosses the frame in one of 8 directions (E, NE, N, ..., SE); the label is the
  direction. Reversing time swaps opposite classes, so a model blind to frame order cannot solve it (with a temporal
  tubelet of 1 frame: a longer tubelet sees local motion inside itself). 8 classes.
- ``shape-endpoint``: a warm shape moves in a straight line from one cell of a 3x3 layout to another among cool still
  distractors; the label is the cell where it ends. Needs where (space) and when (time order). 9 classes.
"""
from __future__ import annotations

import math
import random
from functools import lru_cache

import numpy as np
import torch

from .base import ClipTensorDataset
from .registry import SPLITS, register_dataset
from .scenes import KINDS, num_scenes, random_colour, render

VIDEO_SYNTHETIC = ("moving-shapes", "shape-endpoint")


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
        shapes.append((rng.choice(KINDS), start, end, rng.uniform(0.08, 0.11),
                       random_colour(rng, warm=rng.random() < .5)))
    else:
        label = rng.randrange(9)
        first = rng.choice([c for c in range(9) if c != label])
        cell = lambda c: ((c % 3 + 0.5) / 3 + rng.uniform(-0.05, 0.05), (c // 3 + 0.5) / 3 + rng.uniform(-0.05, 0.05))
        shapes.append((rng.choice(KINDS), cell(first), cell(label), rng.uniform(0.07, 0.09),
                       random_colour(rng, warm=True)))
        for c in rng.sample([c for c in range(9) if c not in (first, label)], 3):
            at = cell(c)
            shapes.append((rng.choice(KINDS), at, at, rng.uniform(0.07, 0.09), random_colour(rng, warm=False)))
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


def _builder(task: str, num_classes: int):
    def build(split: str, img_size: int, num_frames: int, seed: int = 0, num_samples=None) -> ClipTensorDataset:
        clips, labels = _render_clips(task, split, num_scenes(split, num_samples), seed, img_size, num_frames)
        return ClipTensorDataset(clips, labels, num_classes, (0.5,) * 3, (0.5,) * 3, name=task)
    build.__name__ = task.replace("-", "_")
    return build


for _task, _classes in (("moving-shapes", 8), ("shape-endpoint", 9)):
    register_dataset(_task, num_classes=_classes, kind="video", synthetic=True)(_builder(_task, _classes))
