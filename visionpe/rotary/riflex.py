"""RIFLEx (Zhao et al., ICML 2025, "RIFLEx: A Free Lunch for Length Extrapolation in Video Diffusion Transformers";
official code ``thu-ml/RIFLEx``, ``riflex_utils.py``): 3D RoPE whose intrinsic temporal frequency is lowered on a
longer clip, so that the clip stays within one period of it.

The time axis (grid axis 0) has ``n`` bands ``w_j = theta^(-(j - 1) / n)``, ``j = 1 .. n``, of periods
``N_j = round(2 pi / w_j)`` frames (official ``identify_k``). Extrapolated to a clip longer than a band's period, that
band repeats: the paper finds one *intrinsic* band ``k`` whose period sets where a video repeats, and RIFLEx lowers it
alone on a clip of ``L`` frames longer than ``N_k``:

    w'_k = margin * 2 pi / L,   L = s * L_train  (the extrapolation factor ``s``),

``margin = 0.9`` in the official code ("to keep the extrapolated length below 90% of a single period"; the paper's
and project page's rule is ``w'_k = 2 pi / (L s)``, margin 1). Every other band, and the clip's spatial axes, are left
to the RoPE's own ``scaling`` (RIFLEx keeps time out of it: never interpolated).

Which band is intrinsic (the paper's Eq. 7, official ``identify_k(b, d, N)``): the band whose period is closest to
``N``, the first frame where an extrapolated video repeats (``repetition_frame=N``: HunyuanVideo's 48 latent frames
give ``k = 4``, ``N_k = 50``). An encoder trained here has no observed repetition; by default ``k`` is the first band
whose period exceeds the training clip (``ref_shape[0]`` frames), which is what the official README's two choices
are (HunyuanVideo: 33 latent frames, ``theta = 256``, 16 time channels -> ``k = 4``, ``N_k = 50``; CogVideoX-5B: 13
latent frames, ``theta = 10000``, 16 channels -> ``k = 2``, ``N_k = 20``). ``intrinsic_index=k`` sets it (1-based, as
the paper's ``k``). Only the training-free form is here: the fine-tuned one trains with ``w'_k`` at ``L = N_k``.
"""
from __future__ import annotations

import math

import torch

from .._checks import check_number, check_positive_int
from ..grid import Grid
from .conventions import (AXIAL_CONVENTIONS, PER_HEAD_LAYOUTS, PERIODS, ChannelLayout, FrequencyBands,
                          ResolutionScaling, check_records)
from .layouts import rotated_count
from .rope import AxialRoPE


def band_periods(num_bands: int, theta: float, rotate_fraction: float = 1.0) -> list[float]:
    """Periods ``round(2 pi / w_j)`` in frames of the ``num_bands`` time bands ``w_j = theta^(-(j - 1) / n)``, highest
    frequency first (official ``identify_k``); a band that does not rotate (p-RoPE) has an infinite period. Plain
    Python (no tensor), so a compiled forward reads it as constants."""
    rotating = rotated_count(num_bands, rotate_fraction)
    return [round(2 * math.pi * theta ** (j / num_bands)) if j < rotating else math.inf for j in range(num_bands)]


def intrinsic_band(periods, train_frames: float | None = None, repetition_frame: float | None = None) -> int:
    """The intrinsic band ``k`` (1-based): the period closest to ``repetition_frame`` (the paper's Eq. 7, the first
    of equals as the official ``identify_k``), else the first period longer than ``train_frames``."""
    if repetition_frame is not None:
        diffs = [abs(p - repetition_frame) for p in periods]
        return diffs.index(min(diffs)) + 1
    longer = [j for j, p in enumerate(periods, start=1) if p > train_frames]
    if not longer:
        raise ValueError(f"no time band has a period longer than the training clip of {train_frames:g} frames "
                         f"(periods {periods}): RIFLEx has no intrinsic band to lower; raise theta or pass "
                         "intrinsic_index")
    return longer[0]


class RIFLEx(AxialRoPE):
    """Axial 3D RoPE with RIFLEx on its time axis: ``pe(q, k, grid) -> (q, k)`` as every rotary encoding.

    Args:
        head_dim, num_heads, theta, pairs, sections, axis_order, rotate_fraction: as
            :class:`~visionpe.rotary.rope.AxialRoPE` (``theta=10000``: the official default).
        scaling, ref_shape: the training grid ``(T, H, W)`` (a model's) and the adaptation of the spatial axes to
            other sizes (``"pi"`` in a model); the time axis always extrapolates, with RIFLEx.
        intrinsic_index: the intrinsic band ``k`` (1-based), or None: by ``repetition_frame``, else the first band
            whose period exceeds ``ref_shape[0]`` frames.
        repetition_frame: ``N``, the first repeating frame observed when extrapolating (the paper's Eq. 7).
        period_margin: the fraction of one period the longer clip may span (official 0.9; the paper's rule 1).

    A clip of ``L`` frames (its time coordinates' extent from 0: ``offset + T * spacing``) longer than ``N_k`` turns
    band ``k`` at ``period_margin * 2 pi / L``; shorter clips, the training one included, are plain RoPE.
    """

    ndims = (3,)

    refused = AXIAL_CONVENTIONS + PER_HEAD_LAYOUTS + PERIODS  # index coordinates, theta's spectrum per axis

    def __init__(self, *, head_dim: int, num_heads: int = 1, ndim: int = 3, theta: float = 10000.0, ref_shape=None,
                 intrinsic_index: int | None = None, repetition_frame: float | None = None,
                 period_margin: float = 0.9, bands: FrequencyBands = FrequencyBands(),
                 channels: ChannelLayout = ChannelLayout(), resolution: ResolutionScaling = ResolutionScaling()):
        if ndim != 3:
            raise ValueError(f"riflex is defined on (T, H, W) grids (it lowers a temporal frequency): ndim must be 3, "
                             f"got ndim={ndim!r} (for images use rope_axial or rope_mixed)")
        check_records("RIFLEx", RIFLEx.refused, bands=bands, channels=channels, resolution=resolution)
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, theta=theta, ref_shape=ref_shape,
                         bands=bands, channels=channels, resolution=resolution)
        self.period_margin = check_number("period_margin", period_margin, minimum=0.0, inclusive=False, maximum=1.0)
        if repetition_frame is not None:
            check_number("repetition_frame", repetition_frame, minimum=0.0, inclusive=False)
        if intrinsic_index is not None:
            check_positive_int("intrinsic_index", intrinsic_index)
            if intrinsic_index > self.sections[0]:
                raise ValueError(f"intrinsic_index={intrinsic_index} is beyond the {self.sections[0]} time bands "
                                 f"(sections={self.sections}); allowed 1 .. {self.sections[0]}")
        elif repetition_frame is None and self.ref_shape is None:
            raise ValueError("riflex finds its intrinsic band from the training clip's length: pass "
                             "ref_shape=(T, H, W) (a model gives its grid), intrinsic_index=k or repetition_frame=N")
        self.intrinsic_index, self.repetition_frame = intrinsic_index, repetition_frame
        self.intrinsic()  # a clear error now rather than at the first forward

    def periods(self) -> list[float]:
        """The time bands' periods in frames, highest frequency first."""
        return band_periods(self.sections[0], self.theta, self.rotate_fraction)

    def intrinsic(self) -> tuple[int, float]:
        """``(k, N_k)``: the intrinsic band (1-based) and its period in frames."""
        periods = self.periods()
        k = self.intrinsic_index or intrinsic_band(periods, self.ref_shape and self.ref_shape[0],
                                                   self.repetition_frame)
        return k, periods[k - 1]

    def rescale(self, coords: torch.Tensor, freqs: torch.Tensor, grid: Grid, ref_shape):
        """The spatial axes scaled against ``ref_shape`` by ``scaling``; time kept at its frames, its intrinsic band
        lowered on a clip longer than its period."""
        ref = None if ref_shape is None else (grid.shape[0], *ref_shape[1:])
        coords, freqs, scales = super().rescale(coords, freqs, grid, ref)
        k, period = self.intrinsic()
        offset = grid.offset[0] if grid.offset is not None else 0.0
        frames = offset + grid.shape[0] * grid.steps[0]
        if frames <= period:
            return coords, freqs, scales
        time = self.components(range(self.ndim)).index(0)
        pair = sum(self.components(self.sections)[:time]) + k - 1  # band k of the time section
        lowered = torch.zeros_like(freqs)
        lowered[time, :, pair] = self.period_margin * 2 * math.pi / frames - freqs[time, :, pair]
        return coords, freqs + lowered, scales

    def adaptation_label(self) -> str:
        k, period = self.intrinsic()
        space = "extrapolated" if self.scaling == "none" else f"scaling={self.scaling}"
        return f"RIFLEx: time band {k} lowered past {period:g} frames; space {space}"

    def extra_repr(self) -> str:
        k, period = self.intrinsic()
        return super().extra_repr() + f", intrinsic band {k} (period {period:g} frames), margin={self.period_margin}"
