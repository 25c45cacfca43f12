"""The numbers behind every figure: similarity maps, mosaics, frequencies, adaptations (no matplotlib).

Each function asks the encoding itself (:class:`visionpe.Encoding` methods ``position_vectors``, ``pair_map``,
``adapt``, ``similarity_label``, ``similarity_note``), so a user's registered encoding is drawn like a built-in one.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .._checks import check_choice, to_shape
from ..grid import Grid, as_grid
from ..registry import ENCODINGS, available
from ..rotary import rope_kernel
from ..rotary import block_columns
from ..rotary.rope import axial_frequencies

KINDS = ("similarity", "heatmap", "freqs", "resolution", "video")

__all__ = ["KINDS", "rope_kernel", "family_of", "name_of", "num_heads_of", "patch_grid", "position_vectors",
           "cosine_similarity", "pair_maps", "select_head", "similarity", "quantity_of", "note_of", "arrange",
           "grid_image", "similarity_mosaic", "query_map", "as_frames", "centre", "encoding_channels",
           "rope_frequencies", "axial_reference", "adapt", "larger_shape", "resolution_similarity",
           "pick_encoding", "kinds_for", "native_grid"]


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


def patch_grid(grid) -> Grid:
    """The grid without prefix tokens (maps only cover patches)."""
    return as_grid(grid).without_prefix()


def position_vectors(pe: nn.Module, grid) -> torch.Tensor:
    """Position vectors of a tokens-family encoding, ``(N, dim)`` float32 (:meth:`TokenEncoding.position_vectors`:
    a table, or for PEG and other table-free encodings ``pe(1, grid) - 1``, the output for a constant input)."""
    if family_of(pe) != "tokens":
        raise ValueError(f"{name_of(pe)} is a {family_of(pe)} encoding and has no position vectors; "
                         "position vectors exist for the tokens family only")
    return pe.position_vectors(patch_grid(grid))


def cosine_similarity(vectors: torch.Tensor) -> torch.Tensor:
    """``(N, D) -> (N, N)``: cosine similarity of every pair of rows."""
    unit = F.normalize(vectors.float(), dim=-1)
    return unit @ unit.T





def pair_maps(pe: nn.Module, grid) -> torch.Tensor:
    """Per-head pairwise maps of a rotary or bias encoding, ``(heads or 1, N, N)`` float32 (its ``pair_map``:
    the kernel ``tr(R_i^T R_j) / d`` of its rotations (for 2x2 pairs the RoPE kernel :func:`rope_kernel`), or the bias
    without prefix rows and columns)."""
    if family_of(pe) == "tokens":
        raise ValueError(f"{name_of(pe)} is a tokens encoding: it has no per-head pairwise map")
    return pe.pair_map(patch_grid(grid))


def select_head(maps: torch.Tensor, head: int | None, num_heads: int, masked: bool = False) -> torch.Tensor:
    """``(heads or 1, ...) -> (...)``: the mean over heads (``head=None``) or one head.

    A map shared by all heads (leading size 1, as axial RoPE) serves every ``head < num_heads``. ``masked``: the
    maps are NaN where a head masks the pair (a directional bias such as LookHere, whose heads look different ways),
    so the mean is over the heads that see it (NaN only where none does), not NaN wherever one head masks it.
    """
    if head is None:
        return maps.nanmean(0) if masked else maps.mean(0)
    if not 0 <= head < num_heads:
        raise ValueError(f"head={head} is out of range: the encoding has {num_heads} head(s), 0..{num_heads - 1}")
    return maps[head if maps.shape[0] > 1 else 0]


@torch.no_grad()
def similarity(pe: nn.Module, grid, head: int | None = None) -> torch.Tensor:
    """Similarity of every patch position to every other, ``(N, N)`` float32, rows = queries.

    Tokens: cosine similarity of :func:`position_vectors` (``head`` is ignored); rotary: the rotation kernel;
    bias: the bias; the last two for ``head`` or averaged over heads (``head=None``). See the module doc.
    """
    if family_of(pe) == "tokens":
        return cosine_similarity(position_vectors(pe, grid))
    return select_head(pair_maps(pe, grid), head, num_heads_of(pe), getattr(pe, "masks_pairs", False))


def quantity_of(pe: nn.Module, head: int | None = None) -> str:
    """A short label for what :func:`similarity` shows for this encoding (colour-bar label)."""
    family_of(pe)
    return pe.similarity_label(head)


def note_of(pe: nn.Module) -> str:
    """One phrase on how the map is defined for this encoding (for figure titles)."""
    family_of(pe)
    return pe.similarity_note()


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

    Tokens: the position vectors (``C = dim``). Rotary: the first column of every rotation block of ``head``
    (default 0), entry ``r`` of all blocks together (:func:`~visionpe.rotary.block_columns`), ``C = head_dim``:
    for 2x2 pairs ``[cos angle_p | sin angle_p]``, for ``b x b`` blocks (ComRoPE, LieRE) where each block sends its
    first basis vector. Bias encodings have no channels (``ValueError``).
    """
    family = family_of(pe)
    if family == "tokens":
        return position_vectors(pe, grid), "channel"
    if family == "rotary":
        blocks = pe.rotation_blocks(patch_grid(grid)).cpu()
        channels = select_head(block_columns(blocks), 0 if head is None else head, num_heads_of(pe)).float()
        size = blocks.shape[-1]
        if size == 2:
            return channels, "rotation pair (cos | sin)"
        return channels, f"first column of each {size}x{size} rotation block (row 0 of all blocks | row 1 | ...)"
    raise ValueError(f"{name_of(pe)} is a bias encoding: it has no channels to draw as a heatmap; "
                     "use kind 'similarity' for its bias rows")


def native_grid(pe: nn.Module, model_grid) -> tuple[int, ...]:
    """The grid an encoding of a trained model was built for: its window (a Swin window bias or window RoPE:
    ``window_size``), its table's grid (``grid_shape``) or its scaling reference (``ref_shape``), else the model's
    patch grid ``model_grid`` (encodings defined on any grid, such as ALiBi)."""
    for name in ("window_size", "grid_shape", "ref_shape"):
        shape = getattr(pe, name, None)
        if shape is not None:
            return tuple(int(s) for s in shape)
    return tuple(model_grid)


def kinds_for(pe: nn.Module) -> tuple[str, ...]:
    """The kinds of figure (:data:`KINDS`) that apply to ``pe``: ``similarity`` and ``resolution`` for every encoding,
    ``heatmap`` where it has channels (tokens: position vectors; rotary: rotation pairs), ``freqs`` where its
    rotations turn planes at fixed frequencies (:meth:`~visionpe.rotary.RotaryEncoding.frequency_vectors` exists:
    RoPE's ``freqs``, STRING's, ComRoPE's eigenfrequencies; not LieRE), ``video`` where it takes a 3D grid
    (``pe.ndims``)."""
    family = family_of(pe)
    kinds = ["similarity"]
    if family in ("tokens", "rotary"):
        kinds.append("heatmap")
    if family == "rotary" and has_frequency_vectors(pe):
        kinds.append("freqs")
    kinds.append("resolution")
    if 3 in getattr(pe, "ndims", (1, 2, 3)):
        kinds.append("video")
    return tuple(kinds)


def has_frequency_vectors(pe: nn.Module) -> bool:
    """Whether the rotary ``pe`` has frequency vectors (its ``frequency_vectors()`` raises no ``ValueError``)."""
    try:
        pe.frequency_vectors()
    except ValueError:
        return False
    return True


def _check_rotary(pe: nn.Module) -> None:
    if family_of(pe) != "rotary":
        raise ValueError(f"{name_of(pe)} is a {family_of(pe)} encoding: frequencies exist for rotary encodings "
                         "whose rotations turn planes at fixed frequencies (rope_axial, rope_mixed, string, comrope)")


def rope_frequencies(pe: nn.Module) -> torch.Tensor:
    """Frequency vectors ``(heads or 1, planes, ndim)``, components in xy order (``[..., 0]`` = fx), from the
    encoding's :meth:`~visionpe.rotary.RotaryEncoding.frequency_vectors` (a ``ValueError`` for rotations without
    them, such as LieRE's non-commuting ones)."""
    _check_rotary(pe)
    return rearrange(pe.frequency_vectors().float().cpu(), "a h p -> h p a")


def axial_reference(pe: nn.Module) -> torch.Tensor | None:
    """The axis-aligned frequencies ``(head_dim / 2, ndim)`` (xy order) an axial RoPE would use with the same
    ``head_dim`` and ``theta``: for ``rope_mixed`` (and STRING, initialised as it) the magnitudes its initialisation
    draws directions for; None for an encoding without a ``theta`` spectrum (ComRoPE)."""
    _check_rotary(pe)
    if getattr(pe, "theta", None) is None:
        return None
    sections = getattr(pe, "sections", None) or (pe.head_dim // (2 * pe.ndim),) * pe.ndim
    order = pe.components(sections) if hasattr(pe, "components") else tuple(sections)[::-1]
    return rearrange(axial_frequencies(order, pe.theta, **getattr(pe, "bands", {})), "a 1 p -> p a")


def adapt(pe: nn.Module, shape, new_shape, scaling: str | None = None) -> tuple[nn.Module, str]:
    """The encoding as it runs on ``new_shape`` after its own adaptation from ``shape`` (its native grid), and a
    label naming that adaptation (:meth:`Encoding.adapt`); ``pe`` itself is never modified.

    - ``learned``: the table is resampled; ``sincos``: recomputed (or stretched to ``ref_shape`` if set);
      ``peg``: the convolution runs on the new grid.
    - rotary: ``scaling=None`` keeps the module's own ``scaling``/``ref_shape``; ``"none"``, ``"pi"``,
      ``"ntk"``, ``"yarn"`` choose one, with ``ref_shape`` = the module's or else ``shape``.
    - ``swin_bias`` (fixed window): the table is resized to the new window; ``rel_bias``: resampled on the
      fly; ``cpb``: the MLP is evaluated on the new offsets; ``alibi``: defined for any grid.
    """
    family_of(pe)
    return pe.adapt(tuple(shape), tuple(new_shape), scaling)


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
    if available()[name] == "tokens":  # one module before the blocks: there is no layer to choose
        return modules[0]
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(modules):
        raise ValueError(f"layer={layer!r} is out of range: the model has {len(modules)} block(s) with a {name} "
                         f"encoding, layers 0..{len(modules) - 1}")
    return modules[layer]
