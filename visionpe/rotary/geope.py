"""GeoPE (Yao & Yang, "GeoPE: A Unified Geometric Positional Embedding for Structured Tensors", arXiv 2512.04963):
each channel triplet rotated in 3D by the geometric mean, taken in the Lie algebra ``so(3)``, of one rotation per grid
axis about its own orthogonal axis."""
from __future__ import annotations

import torch

from ..coords import CoordinateSystem
from ..grid import grid_coordinates
from .triplets import TripletRotation


def rotation_from_vector(v: torch.Tensor) -> torch.Tensor:
    """``exp([v]_x)`` of rotation vectors ``v (..., 3)`` (``[v]_x u = v x u``), Rodrigues' formula ``I + sinc(phi) K +
    (1 - cos phi) / phi^2 K^2`` with ``K = [v]_x``, ``phi = |v|``, through ``torch.sinc`` (smooth and exportable at
    ``phi = 0``): ``(..., 3, 3)``."""
    x, y, z = v.unbind(-1)
    zero = torch.zeros_like(x)
    k = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], dim=-1).unflatten(-1, (3, 3))
    phi = v.square().sum(-1).sqrt()[..., None, None]
    eye = torch.eye(3, dtype=v.dtype, device=v.device)
    return eye + torch.sinc(phi / torch.pi) * k + 0.5 * torch.sinc(phi / (2 * torch.pi)).square() * (k @ k)


class GeoPE(TripletRotation):
    """GeoPE (arXiv 2512.04963): triplet ``d`` of a patch at coordinates ``c`` turned by

        ``R_d(c) = exp( (1 / n) sum_a omega_d c_a G_a )``

    the geometric mean in the Lie algebra of the ``n`` axis rotations ``exp(omega_d c_a G_a)`` (the log of each, their
    mean, the exponential: the quaternion log-exp average of the paper), ``G_a`` the generator of rotations about the
    triplet's ``a``-th axis (grid axis order: rows about the first, columns about the second, a third grid axis about
    the third). The mean is symmetric in the axes, unlike an ordered product of the axis rotations (Spherical RoPE's
    Euler angles); with one coordinate moving it is a plane rotation by ``omega_d c_a / n`` (RoPE's, at ``1/n`` the
    frequency, the third channel of the triplet fixed). The generators do not commute, so GeoPE is not exactly
    relative off the axes (the paper's "linear" variant, which makes scores functions of ``c_j - c_i`` by one matrix
    per query-key pair, is not included). Computed by Rodrigues' formula, exportable.

    What the stored copy of the paper (abstract, reviews) fixes: 3D rotations of channel triplets (the head split into
    ``head_dim / 3`` three-vectors), one rotation per spatial axis about orthogonal axes, combined by the log-exp
    (geometric) mean, different frequencies per triplet, 2D and 3D inputs. What it does not give, so that these are
    visionpe's settings, not the paper's: the frequencies (here ``omega_d = scale * base^(-2 d / head_dim)``, ``base``
    100, Spherical RoPE's spectrum), the coordinates (``coords="index"``, integer patch positions, with the resolution
    scaling of :class:`~visionpe.rotary.LearnedRotation`), and the quaternion angle convention (a factor 2 in the
    frequencies). Which triplet axis each grid axis turns about is immaterial (a fixed signed permutation of the
    triplet's channels, absorbed by the query and key projections). With ``head_dim mod 3 = r > 0`` the last ``r``
    channels stay unrotated; prefix tokens are not rotated; ``num_heads``: every head shares the rotations.

    Call: ``pe(q, k, grid) -> (q, k)``, ``q, k: (B, heads, P + N, head_dim)``; ``pe.rotation_blocks(grid)``: the
    patches' rotations ``(1, N, head_dim // 3, 3, 3)``.
    """

    ndims = (2, 3)

    def __init__(self, head_dim: int, *, num_heads: int = 1, ndim: int = 2, base: float = 100.0, scale: float = 1.0,
                 scaling: str = "none", ref_shape=None, coords: str = "index", normalize_coords: str = "separate",
                 shift_coords: float | None = None, jitter_coords: float | None = None,
                 rescale_coords: float | None = None, draw_coords: str = "forward"):
        if ndim not in self.ndims:
            raise ValueError(f"geope averages one rotation per grid axis of a 2D or 3D grid: ndim must be 2 or 3, "
                             f"got ndim={ndim!r}")
        coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                       draw_coords)
        super().__init__(head_dim, num_heads, ndim, base, scale, scaling, ref_shape, coordinates)

    def rotation_vectors(self, coords: torch.Tensor) -> torch.Tensor:
        """The mean of the axes' Lie-algebra elements as rotation vectors: ``(N, ndim)`` coordinates -> ``(N, m, 3)``,
        component ``a`` of triplet ``d`` being ``omega_d c_a / ndim`` (zero past the grid's axes)."""
        angles = torch.stack([self.angles(c) for c in coords.unbind(-1)], dim=-1) / self.ndim  # (N, m, ndim)
        return torch.nn.functional.pad(angles, (0, 3 - self.ndim))

    def _patch_rotations(self, axis_positions, dtype) -> torch.Tensor:
        coords = grid_coordinates([positions.to(dtype) for positions in axis_positions])
        return rotation_from_vector(self.rotation_vectors(coords))[None]

    def similarity_note(self) -> str:
        return "score of one isotropic q rotated to i and to j; not relative off the axes"
