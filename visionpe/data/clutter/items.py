"""What a clutter scene is made of: items (shapes, rings, box outlines) with optional procedural textures, their
colour classes, and the placement of items that keep clear of each other."""
from __future__ import annotations

import colorsys
import math
import random
from typing import NamedTuple

HUES = (0.0, 0.15, 0.35, 0.62)  # the colour classes: red, yellow, green, blue


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


def hsv(h: float, s: float, v: float) -> tuple[int, int, int]:
    return tuple(int(255 * c) for c in colorsys.hsv_to_rgb(h % 1.0, s, v))


def texture(rng: random.Random) -> Texture:
    """Fine enough to be flat up to 64 px (a period of at most 2.2 px) and visible from about 128 px on."""
    return Texture(rng.choice(("stripes", "grid")), rng.uniform(0.016, 0.035), rng.uniform(0, math.pi),
                   rng.uniform(0, 2 * math.pi))


def place(rng: random.Random, radius: float, placed: list, gap: float, lo: float = 0.06, hi: float = 0.94,
           tries: int = 200):
    """A centre for an item of ``radius`` whose edge keeps ``gap`` from every ``(cx, cy, r)`` in ``placed``, or
    None after ``tries`` draws."""
    for _ in range(tries):
        x, y = rng.uniform(lo + radius, hi - radius), rng.uniform(lo + radius, hi - radius)
        if all(math.hypot(x - px, y - py) >= radius + pr + gap for px, py, pr in placed):
            return x, y
    return None

