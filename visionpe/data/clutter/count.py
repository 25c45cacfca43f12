"""``clutter-count``: how many warm marks lie inside the outlined box (see :mod:`visionpe.data.clutter`)."""
from __future__ import annotations

import random

from ..scenes import KINDS
from .items import Item, hsv, place, texture


def count_scene(rng: random.Random) -> tuple[int, list[Item]]:
    """``(label, items)`` of one scene drawn from ``rng``: the label is how many of the six warm marks lie inside
    the box (0..4)."""
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
                at = place(rng, r, placed, gap=0.03, lo=0.03, hi=0.97)
                if at is not None and (inside(*at, r) if want_inside else outside(*at, r)):
                    break
            else:
                break
            placed.append((*at, r))
            marks.append(Item("circle", *at, r, hsv(rng.uniform(-0.05, 0.12), rng.uniform(0.7, 1.0),
                                                     rng.uniform(0.85, 1.0))))
        if len(marks) == 6:
            break
    items = [Item("box", bx, by, (hx, hy), hsv(rng.random(), rng.uniform(0.0, 0.2), rng.uniform(0.85, 1.0)))]
    for _ in range(rng.randint(2, 4)):  # cool distractor marks, inside or outside
        r = rng.uniform(0.022, 0.04)
        at = place(rng, r, placed, gap=0.03, lo=0.03, hi=0.97)
        if at is not None and (inside(*at, r) or outside(*at, r)):
            placed.append((*at, r))
            marks.append(Item(rng.choice(("circle", "square")), *at, r,
                              hsv(rng.uniform(0.45, 0.7), rng.uniform(0.6, 1.0), rng.uniform(0.8, 1.0))))
    for _ in range(rng.randint(1, 3)):  # larger textured grey shapes, clear of the marks
        r = rng.uniform(0.05, 0.09)
        at = place(rng, r, placed, gap=0.03)
        if at is not None and outside(*at, r):
            placed.append((*at, r))
            marks.append(Item(rng.choice(KINDS), *at, r, hsv(rng.random(), rng.uniform(0.0, 0.15),
                                                              rng.uniform(0.35, 0.6)), texture(rng)))
    rng.shuffle(marks)
    return label, items + marks

