"""Rotations of channel triplets: 3x3 rotation blocks at one fixed frequency per triplet (Spherical RoPE's Euler
angles, GeoPE's mean in the Lie algebra ``so(3)``).

A head of ``head_dim`` channels holds ``m = head_dim // 3`` triplets ``[3 d, 3 d + 3)``, triplet ``d`` turning at
``omega_d = scale * base^(-2 d / head_dim)``; the ``head_dim mod 3`` channels after the last triplet stay unrotated
(the papers take head dimensions divisible by 3; visionpe rotates what fits, as RoPE leaves a head's rest pairs
unrotated). Coordinates, resolution scaling, caching and the forward are :class:`~visionpe.rotary.LearnedRotation`'s
(the frequencies are fixed, so the tables are cached in training too); prefix tokens are not rotated.
"""
from __future__ import annotations

import torch

from .._checks import check_number, check_positive_int
from ..coords import CoordinateSystem
from .blocks import apply_blocks
from .learned import LearnedRotation

# the generators of rotations about the first, second and third axis of a triplet: G_a v = e_a x v
SO3_GENERATORS = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]],
                               [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]],
                               [[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])


def triplet_frequencies(head_dim: int, base: float, scale: float, dtype=torch.float64) -> torch.Tensor:
    """``omega_d = scale * base^(-2 d / head_dim)`` for the ``head_dim // 3`` triplets, ``(m,)``."""
    d = torch.arange(head_dim // 3, dtype=dtype)
    return scale * base ** (-2.0 * d / head_dim)


def axis_rotations(angles: torch.Tensor, axis: int) -> torch.Tensor:
    """Rotations by ``angles (...)`` about the triplet's axis ``axis`` (0, 1, 2): ``(..., 3, 3)``, ``exp(angle G_axis)``
    written out (``I + sin G + (1 - cos) G^2``)."""
    g = SO3_GENERATORS[axis].to(angles)
    eye = torch.eye(3, dtype=angles.dtype, device=angles.device)
    s, c = angles.sin()[..., None, None], angles.cos()[..., None, None]
    return eye + s * g + (1 - c) * (g @ g)


class TripletRotation(LearnedRotation):
    """Base of the fixed-frequency triplet rotations; a subclass gives :meth:`_patch_rotations` (``(1, N, m, 3, 3)``
    from per-axis coordinates, frequencies :attr:`omegas`)."""

    block_size = 3

    def __init__(self, head_dim: int, num_heads: int, ndim: int, base: float, scale: float, scaling: str, ref_shape,
                 coordinates: CoordinateSystem):
        check_positive_int("head_dim", head_dim)
        if head_dim < 3:
            raise ValueError(f"head_dim must be >= 3 for {type(self).__name__} (it rotates channel triplets), got "
                             f"{head_dim!r}")
        self.base = check_number("base", base, minimum=1.0, inclusive=False)
        self.scale = check_number("scale", scale, minimum=0.0, inclusive=False)
        super().__init__(head_dim, num_heads, ndim, scaling, ref_shape, coordinates)
        self.num_blocks = head_dim // 3
        self.register_derived_buffers()

    def derived_buffers(self) -> dict:
        """The triplets' frequencies ``omegas (m,)``."""
        return {"omegas": triplet_frequencies(self.head_dim, self.base, self.scale).float()}

    def _device(self):
        return self.omegas.device

    def _rotate(self, tensors, rows: torch.Tensor) -> tuple:
        """The triplets rotated by ``rows``, the ``head_dim mod 3`` channels after them unrotated."""
        rotated = 3 * self.num_blocks
        if rotated == self.head_dim:
            return super()._rotate(tensors, rows)
        return tuple(torch.cat([apply_blocks(x[..., :rotated], rows), x[..., rotated:]], dim=-1) for x in tensors)

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """``omega_d * c`` for coordinates ``positions (n,)``: ``(n, m)``, the frequencies computed in their dtype."""
        omegas = triplet_frequencies(self.head_dim, self.base, self.scale, positions.dtype).to(positions.device)
        return positions[:, None] * omegas[None]

    def extra_repr(self) -> str:
        return f"base={self.base}, scale={self.scale}, {super().extra_repr()}"
