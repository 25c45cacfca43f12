"""MHRoPE (Huang et al., ICLR 2026, "Revisiting Multimodal Positional Encoding in Vision-Language Models", arXiv
2510.23095; official code ``JJJYmmm/Multimodal-RoPEs``, ``multimodal_ropes/freq_allocation/mhrope.py``): Multi-Head
RoPE, where whole attention heads, not blocks of a head's pairs, are dealt to the position axes.

M-RoPE splits the ``P = head_dim / 2`` pairs of every head among t, h and w, so each axis turns on a part of the
spectrum only. MHRoPE keeps each head's full spectrum ``theta^(-p/P)`` and gives the head one axis: with
``head_sections = (n_t, n_h, n_w)`` the first ``n_t`` (KV) heads rotate by time alone, the next ``n_h`` by the row,
the next ``n_w`` by the column, and heads left over get no rotation (the official code pads them with zero angles:
NoPE). The official default is ``(2, 3, 3)`` over 8 KV heads. Within a head the score depends on the offset along
its one axis only.

That is visionpe's per-head axis assignment (``rope_axial(head_axes=...)``, :mod:`visionpe.rotary.layouts`) with a
fixed assignment: a head with one axis gets all ``P`` pairs on that axis's spectrum ``theta^(-i/P)``, the paper's
full spectrum. :class:`MHRoPE` builds that assignment from ``head_sections`` (heads per grid axis, in grid order: the
paper's ``(t, h, w)`` on a video grid, ``(h, w)`` on an image, whose time is one constant in the VLM and rotates
nothing). Default: the heads split evenly over the grid's axes, the remainder to the later axes, which is the
paper's ``(2, 3, 3)`` at 8 heads in 3D. Grouped-query attention (q heads sharing a KV head's rotation) is the
model's business: an encoder's heads here are its KV heads.
"""
from __future__ import annotations

from .._checks import check_ndim, check_positive_int
from ..coords import CoordinateSystem
from .conventions import (AXIAL_CONVENTIONS, PER_HEAD_LAYOUTS, ChannelLayout, FrequencyBands, ResolutionScaling,
                          check_records)
from .layouts import AXIS_LETTERS, split_pairs
from .rope import AxialRoPE


def check_head_sections(head_sections, num_heads: int, ndim: int) -> tuple[int, ...]:
    """``head_sections`` as a tuple of ``ndim`` integers ``>= 0`` summing to at most ``num_heads``; None: an even
    split of the heads over the axes, the remainder to the later axes."""
    if head_sections is None:
        return split_pairs(num_heads, ndim)
    if isinstance(head_sections, list):
        head_sections = tuple(head_sections)
    if not (isinstance(head_sections, tuple) and len(head_sections) == ndim and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in head_sections)):
        raise ValueError(f"head_sections={head_sections!r} must be {ndim} integers >= 0, the heads of each grid axis "
                         f"in grid order ({', '.join(AXIS_LETTERS[ndim])}), e.g. {split_pairs(num_heads, ndim)}")
    if sum(head_sections) > num_heads:
        raise ValueError(f"head_sections={tuple(head_sections)} deal {sum(head_sections)} heads to the axes but the "
                         f"attention has num_heads={num_heads}: they may sum to at most num_heads (the heads left "
                         "over are not rotated)")
    return head_sections


def mhrope_head_axes(head_sections, num_heads: int, ndim: int) -> tuple[str, ...]:
    """MHRoPE's assignment as ``head_axes``: ``head_sections[a]`` consecutive heads on grid axis ``a`` (grid order),
    the heads left over unrotated (``""``), e.g. ``(2, 3, 3)`` of 8 heads in 3D -> ``("t", "t", "y", "y", "y", "x",
    "x", "x")``."""
    letters = AXIS_LETTERS[ndim]
    axes = tuple(letters[a] for a, n in enumerate(head_sections) for _ in range(n))
    return axes + ("",) * (num_heads - len(axes))


class MHRoPE(AxialRoPE):
    """Multi-Head RoPE: ``pe(q, k, grid) -> (q, k)``; head ``h`` rotates all its pairs with one grid axis (see the
    module docstring).

    ``head_sections``: heads per grid axis in grid order (``(t, h, w)`` or ``(h, w)``), each an integer ``>= 0``
    summing to at most ``num_heads`` (default: an even split, the remainder to the later axes); ``theta``: the base
    of each head's spectrum ``theta^(-p/P)`` (default 100, the package's index-coordinate base; Qwen's LLMs use 1e6 to
    5e6); ``pairs``: ``"interleaved"`` (default) or ``"half"`` (the official ``rotate_half``). Coordinates, their
    augmentation, ``rotate_fraction``, DINOv3's periods and resolution ``scaling`` are axial RoPE's.
    """

    refused = AXIAL_CONVENTIONS + PER_HEAD_LAYOUTS + ("sections",)  # the assignment is head_sections'

    def __init__(self, *, head_dim: int, num_heads: int = 1, ndim: int = 2, head_sections=None, theta: float = 100.0,
                 ref_shape=None, grid_offset: float = 0.0, bands: FrequencyBands = FrequencyBands(),
                 channels: ChannelLayout = ChannelLayout(), coordinates: CoordinateSystem = CoordinateSystem(),
                 resolution: ResolutionScaling = ResolutionScaling()):
        check_records("MHRoPE", MHRoPE.refused, bands=bands, channels=channels, coordinates=coordinates,
                      resolution=resolution)
        check_ndim(ndim)
        check_positive_int("num_heads", num_heads)
        self.head_sections = check_head_sections(head_sections, num_heads, ndim)
        head_axes = mhrope_head_axes(self.head_sections, num_heads, ndim)
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, theta=theta, ref_shape=ref_shape,
                         grid_offset=grid_offset, bands=bands, channels=ChannelLayout(
                             pairs=channels.pairs, axis_order=channels.axis_order, head_axes=head_axes),
                         coordinates=coordinates, resolution=resolution)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", head_sections={self.head_sections}"
