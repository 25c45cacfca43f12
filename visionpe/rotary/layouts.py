"""Frequency layouts of RoPE: the direction each rotation pair turns along, and which pairs or heads rotate at all.

A layout maps band magnitudes (:func:`band_frequencies`) to frequency vectors ``freqs: (ndim, heads or 1,
pairs)`` (components in coordinate order: ``x`` first for ``axis_order="xy"``). Three options, one vocabulary, on
``rope_axial`` (fixed) and ``rope_mixed`` (the initialisation of learned vectors):

- ``directions``: ``"axial"`` (pairs of axis ``a``'s section turn along ``a``: RoPE-ViT's axial layout),
  ``"random"`` (``rope_mixed``'s default: RoPE-ViT's ``init_random_2d_freqs``, one random rotation per head) or
  ``"golden"`` (2D: the pair of rank ``r`` in head ``h`` (``r = 0`` the highest frequency, ties in pair order)
  turns along the angle ``(h P + r) * gamma`` from the x axis towards y, ``gamma = pi (3 - sqrt 5)`` the golden
  angle, ``P`` pairs per head). The golden-angle sequence (Vogel's sunflower spiral) spreads any number of
  consecutive directions almost uniformly over the circle, with no repeated or clustered directions across bands
  and heads; this is the 2D case of the low-discrepancy direction sets of "Golden Gate RoPE" (J. Xiong, "On
  N-dimensional rotary positional embeddings", 2025), who reports that uniformly spread directions remove the
  cross-shaped artefacts of axial RoPE. Magnitudes are the layout's own (``spectrum="mrope"`` gives one log-spaced
  spectrum over all pairs, as Golden Gate RoPE has).
- ``rotate_fraction=p`` (p-RoPE, Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary Positional
  Encodings useful?"): in each band of ``n`` pairs sharing one spectrum (an axis's section, or the one spectrum of
  ``spectrum="mrope"``), only the ``floor(p n)`` highest frequencies rotate; the lowest ``n - floor(p n)`` get
  frequency 0 and pass q and k through unchanged (their paper's ``rope_angles = int(p * head_dim // 2)`` in 1D,
  the rest ``timescale = inf``). ``p=1`` is RoPE, ``p=0`` no rotation (NoPE).
- ``head_axes`` (per-head axis assignment; lucidrains/rotary-embedding-torch issue #41): one string per head naming
  the grid axes it rotates with (``"x"``, ``"y"``, ``"t"``; ``"yx"`` both; ``""`` an unrotated head). A head's
  ``head_dim / 2`` pairs are split evenly over its axes (the remainder to the later grid axes; a head with every
  axis uses ``sections`` when given), each axis with its own spectrum ``1 / theta^(i / n)``: an x-only head gets
  twice the x bands of an axial head.
"""
from __future__ import annotations

import math

import torch

from .._checks import check_number


def band_frequencies(num_bands: int, theta: float, dtype=torch.float32, per_turn: bool = False,
                     periods=None, pixel=None) -> torch.Tensor:
    """``w_i = 1 / theta ** (i / num_bands)``, ``i < num_bands``: rope-vit's ``1/theta^(4i/d)`` in 2D.

    DINOv3's parametrisation (timm ``RotaryEmbeddingDinoV3``) gives *periods* instead, ``w_i = 2 pi / period_i``:
    ``per_turn=True`` reads ``theta ** (i / num_bands)`` as the periods (DINOv3's ``temperature``), and
    ``periods=(min_period, max_period)`` spaces them geometrically, ``min_period (max/min) ** (i / (n - 1))``.
    ``pixel=(max_res, linear_bands)`` gives timm's pixel-frequency bands (``pixel_freq_bands``), lowest first:
    ``w_i = pi * linspace(1, max_res / 2, n)_i`` (linear) or ``pi * 2 ** linspace(0, log2(max_res) - 1, n)_i``,
    computed in float32 as timm stores them (up to ``pi * max_res / 2`` radians per unit, so that a float64 table
    rotates by timm's own frequencies), then cast to ``dtype``.
    """
    if pixel is not None:
        max_res, linear = pixel
        if linear:
            bands = torch.linspace(1.0, max_res / 2, num_bands, dtype=torch.float32)
        else:
            bands = 2 ** torch.linspace(0.0, math.log(max_res, 2) - 1, num_bands, dtype=torch.float32)
        return (bands * math.pi).to(dtype)
    if periods is not None:
        low, high = periods
        exponents = torch.linspace(0, 1, num_bands, dtype=dtype)
        return 2 * math.pi / (low * (high / low) ** exponents)
    freqs = theta ** -(torch.arange(num_bands, dtype=dtype) / num_bands)
    return 2 * math.pi * freqs if per_turn else freqs

GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))
DIRECTIONS = ("axial", "random", "golden")
AXIS_LETTERS = {1: "x", 2: "yx", 3: "tyx"}  # grid order: the last axis is x


def golden_directions(magnitudes: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Frequency vectors ``(2, num_heads, pairs)`` (x, y components) with the given per-pair ``magnitudes:
    (pairs,)`` and golden-angle directions: the pair of rank ``r`` by decreasing magnitude (stable) in head ``h``
    turns along ``(h * pairs + r) * GOLDEN_ANGLE``."""
    pairs = magnitudes.shape[0]
    rank = torch.empty(pairs, dtype=torch.long)
    rank[torch.sort(-magnitudes, stable=True).indices] = torch.arange(pairs)
    k = torch.arange(num_heads, dtype=magnitudes.dtype)[:, None] * pairs + rank.to(magnitudes.dtype)
    angle = k * GOLDEN_ANGLE
    return torch.stack([angle.cos(), angle.sin()]) * magnitudes


def spiral_directions(magnitudes: torch.Tensor, num_directions: int) -> torch.Tensor:
    """Spiral RoPE's frequency vectors ``(2, 1, 2 n)``, components in grid order ``(y, x)``, from the ``n`` magnitudes
    of each half of the head (``magnitudes: (n,)``, highest first).

    Pair ``p`` of the head turns by ``a_p = ((p // 2) mod (K / 2)) * pi / K`` (``K = num_directions``, even): the first
    ``n`` pairs along the y axis turned by ``a_p`` towards x, ``(y, x) = (cos a_p, sin a_p)``, the last ``n`` along the
    x axis turned by ``a_p`` towards -y, ``(-sin a_p, cos a_p)``. Successive pairs of pairs cycle through the ``K / 2``
    turns of the two axes: ``K`` directions spaced ``pi / K`` apart in all, as the official
    ``VisionRotaryEmbedding(rotate=K / 2)`` turns its chunks of 4 channels (2 pairs).
    """
    n = magnitudes.shape[0]
    pair = torch.arange(2 * n, dtype=magnitudes.dtype)
    angle = torch.div(pair, 2, rounding_mode="floor").remainder(num_directions // 2) * (math.pi / num_directions)
    first = pair < n  # the y half: y turned towards x; the x half: x turned towards -y
    y = torch.where(first, angle.cos(), -angle.sin())
    x = torch.where(first, angle.sin(), angle.cos())
    return torch.stack([y, x])[:, None] * magnitudes.repeat(2)


def check_rotate_fraction(rotate_fraction) -> float:
    return check_number("rotate_fraction", rotate_fraction, minimum=0.0, maximum=1.0)


def rotated_count(num_bands: int, fraction: float) -> int:
    """How many of a band's highest frequencies rotate: ``floor(fraction * num_bands)`` (a hair of slack so that
    e.g. ``0.3 * 10`` counts 3)."""
    return min(num_bands, math.floor(fraction * num_bands + 1e-9))


def rotated_pairs(band_sizes, fraction: float) -> torch.Tensor:
    """``(sum(band_sizes),)`` bool, True for the pairs that rotate: the first :func:`rotated_count` of each band
    (bands list their pairs from the highest frequency down)."""
    return torch.cat([torch.arange(n) < rotated_count(n, fraction) for n in band_sizes])


def parse_head_axes(head_axes, ndim: int, num_heads: int) -> tuple[tuple[int, ...], ...] | None:
    """``head_axes`` (one string of axis letters per head) -> the grid axes of each head (sorted); None stays
    None."""
    if head_axes is None:
        return None
    letters = AXIS_LETTERS[ndim]
    example = ", ".join(repr(s) for s in (letters[-1], letters[0], letters, ""))
    if isinstance(head_axes, str) or not isinstance(head_axes, (list, tuple)) or len(head_axes) != num_heads:
        raise ValueError(f"head_axes={head_axes!r} must be a sequence of num_heads={num_heads} strings of axis letters "
                         f"from {letters!r} (in {ndim}D), e.g. ({example}); '' leaves a head unrotated")
    parsed = []
    for spec in head_axes:
        if not isinstance(spec, str) or len(set(spec)) != len(spec) or any(c not in letters for c in spec):
            raise ValueError(f"head_axes entry {spec!r} must be a string of distinct axis letters from {letters!r} "
                             f"(in {ndim}D; '' for an unrotated head)")
        parsed.append(tuple(sorted(letters.index(c) for c in spec)))
    return tuple(parsed)


def split_pairs(num_pairs: int, count: int) -> tuple[int, ...]:
    """``num_pairs`` split over ``count`` axes (grid order): equal shares, the remainder to the later axes."""
    base, rest = divmod(num_pairs, count)
    return tuple(base + (i >= count - rest) for i in range(count))


def head_axes_layout(head_axes, num_pairs: int, ndim: int, axis_order: str, theta: float, fraction: float,
                     sections=None, dtype=torch.float32, rotations=None, bands=None):
    """Frequencies of a per-head axis assignment.

    Args:
        head_axes: per head, its grid axes (:func:`parse_head_axes`).
        sections: pairs per axis (grid order) for heads that rotate with every axis, or None for an even split.
        rotations: optional callable ``k -> (k, k)`` rotation drawn for a head with ``k`` axes (``rope_mixed``'s
            random directions inside the head's axes); None keeps each band on its axis.
        bands: :func:`band_frequencies` keywords (``per_turn``, ``periods``).
    Returns:
        ``freqs (ndim, heads, pairs)``, NTK's band fractions ``(heads, pairs)``, and ``free (ndim, heads, pairs)``:
        1 where a learned frequency may move (its head's axes, rotating pairs), 0 where it stays 0.
    """

    heads = len(head_axes)
    freqs = torch.zeros(ndim, heads, num_pairs, dtype=dtype)
    band_fraction = torch.zeros(heads, num_pairs, dtype=torch.float32)
    free = torch.zeros(ndim, heads, num_pairs, dtype=dtype)
    for h, axes in enumerate(head_axes):
        if not axes:
            continue
        sizes = tuple(sections) if sections is not None and len(axes) == ndim else split_pairs(num_pairs, len(axes))
        components = sorted(ndim - 1 - a if axis_order == "xy" else a for a in axes)
        size_of = dict(zip(axes, sizes))
        rotation = rotations(len(axes)).to(dtype) if rotations is not None else torch.eye(len(axes), dtype=dtype)
        start = 0
        for group, component in enumerate(components):
            axis = ndim - 1 - component if axis_order == "xy" else component
            n = size_of[axis]
            keep = rotated_pairs([n], fraction).to(dtype)
            magnitudes = band_frequencies(n, theta, dtype, **(bands or {})) * keep
            freqs[components, h, start:start + n] = rotation[:, group, None] * magnitudes
            free[components, h, start:start + n] = keep
            band_fraction[h, start:start + n] = torch.arange(n, dtype=torch.float32) / max(n - 1, 1)
            start += n
    return freqs, band_fraction, free
