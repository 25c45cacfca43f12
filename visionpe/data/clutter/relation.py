"""``clutter-relation``: where the red item lies from the marker (see :mod:`visionpe.data.clutter`)."""
from __future__ import annotations

import math
import random

from ..scenes import KINDS
from .items import HUES, Item, hsv, place, texture

# the offset across the label's axis over the offset along it, in one of two ranges (half the scenes each): a
# clear call or a close one, near the diagonal
CLEAR_TURN, CLOSE_TURN = (0.0, 0.5), (0.67, 0.87)


def relation_scene(rng: random.Random) -> tuple[int, list[Item]]:
    """``(label, items)`` of one scene drawn from ``rng``: the label is where the red item lies from the
    marker."""
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
             Item(rng.choice(KINDS), x, y, r, hsv(HUES[0] + rng.uniform(-0.03, 0.03), rng.uniform(0.75, 1.0),
                                                   rng.uniform(0.8, 1.0)), texture(rng))]
    for hue in [*HUES[1:], *[None] * rng.randint(2, 3)]:  # one item of each other colour class, then greys
        size = math.exp(rng.uniform(math.log(0.035), math.log(0.1)))
        at = place(rng, size, placed, gap=0.03)
        if at is not None:
            placed.append((*at, size))
            colour = (hsv(rng.random(), rng.uniform(0.0, 0.15), rng.uniform(0.35, 0.6)) if hue is None else
                      hsv(hue + rng.uniform(-0.03, 0.03), rng.uniform(0.75, 1.0), rng.uniform(0.8, 1.0)))
            items.append(Item(rng.choice(KINDS), *at, size, colour, texture(rng)))
    rng.shuffle(items)
    return label, items

