"""The cluttered built-in tasks (visionpe.data.clutter): labels follow from the scene's geometry, the same scene at
every size, texture detail that only resolves at larger sizes, per-axis stretching, bad names refused."""
import colorsys
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from visionpe import data
from visionpe.data import clutter


def _hue_class(colour):
    """The colour class of a candidate of clutter-nearest by its nearest hue, or None for a grey item."""
    h, s, _ = colorsys.rgb_to_hsv(*(c / 255 for c in colour))
    if s < 0.5:
        return None
    return min(range(len(clutter.HUES)), key=lambda k: min(abs(h - clutter.HUES[k]), 1 - abs(h - clutter.HUES[k])))


def test_nearest_label_is_the_colour_of_the_candidate_nearest_the_marker():
    calls = []
    for i in range(40):
        sc = clutter.clutter_scene("clutter-nearest", 2, i)
        (marker,) = [it for it in sc["items"] if it.kind == "ring"]
        candidates = [it for it in sc["items"] if it.kind != "ring" and _hue_class(it.colour) is not None]
        assert sorted(_hue_class(it.colour) for it in candidates) == [0, 1, 2, 3]  # each colour class once
        dist = sorted((math.hypot(it.cx - marker.cx, it.cy - marker.cy), _hue_class(it.colour)) for it in candidates)
        assert dist[0][1] == sc["label"]
        ratio = dist[0][0] / dist[1][0]  # a clear or a close call, never a near tie
        assert 0 <= ratio <= clutter.CLEAR_CALL[1] or clutter.CLOSE_CALL[0] <= ratio <= clutter.CLOSE_CALL[1]
        calls.append(ratio <= clutter.CLEAR_CALL[1])
        nearest = next(it for it in candidates if _hue_class(it.colour) == sc["label"])
        assert dist[0][0] - nearest.radius - marker.radius >= 0.125  # never within a 32 px patch of the marker
    assert 10 <= sum(calls) <= 30  # about half the scenes are clear calls


def test_relation_label_is_where_the_red_item_lies_from_the_marker():
    calls = []
    for i in range(40):
        sc = clutter.clutter_scene("clutter-relation", 2, i)
        (marker,) = [it for it in sc["items"] if it.kind == "ring"]
        classes = [_hue_class(it.colour) for it in sc["items"] if it.kind != "ring"]
        assert classes.count(0) == 1  # one red item among the other colour classes and greys
        (target,) = [it for it in sc["items"] if it.kind != "ring" and _hue_class(it.colour) == 0]
        dx, dy = target.cx - marker.cx, target.cy - marker.cy
        want = (0 if dx < 0 else 1) if abs(dx) > abs(dy) else (2 if dy < 0 else 3)  # y grows downwards
        assert sc["label"] == want
        turn = min(abs(dx), abs(dy)) / max(abs(dx), abs(dy))  # a clear or a close call, never a diagonal
        assert turn <= clutter.CLEAR_TURN[1] or clutter.CLOSE_TURN[0] <= turn <= clutter.CLOSE_TURN[1]
        calls.append(turn <= clutter.CLEAR_TURN[1])
        assert math.hypot(dx, dy) - target.radius - marker.radius >= 0.125
    assert 10 <= sum(calls) <= 30


def _warm(colour):
    h, s, _ = colorsys.rgb_to_hsv(*(c / 255 for c in colour))
    return s > 0.5 and (h < 0.15 or h > 0.9)


def test_count_label_is_the_number_of_warm_marks_inside_the_box():
    for i in range(40):
        sc = clutter.clutter_scene("clutter-count", 2, i)
        (box,) = [it for it in sc["items"] if it.kind == "box"]
        hx, hy = box.radius
        marks = [it for it in sc["items"] if it.kind == "circle" and _warm(it.colour)]
        assert len(marks) == 6
        inside = [abs(m.cx - box.cx) < hx and abs(m.cy - box.cy) < hy for m in marks]
        assert sum(inside) == sc["label"]
        for m, isin in zip(marks, inside):  # clear of the outline on the side it is on
            gap = max(abs(m.cx - box.cx) - hx, abs(m.cy - box.cy) - hy) if not isin else \
                min(hx - abs(m.cx - box.cx), hy - abs(m.cy - box.cy))
            assert gap >= m.radius + 0.04 - 1e-9


def test_scene_is_deterministic_and_independent_of_the_size():
    for task in clutter.CLUTTER:
        a, b = clutter.clutter_scene(task, 5, 7, "val"), clutter.clutter_scene(task, 5, 7, "val")
        assert a == b and a != clutter.clutter_scene(task, 5, 7, "train") != clutter.clutter_scene(task, 6, 7, "val")


def _textured_disc(size):
    sc = {"background": (0, 0, 0), "items": [clutter.Item("circle", 0.5, 0.5, 0.3, (200, 100, 50),
                                                           clutter.Texture("stripes", 0.03, 0.3, 0.0))]}
    flat = {**sc, "items": [sc["items"][0]._replace(texture=None)]}
    return clutter.render_clutter(sc, size).astype(float), clutter.render_clutter(flat, size).astype(float)


def test_texture_is_flat_at_the_training_size_and_resolves_at_larger_sizes():
    textured, flat = _textured_disc(32)  # a period of 0.96 px: its mean colour
    assert np.abs(textured - flat).max() <= 1
    for size in (128, 256):  # 3.8 and 7.7 px: visible stripes inside the disc ...
        textured, flat = _textured_disc(size)
        core = slice(size * 3 // 8, size * 5 // 8)
        assert textured[core, core, 0].std() > 20 and flat[core, core, 0].std() < 1
        # ... whose mean is the flat colour
        assert abs(textured[core, core, 0].mean() - flat[core, core, 0].mean()) < 4


@pytest.mark.parametrize("task", clutter.CLUTTER)
def test_a_large_render_area_averaged_is_the_small_render(task):
    for i in range(4):
        sc = clutter.clutter_scene(task, 0, i, "val")
        small = clutter.render_clutter(sc, 32).astype(float)
        big = clutter.render_clutter(sc, 128).astype(float)  # textures visible here
        down = big.reshape(32, 4, 32, 4, 3).mean(axis=(1, 3))
        other = clutter.render_clutter(clutter.clutter_scene(task, 0, i + 10, "val"), 32).astype(float)
        assert np.abs(down - small).mean() < 1.5 < np.abs(other - small).mean()


def test_render_stretches_the_scene_per_axis_and_draws_where_the_scene_says():
    sc = clutter.clutter_scene("clutter-count", 0, 3, "val")
    wide = clutter.render_clutter(sc, (24, 48)).astype(float)
    square = clutter.render_clutter(sc, 48).astype(float)
    assert wide.shape == (24, 48, 3) and np.abs(wide - (square[0::2] + square[1::2]) / 2).mean() < 2.0
    one = {"background": (0, 0, 0), "items": [clutter.Item("square", 0.25, 0.75, 0.1, (255, 255, 255))]}
    img = clutter.render_clutter(one, 40)
    assert img[30, 10].min() == 255 and img[10, 30].max() == 0  # (x=0.25, y=0.75) -> row 30, col 10
    box = {"background": (0, 0, 0), "items": [clutter.Item("box", 0.5, 0.5, (0.3, 0.3), (255, 255, 255))]}
    img = clutter.render_clutter(box, 100)
    assert img[50, 21].min() > 200 and img[50, 50].max() == 0  # the outline is drawn, the inside is not


def test_bad_task_or_split_is_refused():
    with pytest.raises(ValueError, match="clutter-nearest"):
        clutter.clutter_scene("shapes-position", 0, 0)
    with pytest.raises(ValueError, match="split"):
        clutter.clutter_scene("clutter-count", 0, 0, "holdout")
    assert data.info("clutter-count") == {"num_classes": 5, "in_chans": 3, "synthetic": True, "video": False}


@pytest.mark.parametrize("task", clutter.CLUTTER)
def test_a_larger_size_shows_more_detail_not_only_more_pixels(task):
    """At 4x the training size a scene holds detail that its training-size render, upsampled, does not (sharper
    outlines and marks, and item textures, which are absent at the training size and present at 4x)."""
    missing, texture = [], {32: [], 128: []}
    for i in range(8):
        sc = clutter.clutter_scene(task, 0, i, "val")
        flat = {**sc, "items": [it._replace(texture=None) for it in sc["items"]]}
        renders = {s: clutter.render_clutter(sc, s).astype(np.float32) for s in (32, 128)}
        for s in (32, 128):
            texture[s].append(np.abs(renders[s] - clutter.render_clutter(flat, s)).mean())
        up = F.interpolate(torch.from_numpy(renders[32]).permute(2, 0, 1)[None], size=(128, 128), mode="bicubic",
                           align_corners=False)[0].permute(1, 2, 0).numpy()
        missing.append(np.sqrt(((renders[128] - up) ** 2).mean()))
    assert np.mean(missing) > 8  # grey levels (rms) the upsampled training-size render lacks
    assert np.mean(texture[32]) < 0.01 < np.mean(texture[128])  # textures: none at 32 px, there at 128


def _colour_histogram(images):
    """``(N, 65)``: the share of each pixel colour (4 levels a channel) and a constant, whatever its place."""
    levels = (images.long() * 4 // 256)  # (N, 3, H, W) uint8 -> 0..3
    index = (levels[:, 0] * 16 + levels[:, 1] * 4 + levels[:, 2]).flatten(1)
    counts = torch.zeros(len(images), 64).scatter_add_(1, index, torch.ones(index.shape))
    return torch.cat([counts / index.shape[1], torch.ones(len(images), 1)], dim=1)


@pytest.mark.parametrize("task", clutter.CLUTTER)
def test_the_colours_alone_do_not_give_the_label(task):
    """Not trivial: a least-squares classifier on where-free colour histograms (what a model without positions could
    read) stays near chance on the validation scenes."""
    train = data.build_dataset(task, "train", 24, num_samples=480)
    val = data.build_dataset(task, "val", 24, num_samples=240)
    x, y = _colour_histogram(train.images), F.one_hot(train.labels).float()
    weights = torch.linalg.solve(x.T @ x + 1e-3 * torch.eye(x.shape[1]), x.T @ y)
    acc = (_colour_histogram(val.images) @ weights).argmax(1).eq(val.labels).float().mean().item()
    assert acc < 1 / train.num_classes + 0.1, acc
