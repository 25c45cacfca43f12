"""Built-in cluttered image tasks, rendered natively with detail that resolves only at larger sizes.

Each scene is a list of items in normalised coordinates (x right, y down), drawn at 4x supersampling and area
filtered, deterministic by ``(seed, split, index)`` (as :mod:`visionpe.data.scenes`). Unlike those tasks, a larger
test image shows the scene with more detail, not only more pixels (as ImageNet-HR against upsampled ImageNet):
items carry fine procedural textures (stripes, grids) whose period is below two pixels at the training size, where
they render as their mean colour, and visible from about 3-4x on; items come at several scales, and thin outlines
sharpen with the size. The textures never carry the label, so a model must keep its reading of positions while the
patches it sees fill with detail it has never seen.

- ``clutter-nearest``: four candidate items, one of each colour class (red, yellow, green, blue), a white ring
  marker and grey distractors, at several scales. The label is the colour class of the candidate whose centre is
  nearest the marker's (half the scenes a clear call, the nearest at most 0.6 times as far as the second, half a
  close one, 0.75-0.9; never within a patch of the marker). A comparison of relative distances among clutter:
  which offset is the shortest, not in which direction. 4 classes.
- ``clutter-relation``: one red item, a ring marker, one item of each other colour class and greys. The label is
  where the red item lies from the marker (left, right, above, below; half the scenes close calls near the
  diagonal). A direction among distractors. 4 classes.
- ``clutter-count``: a thin outlined box (nothing but its outline marks the region), six small warm marks of which
  ``k`` lie inside the box, and cool distractor marks anywhere. The label is ``k`` (0..4): an inside/outside test
  of each mark against four edges (relative position to a drawn region, on both axes), summed. 5 classes.

Without a positional encoding a ViT sees a bag of patches, which holds the same items in every scene of a class
(every colour class once, six warm marks): items are kept apart so that few patches show a label-carrying pair, and
it stays near chance. All three ask for relative position only, so encodings without absolute position (biases of
offsets: ALiBi, LookHere, FIRE, relative tables) can learn them; they are harder than the shapes tasks (several
items to compare, margins that need sub-patch precision), so the rows do not all saturate at the training size.
A non-square size stretches the scene per axis, textures included. The resolution protocols are the ones of
:mod:`visionpe.data.scenes`.

One module a task (:mod:`.nearest`, :mod:`.relation`, :mod:`.count`: how a scene of it is drawn from a seeded
generator); :mod:`.items` is what scenes are made of, :mod:`.render` draws them at any size.
"""
from __future__ import annotations

import random
from functools import lru_cache

from ..registry import SPLITS, register_dataset
from ..scenes import MEAN_STD, render_scenes, scene_builder
from .count import count_scene
from .items import HUES, Item, Texture
from .nearest import CLEAR_CALL, CLOSE_CALL, nearest_scene
from .relation import CLEAR_TURN, CLOSE_TURN, relation_scene
from .render import render_clutter

__all__ = ["CLEAR_CALL", "CLEAR_TURN", "CLOSE_CALL", "CLOSE_TURN", "CLUTTER", "HUES", "Item", "NUM_CLASSES",
           "Texture", "clutter_scene", "render_clutter"]

CLUTTER = ("clutter-nearest", "clutter-relation", "clutter-count")
NUM_CLASSES = {"clutter-nearest": 4, "clutter-relation": 4, "clutter-count": 5}
SCENES = {"clutter-nearest": nearest_scene, "clutter-relation": relation_scene, "clutter-count": count_scene}


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


@lru_cache(maxsize=16)
def _render_split(task: str, split: str, num: int, seed: int, size, first: int = 0):
    """:func:`~visionpe.data.scenes.render_scenes` of the clutter tasks."""
    return render_scenes(clutter_scene, render_clutter, task, split, num, seed, size, first)


for _task in CLUTTER:
    register_dataset(_task, num_classes=NUM_CLASSES[_task], mean=MEAN_STD[0], std=MEAN_STD[1], synthetic=True)(
        scene_builder(_task, NUM_CLASSES[_task], _render_split))
