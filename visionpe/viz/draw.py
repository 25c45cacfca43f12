"""Drawing (matplotlib): each function lays out numbers from :mod:`visionpe.viz.numbers` and returns a
``matplotlib.figure.Figure`` (no pyplot, no global state); :func:`save` writes it, :func:`render` is one call
per view (numbers + drawing).
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_choice
from .numbers import (KINDS, adapt, as_frames, axial_reference, centre, encoding_channels, family_of, larger_shape,
                      name_of, note_of, quantity_of, query_map, resolution_similarity, rope_frequencies, similarity,
                      similarity_mosaic)

AXIS_NAMES_XY = ("x", "y", "t")  # frequency components are in xy order: last grid axis first

__all__ = ["AXIS_NAMES_XY", "draw_images", "draw_similarity", "draw_resolution", "draw_video", "draw_heatmap",
           "draw_frequencies", "save", "render"]


def _grid_text(shape) -> str:
    return "x".join(map(str, shape))


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="white")


def _limits(images) -> tuple[float, float]:
    values = torch.cat([torch.as_tensor(i).flatten() for i in images])
    values = values[~values.isnan()]
    lo, hi = float(values.min()), float(values.max())
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def draw_images(images, titles, suptitle: str = "", label: str = "", cmap: str = "viridis",
                markers=None, panel_width: float = 5.0, ncols: int | None = None):
    """Several 2D images on ONE shared colour scale with one colour bar; NaN is drawn white.

    ``markers``: optional ``(row, col)`` per image (or None) drawn as a red ring (the query).
    """
    images = [torch.as_tensor(i).float() for i in images]
    ncols = ncols or len(images)
    nrows = math.ceil(len(images) / ncols)
    aspect = max(i.shape[0] / i.shape[1] for i in images)
    fig = _figure(panel_width * ncols + 1.0, panel_width * nrows * min(max(aspect, 0.25), 2.0) + 0.8)
    axes = fig.subplots(nrows, ncols, squeeze=False).flatten()
    vmin, vmax = _limits(images)
    for k, ax in enumerate(axes):
        if k >= len(images):
            ax.set_axis_off()
            continue
        shown = ax.imshow(images[k].numpy(), cmap=_cmap(cmap), vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_title(titles[k], fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        if markers is not None and markers[k] is not None:
            ax.scatter([markers[k][1]], [markers[k][0]], s=60, facecolors="none", edgecolors="red", linewidths=1.5)
    fig.colorbar(shown, ax=list(axes[:len(images)]), label=label, shrink=0.8)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return fig


def _layout_note(shape) -> str:
    if len(shape) == 3:
        return "tile = query (frame blocks top to bottom); inside a tile key frames t=0.. left to right"
    return "tile = query at its grid position; pixel = key position"


def draw_similarity(sim: torch.Tensor, shape, title: str = "", label: str = "similarity"):
    """The similarity grid (ViT paper figure) of ``sim (N, N)`` on a grid ``shape``."""
    return draw_images([similarity_mosaic(sim, shape)], [_layout_note(shape)],
                       suptitle=f"{title} on a {_grid_text(shape)} grid".strip(), label=label, panel_width=5.5)


def draw_resolution(sim: torch.Tensor, new_sim: torch.Tensor, shape, new_shape, adaptation: str,
                    title: str = "", label: str = "similarity"):
    """Similarity grids on the native and on a larger grid, side by side, one colour scale."""
    images = [similarity_mosaic(sim, shape), similarity_mosaic(new_sim, new_shape)]
    titles = [f"native grid {_grid_text(shape)}", f"grid {_grid_text(new_shape)}: {adaptation}"]
    return draw_images(images, titles, suptitle=title, label=label, panel_width=4.5)


def draw_video(sim: torch.Tensor, shape, query, title: str = "", label: str = "similarity"):
    """Similarity of one query to every ``(t, h, w)``: a strip of ``T`` frames, the query ringed in red."""
    shape3 = (1,) * (3 - len(shape)) + tuple(shape)
    query3 = (0,) * (3 - len(shape)) + tuple(query)
    frames = as_frames(query_map(sim, shape, query), shape)
    markers = [query3[1:] if t == query3[0] else None for t in range(shape3[0])]
    ncols = min(shape3[0], 8)
    return draw_images(list(frames), [f"t={t}" for t in range(shape3[0])],
                       suptitle=f"{title}: query (t, h, w)={query3} on a {_grid_text(shape)} grid".strip(": "),
                       label=label, markers=markers, panel_width=1.7, ncols=ncols)


def draw_heatmap(channels: torch.Tensor, title: str = "", channel_label: str = "channel"):
    """Position x channel heatmap of ``channels (N, C)`` (patches in row-major order), diverging scale."""
    fig = _figure(7.0, 4.5)
    ax = fig.subplots()
    bound = float(channels.abs().max()) or 1.0
    shown = ax.imshow(channels.numpy(), aspect="auto", cmap="RdBu_r", vmin=-bound, vmax=bound,
                      interpolation="nearest")
    ax.set_xlabel(channel_label)
    ax.set_ylabel("patch position (row-major)")
    ax.set_title(title, fontsize=10)
    fig.colorbar(shown, ax=ax, label="value")
    return fig


def draw_frequencies(freqs: torch.Tensor, reference: torch.Tensor | None, title: str = "", max_cols: int = 6):
    """Frequency vectors per head as arrows from the origin (coloured by band), the axial ones (if any) as grey
    crosses; one panel per (head, plane of two components): 2D ``(fx, fy)``, 3D also ``(fx, ft)``, ``(fy, ft)``.

    ``freqs: (heads, planes, ndim)``, ``reference: (pairs, ndim)`` or None, components in xy order.
    """
    heads, pairs, ndim = freqs.shape
    if ndim == 1:
        freqs = F.pad(freqs, (0, 1))
        reference = None if reference is None else F.pad(reference, (0, 1))
    planes = list(itertools.combinations(range(max(ndim, 2)), 2))
    panels = [(plane, h) for plane in planes for h in range(heads)]
    ncols = min(len(panels), max_cols)
    nrows = math.ceil(len(panels) / ncols)
    fig = _figure(2.4 * ncols + 0.6, 2.4 * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False).flatten()
    bound = 1.08 * float(max(freqs.abs().max(), 0.0 if reference is None else reference.abs().max())) or 1.0
    band = torch.arange(pairs) % max(pairs // max(ndim, 1), 1)
    for ax, ((a, b), h) in zip(axes, panels):
        if reference is not None:
            ax.scatter(reference[:, a], reference[:, b], marker="x", color="0.6", s=18, label="axial")
        ax.quiver(torch.zeros(pairs), torch.zeros(pairs), freqs[h, :, a], freqs[h, :, b], band.numpy(),
                  angles="xy", scale_units="xy", scale=1, width=0.012, cmap="viridis")
        ax.set_xlim(-bound, bound)
        ax.set_ylim(-bound, bound)
        ax.set_aspect("equal")
        ax.axhline(0, color="0.85", lw=0.5)
        ax.axvline(0, color="0.85", lw=0.5)
        ax.set_title(f"head {h}" if heads > 1 else "all heads", fontsize=8)
        ax.set_xlabel(f"f{AXIS_NAMES_XY[a]}", fontsize=8)
        ax.set_ylabel(f"f{AXIS_NAMES_XY[b]}", fontsize=8)
        ax.tick_params(labelsize=6)
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if reference is not None:
        axes[0].legend(fontsize=6, loc="upper right")
    legend = "; x: axial" if reference is not None else ""
    fig.suptitle(f"{title} (arrows: frequency vectors coloured by band{legend})".strip(), fontsize=9)
    return fig


def save(fig, path, dpi: int = 90) -> Path:
    """Write ``fig`` as a PNG (parent folders created) and return the path written: ``path``, with ``.png`` added
    when it has no suffix (as matplotlib adds it, so that the path returned is the file's)."""
    path = Path(path)
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def render(pe: nn.Module, kind: str, shape, head: int | None = None, new_shape=None, scaling: str | None = None,
           query=None, native_shape=None, title: str | None = None):
    """Figure of ``kind`` (one of :data:`KINDS`) for encoding ``pe`` on the grid ``shape``.

    ``native_shape``: the grid the encoding was built/trained for (default ``shape``); when ``shape``
    differs, the encoding is first adapted to it (:func:`adapt`, with ``scaling`` for RoPE).
    ``new_shape``: the larger grid of the resolution view (default :func:`larger_shape`).
    ``query``: the query position of the video view (default the centre).
    """
    check_choice("kind", kind, KINDS)
    shape = tuple(shape)
    native_shape = tuple(native_shape or shape)
    title = title or name_of(pe)
    if kind != "freqs" and note_of(pe):
        title = f"{title} ({note_of(pe)})"
    label = quantity_of(pe, head)
    if kind == "resolution":
        new_shape = tuple(new_shape or larger_shape(native_shape))
        sim, new_sim, adaptation = resolution_similarity(pe, native_shape, new_shape, head, scaling)
        return draw_resolution(sim, new_sim, native_shape, new_shape, adaptation, title, label)
    if kind == "freqs":
        return draw_frequencies(rope_frequencies(pe), axial_reference(pe), title)
    pe, _ = adapt(pe, native_shape, shape, scaling)
    if kind == "heatmap":
        channels, channel_label = encoding_channels(pe, shape, head)
        what = "position vectors" if family_of(pe) == "tokens" else f"rotations, head {head or 0}"
        return draw_heatmap(channels, f"{title}: {what} on a {_grid_text(shape)} grid", channel_label)
    sim = similarity(pe, shape, head)
    if kind == "video":
        return draw_video(sim, shape, query if query is not None else centre(shape), title, label)
    return draw_similarity(sim, shape, title, label)
