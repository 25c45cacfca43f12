"""Spherical RoPE (van de Geijn, Lüddecke, Turishcheva, Ecker, NeurIPS 2025, "A Circular Argument: Does RoPE need to
be Equivariant for Vision?", arXiv 2511.08368): each channel triplet rotated on a sphere by two Euler angles, one per
image axis, with non-commuting generators, so scores are not a function of position differences."""
from __future__ import annotations

import math

import torch

from ..coords import CoordinateSystem
from .triplets import TripletRotation, axis_rotations

YAW_AXIS, ROLL_AXIS = 2, 0  # yaw: about the triplet's third axis (turns channels 0, 1); roll: about its first (1, 2)


class SphericalRoPE(TripletRotation):
    """Spherical RoPE (arXiv 2511.08368: Sec. 4's equation "Spherical RoPE embeds position as", with Fig. 2's caption
    and App. F, G, which fix its order and frequencies):
    ``q_d -> R(omega_d p_y) Y(omega_d p_x) q_d`` for every triplet ``q_d = q[3 d : 3 d + 3]``: first the yaw
    (``Y``, about the triplet's third axis) by the ``x`` position, then the roll (``R``, about its first axis) by the
    ``y`` position ("the triplet is first rotated around the axis associated with p_x and then rotated around the axis
    associated with p_y"). Yaw and roll do not commute, so ``R_i^T R_j`` is not a function of ``p_j - p_i``: not
    relative, by design (the paper's point: it matches Mixed RoPE without equivariance).

    Frequencies fixed (App. G): ``omega_d = 1 / 100^(2 d / D)``, ``d`` the triplet index and ``D`` the head dimension
    (the authors' code README: ``100^(-2d/D)`` with ``D`` the embedding dimension); ``base`` is the 100. Positions
    (App. G): the training grid's patches evenly spread over ``[-pi, pi]`` per axis, the top-left patch at
    ``-pi``, the bottom-right at ``pi``: here ``coords="pixel"`` (``linspace(-1, 1, n)`` per axis) times ``scale=pi``,
    exactly the paper's training positions. On another grid ``"pixel"`` spans ``[-pi, pi]`` again; the paper instead
    extrapolates, centred, the range grown by the size ratio (not a coordinate system here: ``coords="index"`` with
    ``scale=2 pi / (n - 1)`` keeps the training spacing but counts from the corner, which matters to a non-relative
    encoding).

    The paper's head dimensions are multiples of 3 (60 and 63 per head); with ``head_dim mod 3 = r > 0`` the last
    ``r`` channels stay unrotated. Which of the triplet's axes are yaw's and roll's is immaterial: another pair of
    orthogonal axes is the same encoding up to a fixed signed permutation of each triplet's channels, which the query
    and key projections absorb. The class token is not rotated (the paper's, and visionpe's rule). The paper's learned
    variant ("Learned Spherical RoPE", an ablation) is not included. 2D grids only; ``num_heads``: every head
    shares the rotations.

    Call: ``pe(q, k, grid) -> (q, k)``, ``q, k: (B, heads, P + N, head_dim)``; ``pe.rotation_blocks(grid)``: the
    patches' rotations ``(1, N, head_dim // 3, 3, 3)``.
    """

    ndims = (2,)

    def __init__(self, head_dim: int, *, num_heads: int = 1, ndim: int = 2, base: float = 100.0,
                 scale: float = math.pi, scaling: str = "none", ref_shape=None, coords: str = "pixel",
                 normalize_coords: str = "separate", shift_coords: float | None = None,
                 jitter_coords: float | None = None, rescale_coords: float | None = None, draw_coords: str = "forward"):
        if ndim != 2:
            raise ValueError(f"spherical_rope turns each triplet by two Euler angles (yaw by x, roll by y): ndim must "
                             f"be 2, got ndim={ndim!r}")
        coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                       draw_coords)
        super().__init__(head_dim, num_heads, ndim, base, scale, scaling, ref_shape, coordinates)

    def _patch_rotations(self, axis_positions, dtype) -> torch.Tensor:
        rows, cols = axis_positions  # grid axis order: y, then x
        roll = axis_rotations(self.angles(rows.to(dtype)), ROLL_AXIS)  # (n_y, m, 3, 3)
        yaw = axis_rotations(self.angles(cols.to(dtype)), YAW_AXIS)  # (n_x, m, 3, 3)
        table = roll[:, None] @ yaw[None]  # (n_y, n_x, m, 3, 3): R(omega p_y) Y(omega p_x), row-major patches
        return table.flatten(0, 1)[None]

    def similarity_note(self) -> str:
        return "score of one isotropic q rotated to i and to j; not relative"
