"""Pictures of what a positional encoding knows about space, for every family, on 1D/2D/3D grids.

Numbers and pictures are separate. The functions in the first part return tensors (and are what the
tests check); the ``draw_*`` functions only lay those numbers out with matplotlib and return a
``matplotlib.figure.Figure`` (no pyplot, no global state); :func:`save` writes it as a PNG.

What the *similarity* between two patch positions ``i`` and ``j`` means in each family:

- **tokens** (``sincos``, ``learned`` joint or factorized): the cosine similarity of the position vectors
  ``e_i, e_j`` (the ViT paper's figure). ``peg`` has no position vectors: it is a convolution of the
  tokens. We show the cosine similarity of its output for a constant input (all ones), ``PEG(1)_i``:
  the only position signal PEG has is the zero padding at the borders, so interior positions come out
  identical (similarity 1) and only the border rows/columns differ.
- **rotary** (``rope_axial``, ``rope_mixed``): the positional kernel RoPE imposes on a query/key pair,
  ``K_h[i, j] = Re(sum_p conj(cis[h, i, p]) * cis[h, j, p]) / (head_dim / 2)``. It is the expected score
  ``E[<R_i x, R_j x>] / E[|x|^2]`` between the same vector ``x`` rotated to position ``i`` and to position
  ``j``, for an isotropic random ``x`` (``q = k``): each rotation pair ``p`` carries ``E|x_p|^2 = 2 / head_dim``
  of the energy. ``K[i, i] = 1`` (YaRN: its attention factor squared), ``|K| <= K[i, i]`` and ``K[i, j]`` depends
  only on the offset ``c_j - c_i``. Shown for one head or averaged over heads.
- **bias** (``swin_bias``, ``rel_bias``, ``cpb``, ``alibi``): the bias row ``pe(grid)[h, i, :]`` added to the
  logits of query ``i``, for one head or averaged over heads.

Prefix tokens (class, registers) have no spatial position and never appear in these maps.
"""
from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._checks import check_choice, to_shape
from .bias import ALiBi, ContinuousPositionBias, RelativePositionBias
from .grid import Grid, as_grid
from .registry import ENCODINGS, available
from .rotary.rope import axial_frequencies
from .tokens import PEG, Learned, SinCos

KINDS = ("similarity", "heatmap", "freqs", "resolution", "video")
AXIS_NAMES_XY = ("x", "y", "t")  # frequency components are in xy order: last grid axis first


# ---------------------------------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------------------------------
def family_of(pe: nn.Module) -> str:
    """``"tokens"``, ``"rotary"`` or ``"bias"``."""
    family = getattr(pe, "family", None)
    if family not in ("tokens", "rotary", "bias"):
        raise ValueError(f"{type(pe).__name__} is not a visionpe encoding (no family attribute)")
    return family


def name_of(pe: nn.Module) -> str:
    """The registry name of an encoding (``"rope_mixed"``), or its class name."""
    for name, cls in ENCODINGS.items():
        if type(pe) is cls:
            return name + (" (factorized)" if getattr(pe, "factorized", False) else "")
    return type(pe).__name__


def num_heads_of(pe: nn.Module) -> int:
    return int(getattr(pe, "num_heads", 1))


def _grid_text(shape) -> str:
    return "x".join(map(str, shape))


def patch_grid(grid) -> Grid:
    """The grid without prefix tokens (maps only cover patches)."""
    grid = as_grid(grid)
    return Grid(grid.shape, 0, grid.offset)


@torch.no_grad()
def position_vectors(pe: nn.Module, grid) -> torch.Tensor:
    """Position vectors of a tokens-family encoding, ``(N, dim)`` float32.

    ``sincos``: its table; ``learned``: its table for this grid (resampled if the grid differs from the
    training grid); ``peg`` and any other tokens encoding: ``pe(1, grid) - 1``, the encoding's output for a
    constant input (for PEG the convolution of a constant map: equal in the interior, differing at borders).
    """
    grid = patch_grid(grid)
    if family_of(pe) != "tokens":
        raise ValueError(f"{name_of(pe)} is a {family_of(pe)} encoding and has no position vectors; "
                         "position vectors exist for the tokens family only")
    if isinstance(pe, SinCos):
        return pe.table(grid).float().cpu()
    if isinstance(pe, Learned):
        return pe.patch_table(grid).detach().float().cpu()
    dim = pe.proj.in_channels if isinstance(pe, PEG) else pe.dim
    device = next(iter(pe.parameters()), torch.empty(0)).device
    ones = torch.ones(1, grid.num_tokens, dim, device=device)
    return (pe(ones, grid) - ones)[0].float().cpu()


def cosine_similarity(vectors: torch.Tensor) -> torch.Tensor:
    """``(N, D) -> (N, N)``: cosine similarity of every pair of rows."""
    unit = F.normalize(vectors.float(), dim=-1)
    return unit @ unit.T


def rope_kernel(cis: torch.Tensor) -> torch.Tensor:
    """RoPE kernel ``(heads, N, pairs)`` complex -> ``(heads, N, N)``.

    ``K[h, i, j] = Re(sum_p conj(cis[h, i, p]) cis[h, j, p]) / pairs``: the expected score between an
    isotropic random vector rotated to position ``i`` and the same vector rotated to ``j``, over its norm.
    """
    return torch.einsum("hip,hjp->hij", cis.conj(), cis).real / cis.shape[-1]


@torch.no_grad()
def pair_maps(pe: nn.Module, grid) -> torch.Tensor:
    """Per-head pairwise maps of a rotary or bias encoding, ``(heads or 1, N, N)`` float32.

    Rotary: :func:`rope_kernel` of ``pe.cis(grid)``; bias: ``pe(grid)`` without prefix rows and columns.
    """
    grid = patch_grid(grid)
    family = family_of(pe)
    if family == "rotary":
        return rope_kernel(pe.cis(grid)).float().cpu()
    if family == "bias":
        return pe(grid).detach().float().cpu()
    raise ValueError(f"{name_of(pe)} is a tokens encoding: it has no per-head pairwise map")


def select_head(maps: torch.Tensor, head: int | None, num_heads: int) -> torch.Tensor:
    """``(heads or 1, ...) -> (...)``: the mean over heads (``head=None``) or one head.

    A map shared by all heads (leading size 1, as axial RoPE) serves every ``head < num_heads``.
    """
    if head is None:
        return maps.mean(0)
    if not 0 <= head < num_heads:
        raise ValueError(f"head={head} is out of range: the encoding has {num_heads} head(s), 0..{num_heads - 1}")
    return maps[head if maps.shape[0] > 1 else 0]


@torch.no_grad()
def similarity(pe: nn.Module, grid, head: int | None = None) -> torch.Tensor:
    """Similarity of every patch position to every other, ``(N, N)`` float32, rows = queries.

    Tokens: cosine similarity of :func:`position_vectors` (``head`` is ignored); rotary: RoPE kernel;
    bias: the bias; the last two for ``head`` or averaged over heads (``head=None``). See the module doc.
    """
    if family_of(pe) == "tokens":
        return cosine_similarity(position_vectors(pe, grid))
    return select_head(pair_maps(pe, grid), head, num_heads_of(pe))


def quantity_of(pe: nn.Module, head: int | None = None) -> str:
    """A short label for what :func:`similarity` shows for this encoding (colour-bar label)."""
    family = family_of(pe)
    heads = "mean over heads" if head is None else f"head {head}"
    if family == "tokens":
        if isinstance(pe, (SinCos, Learned)):
            return "cosine similarity of position vectors"
        return "cosine similarity of PEG(constant input)"
    if family == "rotary":
        return f"RoPE kernel, {heads}"
    return f"attention bias, {heads}"


def note_of(pe: nn.Module) -> str:
    """One phrase on how the map is defined for this encoding (for figure titles)."""
    family = family_of(pe)
    if family == "rotary":
        return "score of one isotropic q rotated to i and to j"
    if family == "bias":
        return "bias row of each query"
    if isinstance(pe, (SinCos, Learned)):
        return ""
    return "no position vectors: PEG output for a constant input"


def arrange(tiles: torch.Tensor, shape, frames: str = "horizontal", gap: int = 0,
            frame_gap: int = 1) -> torch.Tensor:
    """Lay out one tile per grid position as one 2D image, with NaN gaps.

    Args:
        tiles: ``(..., N, r, c)``, ``N = prod(shape)`` in row-major grid order.
        shape: ``(L,)``, ``(H, W)`` or ``(T, H, W)``.
        frames: 3D frames side by side (``"horizontal"``) or stacked (``"vertical"``).
        gap, frame_gap: NaN pixels between tiles and between frames.
    Returns:
        ``(..., H (r + gap) - gap, W (c + gap) - gap)`` for a 2D grid (tile ``(h, w)`` at block row ``h``, block
        column ``w``); a 3D grid adds its ``T`` frames along ``frames``; a 1D grid is one row of tiles.
    """
    check_choice("frames", frames, ("horizontal", "vertical"))
    shape = to_shape("shape", tuple(shape))
    t, h, w = (1,) * (3 - len(shape)) + shape
    padded = F.pad(tiles.float(), (0, gap, 0, gap), value=math.nan)
    image = rearrange(padded, "... (t h w) r c -> ... t (h r) (w c)", t=t, h=h, w=w)
    image = image[..., :image.shape[-2] - gap, :image.shape[-1] - gap]
    if frames == "horizontal":
        image = rearrange(F.pad(image, (0, frame_gap), value=math.nan), "... t r c -> ... r (t c)")
        return image[..., :image.shape[-1] - frame_gap]
    image = rearrange(F.pad(image, (0, 0, 0, frame_gap), value=math.nan), "... t r c -> ... (t r) c")
    return image[..., :image.shape[-2] - frame_gap, :]


def grid_image(values: torch.Tensor, shape, frames: str = "horizontal", frame_gap: int = 1) -> torch.Tensor:
    """Values per position ``(..., N)`` as an image of the grid (3D: frames side by side)."""
    return arrange(values[..., None, None], shape, frames, gap=0, frame_gap=frame_gap)


def similarity_mosaic(sim: torch.Tensor, shape, gap: int = 1) -> torch.Tensor:
    """The ViT-paper figure as one image: query ``i``'s row of ``sim (N, N)`` drawn as a tile of the grid,
    tiles placed at the query's grid position, ``gap`` NaN pixels between tiles.

    2D ``(H, W)``: ``(H (H + gap) - gap, W (W + gap) - gap)``. 3D ``(T, H, W)``: inside a tile the ``T`` key
    frames run left to right (1 NaN pixel apart); the query tiles of frame ``t`` form the ``t``-th block from
    the top; tiles are ``2 gap`` apart, frame blocks ``4 gap``.
    """
    keys = grid_image(sim, shape, "horizontal", frame_gap=1)  # (N, r, c)
    gap = 2 * gap if len(tuple(shape)) == 3 else gap  # wider than the 1-pixel gap between key frames
    return arrange(keys, shape, "vertical", gap=gap, frame_gap=2 * gap)


def query_map(sim: torch.Tensor, shape, query) -> torch.Tensor:
    """Row of ``sim (N, N)`` for the query at grid index ``query`` (a tuple), reshaped to ``shape``."""
    shape = tuple(shape)
    query = tuple(int(q) for q in query)
    if len(query) != len(shape) or any(not 0 <= q < s for q, s in zip(query, shape)):
        raise ValueError(f"query={query} is not a position of the grid {shape}")
    return sim[int(np.ravel_multi_index(query, shape))].reshape(shape)


def as_frames(values: torch.Tensor, shape) -> torch.Tensor:
    """``(*shape)`` -> ``(T, H, W)`` frames (1D: one frame of one row, 2D: one frame)."""
    shape = tuple(shape)
    t, h, w = (1,) * (3 - len(shape)) + shape
    return values.reshape(t, h, w)


def centre(shape) -> tuple[int, ...]:
    return tuple(s // 2 for s in shape)


@torch.no_grad()
def encoding_channels(pe: nn.Module, grid, head: int | None = None) -> tuple[torch.Tensor, str]:
    """Position x channel table ``(N, C)`` and what its channels are.

    Tokens: the position vectors (``C = dim``). Rotary: ``[cos angle_p | sin angle_p]`` of the rotation pairs
    of ``head`` (default 0), ``C = head_dim``. Bias encodings have no channels (``ValueError``).
    """
    family = family_of(pe)
    if family == "tokens":
        return position_vectors(pe, grid), "channel"
    if family == "rotary":
        cis = select_head(pe.cis(patch_grid(grid)).cpu(), 0 if head is None else head, num_heads_of(pe))
        return torch.cat([cis.real, cis.imag], dim=-1).float(), "rotation pair (cos | sin)"
    raise ValueError(f"{name_of(pe)} is a bias encoding: it has no channels to draw as a heatmap; "
                     "use kind 'similarity' for its bias rows")


def _check_rotary(pe: nn.Module) -> None:
    if family_of(pe) != "rotary":
        raise ValueError(f"{name_of(pe)} is a {family_of(pe)} encoding: frequencies exist for "
                         "rope_axial / rope_mixed only")


def rope_frequencies(pe: nn.Module) -> torch.Tensor:
    """Frequency vectors ``(heads or 1, head_dim / 2, ndim)``, components in xy order (``[..., 0]`` = fx)."""
    _check_rotary(pe)
    return rearrange(pe.freqs.detach().float().cpu(), "a h p -> h p a")


def axial_reference(pe: nn.Module) -> torch.Tensor:
    """The axis-aligned frequencies ``(head_dim / 2, ndim)`` (xy order) an axial RoPE would use with the same
    ``head_dim`` and ``theta``: for ``rope_mixed`` the magnitudes its initialisation draws directions for."""
    _check_rotary(pe)
    sections = getattr(pe, "sections", None) or (pe.head_dim // (2 * pe.ndim),) * pe.ndim
    return rearrange(axial_frequencies(tuple(sections)[::-1], pe.theta), "a 1 p -> p a")


def adapt(pe: nn.Module, shape, new_shape, scaling: str | None = None) -> tuple[nn.Module, str]:
    """The encoding as it runs on ``new_shape`` after its own adaptation from ``shape`` (its native grid),
    and a label naming that adaptation. ``pe`` itself is never modified (a copy is adapted when needed).

    - ``learned``: the table is resampled (on the fly by ``patch_table``); ``sincos``: recomputed
      (or stretched to ``ref_shape`` if set); ``peg``: the convolution runs on the new grid.
    - rotary: ``scaling=None`` keeps the module's own ``scaling``/``ref_shape``; ``"none"``, ``"pi"``,
      ``"ntk"``, ``"yarn"`` choose one, with ``ref_shape`` = the module's or else ``shape``.
    - ``swin_bias`` (fixed window): the table is resized to the new window; ``rel_bias``: resampled on the
      fly; ``cpb``: the MLP is evaluated on the new offsets; ``alibi``: defined for any grid.
    """
    shape, new_shape = tuple(shape), tuple(new_shape)
    if family_of(pe) == "rotary":
        if scaling is not None:
            pe = pe.with_scaling(scaling, pe.ref_shape or shape)
        if new_shape == shape:
            return pe, "native grid"
        if pe.scaling == "none":
            return pe, "RoPE extrapolated (integer positions)"
        return pe, f"RoPE scaling={pe.scaling}, ref_shape={_grid_text(pe.ref_shape)}"
    if scaling not in (None, "none"):
        raise ValueError(f"scaling={scaling!r} applies to rotary encodings only, not to {name_of(pe)}")
    if new_shape == shape:
        return pe, "native grid"
    if isinstance(pe, RelativePositionBias):
        if pe.grow == "error" and any(n > w for n, w in zip(new_shape, pe.window_size)):
            pe = copy.deepcopy(pe).resize(new_shape)
            return pe, f"table resized to window {_grid_text(new_shape)} ({pe.interpolation})"
        return pe, f"table resampled ({pe.interpolation})"
    if isinstance(pe, Learned):
        return pe, f"table resampled ({pe.interpolation}{', antialias' if pe.antialias else ''})"
    if isinstance(pe, SinCos):
        return pe, "recomputed" if pe.ref_shape is None else "coordinates stretched to ref_shape"
    if isinstance(pe, PEG):
        return pe, "convolution on the new grid"
    if isinstance(pe, ContinuousPositionBias):
        return pe, "MLP evaluated on the new offsets"
    if isinstance(pe, ALiBi):
        return pe, "distances on the new grid (no adaptation)"
    return pe, "evaluated on the new grid"


def larger_shape(shape, factor: float = 2.0) -> tuple[int, ...]:
    """Default grid of the resolution view: the spatial (last two) axes times ``factor``, time kept."""
    shape = tuple(shape)
    keep = 1 if len(shape) == 3 else 0
    return shape[:keep] + tuple(max(1, round(s * factor)) for s in shape[keep:])


@torch.no_grad()
def resolution_similarity(pe: nn.Module, shape, new_shape, head: int | None = None,
                          scaling: str | None = None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Similarity on the native grid ``(N, N)`` and on ``new_shape`` after adaptation ``(N', N')``, and the
    adaptation's label (see :func:`adapt`)."""
    adapted, label = adapt(pe, shape, new_shape, scaling)
    return similarity(pe, shape, head), similarity(adapted, new_shape, head), label


# ---------------------------------------------------------------------------------------------------
# loading a trained model (a train_vit.py run directory or a checkpoint inside one)
# ---------------------------------------------------------------------------------------------------
def read_config(run_dir) -> dict:
    """``run_dir/config.yaml`` as a dict, checked for the keys needed to rebuild the model."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: --run/--checkpoint must point into a train_vit.py run directory")
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    missing = [k for k in ("model", "pe", "img_size", "patch_size", "num_classes") if not isinstance(cfg, dict)
               or k not in cfg]
    if missing:
        raise ValueError(f"{path} lacks the key(s) {', '.join(missing)}")
    return cfg


def _tubelet(cfg: dict) -> tuple[int, int, int]:
    """A video run's tubelet: ``tubelet_size`` if given, else ``(2, patch, patch)``."""
    if cfg.get("tubelet_size"):
        return to_shape("tubelet_size", cfg["tubelet_size"], 3)
    patch = cfg["patch_size"]
    return (2, *((patch, patch) if isinstance(patch, int) else tuple(patch)))


def run_grid(cfg: dict) -> tuple[int, ...]:
    """Patch grid of a trained model: ``img_size // patch_size`` per axis (either may be an int or a list);
    a video run (``num_frames`` set) adds ``num_frames // tubelet_size[0]`` in front."""
    img = cfg["img_size"]
    img = (img, img) if isinstance(img, int) else tuple(img)
    patch = cfg["patch_size"]
    patch = (patch,) * len(img) if isinstance(patch, int) else tuple(patch)
    if cfg.get("num_frames"):
        tubelet = _tubelet(cfg)
        img, patch = (int(cfg["num_frames"]), *img), tubelet
    if len(patch) != len(img):
        raise ValueError(f"img_size={cfg['img_size']!r} and patch_size={cfg['patch_size']!r} differ in axes")
    return tuple(int(i) // int(p) for i, p in zip(img, patch))


def load_model(path, which: str = "best") -> tuple[nn.Module, dict]:
    """Rebuild a trained model from a run directory (``which`` = ``"best"`` or ``"last"`` checkpoint) or from a
    ``.safetensors`` file inside one; returns ``(model in eval mode, config)``."""
    import visionpe
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (neither a run directory nor a checkpoint file)")
    if path.is_dir():
        run_dir, checkpoint = path, path / f"{which}.safetensors"
    else:
        run_dir, checkpoint = path.parent, path
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    cfg = read_config(run_dir)
    # train_vit.py's model_kwargs already hold img_size, patch_size, num_classes and in_chans; they win
    kwargs = {"img_size": cfg["img_size"], "num_classes": cfg["num_classes"], **(cfg.get("model_kwargs") or {})}
    if cfg.get("pe_kwargs") and "pe_kwargs" not in kwargs:
        kwargs["pe_kwargs"] = cfg["pe_kwargs"]
    if cfg.get("num_frames"):  # a video run: tubelets over (T, H, W)
        from .video import create_video_model

        kwargs.pop("patch_size", None)
        model = create_video_model(cfg["model"], pe=cfg["pe"], num_frames=cfg["num_frames"],
                                   tubelet_size=_tubelet(cfg), **kwargs)
    else:
        model = visionpe.create_model(cfg["model"], pe=cfg["pe"], **{"patch_size": cfg["patch_size"], **kwargs})
    try:
        state = load_file(str(checkpoint))
    except Exception as err:  # safetensors raises its own error type for a damaged file
        raise ValueError(f"cannot read {checkpoint}: {' '.join(str(err).split())}") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{checkpoint} does not fit the model rebuilt from config.yaml: "
                         f"{' '.join(str(err).split())[:300]}") from None
    return model.eval(), cfg


def pick_encoding(model: nn.Module, name: str, layer: int = 0) -> nn.Module:
    """The ``name`` encoding of a model (from ``visionpe.encodings_of``); per-block encodings by ``layer``."""
    import visionpe

    if name not in available():
        raise ValueError(f"unknown encoding {name!r}; available: {', '.join(available())}")
    found = visionpe.encodings_of(model)
    modules = [m for m in found.get(available()[name], []) if m is not None and isinstance(m, ENCODINGS[name])]
    if not modules:
        present = sorted({name_of(m) for ms in found.values() for m in ms if m is not None})
        raise ValueError(f"the model has no {name} encoding; it has: {', '.join(present) or 'none'}")
    if len(modules) == 1:
        return modules[0]
    if not 0 <= layer < len(modules):
        raise ValueError(f"layer={layer} is out of range: the model has {len(modules)} {name} modules, "
                         f"0..{len(modules) - 1}")
    return modules[layer]


# ---------------------------------------------------------------------------------------------------
# drawing (matplotlib): each function takes numbers from above and returns a Figure
# ---------------------------------------------------------------------------------------------------
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


def draw_frequencies(freqs: torch.Tensor, reference: torch.Tensor, title: str = "", max_cols: int = 6):
    """Frequency vectors per head as arrows from the origin (coloured by band), the axial ones as grey
    crosses; one panel per (head, plane of two components): 2D ``(fx, fy)``, 3D also ``(fx, ft)``, ``(fy, ft)``.

    ``freqs: (heads, pairs, ndim)``, ``reference: (pairs, ndim)``, components in xy order.
    """
    heads, pairs, ndim = freqs.shape
    if ndim == 1:
        freqs, reference = F.pad(freqs, (0, 1)), F.pad(reference, (0, 1))
    planes = list(itertools.combinations(range(max(ndim, 2)), 2))
    panels = [(plane, h) for plane in planes for h in range(heads)]
    ncols = min(len(panels), max_cols)
    nrows = math.ceil(len(panels) / ncols)
    fig = _figure(2.4 * ncols + 0.6, 2.4 * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False).flatten()
    bound = 1.08 * float(max(freqs.abs().max(), reference.abs().max()))
    band = torch.arange(pairs) % max(pairs // max(ndim, 1), 1)
    for ax, ((a, b), h) in zip(axes, panels):
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
    axes[0].legend(fontsize=6, loc="upper right")
    fig.suptitle(f"{title} (arrows: frequency vectors coloured by band; x: axial)".strip(), fontsize=9)
    return fig


def save(fig, path, dpi: int = 90) -> Path:
    """Write ``fig`` as a PNG (parent folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


# ---------------------------------------------------------------------------------------------------
# one call per view: numbers + drawing
# ---------------------------------------------------------------------------------------------------
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
