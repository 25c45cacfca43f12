"""Spiral RoPE ("Spiral RoPE: Rotate Your Rotary Positional Embeddings in the 2D Plane", arXiv 2602.03227, 2026;
official code ``huajianduzhuo-code/Spiral_RoPE``, ``RoPE_DeiT/rope.py``): axial RoPE whose channel groups are turned
to ``K`` evenly spaced directions of the image plane.

Axial 2D RoPE rotates half of the pairs with y and half with x, so a head measures offsets along two directions only.
Spiral RoPE turns groups of pairs to ``K`` directions spaced ``pi / K`` apart (``K = num_directions``, even): pair
``p`` of the head, ``n = head_dim / 4`` pairs per half, turns by

    angle_p(c) = |f_p| <c, u_p>,   |f_p| = max_freq * theta^(-(p mod n) / n),

``u_p`` the y axis (first half) or the x axis (second half) turned by ``((p // 2) mod (K / 2)) * pi / K``
(:func:`~visionpe.rotary.layouts.spiral_directions`): the frequency directions of a layout of RoPE, like RoPE-Mixed's
learned ones but fixed. ``K = 2`` is axial RoPE (on the official geometric spectrum).

The official code, read (commit ``bde84ff``), builds the angle image of the y and x halves and turns chunks of 4
channels with ``F.grid_sample`` (``padding_mode="border"``); here the angles are the linear function above. The two
agree wherever a patch's turned coordinate stays inside the grid; beyond (the corners of a grid for turned
directions) the official border padding holds the angle at its value on the border, a clamp this module does not
reproduce (tests/encodings/test_encodings_2026.py shows both). Its defaults (``run_all.sh``): ``K = 4`` (``ROTATE=2``),
``theta = 10000``, ``max_freq = 1.5``, independent frequencies per direction (``SAME_THETA=False``, the only layout
here), y pairs first (``axis_order="ij"``), adjacent channel pairs, positions interpolated to the training grid
(``t = i / n * pt_seq_len``: ``scaling="pi"``, a model's default), the class token not rotated.
"""
from __future__ import annotations

import torch

from .._checks import check_number, check_positive_int
from ..coords import CoordinateSystem
from .conventions import (AXIAL_CONVENTIONS, PER_HEAD_LAYOUTS, PERIODS, ChannelLayout, FrequencyBands,
                          ResolutionScaling, check_records)
from .layouts import band_frequencies, rotated_pairs, spiral_directions
from .rope import AxialRoPE


class SpiralRoPE(AxialRoPE):
    """Spiral RoPE on a 2D grid: ``pe(q, k, grid) -> (q, k)`` as every rotary encoding.

    Args:
        head_dim: channels per head, a multiple of 4 (two halves of whole pairs).
        num_directions: ``K``, the even number of directions (official ``rotate = K / 2``), at most the head's
            ``head_dim // 2`` frequency pairs.
        theta, max_freq: the spectrum ``max_freq * theta^(-i / n)`` of each half (official ``theta``,
            ``max_freq_lang``).
        axis_order: ``"ij"`` (official: the y half first) or ``"xy"`` (the x half first).
        rotate_fraction: p-RoPE's fraction of each half's highest frequencies that rotate (official
            ``truncate_percentage = 1 - rotate_fraction``).
        The other keywords are :class:`~visionpe.rotary.rope.AxialRoPE`'s (``pairs``, ``scaling``, ``ref_shape``,
        coordinates and their augmentation).
    """

    ndims = (2,)

    refused = AXIAL_CONVENTIONS + PER_HEAD_LAYOUTS + PERIODS + ("sections",)  # two halves turned to K directions

    def __init__(self, *, head_dim: int, num_heads: int = 1, ndim: int = 2, num_directions: int = 4,
                 theta: float = 10000.0, max_freq: float = 1.5, ref_shape=None,
                 bands: FrequencyBands = FrequencyBands(), channels: ChannelLayout = ChannelLayout(axis_order="ij"),
                 coordinates: CoordinateSystem = CoordinateSystem(),
                 resolution: ResolutionScaling = ResolutionScaling()):
        if ndim != 2:
            raise ValueError(f"spiral_rope turns frequency directions in the image plane: ndim must be 2, got "
                             f"ndim={ndim!r} (for video use rope_axial, rope_mixed or videorope)")
        check_records("SpiralRoPE", SpiralRoPE.refused, bands=bands, channels=channels, coordinates=coordinates,
                      resolution=resolution)
        check_positive_int("num_directions", num_directions)
        if num_directions % 2:
            raise ValueError(f"num_directions={num_directions} must be even: the y and x halves turn together "
                             "(official rotate = num_directions / 2)")
        self.num_directions = num_directions
        self.max_freq = check_number("max_freq", max_freq, minimum=0.0, inclusive=False)
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, theta=theta, ref_shape=ref_shape,
                         bands=bands, channels=channels, coordinates=coordinates, resolution=resolution)
        if num_directions > self.head_dim // 2:
            raise ValueError(f"num_directions={num_directions} must be at most the head's {self.head_dim // 2} "
                             f"frequency pairs (head_dim={self.head_dim} // 2): each direction turns pairs of the "
                             f"head, and more directions than pairs leave most unused (the turns shrink towards axial "
                             f"RoPE)")

    def _frequencies(self, axis_order: str, dtype: torch.dtype) -> torch.Tensor:
        n = self.sections[0]
        freqs = spiral_directions(self.max_freq * band_frequencies(n, self.theta, dtype, **self.band_options),
                                  self.num_directions)  # (y, x) components, the y half first
        if axis_order == "xy":
            freqs = torch.cat([freqs[..., n:], freqs[..., :n]], dim=-1).flip(0)
        return freqs * rotated_pairs([n, n], self.rotate_fraction).to(dtype)

    def scriptable(self):
        """The TorchScript form: RoPE's (:meth:`~visionpe.rotary.rope.RoPE.scripted_rope`) with the turned
        frequencies."""
        self.check_scriptable_class(SpiralRoPE)
        return self.scripted_rope()

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_directions={self.num_directions}, max_freq={self.max_freq}"
