"""DyPE (Issachar et al., "DyPE: Dynamic Position Extrapolation for Ultra High Resolution Diffusion", arXiv
2510.20766): axial RoPE whose resolution scaling (PI, NTK-aware or YaRN, per axis against the training grid) changes
with the diffusion step.

Low frequencies of an image settle early in sampling and high ones late, so DyPE scales hard at the start (``t = 1``,
noise) and fades to the training encoding at the end (``t = 0``). The schedule (the paper's Eq. 13):

    kappa(t) = lambda_s * t^lambda_t

plugged into each method (Eqs. 14-17), with ``s_a`` the size ratio of axis ``a`` against the training grid:

- Dy-PI: positions ``m / s_a^kappa(t)``;
- Dy-NTK: band ``i`` of ``n`` scaled by ``s_a^(-kappa(t) i / (n - 1))`` (the paper's ``theta_d s^(-kappa(t) 2d /
  (D - 2))``);
- Dy-YaRN: YaRN's ramp thresholds ``alpha``, ``beta`` (turns per training length) become ``alpha kappa(t)``,
  ``beta kappa(t)`` with ``lambda_s = 1`` (Eq. 17: ``kappa(t) = t^lambda_t``); the attention factor stays YaRN's.

At ``kappa = 0`` every method is the unscaled encoding (Dy-YaRN keeps its attention factor). The paper's settings
(appendix C): ``lambda_s = lambda_t = 2``, ``alpha = 1``, ``beta = 32``. Its code is not released; the schedule and
the three substitutions above are the paper's text. The default is Dy-NTK, one of the paper's two main variants.

The step is set on the module (``timestep``, or :func:`set_timestep` on every DyPE module of a model before each
denoising step); a new step empties the table cache, and under ``torch.compile`` each step value is a guard (a
sampler with few steps compiles a graph per step). An encoder with no diffusion keeps the constructor's ``timestep``
(default 0: the unscaled encoding; with Dy-YaRN, plus its attention factor on a larger grid).
"""
from __future__ import annotations

import torch
from torch import nn

from .._checks import check_choice, check_number, check_positive_int, to_shape
from ..cache import TableCache
from ..grid import Grid
from ..coords import CoordinateSystem
from .conventions import ChannelLayout, ResolutionScaling
from .rope import RoPE, axial_frequencies, band_fractions, resolve_sections
from .scaling import axis_scales, scale_frequencies, scale_positions

METHODS = ("pi", "ntk", "yarn")


def dype_schedule(t: float, lambda_s: float = 2.0, lambda_t: float = 2.0) -> float:
    """``kappa(t) = lambda_s * t^lambda_t``, the scaling's strength at diffusion time ``t`` in ``[0, 1]`` (1: noise)."""
    return lambda_s * t ** lambda_t


class DyPE(RoPE):
    """DyPE: axial RoPE ``pe(q, k, grid) -> (q, k)`` scaled by ``scaling`` (``"pi"``, ``"ntk"`` (default),
    ``"yarn"``) against ``ref_shape`` with the step-dependent strength :func:`dype_schedule`; see the module docstring.

    ``timestep`` in ``[0, 1]``: the diffusion time of the next forward (default 0); ``lambda_s``, ``lambda_t``: the
    schedule (Dy-YaRN ignores ``lambda_s``, as the paper's Eq. 17); ``yarn_alpha``, ``yarn_beta``: YaRN's ramp
    (1, 32). Axial bands as :class:`~visionpe.rotary.rope.AxialRoPE`'s: ``theta`` (100), ``sections`` (equal per
    axis), ``pairs``, ``axis_order`` (``"xy"``: x pairs first). In a model ``ref_shape`` is the model's grid.
    """

    scalings = METHODS

    def __init__(self, head_dim: int, num_heads: int = 1, ndim: int = 2, scaling: str = "ntk", ref_shape=None,
                 timestep: float = 0.0, lambda_s: float = 2.0, lambda_t: float = 2.0, theta: float = 100.0,
                 sections=None, pairs: str = "interleaved", yarn_alpha: float = 1.0, yarn_beta: float = 32.0,
                 axis_order: str = "xy"):
        check_choice("scaling", scaling, METHODS)
        check_positive_int("num_heads", num_heads)
        if ref_shape is None:
            raise ValueError("DyPE scales against the training grid: pass ref_shape (e.g. ref_shape=(16, 16)); in a "
                             "model it is the model's grid")
        self.lambda_s = check_number("lambda_s", lambda_s, minimum=0.0)
        self.lambda_t = check_number("lambda_t", lambda_t, minimum=0.0)
        self.theta = check_number("theta", theta, minimum=1.0, inclusive=False)
        check_choice("axis_order", axis_order, ("xy", "ij"))
        self.sections = resolve_sections(head_dim, ndim, sections, "dype")
        self.axis_order = axis_order
        freqs, fraction, _ = self.initial_state()
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, freqs=freqs, band_fraction=fraction,
                         ref_shape=to_shape("ref_shape", ref_shape, ndim),
                         channels=ChannelLayout(pairs=pairs, axis_order=axis_order), coordinates=CoordinateSystem(),
                         resolution=ResolutionScaling(scaling=scaling, yarn_alpha=yarn_alpha, yarn_beta=yarn_beta))
        self.timestep = timestep

    @property
    def timestep(self) -> float:
        """The diffusion time of the next forward, in ``[0, 1]`` (1: noise); setting a new one empties the table
        cache."""
        return self._timestep

    @timestep.setter
    def timestep(self, t: float) -> None:
        t = check_number("timestep", t, minimum=0.0, maximum=1.0)
        if t != getattr(self, "_timestep", None):
            self._cache = TableCache(maxsize=16)  # the tables of the previous step
        self._timestep = t

    def _bands(self):
        return self.sections[::-1] if self.axis_order == "xy" else self.sections

    def initial_state(self, generator=None) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Axial frequencies ``(ndim, 1, pairs)`` and NTK's band fractions, in component order; nothing drawn."""
        return self.frequencies(torch.float32), band_fractions(self._bands()), None

    def frequencies(self, dtype: torch.dtype) -> torch.Tensor:
        freqs = axial_frequencies(self._bands(), self.theta, dtype)
        buffer = getattr(self, "freqs", None)
        return freqs if buffer is None else freqs.to(buffer.device)

    def kappa(self) -> float:
        """The schedule at this module's ``timestep`` (Dy-YaRN: ``lambda_s = 1``)."""
        return dype_schedule(self.timestep, 1.0 if self.scaling == "yarn" else self.lambda_s, self.lambda_t)

    def rescale(self, coords: torch.Tensor, freqs: torch.Tensor, grid: Grid, ref_shape):
        """The method at strength :meth:`kappa` on ``grid`` against ``ref_shape`` (see the module docstring)."""
        ref = self.components(ref_shape)
        scales = axis_scales(self.components(grid.shape), ref, coords.dtype)
        kappa = self.kappa()
        if self.scaling == "yarn":
            if kappa > 0:
                freqs = scale_frequencies(freqs, self.band_fraction, scales, ref, "yarn", self.yarn_alpha * kappa,
                                          self.yarn_beta * kappa)
            return coords, freqs, scales
        dynamic = scales ** kappa
        return (scale_positions(coords, dynamic, self.scaling),
                scale_frequencies(freqs, self.band_fraction, dynamic, ref, self.scaling), dynamic)

    @classmethod
    def for_model(cls, context, **kwargs) -> "DyPE":
        """Dy-NTK against the model's grid unless ``scaling`` is given."""
        return super().for_model(context, **{"scaling": "ntk", **kwargs})

    def adaptation_label(self) -> str:
        return f"DyPE {self.scaling} at t={self.timestep}, ref_shape={'x'.join(map(str, self.ref_shape))}"

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", timestep={self.timestep}, lambda_s={self.lambda_s}, "
                                       f"lambda_t={self.lambda_t}, theta={self.theta}, sections={self.sections}")


def set_timestep(model: nn.Module, t: float) -> int:
    """Set the diffusion time ``t`` on every :class:`DyPE` module of ``model`` (before a denoising step); returns how
    many were set."""
    modules = [m for m in model.modules() if isinstance(m, DyPE)]
    for module in modules:
        module.timestep = t
    return len(modules)
