"""LieRE (Ostmeier et al., ICML 2025, "LieRE: Generalizing Rotary Position Encodings"): rotations from dense learned
skew-symmetric generators through a matrix exponential per position."""
from __future__ import annotations

import math
from typing import List

import torch
from torch import nn

from .._checks import check_generator, check_number, check_positive_int
from ..coords import CoordinateSystem
from ..grid import grid_coordinates
from ..sharding import full_tensor
from .blocks import matrix_exp, num_upper, skew_from_upper
from .learned import LearnedRotation, ScriptedBlockRotation, check_block_size


class LieRE(LearnedRotation):
    """LieRE (Ostmeier et al., ICML 2025; official code ``StanfordMIMI/LieRE``): ``R(c) = exp(sum_a c_a L_a)`` with
    learned skew-symmetric generators ``L_a`` per head, block-diagonal with ``b x b`` blocks (``block_size``; default
    ``head_dim``: one dense generator, the official ``generator_dim=64`` at head_dim 64).

    The generators do not commute in general, so ``R(c_i)^T R(c_j)`` is not a function of ``c_j - c_i``: scores are
    not exactly relative (as the paper says), and the exponential is taken at every position: ``N`` batched
    exponentials per head and block, once per forward in training, cached in evaluation (a dense ``(heads, N, d, d)``
    table, applied as one ``d x d`` product per token). The generator sums are formed in float64, the exponentials
    taken in float32, as the official code does (float64 cost 3-4x on CPU); a dense generator's exponential and its
    gradient dominate a training step on CPU, where ``block_size=8`` costs a fraction of it.

    Official convention (``models/rope_vit.py``, ``LierePositionEncoder``): ``generator_raw_params (ndim, ...,
    num_generators, b, b)`` ``~ U[0, 2 pi)``; only the entries above the diagonal count
    (``B = triu(W, 1) - triu(W, 1)^T``), stored here as ``generators (ndim, heads, m, b (b - 1) / 2)`` (row-major
    upper triangle, ``m = head_dim / b`` blocks per head); ``R = matrix_exp(sum_a p_a B_a)`` applied to the column
    vector of each block of channels ``[j b, (j + 1) b)``; positions ``p_a = i_a / (n_a - 1)`` in ``[0, 1]`` on the
    training grid (``linspace``; on a grid of ``s`` patches against ``e`` trained, ``linspace(0, s/e, s)``); the class
    token unrotated. Here ``coords="normalized"`` (default) is the centred ``2 (i + 0.5) / n - 1`` (a span of 2 against
    the official 1, so the default ``init_range=pi`` draws entries ``U[0, pi)``: the official rotations per image
    extent, about the centre instead of a corner). On a new grid the normalised coordinates span ``[-1, 1]`` again;
    ``coords="index"`` with ``scaling="pi"`` interpolates to ``ref_shape``, ``"none"`` extrapolates (``init_range`` is
    then per patch). ``shift_coords``, ``jitter_coords``, ``rescale_coords``: train-time augmentation (see
    :mod:`visionpe.rotary.learned`).
    """

    def __init__(self, head_dim: int, num_heads: int = 1, ndim: int = 2, block_size: int | None = None,
                 init_range: float = math.pi, scaling: str = "none", ref_shape=None, coords: str = "normalized",
                 normalize_coords: str = "separate", shift_coords: float | None = None,
                 jitter_coords: float | None = None, rescale_coords: float | None = None,
                 draw_coords: str = "forward", generator=None):
        check_positive_int("head_dim", head_dim)
        if block_size is None and head_dim < 2:
            raise ValueError(f"head_dim must be >= 2 for LieRE (its generators are skew-symmetric head_dim x head_dim "
                             f"blocks by default, and a 1x1 one is 0), got {head_dim!r}")
        block_size = head_dim if block_size is None else check_positive_int("block_size", block_size)
        check_block_size(head_dim, block_size)
        init_range = check_number("init_range", init_range, minimum=0.0)
        check_generator(generator)
        coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                       draw_coords)
        super().__init__(head_dim, num_heads, ndim, scaling, ref_shape, coordinates)
        self.block_size, self.num_blocks, self.init_range = block_size, head_dim // block_size, init_range
        self.generators = nn.Parameter(self.initial_parameters(generator)["generators"])

    def initial_parameters(self, generator=None) -> dict:
        """The upper triangles of the generators ``U[0, init_range)``."""
        shape = (self.ndim, self.num_heads, self.num_blocks, num_upper(self.block_size))
        return {"generators": torch.rand(shape, generator=generator) * self.init_range}

    def skew_generators(self, dtype=torch.float32) -> torch.Tensor:
        """The generators ``L_a`` as blocks ``(ndim, heads, m, b, b)``, grid axis order."""
        return skew_from_upper(full_tensor(self.generators).to(dtype), self.block_size)

    def _patch_rotations(self, axis_positions, dtype) -> torch.Tensor:
        return lie_rotations(grid_coordinates(axis_positions), self.skew_generators(dtype))

    def scriptable(self) -> "ScriptedLieRE":
        """The TorchScript form (:class:`ScriptedLieRE`): any coordinates without augmentation, ``scaling`` ``"none"``
        or ``"pi"``."""
        self.check_scriptable_class(LieRE)
        self.check_scriptable_coordinates(normalized=True)
        return ScriptedLieRE(self)

    def similarity_note(self) -> str:
        return "score of one isotropic q rotated to i and to j; not relative"

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}, {super().extra_repr()}"


def lie_rotations(coords: torch.Tensor, generators: torch.Tensor) -> torch.Tensor:
    """LieRE's rotations ``exp(sum_a c_a L_a)`` ``(heads, N, m, b, b)`` of the positions ``coords (N, ndim)`` and
    generators ``(ndim, heads, m, b, b)``: the sums in their dtype, the exponentials in float32 (a TorchScript
    function)."""
    # one matrix product gives the generator sums contiguous, as matrix_exp needs them (an einsum's permuted
    # output is not, also under inductor, where .contiguous() does not help)
    algebra = (coords @ generators.flatten(1)).view([coords.shape[0]] + list(generators.shape[1:]))  # (N, h, m, b, b)
    return matrix_exp(algebra.float()).movedim(0, 1)  # (heads, N, m, b, b)


class ScriptedLieRE(ScriptedBlockRotation):
    """TorchScript form of :class:`LieRE` (:class:`~visionpe.rotary.learned.ScriptedBlockRotation`): its
    ``generators`` (shared) and :func:`lie_rotations`."""

    def __init__(self, pe: LieRE):
        super().__init__(pe)
        self.generators, self.block_size = pe.generators, pe.block_size

    def patch_rotations(self, axis_positions: List[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        generators = skew_from_upper(self.generators.to(dtype), self.block_size)
        return lie_rotations(grid_coordinates(axis_positions), generators)
