"""``clutter-nearest``: the colour class of the candidate nearest the marker (see :mod:`visionpe.data.clutter`)."""
from __future__ import annotations

import math
import random

from ..scenes import KINDS
from .items import HUES, Item, hsv, place, texture

# the nearest candidate's distance over the second's, in one of two ranges (half the scenes each): a
# clear call, which every encoding that can compare distances learns, and a close one, which takes precision
CLEAR_CALL, CLOSE_CALL = (0.0, 0.6), (0.75, 0.9)


def nearest_scene(rng: random.Random) -> tuple[int, list[Item]]:
    """``(label, items)`` of one scene drawn from ``rng``: the label is the colour class of the candidate nearest
    the marker."""
    lo, hi = CLEAR_CALL if rng.random() < 0.5 else CLOSE_CALL
    while True:
        marker_r = 0.05
        mx, my = rng.uniform(0.15, 0.85), rng.uniform(0.15, 0.85)
        placed = [(mx, my, marker_r)]
        candidates = []
        for _ in HUES:
            r = math.exp(rng.uniform(math.log(0.04), math.log(0.1)))  # several scales
            at = place(rng, r, placed, gap=0.03)
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
        colour = hsv(HUES[cls] + rng.uniform(-0.03, 0.03), rng.uniform(0.75, 1.0), rng.uniform(0.8, 1.0))
        items.append(Item(rng.choice(KINDS), x, y, r, colour, texture(rng)))
    for _ in range(rng.randint(2, 3)):  # grey distractors, anywhere clear of the rest
        r = math.exp(rng.uniform(math.log(0.03), math.log(0.09)))
        at = place(rng, r, placed, gap=0.02)
        if at is not None:
            placed.append((*at, r))
            grey = hsv(rng.random(), rng.uniform(0.0, 0.15), rng.uniform(0.35, 0.6))
            items.append(Item(rng.choice(KINDS), *at, r, grey, texture(rng)))
    items.append(Item("ring", mx, my, marker_r, (255, 255, 255)))
    rng.shuffle(items)  # drawing order says nothing
    return label, items

