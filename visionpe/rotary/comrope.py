"""ComRoPE (Yu et al., CVPR 2025, "ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized by
Trainable Commuting Angle Matrices"): block-diagonal rotations from trainable commuting angle matrices."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from .._checks import check_choice, check_generator, check_number, check_positive_int
from ..coords import CoordinateSystem
from ..sharding import full_tensor
from .blocks import commuting_rotations, skew
from .learned import LearnedRotation, ScriptedBlockRotation, check_block_size

VARIANTS = ("ap", "ld")


def axis_partition(ndim: int, num_blocks: int) -> torch.Tensor:
    """ComRoPE-AP's assignment ``(ndim, num_blocks)``: block ``j`` turns with grid axis ``j mod ndim`` (1 there, else
    0)."""
    return (torch.arange(num_blocks)[None] % ndim == torch.arange(ndim)[:, None]).float()


class ComRoPE(LearnedRotation):
    """ComRoPE (Yu et al., CVPR 2025; official code ``Longin-Yu/ComRoPE``): ``R(c) = exp(sum_a c_a A_a)`` with
    block-diagonal angle matrices ``A_a = diag(B_a1, ..., B_am)``, ``m = head_dim / block_size`` blocks of ``b x b``
    that commute across axes, so scores depend only on coordinate differences.

    Per head and block a trainable ``P_j`` (``bases (heads, m, b, b)``, ``N(0, init_std^2)``) gives the skew
    ``P_j - P_j^T``. ``variant="ap"`` (axial partition): ``B_aj = P_j - P_j^T`` if ``j = a (mod ndim)``, else 0 (each
    block turns with one axis, grid axis order: block 0 with the first axis). ``variant="ld"`` (linearly dependent):
    ``B_aj = theta_aj (P_j - P_j^T)`` with trainable ``scales theta (ndim, m)`` shared by the heads (``N(0, 1)``; the
    official code's ``multiplier``). ``block_size=2`` makes AP a learned axial RoPE and LD a learned mixed RoPE.

    Official convention (``model.py``): positions ``p = (i + 0.5) / n`` in ``(0, 1)`` per axis, ``P_j ~ N(0, 1)``, the
    class token at the centre ``p = 0.5``. Here ``coords="normalized"`` (default) is ``c = 2 p - 1``, so angle matrices
    half the official ones give the same rotations up to the shift by the centre, which cancels in every score; the
    default ``init_std=0.5`` draws the official initial rotations, and the class token at the centre (``c = 0``,
    rotation ``I``) is an unrotated prefix token, visionpe's rule for every rotary encoding. On a new grid
    normalised coordinates span ``[-1, 1]`` again (the official positions' behaviour at a new image size);
    ``coords="index"`` with ``scaling="pi"`` interpolates to ``ref_shape``, ``"none"`` extrapolates (``init_std`` is
    then per patch).

    Cost: the rotations are ``exp(c_a A_a)`` for each axis coordinate (``sum_a n_a`` batched ``b x b`` exponentials per
    head and block, not one per token), multiplied per position (commuting); rebuilt per forward in training, cached in
    evaluation; applying them is one ``b x b`` product per token and block. ``shift_coords``, ``jitter_coords``,
    ``rescale_coords``: train-time augmentation (see :mod:`visionpe.rotary.learned`); ComRoPE's own position
    perturbation is not included.
    """

    def __init__(self, head_dim: int, num_heads: int = 1, ndim: int = 2, variant: str = "ld", block_size: int = 4,
                 init_std: float = 0.5, scaling: str = "none", ref_shape=None, coords: str = "normalized",
                 normalize_coords: str = "separate", shift_coords: float | None = None,
                 jitter_coords: float | None = None, rescale_coords: float | None = None,
                 draw_coords: str = "forward", generator=None):
        check_choice("variant", variant, VARIANTS)
        check_positive_int("block_size", block_size)
        check_positive_int("head_dim", head_dim)
        check_block_size(head_dim, block_size)
        init_std = check_number("init_std", init_std, minimum=0.0)
        check_generator(generator)
        coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                       draw_coords)
        super().__init__(head_dim, num_heads, ndim, scaling, ref_shape, coordinates)
        self.variant, self.block_size, self.num_blocks = variant, block_size, head_dim // block_size
        self.init_std = init_std
        for name, value in self.initial_parameters(generator).items():
            setattr(self, name, nn.Parameter(value))
        self.register_derived_buffers()

    def initial_parameters(self, generator=None) -> dict:
        """``bases ~ N(0, init_std^2)``, then (LD) ``scales ~ N(0, 1)``."""
        shape = (self.num_heads, self.num_blocks, self.block_size, self.block_size)
        values = {"bases": torch.randn(shape, generator=generator) * self.init_std}
        if self.variant == "ld":
            values["scales"] = torch.randn(self.ndim, self.num_blocks, generator=generator)
        return values

    def derived_buffers(self) -> dict:
        """AP's assignment of blocks to axes."""
        return {"partition": axis_partition(self.ndim, self.num_blocks)} if self.variant == "ap" else {}

    def angle_matrices(self, dtype=torch.float32) -> torch.Tensor:
        """The blocks ``B_aj`` of every axis ``(ndim, heads, m, b, b)``, grid axis order."""
        weights = full_tensor(self.scales) if self.variant == "ld" else self.partition
        return angle_matrices(weights.to(dtype), full_tensor(self.bases).to(dtype))

    def _patch_rotations(self, axis_positions, dtype) -> torch.Tensor:
        return commuting_rotations(axis_positions, self.angle_matrices(dtype))

    def scriptable(self) -> "ScriptedComRoPE":
        """The TorchScript form (:class:`ScriptedComRoPE`): any coordinates without augmentation, ``scaling``
        ``"none"`` or ``"pi"``."""
        self.check_scriptable_class(ComRoPE)
        self.check_scriptable_coordinates(normalized=True)
        return ScriptedComRoPE(self)

    @torch.no_grad()
    def frequency_vectors(self) -> torch.Tensor:
        """``(ndim, heads, m * (b // 2))`` in xy order: each block turns ``b // 2`` planes (its eigenvectors) at
        ``omega * (theta_0j, ..., theta_(n-1)j)`` (LD) or ``omega * e_(j mod ndim)`` (AP), ``+-i omega`` the eigenvalues
        of ``P_j - P_j^T``."""
        skews = skew(full_tensor(self.bases).detach().double())
        omegas = torch.linalg.eigvalsh(1j * skews)[..., -(self.block_size // 2):].flip(-1)  # (heads, m, b // 2) >= 0
        weights = (full_tensor(self.scales).detach() if self.variant == "ld" else self.partition).double()  # (ndim, m)
        vectors = weights[:, None, :, None] * omegas[None]  # (ndim, heads, m, b // 2)
        return vectors.flatten(-2).flip(0).float()

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, block_size={self.block_size}, {super().extra_repr()}"


def angle_matrices(weights: torch.Tensor, bases: torch.Tensor) -> torch.Tensor:
    """ComRoPE's blocks ``B_aj = w_aj (P_j - P_j^T)`` of every axis ``(ndim, heads, m, b, b)`` from the weights ``(ndim,
    m)`` (LD's ``scales`` or AP's ``partition``) and ``bases (heads, m, b, b)`` (a TorchScript function)."""
    return weights[:, None, :, None, None] * skew(bases)[None]


class ScriptedComRoPE(ScriptedBlockRotation):
    """TorchScript form of :class:`ComRoPE` (:class:`~visionpe.rotary.learned.ScriptedBlockRotation`): its ``bases``
    and LD's ``scales`` (shared; AP's ``partition``) as ``weights``; the blocks :func:`commuting_rotations` of
    :func:`angle_matrices`."""

    def __init__(self, pe: ComRoPE):
        super().__init__(pe)
        self.bases = pe.bases
        if pe.variant == "ld":
            self.weights = pe.scales
        else:
            self.register_buffer("weights", pe.partition, persistent=False)

    def patch_rotations(self, axis_positions: List[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return commuting_rotations(axis_positions, angle_matrices(self.weights.to(dtype), self.bases.to(dtype)))
