"""HARoPE (Li et al., CVPR 2026, "Head-wise Adaptive Rotary Positional Encoding for Fine-Grained Image Generation";
official code ``Studentxll/HARoPE``, ``model/models_HARoPE.py``): RoPE after a learned linear map per head.

Each head learns an invertible ``M = U diag(s) V^T`` (``U = exp(skew A_u)``, ``V = exp(skew A_v)`` orthogonal,
``skew A = (A - A^T) / 2``, ``s = softplus(sigma) + 1e-6``); queries become ``R_i M q`` and keys ``R_j M^-T k`` (the
official ``q @ M^T``, ``k @ M_inv``), so the score

    (R_i M q)^T (R_j M^-T k) = q^T M^T R_(j - i) M^-T k

depends on the offset only (RoPE's relative property kept) while the planes the rotation turns are the head's own,
and without rotation ``q^T k`` is unchanged. ``A_u = A_v = 0``, ``softplus(sigma) = 1`` at initialisation: ``M = I``,
plain RoPE. Names and initialisation are the official ``SVDBasedMatrix``'s (read at commit ``bf3d5c9``).

The rotation is the official DiT's axial RoPE: ``head_dim / 4`` bands per axis ``theta^(-i / n)``, ``theta = 10000``,
the first half of the pairs with the first grid axis (rows: ``axis_order="ij"``), adjacent channel pairs, integer
positions from 0 (a model interpolates other grids to its own, ``scaling="pi"``; the official DiT runs at one size).
Prefix tokens (the DiT has none) take the map ``M`` too and are not rotated, so their scores with each other stay
``q^T k``.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_choice, device_angle_dtype
from .._compat import autocast_off
from ..cache import TableCache
from ..coords import CoordinateSystem
from ..grid import Grid, Layout, as_layout
from .blocks import change_basis, matrix_exp
from .conventions import AXIAL_CONVENTIONS, PER_HEAD_LAYOUTS, ChannelLayout, ResolutionScaling, check_records
from .rope import AxialRoPE, ScriptedRoPE

SIDES = ("query", "key")


class HARoPE(AxialRoPE):
    """HARoPE: ``pe(q, k, grid) -> (q, k)``, ``q -> R M q`` and ``k -> R M^-T k`` per head.

    Parameters (all excluded from weight decay): ``A_u``, ``A_v`` ``(num_heads, head_dim, head_dim)`` (their skew parts
    are the generators of ``U`` and ``V``) and ``sigma`` ``(num_heads, head_dim)``. ``M`` and ``M^-T`` are computed
    in float64 (float32 on MPS) once per forward in training, cached in evaluation. The other keywords are
    :class:`~visionpe.rotary.rope.AxialRoPE`'s.
    """

    refused = AXIAL_CONVENTIONS + PER_HEAD_LAYOUTS  # the official DiT's axial RoPE

    def __init__(self, *, head_dim: int, num_heads: int = 1, ndim: int = 2, theta: float = 10000.0, ref_shape=None,
                 channels: ChannelLayout = ChannelLayout(axis_order="ij"),
                 coordinates: CoordinateSystem = CoordinateSystem(),
                 resolution: ResolutionScaling = ResolutionScaling()):
        check_records("HARoPE", HARoPE.refused, channels=channels, coordinates=coordinates, resolution=resolution)
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, theta=theta, ref_shape=ref_shape,
                         channels=channels, coordinates=coordinates, resolution=resolution)
        identity = self.identity_map()
        self.A_u, self.A_v, self.sigma = (nn.Parameter(identity[name]) for name in ("A_u", "A_v", "sigma"))
        self._maps = TableCache(maxsize=4)

    def identity_map(self) -> dict:
        """The map's initial parameters, ``M = I``: ``A_u = A_v = 0`` ``(heads, head_dim, head_dim)``, ``sigma``
        with ``softplus(sigma) = 1`` ``(heads, head_dim)``."""
        skew = torch.zeros(self.num_heads, self.head_dim, self.head_dim)
        return {"A_u": skew, "A_v": skew.clone(), "sigma": torch.full((self.num_heads, self.head_dim),
                                                                      math.log(math.e - 1.0))}

    def initial_parameters(self, generator=None) -> dict:
        """The base rotation's initial parameters and the identity map (:meth:`identity_map`)."""
        return {**super().initial_parameters(generator), **self.identity_map()}

    def maps(self, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(M, M^-T)``, each ``(num_heads, head_dim, head_dim)`` float32: the query's and the key's map."""
        device = device or self.sigma.device

        def build():
            with autocast_off(device):
                return head_maps(self.A_u, self.A_v, self.sigma, torch.device(device))

        return self._maps.get(str(device), build, (self.A_u, self.A_v, self.sigma))

    def scriptable(self) -> ScriptedRoPE:
        """The TorchScript form: RoPE's (:meth:`~visionpe.rotary.rope.RoPE.scripted_rope`) after the maps, computed in
        the graph from the shared parameters (:class:`ScriptedHeadMaps`)."""
        self.check_scriptable_class(HARoPE)
        return self.scripted_rope(maps=ScriptedHeadMaps(self))

    def forward(self, q: torch.Tensor, k: torch.Tensor, grid: Grid | Layout) -> tuple[torch.Tensor, torch.Tensor]:
        layout = as_layout(grid)
        for name, x in (("q", q), ("k", k)):
            self.check_input(name, x, layout, self.num_heads)  # one learned map per head
        query, key = self.maps(q.device)
        return super().forward(change_basis(q, query), change_basis(k, key), layout)

    def rotate(self, x: torch.Tensor, grid: Grid | Layout, cis: torch.Tensor | None = None,
               side: str = "query") -> torch.Tensor:
        """One tensor mapped (``side="query"``: by ``M``; ``"key"``: by ``M^-T``) and rotated, as :meth:`forward` does
        to q or k (never augmented)."""
        check_choice("side", side, SIDES)
        self.check_input("x", x, as_layout(grid), self.num_heads)
        return super().rotate(change_basis(x, self.maps(x.device)[SIDES.index(side)]), grid, cis)


def head_maps(a_u: torch.Tensor, a_v: torch.Tensor, sigma: torch.Tensor,
              device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """HARoPE's ``(M, M^-T)`` per head, each ``(heads, head_dim, head_dim)`` float32, from ``A_u``, ``A_v`` ``(heads,
    head_dim, head_dim)`` and ``sigma (heads, head_dim)``, computed on ``device`` in float64 (float32 on MPS): ``M = U
    diag(s) V^T`` and ``M^-T = U diag(1/s) V^T`` (a TorchScript function)."""
    work = device_angle_dtype(device)
    a_u, a_v = a_u.to(device, work), a_v.to(device, work)
    u = matrix_exp(0.5 * (a_u - a_u.transpose(-1, -2)))
    v = matrix_exp(0.5 * (a_v - a_v.transpose(-1, -2)))
    s = F.softplus(sigma.to(device, work)) + 1e-6
    query = u @ (s[..., None] * v.transpose(-1, -2))  # U diag(s) V^T
    key = u @ (v.transpose(-1, -2) / s[..., None])  # M^-T = U diag(1/s) V^T
    return query.float(), key.float()


class ScriptedHeadMaps(nn.Module):
    """HARoPE's maps in a TorchScript form (:class:`~visionpe.rotary.rope.ScriptedRoPE`'s ``maps``): the encoding's
    parameters (shared) and ``forward(device) -> (M, M^-T)`` (:func:`head_maps`)."""

    def __init__(self, pe: HARoPE):
        super().__init__()
        self.A_u, self.A_v, self.sigma = pe.A_u, pe.A_v, pe.sigma

    def forward(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        return head_maps(self.A_u, self.A_v, self.sigma, device)
