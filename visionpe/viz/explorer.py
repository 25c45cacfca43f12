"""One self-contained HTML page to explore what an encoding knows: point at a patch, see its similarity map.

:func:`write_explorer` takes a fresh encoding or a model (every encoding :func:`visionpe.encodings_of` finds: the
tokens table, one rotary or bias module per block) and writes one HTML file that needs no server and no network
(data, script and style inline; a Content-Security-Policy forbids every fetch). Pointing at a patch shows its
row of :func:`visionpe.viz.similarity` (the module doc of :mod:`visionpe.viz` says what it is per family), with
controls for the layer, the head (mean over heads or one), the grid (native, or a larger one after the encoding's
own adaptation, :meth:`Encoding.adapt`; RoPE also under each scaling ``none``/``pi``/``ntk``/``yarn``), and for
video grids a frame slider. Clicking pins the query; the cursor then reads the value of any key.

How the maps are stored (``layers[l].views[v].maps[m]`` of the embedded JSON, ``m = 0`` the mean over heads, then
one per head; a single map where every head shares it):

- each ``(N, N)`` map (rows = queries, keys row-major) is quantised to 256 levels on its own range:
  ``value = lo + level * step``, ``step = (max - min) / 255``; the colour of a patch is its level;
- a map that depends only on the offset between query and key (RoPE, the relative biases, ALiBi; checked, never
  assumed: every entry within ``step / 2`` of its offset's mean) is stored as its table of offsets ``c_q - c_k``,
  ``prod(2 S_a - 1)`` levels, first axis slowest (:func:`visionpe.bias._base.grid_offset_index`), otherwise as all
  ``N * N`` levels (``form`` says which); either way a decoded value is within one ``step`` of the map;
- the levels are zlib-compressed and base64-encoded, and inflated by the page only when a map is first shown
  (``DecompressionStream``: any current browser, e.g. Chromium 80, Firefox 113, Safari 16.4 or later).

Maps are computed with the encodings in evaluation mode (no coordinate augmentation); their modes are restored.
"""
from __future__ import annotations

import base64
import contextlib
import html
import json
import math
import re
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import __version__
from .._checks import check_positive_int, to_shape
from ..bias._base import grid_offset_index
from ..rotary.scaling import SCALINGS
from .numbers import (adapt, family_of, larger_shape, name_of, note_of, num_heads_of, pair_maps, quantity_of,
                      select_head, similarity)

LEVELS = 255  # the highest quantisation level: 256 levels, one per colour of the colour map
MAX_PATCHES = 2048  # patches of the largest grid a page holds (one (N, N) map costs N^2 levels before compression)
MAX_BYTES = 24_000_000  # encoded map data of one page
COLORMAP = "viridis"

__all__ = ["MAX_PATCHES", "MAX_BYTES", "explorer_sources", "head_maps", "encode_map", "resolution_views",
           "explorer_data", "explorer_html", "write_explorer"]


def _grid_text(shape) -> str:
    return "x".join(map(str, shape))


def _layer_text(layers) -> str:
    contiguous = list(layers) == list(range(layers[0], layers[-1] + 1))
    return f"{layers[0]}-{layers[-1]}" if contiguous else ", ".join(map(str, layers))


def _is_encoding(module) -> bool:
    return getattr(module, "family", None) in ("tokens", "rotary", "bias")


def _model_grid(model: nn.Module) -> tuple[int, ...]:
    grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
    if grid is None:
        raise ValueError(f"shape is required: {type(model).__name__} has no patch_embed.grid_size to read the "
                         "patch grid from; pass shape=(H, W) or (T, H, W)")
    return tuple(int(s) for s in grid)


def explorer_sources(source: nn.Module, shape=None) -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """The encodings a page shows, ``[(label, encoding, native grid)]``.

    ``source``: one encoding (``shape`` required: the grid it was built or trained for) or a model, whose
    encodings come from :func:`visionpe.encodings_of` (``shape`` defaults to ``model.patch_embed.grid_size``):
    the tokens encoding, then the per-block rotary and bias modules, ``layer k`` counting the modules of one
    name as ``visionpe.viz.pick_encoding`` does (a module shared by several blocks appears once, labelled with
    all its layers). A window bias (``window_size``: Swin's, a CPB) lives on its window, every other on ``shape``.
    """
    if _is_encoding(source):
        if shape is None:
            raise ValueError(f"shape is required for an encoding ({name_of(source)}): the grid it was built or "
                             "trained for, e.g. shape=(14, 14) or (8, 14, 14)")
        return [(name_of(source), source, to_shape("shape", tuple(shape)))]
    if not isinstance(source, nn.Module):
        raise TypeError(f"source must be a visionpe encoding or a model (torch.nn.Module), got {type(source).__name__}")
    import visionpe

    found = visionpe.encodings_of(source)
    shape = to_shape("shape", tuple(shape)) if shape is not None else _model_grid(source)
    modules = [m for family in ("tokens", "rotary", "bias") for m in found[family] if m is not None]
    if not modules:
        raise ValueError(f"{type(source).__name__} has no visionpe encodings; build it with visionpe.create_model "
                         "or visionpe.apply first")
    counts: dict[str, int] = {}
    where: dict[int, list[int]] = {}  # id(module) -> its layers: it is the k-th module of its name
    for module in modules:
        name = name_of(module)
        where.setdefault(id(module), []).append(counts.get(name, 0))
        counts[name] = counts.get(name, 0) + 1
    sources = []
    for module in {id(m): m for m in modules}.values():
        layers = where[id(module)]
        label = name_of(module) if family_of(module) == "tokens" else \
            f"{name_of(module)}, layer {layers[0]}" if len(layers) == 1 else \
            f"{name_of(module)}, layers {_layer_text(layers)} (one shared module)"
        window = getattr(module, "window_size", None) if family_of(module) == "bias" else None
        sources.append((label, module, tuple(window) if window is not None else shape))
    return sources


@torch.no_grad()
def head_maps(pe: nn.Module, grid) -> torch.Tensor:
    """The maps a page offers for one encoding on one grid, ``(M, N, N)`` float32, rows = queries: the mean over
    heads then each head (:func:`similarity` with ``head=None, 0, 1, ...``), or one map when every head shares it
    (tokens; rotary or bias maps with a leading size 1, as axial RoPE)."""
    if family_of(pe) == "tokens":
        return similarity(pe, grid)[None]
    maps = pair_maps(pe, grid)
    return maps if maps.shape[0] == 1 else torch.cat([select_head(maps, None, num_heads_of(pe))[None], maps])


def _pack(levels: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(levels.astype(np.uint8).tobytes(), 9)).decode("ascii")


def encode_map(values: np.ndarray, shape, index: np.ndarray | None = None) -> dict:
    """One ``(N, N)`` map (rows = queries) on the grid ``shape`` as the page stores it (see the module doc):
    ``{"form": "relative" | "full", "lo", "step", "data"}``; a map with NaN or inf is an error. ``index``: the
    grid's ``(N, N)`` offset index (:func:`grid_offset_index`), to compute it once for many maps."""
    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError(f"the map on the grid {_grid_text(shape)} has NaN or inf values; a page shows finite maps "
                         "only")
    lo, hi = float(values.min()), float(values.max())
    step = (hi - lo) / LEVELS

    def quantise(v):
        return np.zeros(v.shape, np.uint8) if step == 0 else np.clip(np.rint((v - lo) / step), 0, LEVELS)

    index = grid_offset_index(tuple(shape), tuple(shape)).numpy() if index is None else index
    table = np.bincount(index.ravel(), values.ravel()) / np.bincount(index.ravel())
    if np.abs(values - table[index]).max() <= step / 2:
        return {"form": "relative", "lo": lo, "step": step, "data": _pack(quantise(table))}
    return {"form": "full", "lo": lo, "step": step, "data": _pack(quantise(values))}


def _scaled(shape, native, new_native) -> tuple[int, ...]:
    """``shape`` grown as ``native`` grows to ``new_native`` (a window when the patch grid grows)."""
    if tuple(shape) == tuple(native):
        return tuple(new_native)
    return tuple(max(1, round(s * n / o)) for s, o, n in zip(shape, native, new_native))


def resolution_views(pe: nn.Module, shape, new_shape, scalings=None) -> list[tuple[str, tuple[int, ...], nn.Module]]:
    """The grids a page offers for one encoding, ``[(label, grid, encoding as it runs there)]``: the native grid,
    then ``new_shape`` after :func:`adapt`: the encoding's own adaptation and, for a rotary encoding, each of
    ``scalings`` (default ``none``, ``pi``, ``ntk``, ``yarn``, those the encoding rejects left out; given
    explicitly, a rejected one is an error); each label once. ``new_shape == shape`` gives the native grid only."""
    views = [(f"native grid {_grid_text(shape)}", tuple(shape), pe)]
    if tuple(new_shape) == tuple(shape):
        return views
    chosen = () if family_of(pe) != "rotary" else SCALINGS if scalings is None else tuple(scalings)
    for scaling in (None, *chosen):
        try:
            adapted, label = adapt(pe, shape, new_shape, scaling)
        except ValueError:
            if scalings is None and scaling is not None:
                continue  # e.g. normalised coordinates take no pi/ntk/yarn
            raise
        label = f"{_grid_text(new_shape)}: {label}"
        if label not in [v[0] for v in views]:
            views.append((label, tuple(new_shape), adapted))
    return views


@contextlib.contextmanager
def _evaluating(modules):
    """Every module in evaluation mode inside the block (no coordinate augmentation), its own mode after."""
    modes = [(sub, sub.training) for m in modules for sub in m.modules()]
    try:
        for m in modules:
            m.train(False)
        yield
    finally:
        for m, training in modes:
            m.train(training)


def _head_labels(pe: nn.Module, count: int) -> tuple[list[str], list[str]]:
    """Option labels of the head control and what each map shows (colour-bar label)."""
    if count == 1:
        option = "tokens (no heads)" if family_of(pe) == "tokens" else "every head (one shared map)"
        return [option], [quantity_of(pe, None)]
    heads = range(count - 1)
    options = ["mean over heads", *[f"head {h}" for h in heads]]
    return options, [quantity_of(pe, None), *[quantity_of(pe, h) for h in heads]]


def _colormap() -> str:
    import matplotlib

    rgb = matplotlib.colormaps[COLORMAP](np.arange(LEVELS + 1) / LEVELS)[:, :3]
    return base64.b64encode(np.rint(rgb * 255).astype(np.uint8).tobytes()).decode("ascii")


def _layer_entry(label: str, pe: nn.Module, grid, new_grid, scalings) -> dict:
    """One entry of the layer control: its views (grids), each with its encoded maps (see the module doc)."""
    views = []
    for view_label, view_grid, adapted in resolution_views(pe, grid, new_grid, scalings):
        with _evaluating([adapted]):  # an adapted copy may be a new module
            maps = head_maps(adapted, view_grid).numpy()
        index = grid_offset_index(view_grid, view_grid).numpy()
        views.append({"label": view_label, "grid": list(view_grid),
                      "shape": [1] * (3 - len(view_grid)) + list(view_grid),  # (T, H, W): image grids have T = 1
                      "maps": [encode_map(m, view_grid, index) for m in maps]})
    options, quantities = _head_labels(pe, len(views[0]["maps"]))
    return {"label": label, "family": family_of(pe), "note": note_of(pe), "heads": options, "quantities": quantities,
            "views": views}


def explorer_data(source: nn.Module, shape=None, new_shape=None, scalings=None, layers=None,
                  max_patches: int = MAX_PATCHES, max_bytes: int = MAX_BYTES, title: str | None = None) -> dict:
    """Everything the page shows, as the JSON object it embeds (see the module doc for the map format).

    Args:
        source, shape: an encoding and its native grid, or a model (see :func:`explorer_sources`).
        new_shape: the larger grid of the grid control, for encodings on ``shape`` (default
            :func:`larger_shape`: the spatial axes doubled); a window grows in the same ratio.
        scalings: RoPE adaptations on the larger grid besides each encoding's own (see :func:`resolution_views`);
            for rotary encodings only (an error when the page has none).
        layers: indices into :func:`explorer_sources` to include (default: all).
        max_patches: the largest grid, in patches, a page may hold (checked before anything is computed).
        max_bytes: the most encoded map data a page may hold.
    """
    check_positive_int("max_patches", max_patches)
    check_positive_int("max_bytes", max_bytes)
    sources = explorer_sources(source, shape)
    native = to_shape("shape", tuple(shape)) if shape is not None else _model_grid(source)
    new_native = to_shape("new_shape", tuple(new_shape), len(native)) if new_shape is not None \
        else larger_shape(native)
    if layers is not None:
        valid = isinstance(layers, (list, tuple, range)) and len(layers) > 0 and all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(sources) for k in layers)
        if not valid:
            raise ValueError(f"layers={layers!r} must be a non-empty list of indices 0..{len(sources) - 1} of: "
                             + "; ".join(f"{k} {label}" for k, (label, _, _) in enumerate(sources)))
        sources = [sources[k] for k in layers]
    if scalings is not None and all(family_of(pe) != "rotary" for _, pe, _ in sources):
        raise ValueError(f"scalings={tuple(scalings)!r} apply to rotary encodings only; the page shows "
                         + ", ".join(label for label, _, _ in sources))
    for label, _, grid in sources:
        for g in (grid, _scaled(grid, native, new_native)):
            if math.prod(g) > max_patches:
                raise ValueError(f"the grid {_grid_text(g)} of {label} has {math.prod(g)} patches, more than "
                                 f"max_patches={max_patches} a page holds (each map is patches^2 values); choose a "
                                 "smaller shape or new_shape, or raise max_patches")
    entries, total = [], 0
    with _evaluating([pe for _, pe, _ in sources]):
        for label, pe, grid in sources:
            entries.append(_layer_entry(label, pe, grid, _scaled(grid, native, new_native), scalings))
            total += sum(len(m["data"]) for view in entries[-1]["views"] for m in view["maps"])
            if total > max_bytes:
                raise ValueError(f"the page would hold more than max_bytes={max_bytes} of map data (over "
                                 f"{total} bytes after {label}); pass fewer layers (layers=), fewer scalings or a "
                                 "smaller new_shape, or raise max_bytes")
    default_title = name_of(source) if _is_encoding(source) else \
        f"{type(source).__name__} ({', '.join(dict.fromkeys(name_of(pe) for _, pe, _ in sources))})"
    return {"title": title or default_title, "colormap": _colormap(), "levels": LEVELS, "layers": entries}


def explorer_html(source: nn.Module, shape=None, **kwargs) -> str:
    """The page as one HTML string (see :func:`explorer_data` for the arguments)."""
    data = explorer_data(source, shape, **kwargs)
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")  # nothing the HTML parser reads as a tag
    parts = {"__TITLE__": html.escape(data["title"]), "__DATA__": payload, "__SCRIPT__": _SCRIPT,
             "__VERSION__": __version__}
    return re.sub("|".join(parts), lambda match: parts[match.group()], _PAGE)  # one pass: nothing substituted twice


def write_explorer(source: nn.Module, path, shape=None, **kwargs) -> Path:
    """Write the page (:func:`explorer_html`) to ``path`` (parent folders created) and return the path."""
    page = explorer_html(source, shape, **kwargs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; \
style-src 'unsafe-inline'">
<title>__TITLE__</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 17px; margin: 0 0 4px; }
.controls { display: flex; flex-wrap: wrap; gap: 6px 18px; margin: 10px 0; }
.controls label { display: flex; gap: 6px; align-items: center; }
.controls select { flex: none; font: inherit; }
[hidden] { display: none !important; }
.panel { display: flex; gap: 8px; align-items: flex-start; }
#map { cursor: crosshair; }
#scale { display: flex; flex-direction: column; gap: 2px; font-size: 12px; }
#bar { width: 14px; flex: 1; min-height: 0; }
.note, .help, footer { color: #666; font-size: 12px; }
#readout { font-variant-numeric: tabular-nums; min-height: 1.4em; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
<p class="note" id="note"></p>
<div class="controls">
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
<label>grid <select id="view"></select></label>
<label id="frame-box">frame <input type="range" id="frame" min="0" max="0" step="1" value="0">
<output id="frame-out"></output></label>
</div>
<div class="panel">
<canvas id="map" width="1" height="1"></canvas>
<div id="scale"><span id="hi"></span><canvas id="bar" width="1" height="256"></canvas><span id="lo"></span></div>
</div>
<p id="readout"></p>
<p id="quantity"></p>
<p class="help">Point at a patch to see its map (the query is ringed); click to pin it and read any key under the
cursor, click again to release. Colours span each map's own range (the bar).</p>
<footer>visionpe __VERSION__ explorer: maps quantised to 256 levels per map; no network is used.</footer>
<script type="application/json" id="vpe-data">__DATA__</script>
<script>__SCRIPT__</script>
</body>
</html>
"""

_SCRIPT = r"""
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("vpe-data").textContent);
  const $ = (id) => document.getElementById(id);
  const MAX_PX = 384;  // the map's longer side, in CSS pixels
  const bytesOf = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const palette = bytesOf(data.colormap);  // (levels + 1) RGB triples
  const inflated = new Map();
  const state = {layer: 0, view: 0, head: 0, frame: 0, query: [0, 0, 0], cursor: null, pinned: false};
  let shown = null;  // what the canvas shows: {row: levels of every key for the query, cell: pixels per patch}
  let queue = Promise.resolve();

  const layer = () => data.layers[state.layer];
  const view = () => layer().views[state.view];
  const map = () => view().maps[state.head];
  const valueOf = (entry, level) => entry.lo + level * entry.step;
  const place = (p) => "(" + p.slice(3 - view().grid.length).join(", ") + ")";

  function levelsOf(l, v, m) {  // the map's levels, inflated once, when first shown
    const key = l + "/" + v + "/" + m;
    if (!inflated.has(key)) {
      const stream = new Blob([bytesOf(data.layers[l].views[v].maps[m].data)]).stream()
        .pipeThrough(new DecompressionStream("deflate"));
      inflated.set(key, new Response(stream).arrayBuffer().then((buffer) => new Uint8Array(buffer)));
    }
    return inflated.get(key);
  }

  function rowOf(levels, entry, shape, q) {  // levels of every key (row-major) for the query q = [t, h, w]
    const [T, H, W] = shape, n = T * H * W, row = new Uint8Array(n);
    const qi = (q[0] * H + q[1]) * W + q[2];
    let j = 0;
    for (let t = 0; t < T; t++) for (let h = 0; h < H; h++) for (let w = 0; w < W; w++, j++) {
      row[j] = entry.form === "full" ? levels[qi * n + j]
        : levels[((q[0] - t + T - 1) * (2 * H - 1) + (q[1] - h + H - 1)) * (2 * W - 1) + (q[2] - w + W - 1)];
    }
    return row;
  }

  const colour = (level) => "rgb(" + palette.subarray(3 * level, 3 * level + 3).join(",") + ")";

  function draw(levels) {
    const entry = map(), shape = view().shape, [, H, W] = shape;
    const row = rowOf(levels, entry, shape, state.query);
    const cell = Math.max(2, Math.floor(MAX_PX / Math.max(H, W)));
    const canvas = $("map"), ctx = canvas.getContext("2d");
    canvas.width = W * cell;
    canvas.height = H * cell;
    const first = state.frame * H * W;
    for (let h = 0; h < H; h++) for (let w = 0; w < W; w++) {
      ctx.fillStyle = colour(row[first + h * W + w]);
      ctx.fillRect(w * cell, h * cell, cell, cell);
    }
    const [qt, qh, qw] = state.query, ring = Math.max(1, Math.min(2, Math.floor(cell / 6)));
    ctx.setLineDash(qt === state.frame ? [] : [3, 3]);
    ctx.lineWidth = ring;
    ctx.strokeStyle = "#e6194b";
    ctx.strokeRect(qw * cell + ring / 2, qh * cell + ring / 2, cell - ring, cell - ring);
    shown = {row: row, cell: cell};
    $("scale").style.height = canvas.height + "px";
    const bar = $("bar").getContext("2d");
    for (let k = 0; k <= data.levels; k++) {
      bar.fillStyle = colour(data.levels - k);
      bar.fillRect(0, k, 1, 1);
    }
    $("hi").textContent = valueOf(entry, data.levels).toPrecision(4);
    $("lo").textContent = valueOf(entry, 0).toPrecision(4);
    report();
  }

  function report() {
    const entry = map(), [, H, W] = view().shape;
    let text = "query " + place(state.query) + (state.pinned ? " pinned (click to release)" : "");
    if (state.cursor) {
      const c = state.cursor, level = shown.row[(c[0] * H + c[1]) * W + c[2]];
      text += " \u00b7 key " + place(c) + ": " + valueOf(entry, level).toFixed(4);
    }
    $("readout").textContent = text;
    $("quantity").textContent = layer().quantities[state.head] + " \u00b7 " + view().label;
    $("note").textContent = layer().note;
  }

  function render() {
    const l = state.layer, v = state.view, m = state.head;
    queue = queue.then(() => levelsOf(l, v, m)).then(draw)
      .catch((err) => { $("readout").textContent = "cannot show this map: " + err; });
    return queue;
  }

  function fill(select, labels, keep) {
    select.replaceChildren(...labels.map((text, i) => new Option(text, String(i))));
    select.value = String(keep);
    select.disabled = labels.length < 2;
  }

  function moveTo(oldShape) {  // the query (and frame) at the same place of a grid of another shape
    const shape = view().shape;
    const scale = (p, a) => Math.min(shape[a] - 1, Math.floor((p + 0.5) * shape[a] / oldShape[a]));
    state.query = state.query.map(scale);
    state.frame = scale(state.frame, 0);
    state.cursor = null;
    showFrame();
  }

  function showFrame() {  // the frame slider: hidden for image grids
    const T = view().shape[0], slider = $("frame");
    slider.max = String(T - 1);
    slider.value = String(state.frame);
    $("frame-box").hidden = T < 2;
    $("frame-out").textContent = state.frame + " / " + (T - 1);
  }

  function chooseLayer(next, keepView) {
    const old = view().shape;
    state.layer = next;
    state.head = Math.min(state.head, layer().heads.length - 1);
    state.view = keepView < layer().views.length ? keepView : layer().views.length - 1;
    fill($("head"), layer().heads, state.head);
    fill($("view"), layer().views.map((v) => v.label), state.view);
    moveTo(old);
  }

  fill($("layer"), data.layers.map((l) => l.label), 0);
  chooseLayer(0, 0);
  state.query = view().shape.map((s) => Math.floor(s / 2));
  state.frame = state.query[0];
  showFrame();

  $("layer").addEventListener("change", (e) => { chooseLayer(Number(e.target.value), state.view); render(); });
  $("head").addEventListener("change", (e) => { state.head = Number(e.target.value); render(); });
  $("view").addEventListener("change", (e) => {
    const old = view().shape;
    state.view = Number(e.target.value);
    moveTo(old);
    render();
  });
  $("frame").addEventListener("input", (e) => {
    state.frame = Number(e.target.value);
    showFrame();
    render();
  });
  function cellAt(event) {
    const box = $("map").getBoundingClientRect(), [, H, W] = view().shape;
    const clamp = (x, n) => Math.min(n - 1, Math.max(0, Math.floor(x * n)));
    const y = (event.clientY - box.top) / box.height, x = (event.clientX - box.left) / box.width;
    return [state.frame, clamp(y, H), clamp(x, W)];
  }
  $("map").addEventListener("mousemove", (e) => {
    state.cursor = cellAt(e);
    if (!state.pinned) state.query = state.cursor;
    render();
  });
  $("map").addEventListener("click", (e) => {
    state.pinned = !state.pinned;
    state.query = state.cursor = cellAt(e);
    render();
  });

  window.vpeExplorer = {  // for scripted use and the browser tests: what is shown, once drawn
    idle: () => queue,
    state: () => {
      const entry = map(), [, H, W] = view().shape, first = state.frame * H * W;
      const levels = Array.from(shown.row.subarray(first, first + H * W));
      return {layer: state.layer, view: state.view, head: state.head, frame: state.frame, query: state.query.slice(),
              pinned: state.pinned, shape: view().shape.slice(), cell: shown.cell, levels: levels,
              values: levels.map((level) => valueOf(entry, level)), lo: entry.lo, step: entry.step};
    },
  };
  render();
})();
"""
