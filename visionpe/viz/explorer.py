"""One self-contained HTML page to explore what an encoding knows: point at a patch, see its similarity map.

:func:`write_explorer` takes a fresh encoding or a model (every encoding :func:`visionpe.encodings_of` finds: the
tokens table, one rotary or bias module per block) and writes one HTML file that needs no server and no network
(data, script and style inline; a Content-Security-Policy forbids every fetch); its HTML, script and style are
package data files (``visionpe/viz/assets/explorer.html``, ``.js``, ``.css``: :func:`asset`). Pointing at a patch
shows its row of :func:`visionpe.viz.similarity` (the module doc of :mod:`visionpe.viz` says what it is per family), with
controls for the layer, the head (mean over heads or one), the grid (native, or a larger one after the encoding's
own adaptation, :meth:`Encoding.adapt`; RoPE also under each scaling ``none``/``pi``/``ntk``/``yarn``), and for
video grids a frame slider. Clicking pins the query; the cursor then reads the value of any key.

How the maps are stored (``layers[l].views[v].maps[m]`` of the embedded JSON, ``m = 0`` the mean over heads, then
one per head; a single map where every head shares it):

- each ``(N, N)`` map (rows = queries, keys row-major) is quantised to 256 levels on its own range:
  ``value = lo + level * step``, ``step = (max - min) / 255``; the colour of a patch is its level;
- a map that depends only on the offset between query and key (RoPE, the relative biases, ALiBi; checked, never
  assumed: every entry within ``step / 2`` of its offset's mean) is stored as its table of offsets ``c_q - c_k``,
  ``prod(2 S_a - 1)`` levels, first axis slowest (:func:`visionpe.bias.grid_offset_index`), otherwise as all
  ``N * N`` levels (``form`` says which); either way a decoded value is within one ``step`` of the map;
- the levels are zlib-compressed and base64-encoded, and inflated by the page only when a map is first shown
  (``DecompressionStream``: any current browser, e.g. Chromium 80, Firefox 113, Safari 16.4 or later).

Maps are computed with the encodings in evaluation mode (no coordinate augmentation); their modes are restored.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import html
import json
import math
import re
import zlib
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import __version__
from .._checks import check_positive_int, to_shape
from ..bias import grid_offset_index
from ..rotary.scaling import SCALINGS
from .numbers import (adapt, family_of, larger_shape, name_of, note_of, num_heads_of, pair_maps, quantity_of,
                      select_head, similarity)

LEVELS = 255  # the highest quantisation level: 256 levels, one per colour of the colour map
MAX_PATCHES = 2048  # patches of the largest grid a page holds (one (N, N) map costs N^2 levels before compression)
MAX_BYTES = 24_000_000  # encoded map data of one page
COLORMAP = "viridis"
ASSETS = ("explorer.html", "explorer.js", "explorer.css")  # visionpe/viz/assets/: the page's template, script, style

__all__ = ["ASSETS", "MAX_PATCHES", "MAX_BYTES", "asset", "explorer_sources", "head_maps", "encode_map", "resolution_views",
           "explorer_data", "explorer_html", "write_explorer"]


@functools.lru_cache(maxsize=None)
def asset(name: str) -> str:
    """A file of the page, shipped as package data in ``visionpe/viz/assets/`` (:data:`ASSETS`): its HTML template
    (``__TITLE__``, ``__STYLE__``, ``__DATA__``, ``__SCRIPT__``, ``__VERSION__`` filled in by :func:`explorer_html`),
    its script or its style."""
    if name not in ASSETS:
        raise ValueError(f"name={name!r} is not an asset of the explorer page; allowed values: {', '.join(ASSETS)}")
    return resources.files(__package__).joinpath("assets").joinpath(name).read_text(encoding="utf-8")


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
    mean = select_head(maps, None, num_heads_of(pe), getattr(pe, "masks_pairs", False))
    return maps if maps.shape[0] == 1 else torch.cat([mean[None], maps])


def _pack(levels: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(levels.astype(np.uint8).tobytes(), 9)).decode("ascii")


def encode_map(values: np.ndarray, shape, index: np.ndarray | None = None, masked: bool = False) -> dict:
    """One ``(N, N)`` map (rows = queries) on the grid ``shape`` as the page stores it (see the module doc):
    ``{"form": "relative" | "full", "lo", "step", "masked", "data"}``. ``masked``: the encoding masks pairs (a
    directional bias: its map holds NaN or -inf where a key is outside the query's field of view); their level is
    :data:`LEVELS` and the other values take levels ``0..LEVELS - 1``. Otherwise a map with NaN or inf is an error.
    ``index``: the grid's ``(N, N)`` offset index (:func:`grid_offset_index`), to compute it once for many maps."""
    values = np.asarray(values, dtype=np.float64)
    hidden = (np.isnan(values) | np.isneginf(values)) if masked else np.zeros(values.shape, bool)
    if not np.isfinite(values[~hidden]).all():
        raise ValueError(f"the map on the grid {_grid_text(shape)} has NaN or inf values; a page shows finite maps "
                         "only (or masked pairs of an encoding that masks them)")
    shown = values[~hidden]
    lo, hi = (float(shown.min()), float(shown.max())) if shown.size else (0.0, 0.0)
    top = LEVELS - 1 if masked else LEVELS  # with masked pairs the highest level means "masked"
    step = (hi - lo) / top

    def quantise(v, hide):
        levels = np.zeros(v.shape, np.uint8) if step == 0 else np.clip(np.rint((np.where(hide, lo, v) - lo) / step),
                                                                       0, top)
        return np.where(hide, LEVELS, levels)

    index = grid_offset_index(tuple(shape), tuple(shape)).numpy() if index is None else index
    counts = np.bincount(index.ravel())
    hidden_counts = np.bincount(index.ravel(), hidden.ravel(), minlength=counts.size)
    table = np.bincount(index.ravel(), np.where(hidden, 0.0, values).ravel()) / np.maximum(counts - hidden_counts, 1)
    table_hidden = hidden_counts == counts
    relative = (((hidden_counts == 0) | table_hidden).all()  # every offset masked for all its pairs, or for none
                and np.abs(np.where(hidden, 0.0, values - table[index])).max(initial=0.0) <= step / 2)
    form, levels = ("relative", quantise(table, table_hidden)) if relative else ("full", quantise(values, hidden))
    return {"form": form, "lo": lo, "step": step, "masked": bool(masked), "data": _pack(levels)}


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
                      "maps": [encode_map(m, view_grid, index, getattr(adapted, "masks_pairs", False))
                               for m in maps]})
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
    parts = {"__TITLE__": html.escape(data["title"]), "__DATA__": payload, "__SCRIPT__": asset("explorer.js"),
             "__STYLE__": asset("explorer.css"), "__VERSION__": __version__}
    page = asset("explorer.html")
    return re.sub("|".join(parts), lambda match: parts[match.group()], page)  # one pass: nothing substituted twice


def write_explorer(source: nn.Module, path, shape=None, **kwargs) -> Path:
    """Write the page (:func:`explorer_html`) to ``path`` (parent folders created) and return the path."""
    page = explorer_html(source, shape, **kwargs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
