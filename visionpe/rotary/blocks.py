"""Block-diagonal rotations: skew-symmetric generators, their exponentials on a grid, and rotating q and k by them.

A table of block rotations is ``(heads or 1, T, num_blocks, b, b)``: token ``t``'s channels ``[j b, (j + 1) b)`` are
multiplied by block ``j`` (a column vector convention: ``x_j -> R_j x_j``). ComRoPE and LieRE build such tables;
STRING rotates 2x2 pairs after a change of basis (:func:`change_basis`).
"""
from __future__ import annotations

import torch
from einops import rearrange


def skew(square: torch.Tensor) -> torch.Tensor:
    """``M - M^T`` of square matrices ``(..., b, b)``: a skew-symmetric generator from an unconstrained one."""
    return square - square.transpose(-1, -2)


def num_upper(size: int) -> int:
    """Entries strictly above the diagonal of a ``size x size`` matrix: the free parameters of a skew one."""
    return size * (size - 1) // 2


def skew_from_upper(upper: torch.Tensor, size: int) -> torch.Tensor:
    """Skew-symmetric matrices ``(..., size, size)`` from their entries strictly above the diagonal ``(..., n)``,
    ``n = size (size - 1) / 2`` in row-major order (``torch.triu_indices(size, size, 1)``)."""
    rows, cols = torch.triu_indices(size, size, 1, device=upper.device)
    flat = upper.new_zeros(*upper.shape[:-1], size * size)
    flat = flat.index_copy(-1, rows * size + cols, upper) - flat.index_copy(-1, cols * size + rows, upper)
    return flat.unflatten(-1, (size, size))


def commuting_rotations(axis_positions, generators: torch.Tensor) -> torch.Tensor:
    """``R(c) = exp(sum_a c_a A_a) = prod_a exp(c_a A_a)`` for COMMUTING generators, on the grid spanned by per-axis
    coordinates: ``generators (ndim, heads, num_blocks, b, b)``, ``axis_positions[a]: (n_a,)`` -> ``(heads, N, num_blocks,
    b, b)``, positions row-major.

    ``sum_a n_a`` batched exponentials (one per axis coordinate, not per token), then one product per position and
    extra axis; in the generators' dtype.
    """
    table = None
    for axis, positions in enumerate(axis_positions):
        factor = torch.linalg.matrix_exp(positions[:, None, None, None, None].to(generators) * generators[axis])
        table = factor if table is None else (table[:, None] @ factor[None]).flatten(0, 1)  # (N so far, h, k, b, b)
    return table.movedim(0, 1)


def with_identity_prefix(blocks: torch.Tensor, prefix: int) -> torch.Tensor:
    """Prepend ``prefix`` identity rows (prefix tokens are not rotated): ``(h, N, k, b, b) -> (h, P + N, k, b, b)``."""
    if prefix == 0:
        return blocks
    eye = torch.eye(blocks.shape[-1], dtype=blocks.dtype, device=blocks.device)
    return torch.cat([eye.expand(blocks.shape[0], prefix, blocks.shape[2], -1, -1), blocks], dim=1)


def apply_blocks(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Rotate ``x: (B, heads, T, head_dim)`` by block rotations ``(heads or 1, T, num_blocks, b, b)`` shared by the
    batch, or ``(B, heads or 1, T, num_blocks, b, b)`` per sample (a :class:`~visionpe.Layout` that keeps patches).

    In float32 (autocast off: the rotation is not rounded to half precision), cast back to ``x``'s dtype. A shared
    table multiplies every sample's columns at once (one ``b x b`` by ``b x B`` product per token and block), so it is
    read once, never copied per sample.
    """
    b = blocks.shape[-1]
    with torch.autocast(device_type=x.device.type, enabled=False):
        values = x.float()
        if blocks.ndim == x.ndim + 2:  # per sample
            out = (blocks @ values.unflatten(-1, (-1, b))[..., None]).squeeze(-1).flatten(-2)
        elif blocks.shape[0] == 1:  # one table for every head
            columns = rearrange(values, "n h t (k b) -> t k b (h n)", b=b)
            out = rearrange(blocks[0] @ columns, "t k b (h n) -> n h t (k b)", h=x.shape[1])
        else:
            columns = rearrange(values, "n h t (k b) -> h t k b n", b=b)
            out = rearrange(blocks @ columns, "h t k b n -> n h t (k b)")
    return out.type_as(x)


def change_basis(x: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``x -> P x`` per head: ``x: (B, heads, T, d)``, ``basis: (heads or 1, d, d)`` orthogonal; float32, cast back."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        values = x.float()
        out = values @ basis[0].T if basis.shape[0] == 1 else torch.einsum("nhtj,hij->nhti", values, basis)
    return out.type_as(x)
