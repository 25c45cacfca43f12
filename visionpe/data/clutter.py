"""Built-in cluttered image tasks, rendered natively with detail that resolves only at larger sizes.

Each scene is a list of items in normalised coordinates (x right, y down), drawn at 4x supersampling and area
filtered, deterministic by ``(seed, split, index)`` (as :mod:`.scenes`). Unlike :mod:`.scenes`, a larger test image
shows the scene with more detail, not only more pixels (as ImageNet-HR against upsampled ImageNet): items carry fine
procedural textures (stripes, grids) whose period is below two pixels at the training size, where they render as
their mean colour, and visible from about 3-4x on; items come at several scales, and thin outlines sharpen with the
size. The textures never carry the label, so a model must keep its reading of positions while the patches it sees
fill with detail it has never seen.

- ``clutter-nearest``: four candidate items, one of each colour class (red, yellow, green, blue), a white ring
  marker and grey distractors, at several scales. The label is the colour class of the candidate whose centre is
  nearest the marker's (the nearest is at most 0.8 times as far as the second, and never within a patch of the
  marker). A comparison of relative distances among clutter: which offset is the shortest, not in which direction.
  4 classes.
- ``clutter-count``: a thin outlined box (nothing but its outline marks the region), six small warm marks of which
  ``k`` lie inside the box, and cool distractor marks anywhere. The label is ``k`` (0..4): an inside/outside test
  of each mark against four edges (relative position to a drawn region, on both axes), summed. 5 classes.

Without a positional encoding a ViT sees a bag of patches, which holds the same items in every scene of a class
(every colour class once, six warm marks): items are kept apart so that few patches show a label-carrying pair, and
it stays near chance. Both tasks ask for relative position only, so encodings without absolute position (biases of
offsets: ALiBi, LookHere, FIRE, relative tables) can learn them; both are harder than :mod:`.scenes`' tasks (several
items to compare, margins that need sub-patch precision), so the rows do not all saturate at the training size.
A non-square size stretches the scene per axis, textures included. The resolution protocols are the ones of
:mod:`.scenes`.
"""
from __future__ import annotations

import colorsys
import math
import random
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageDraw

from .base import image_hw
from .registry import SPLITS, register_dataset
from .scenes import KINDS, MEAN_STD, SUPERSAMPLE, _draw_shape, render_scenes, scene_builder

CLUTTER = ("clutter-nearest", "clutter-relation", "clutter-count")
NUM_CLASSES = {"clutter-nearest": 4, "clutter-relation": 4, "clutter-count": 5}
HUES = (0.0, 0.15, 0.35, 0.62)  # clutter-nearest's colour classes: red, yellow, green, blue
TEXTURE_AMPLITUDE = 0.35  # a texture scales an item's colour by 1 +- this (its mean is the flat colour)
OUTLINE = 0.02  # the box outline's thickness, a fraction of the side
# clutter-nearest: the nearest candidate's distance over the second's, in one of two ranges (half the scenes each): a
# clear call, which every encoding that can compare distances learns, and a close one, which takes precision
CLEAR_CALL, CLOSE_CALL = (0.0, 0.6), (0.75, 0.9)
# clutter-relation: the offset across the label's axis over the offset along it, likewise clear or close
CLEAR_TURN, CLOSE_TURN = (0.0, 0.5), (0.67, 0.87)


class Texture(NamedTuple):
    """A procedural texture: ``pattern`` ``'stripes'`` (a sine across ``angle``) or ``'grid'`` (the product of two
    sines), ``period`` in normalised units, ``angle`` in radians, ``phase`` in radians."""
    pattern: str
    period: float
    angle: float
    phase: float


class Item(NamedTuple):
    """One drawn item: a shape of :data:`~visionpe.data.scenes.KINDS`, a ``'ring'`` (an annulus a quarter of its
    radius wide) or a ``'box'`` outline (``radius`` its half extents ``(hx, hy)``); centre ``(cx, cy)`` and
    ``radius`` in normalised coordinates; ``colour`` RGB 0..255; ``texture`` None (flat) or a :class:`Texture`."""
    kind: str
    cx: float
    cy: float
    radius: float | tuple[float, float]
    colour: tuple[int, int, int]
    texture: Texture | None = None


def _hsv(h: float, s: float, v: float) -> tuple[int, int, int]:
    return tuple(int(255 * c) for c in colorsys.hsv_to_rgb(h % 1.0, s, v))


def _texture(rng: random.Random) -> Texture:
    """Fine enough to be flat up to 64 px (a period of at most 2.2 px) and visible from about 128 px on."""
    return Texture(rng.choice(("stripes", "grid")), rng.uniform(0.016, 0.035), rng.uniform(0, math.pi),
                   rng.uniform(0, 2 * math.pi))


def _place(rng: random.Random, radius: float, placed: list, gap: float, lo: float = 0.06, hi: float = 0.94,
           tries: int = 200):
    """A centre for an item of ``radius`` whose edge keeps ``gap`` from every ``(cx, cy, r)`` in ``placed``, or
    None after ``tries`` draws."""
    for _ in range(tries):
        x, y = rng.uniform(lo + radius, hi - radius), rng.uniform(lo + radius, hi - radius)
        if all(math.hypot(x - px, y - py) >= radius + pr + gap for px, py, pr in placed):
            return x, y
    return None


def _nearest_scene(rng: random.Random) -> tuple[int, list[Item]]:
    lo, hi = CLEAR_CALL if rng.random() < 0.5 else CLOSE_CALL
    while True:
        marker_r = 0.05
        mx, my = rng.uniform(0.15, 0.85), rng.uniform(0.15, 0.85)
        placed = [(mx, my, marker_r)]
        candidates = []
        for _ in HUES:
            r = math.exp(rng.uniform(math.log(0.04), math.log(0.1)))  # several scales
            at = _place(rng, r, placed, gap=0.03)
            if at is None or math.hypot(at[0] - mx, at[1] - my) - r - marker_r < 0.125:
                break  # not within a patch (at 32 px) of the marker
            placed.append((*at, r))
            candidates.append((*at, r))
        if len(candidates) < len(HUES):
            continue
        dist = sorted((math.hypot(x - mx, y - my), i) for i, (x, y, _) in enumerate(candidates))
        if lo <= dist[0][0] / dist[1][0] <= hi:
            break
    order = list(range(len(HUES)))
    rng.shuffle(order)  # candidate i has colour class order[i]: the label is uniform by symmetry
    label = order[dist[0][1]]
    items = []
    for (x, y, r), cls in zip(candidates, order):
        colour = _hsv(HUES[cls] + rng.uniform(-0.03, 0.03), rng.uniform(0.75, 1.0), rng.uniform(0.8, 1.0))
        items.append(Item(rng.choice(KINDS), x, y, r, colour, _texture(rng)))
    for _ in range(rng.randint(2, 3)):  # grey distractors, anywhere clear of the rest
        r = math.exp(rng.uniform(math.log(0.03), math.log(0.09)))
        at = _place(rng, r, placed, gap=0.02)
        if at is not None:
            placed.append((*at, r))
            grey = _hsv(rng.random(), rng.uniform(0.0, 0.15), rng.uniform(0.35, 0.6))
            items.append(Item(rng.choice(KINDS), *at, r, grey, _texture(rng)))
    items.append(Item("ring", mx, my, marker_r, (255, 255, 255)))
    rng.shuffle(items)  # drawing order says nothing
    return label, items


def _relation_scene(rng: random.Random) -> tuple[int, list[Item]]:
    label = rng.randrange(4)  # where the red item lies from the marker: 0 left, 1 right, 2 above, 3 below
    lo, hi = CLEAR_TURN if rng.random() < 0.5 else CLOSE_TURN
    marker_r = 0.05
    while True:
        mx, my = rng.uniform(0.15, 0.85), rng.uniform(0.15, 0.85)
        r = math.exp(rng.uniform(math.log(0.04), math.log(0.1)))
        along = rng.uniform(0.15, 0.5)  # the offset along the label's axis, and across it
        across = along * rng.uniform(lo, hi) * rng.choice((-1, 1))
        sign = -1 if label in (0, 2) else 1  # left and above are the negative directions (y grows downwards)
        dx, dy = (sign * along, across) if label < 2 else (across, sign * along)
        x, y = mx + dx, my + dy
        if (0.06 + r <= x <= 0.94 - r and 0.06 + r <= y <= 0.94 - r
                and math.hypot(dx, dy) - r - marker_r >= 0.125):  # not within a patch (at 32 px) of the marker
            break
    placed = [(mx, my, marker_r), (x, y, r)]
    items = [Item("ring", mx, my, marker_r, (255, 255, 255)),
             Item(rng.choice(KINDS), x, y, r, _hsv(HUES[0] + rng.uniform(-0.03, 0.03), rng.uniform(0.75, 1.0),
                                                   rng.uniform(0.8, 1.0)), _texture(rng))]
    for hue in [*HUES[1:], *[None] * rng.randint(2, 3)]:  # one item of each other colour class, then greys
        size = math.exp(rng.uniform(math.log(0.035), math.log(0.1)))
        at = _place(rng, size, placed, gap=0.03)
        if at is not None:
            placed.append((*at, size))
            colour = (_hsv(rng.random(), rng.uniform(0.0, 0.15), rng.uniform(0.35, 0.6)) if hue is None else
                      _hsv(hue + rng.uniform(-0.03, 0.03), rng.uniform(0.75, 1.0), rng.uniform(0.8, 1.0)))
            items.append(Item(rng.choice(KINDS), *at, size, colour, _texture(rng)))
    rng.shuffle(items)
    return label, items


def _count_scene(rng: random.Random) -> tuple[int, list[Item]]:
    label = rng.randrange(5)
    hx, hy = rng.uniform(0.2, 0.31), rng.uniform(0.2, 0.31)  # half extents, independent of the label
    bx, by = rng.uniform(0.04 + hx, 0.96 - hx), rng.uniform(0.04 + hy, 0.96 - hy)
    margin = 0.04  # between a mark's edge and the outline

    def inside(x, y, r):
        return abs(x - bx) <= hx - r - margin and abs(y - by) <= hy - r - margin

    def outside(x, y, r):
        return abs(x - bx) >= hx + r + margin or abs(y - by) >= hy + r + margin

    while True:
        placed, marks = [], []
        for want_inside in [True] * label + [False] * (6 - label):
            for _ in range(200):
                r = rng.uniform(0.022, 0.04)
                at = _place(rng, r, placed, gap=0.03, lo=0.03, hi=0.97)
                if at is not None and (inside(*at, r) if want_inside else outside(*at, r)):
                    break
            else:
                break
            placed.append((*at, r))
            marks.append(Item("circle", *at, r, _hsv(rng.uniform(-0.05, 0.12), rng.uniform(0.7, 1.0),
                                                     rng.uniform(0.85, 1.0))))
        if len(marks) == 6:
            break
    items = [Item("box", bx, by, (hx, hy), _hsv(rng.random(), rng.uniform(0.0, 0.2), rng.uniform(0.85, 1.0)))]
    for _ in range(rng.randint(2, 4)):  # cool distractor marks, inside or outside
        r = rng.uniform(0.022, 0.04)
        at = _place(rng, r, placed, gap=0.03, lo=0.03, hi=0.97)
        if at is not None and (inside(*at, r) or outside(*at, r)):
            placed.append((*at, r))
            marks.append(Item(rng.choice(("circle", "square")), *at, r,
                              _hsv(rng.uniform(0.45, 0.7), rng.uniform(0.6, 1.0), rng.uniform(0.8, 1.0))))
    for _ in range(rng.randint(1, 3)):  # larger textured grey shapes, clear of the marks
        r = rng.uniform(0.05, 0.09)
        at = _place(rng, r, placed, gap=0.03)
        if at is not None and outside(*at, r):
            placed.append((*at, r))
            marks.append(Item(rng.choice(KINDS), *at, r, _hsv(rng.random(), rng.uniform(0.0, 0.15),
                                                              rng.uniform(0.35, 0.6)), _texture(rng)))
    rng.shuffle(marks)
    return label, items + marks


SCENES = {"clutter-nearest": _nearest_scene, "clutter-relation": _relation_scene, "clutter-count": _count_scene}


def clutter_scene(task: str, seed: int, index: int, split: str = "train") -> dict:
    """Scene ``index`` of ``task`` for ``(seed, split)``: ``{'label', 'background', 'items'}`` (a list of
    :class:`Item`, drawn in order), independent of the size it is later rendered at."""
    if task not in CLUTTER or split not in SPLITS:
        raise ValueError(f"{task!r}/{split!r}: a clutter task is one of {', '.join(CLUTTER)}, a split one of "
                         f"{', '.join(SPLITS)}")
    rng = random.Random(f"{task}/{int(seed)}/{split}/{int(index)}")
    background = tuple(rng.randrange(40) for _ in range(3))
    label, items = SCENES[task](rng)
    return {"label": label, "background": background, "items": items}


def _shading(texture: Texture, xs: np.ndarray, ys: np.ndarray, pixels: float) -> np.ndarray:
    """The texture's brightness factor on a grid of normalised coordinates ``xs (w,)``, ``ys (h,)`` -> ``(h, w)``.
    Band-limited for an output image of ``pixels`` on its shorter side: the modulation fades in from a period of 2
    output pixels (Nyquist) to full at 3, so what the output cannot resolve renders as the flat colour."""
    amplitude = TEXTURE_AMPLITUDE * min(max(texture.period * pixels - 2, 0.0), 1.0)
    if amplitude == 0:
        return np.ones((len(ys), len(xs)), dtype=np.float32)
    c, s, k = math.cos(texture.angle), math.sin(texture.angle), 2 * math.pi / texture.period
    u = xs[None, :] * c + ys[:, None] * s  # (h, w) across the stripes
    wave = np.sin(k * u + texture.phase)
    if texture.pattern == "grid":
        wave = wave * np.sin(k * (ys[:, None] * c - xs[None, :] * s) + texture.phase)
    return (1 + amplitude * wave).astype(np.float32)


def _cover(lo: float, hi: float, n: int) -> np.ndarray:
    """``(n,)`` float32: the length of ``[lo, hi]`` inside each pixel ``[i, i + 1]`` of ``0..n``."""
    edges = np.arange(n, dtype=np.float32)
    return np.clip(np.minimum(hi, edges + 1) - np.maximum(lo, edges), 0, 1)


def _mask(item: Item, box: tuple[int, int, int, int], big_w: int, big_h: int) -> np.ndarray:
    """The item's coverage in ``[0, 1]`` (float32 ``(h, w)``) of the canvas pixels of ``box = (x0, y0, x1, y1)``."""
    x0, y0, x1, y1 = box
    x, y = item.cx * big_w - x0, item.cy * big_h - y0
    rx, ry = item.radius if isinstance(item.radius, tuple) else (item.radius, item.radius)
    rx, ry = rx * big_w, ry * big_h
    if item.kind == "box":  # exact coverage, the outer rectangle less the inner one: thin lines agree across sizes
        tx, ty = OUTLINE * big_w, OUTLINE * big_h
        outer = _cover(y - ry, y + ry, y1 - y0)[:, None] * _cover(x - rx, x + rx, x1 - x0)[None, :]
        return outer - _cover(y - ry + ty, y + ry - ty, y1 - y0)[:, None] * _cover(x - rx + tx, x + rx - tx, x1 - x0)
    img = Image.new("L", (x1 - x0, y1 - y0), 0)
    draw = ImageDraw.Draw(img)
    if item.kind == "ring":
        draw.ellipse([x - rx, y - ry, x + rx, y + ry], fill=255)
        draw.ellipse([x - 0.5 * rx, y - 0.5 * ry, x + 0.5 * rx, y + 0.5 * ry], fill=0)
    else:
        _draw_shape(draw, item.kind, x, y, rx, ry, 255)
    return np.asarray(img, dtype=np.float32) / 255


def render_clutter(sc: dict, size, supersample: int = SUPERSAMPLE) -> np.ndarray:
    """Rasterise a clutter scene at ``size`` pixels (an integer: square; or ``(height, width)``): each item drawn at
    ``supersample`` times the size (its texture band-limited for the output size), then area-averaged. Returns
    ``uint8 (H, W, 3)``."""
    height, width = image_hw(size, "size", 1)
    big_h, big_w = height * supersample, width * supersample
    canvas = np.empty((big_h, big_w, 3), dtype=np.float32)
    canvas[:] = sc["background"]
    for item in sc["items"]:
        rx, ry = item.radius if isinstance(item.radius, tuple) else (item.radius, item.radius)
        x0, x1 = max(0, math.floor((item.cx - rx) * big_w) - 1), min(big_w, math.ceil((item.cx + rx) * big_w) + 1)
        y0, y1 = max(0, math.floor((item.cy - ry) * big_h) - 1), min(big_h, math.ceil((item.cy + ry) * big_h) + 1)
        if x1 <= x0 or y1 <= y0:
            continue
        mask = _mask(item, (x0, y0, x1, y1), big_w, big_h)[..., None]  # (h, w, 1)
        colour = np.asarray(item.colour, dtype=np.float32)
        if item.texture is not None:
            xs = (np.arange(x0, x1, dtype=np.float32) + 0.5) / big_w
            ys = (np.arange(y0, y1, dtype=np.float32) + 0.5) / big_h
            colour = colour * _shading(item.texture, xs, ys, min(height, width))[..., None]
        region = canvas[y0:y1, x0:x1]
        region += mask * (colour - region)
    out = canvas.reshape(height, supersample, width, supersample, 3).mean(axis=(1, 3))
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@lru_cache(maxsize=16)
def _render_split(task: str, split: str, num: int, seed: int, size, first: int = 0):
    """:func:`~visionpe.data.scenes.render_scenes` of the clutter tasks."""
    return render_scenes(clutter_scene, render_clutter, task, split, num, seed, size, first)


for _task in CLUTTER:
    register_dataset(_task, num_classes=NUM_CLASSES[_task], mean=MEAN_STD[0], std=MEAN_STD[1], synthetic=True)(
        scene_builder(_task, NUM_CLASSES[_task], _render_split))
