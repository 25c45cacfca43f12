"""Shared contract of the rotary family: rotations of queries and keys inside attention.

Every rotary encoding rotates the query and key of patch ``i`` by an orthogonal ``R_i``, block-diagonal in its own
basis: 2x2 pairs for RoPE, ``b x b`` blocks for ComRoPE and LieRE, pairs after a learned change of basis for STRING.
What visualization draws follows from those blocks (:meth:`RotaryEncoding.rotation_blocks`), whatever their size.
"""
from __future__ import annotations

import torch
from einops import rearrange

from ..encoding import Encoding
from ..grid import Grid, Layout, as_grid
from ..sharding import full_tensor


def rope_kernel(cis: torch.Tensor) -> torch.Tensor:
    """RoPE kernel ``(heads, N, pairs)`` complex -> ``(heads, N, N)``.

    ``K[h, i, j] = Re(sum_p conj(cis[h, i, p]) cis[h, j, p]) / pairs``: the expected score between an
    isotropic random vector rotated to position ``i`` and the same vector rotated to ``j``, over its norm.
    """
    return torch.einsum("hip,hjp->hij", cis.conj(), cis).real / cis.shape[-1]


def rotation_kernel(blocks: torch.Tensor) -> torch.Tensor:
    """Kernel of block-diagonal rotations ``(heads, N, num_blocks, b, b)`` -> ``(heads, N, N)``.

    ``K[h, i, j] = tr(R_i^T R_j) / d`` (``d = num_blocks * b``): the expected score ``E<R_i x, R_j x> / E|x|^2`` of an
    isotropic random ``x``. For 2x2 pairs it is :func:`rope_kernel` of the pairs' ``cis``; a change of basis shared
    by all positions leaves it unchanged.
    """
    blocks = blocks.double()
    width = blocks.shape[-3] * blocks.shape[-1]
    return (torch.einsum("hikab,hjkab->hij", blocks, blocks) / width).float()


def pair_blocks(rotations: torch.Tensor) -> torch.Tensor:
    """``(cos, sin)`` pairs ``(..., pairs, 2)`` -> 2x2 rotation blocks ``(..., pairs, 2, 2)``, ``[[c, -s], [s, c]]``
    (the pair ``(x_0, x_1)`` turns to ``(x_0 c - x_1 s, x_0 s + x_1 c)``, as :func:`~visionpe.rotary.apply_rotary`)."""
    cos, sin = rotations.unbind(-1)
    return torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)


def block_columns(blocks: torch.Tensor) -> torch.Tensor:
    """First column of every block, ``(..., num_blocks, b, b) -> (..., b * num_blocks)``, entry ``r`` of all blocks
    together (``r = 0, 1, ...``): for 2x2 pairs ``[cos_p | sin_p]``."""
    return rearrange(blocks[..., 0], "... k b -> ... (b k)")


class RotaryEncoding(Encoding):
    """Base class: ``pe(q, k, grid) -> (q, k)`` with ``q, k: (B, heads, P + N, head_dim)``.

    A subclass provides :meth:`rotation_blocks` (block-diagonal rotations per patch) or, for 2x2 pairs,
    ``cis(grid) -> (heads or 1, P + N, head_dim / 2)`` complex rotations, from which the blocks follow; the pairwise
    kernel that visualization draws (:meth:`pair_map`) follows from the blocks. :meth:`frequency_vectors` gives the
    frequency vectors where the rotations have them.
    """

    family = "rotary"

    def cis(self, grid: Grid, device=None) -> torch.Tensor:
        raise NotImplementedError

    def rotation_blocks(self, grid, device=None) -> torch.Tensor:
        """The rotation of each patch of ``grid`` (prefix tokens excluded), block-diagonal in the encoding's own basis:
        ``(heads or 1, N, num_blocks, b, b)`` float32. Default: the 2x2 pairs of :meth:`cis`."""
        return pair_blocks(torch.view_as_real(self.cis(as_grid(grid).without_prefix(), device)).float())

    @torch.no_grad()
    def pair_map(self, grid) -> torch.Tensor:
        """The positional kernel :func:`rotation_kernel` on the grid's patches, ``(heads or 1, N, N)`` float32."""
        patches = as_grid(grid).without_prefix()
        self.check_table(patches, getattr(self, "num_heads", 1) * patches.num_tokens ** 2 * 8, "kernel (float64)")
        return rotation_kernel(self.rotation_blocks(patches)).cpu()

    def table_bytes(self, grid: Grid) -> int:
        """The float32 rotations of ``grid``'s tokens, one value per channel of every head (2x2 pairs: a ``(cos,
        sin)`` pair per two channels); rotations of larger blocks take more."""
        return 4 * getattr(self, "num_heads", 1) * as_grid(grid).num_tokens * self.head_dim

    def check_input(self, name: str, x, layout: Layout, heads: int, leading_axes: bool = False) -> None:
        """``x``, the input ``name`` (``"q"``, ``"k"``), fits ``layout``: a floating-point ``(batch, heads, tokens,
        head_dim)`` tensor with ``heads`` heads (any number where ``heads`` is 1: rotations shared by the heads).

        ``leading_axes=True`` also takes ``(..., heads, tokens, head_dim)`` (without kept patches) and, where the
        rotations are shared, ``(batch, tokens, head_dim)``; with a rotation per head a 3-D input is refused, since
        its first axis could be the batch or the heads (reading it as heads would give each sample another head's
        rotations).
        """
        grid = layout.grid
        expected = f"(batch, heads, {layout.num_tokens}, {self.head_dim})"
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            got = f"{x.dtype} (integer rotations would be truncated)" if isinstance(x, torch.Tensor) else \
                type(x).__name__
            raise ValueError(f"{name} must be a floating-point tensor {expected}, got {got}")
        axes_taken = x.ndim == 4 or (leading_axes and (x.ndim == 3 or (x.ndim > 4 and layout.keep is None)))
        if not axes_taken or tuple(x.shape[-2:]) != (layout.num_tokens, self.head_dim):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {expected} for grid {grid.shape} with "
                             f"prefix={grid.prefix}{'' if layout.keep is None else ' and kept patches'}")
        if x.ndim == 3 and heads > 1:
            raise ValueError(f"{name} has shape {tuple(x.shape)}: 3 axes, but {type(self).__name__} rotates each of "
                             f"its {heads} heads differently, so the first axis could be the batch or the heads; pass "
                             f"{expected} ({name}[None] for one sample)")
        if x.ndim == 4:
            layout.check_batch(x.shape[0], x.device)
        if heads > 1 and x.shape[-3] != heads:
            raise ValueError(f"{name} has {x.shape[-3]} heads but {type(self).__name__} was built with "
                             f"num_heads={heads}")

    def frequency_vectors(self) -> torch.Tensor:
        """Frequency vectors ``(ndim, heads or 1, head_dim / 2)`` in coordinate-component order: the plane of pair
        ``p`` turns by ``<c, f_p>``. Default: the ``freqs`` attribute (RoPE); rotations without frequency vectors
        raise a ``ValueError``."""
        freqs = getattr(self, "freqs", None)
        if not isinstance(freqs, torch.Tensor):
            raise ValueError(f"{type(self).__name__} has no frequency vectors: its rotations are not a set of planes "
                             "turning at fixed frequencies")
        return full_tensor(freqs).detach()

    def similarity_label(self, head: int | None = None) -> str:
        return f"RoPE kernel, {'mean over heads' if head is None else f'head {head}'}"

    def similarity_note(self) -> str:
        return "score of one isotropic q rotated to i and to j"
