"""Helpers for the explorer tests: read the data a page embeds and decode its maps, written here independently
of the page's own decoder (its script) and of the writer (visionpe.viz.explorer)."""
from __future__ import annotations

import base64
import json
import math
import re
import zlib

import numpy as np
import pytest
import torch

from visionpe import viz
from visionpe.rotary.scaling import SCALINGS


def page_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="vpe-data">(.*?)</script>', page, re.S)
    assert match, "no embedded data"
    return json.loads(match.group(1))


def decode(entry: dict, shape) -> np.ndarray:
    """``(N, N)`` values of one stored map: a table of offsets (query - key, first axis slowest) or all pairs."""
    levels = np.frombuffer(zlib.decompress(base64.b64decode(entry["data"])), np.uint8)
    n = math.prod(shape)
    if entry["form"] == "full":
        assert levels.size == n * n
        pairs = levels.reshape(n, n)
    else:
        assert entry["form"] == "relative" and levels.size == math.prod(2 * s - 1 for s in shape)
        coords = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1).reshape(n, len(shape))
        offsets = coords[:, None, :] - coords[None, :, :] + np.array(shape) - 1
        pairs = levels[np.ravel_multi_index(tuple(np.moveaxis(offsets, -1, 0)), [2 * s - 1 for s in shape])]
    return entry["lo"] + pairs.astype(np.float64) * entry["step"]


def expected_maps(pe, grid, count: int) -> list[torch.Tensor]:
    """What the page's ``count`` maps must be: the mean over heads then each head, or one map every head shares."""
    if count == 1:
        only = viz.similarity(pe, grid)
        for head in range(viz.num_heads_of(pe) if pe.family != "tokens" else 0):
            torch.testing.assert_close(viz.similarity(pe, grid, head), only)  # truly one map for every head
        return [only]
    assert count == viz.num_heads_of(pe) + 1
    return [viz.similarity(pe, grid)] + [viz.similarity(pe, grid, h) for h in range(count - 1)]


def check_layer(layer: dict, pe, shape, new_shape) -> None:
    """Every view and map of one layer decodes to the encoding's own numbers within one step."""
    scalings = (None, *SCALINGS) if pe.family == "rotary" else (None,)
    adaptations = [viz.adapt(pe, shape, new_shape, s) for s in scalings]
    expected = {f"native grid {'x'.join(map(str, shape))}": (pe, shape)}
    for adapted, label in adaptations:
        expected.setdefault(f"{'x'.join(map(str, new_shape))}: {label}", (adapted, new_shape))
    assert [v["label"] for v in layer["views"]] == list(expected)
    for view in layer["views"]:
        adapted, grid = expected[view["label"]]
        assert view["grid"] == list(grid) and view["shape"] == [1] * (3 - len(grid)) + list(grid)
        maps = expected_maps(adapted, grid, len(view["maps"]))
        assert len(layer["heads"]) == len(layer["quantities"]) == len(maps)
        for entry, values in zip(view["maps"], maps):
            values = values.double().numpy()
            assert entry["step"] == pytest.approx((values.max() - values.min()) / 255, rel=1e-9, abs=1e-12)
            np.testing.assert_allclose(decode(entry, grid), values, rtol=0, atol=entry["step"] + 1e-9)
