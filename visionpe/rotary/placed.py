"""RoPE on positions placed by a rule: fixed frequencies over position components that a subclass computes from the
grid (V2PE's fractional raster index, Circle-RoPE's ring).

The rotation is RoPE's (:class:`~visionpe.rotary.rope.RoPE`: float64 angles, cached ``(cos, sin)`` tables, prefix
tokens unrotated, kept-token layouts, compiled and exported paths); a subclass gives

- :meth:`PlacedRoPE.pair_components`: the position component each rotation pair turns with (one spectrum
  ``theta^(-p/P)`` over the ``P`` pairs, as M-RoPE's), and
- :meth:`PlacedRoPE.place`: the ``(N, components)`` positions of a grid's patches from their index coordinates.

The placement is the encoding's own answer to other grid sizes, so resolution scaling (PI, NTK, YaRN against a
training grid) does not apply: ``scaling`` is always ``"none"``.
"""
from __future__ import annotations

import torch

from .._checks import check_number, check_positive_int, check_divisible
from ..grid import Grid
from ..coords import CoordinateSystem
from .conventions import ChannelLayout, ResolutionScaling
from .rope import RoPE, band_fractions, spectrum_frequencies


class PlacedRoPE(RoPE):
    """Base of RoPE on placed positions; see the module docstring. ``pairs``: ``"interleaved"`` or ``"half"``
    (:func:`~visionpe.rotary.rope.apply_rotary`)."""

    scalings = ()  # takes no scaling keyword: the placement is its answer to other grid sizes
    num_components = 1  # position components per patch (the width of :meth:`place`'s output)

    def __init__(self, head_dim: int, num_heads: int, ndim: int, theta: float, pairs: str):
        check_positive_int("head_dim", head_dim)
        check_divisible("head_dim", head_dim, 2, "rotation pairs")
        check_positive_int("num_heads", num_heads)
        self.theta = check_number("theta", theta, minimum=1.0, inclusive=False)
        self.num_pairs = head_dim // 2
        freqs, fraction, _ = self.initial_state()
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, freqs=freqs, band_fraction=fraction,
                         ref_shape=None, channels=ChannelLayout(pairs=pairs, axis_order="ij"),
                         coordinates=CoordinateSystem(), resolution=ResolutionScaling())

    def pair_components(self) -> list[int]:
        """The position component (a column of :meth:`place`) each of the ``head_dim / 2`` pairs turns with."""
        raise NotImplementedError

    def place(self, coords: torch.Tensor, grid: Grid, scales: torch.Tensor) -> torch.Tensor:
        """``coords (N, ndim)``: the patches' index coordinates (grid axis order, with the grid's offset and
        spacing) -> their positions ``(N, num_components)``."""
        raise NotImplementedError

    def initial_state(self, generator=None) -> tuple[torch.Tensor, torch.Tensor, None]:
        """The fixed frequencies ``(num_components, 1, pairs)`` float32, NTK's band fractions (unused: no scaling),
        nothing drawn."""
        return self.frequencies(torch.float32), band_fractions([self.num_pairs]), None

    def frequencies(self, dtype: torch.dtype) -> torch.Tensor:
        """The frequencies recomputed in ``dtype`` (float64 for the angles)."""
        freqs = spectrum_frequencies(self.pair_components(), self.num_components, self.theta, dtype)
        buffer = getattr(self, "freqs", None)
        return freqs if buffer is None else freqs.to(buffer.device)

    @classmethod
    def model_defaults(cls, context) -> dict:
        """The model's words only: a placement has no training grid to scale against."""
        return super(RoPE, cls).model_defaults(context)

    @classmethod
    def for_model(cls, context, **kwargs) -> "PlacedRoPE":
        return super(RoPE, cls).for_model(context, **kwargs)

    def adapt(self, shape, new_shape, scaling: str | None = None) -> tuple["PlacedRoPE", str]:
        if scaling not in (None, "none"):
            raise ValueError(f"scaling={scaling!r} is not supported by {type(self).__name__}, whose placement of the "
                             "patches is its own answer to other grid sizes; allowed values: 'none'")
        return self, "native grid" if tuple(new_shape) == tuple(shape) else self.adaptation_label()

    def adaptation_label(self) -> str:
        return f"{type(self).__name__} placement on the new grid"

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, num_heads={self.num_heads}, ndim={self.ndim}, pairs={self.pairs!r}, "
                f"theta={self.theta}")
