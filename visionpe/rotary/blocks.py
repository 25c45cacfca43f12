"""Block-diagonal rotations: skew-symmetric generators, their exponentials on a grid, and rotating q and k by them.

A table of block rotations is ``(heads or 1, T, num_blocks, b, b)``: token ``t``'s channels ``[j b, (j + 1) b)`` are
multiplied by block ``j`` (a column vector convention: ``x_j -> R_j x_j``). ComRoPE and LieRE build such tables;
STRING rotates 2x2 pairs after a change of basis (:func:`change_basis`).
"""
from __future__ import annotations

from typing import List, Optional

import torch
from einops import rearrange

from .._compat import autocast_off, is_exporting


def skew(square: torch.Tensor) -> torch.Tensor:
    """``M - M^T`` of square matrices ``(..., b, b)``: a skew-symmetric generator from an unconstrained one."""
    return square - square.transpose(-1, -2)


def num_upper(size: int) -> int:
    """Entries strictly above the diagonal of a ``size x size`` matrix: the free parameters of a skew one."""
    return size * (size - 1) // 2


def skew_from_upper(upper: torch.Tensor, size: int) -> torch.Tensor:
    """Skew-symmetric matrices ``(..., size, size)`` from their entries strictly above the diagonal ``(..., n)``,
    ``n = size (size - 1) / 2`` in row-major order (``torch.triu_indices(size, size, 1)``). A TorchScript function."""
    rows, cols = torch.triu_indices(size, size, 1, device=upper.device).unbind(0)
    flat = upper.new_zeros(list(upper.shape[:-1]) + [size * size])
    flat = flat.index_copy(-1, rows * size + cols, upper) - flat.index_copy(-1, cols * size + rows, upper)
    return flat.unflatten(-1, [size, size])


EXPORT_SQUARINGS, EXPORT_TAYLOR_ORDER = 16, 12  # matrix_exp under torch.export: a / 2^16, Taylor to order 12


def matrix_exp(a: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.matrix_exp(a)`` of ``(..., n, n)`` matrices. Under ``torch.export`` (ONNX has no matrix
    exponential) the same by scaling and squaring in float64: ``a / 2^16``, its Taylor series to order 12, squared 16
    times: the exponential of the float32 input to float32 rounding for ``||a|| <= 2^15`` (the truncation, ``0.5^13 /
    13!`` at the bound, grows ``2^16``-fold in the squarings to about 1e-9; tests/encodings/test_learned_rotations.py),
    closer to it than float32's own ``matrix_exp``, which loses about ``||a||`` float32 steps. A TorchScript
    function (scripted, ``torch.linalg.matrix_exp``)."""
    if torch.jit.is_scripting():
        return torch.linalg.matrix_exp(a)
    else:
        return torch.linalg.matrix_exp(a) if not is_exporting() else _exported_matrix_exp(a)


def _exported_matrix_exp(a: torch.Tensor) -> torch.Tensor:
    """:func:`matrix_exp` while exporting: scaling and squaring in float64."""
    x = a.double() / 2 ** EXPORT_SQUARINGS
    term = total = torch.eye(a.shape[-1], dtype=x.dtype, device=x.device).expand_as(x)
    for k in range(1, EXPORT_TAYLOR_ORDER + 1):
        term = term @ x / k
        total = total + term
    for _ in range(EXPORT_SQUARINGS):
        total = total @ total
    return total.to(a.dtype)


def commuting_rotations(axis_positions: List[torch.Tensor], generators: torch.Tensor) -> torch.Tensor:
    """``R(c) = exp(sum_a c_a A_a) = prod_a exp(c_a A_a)`` for COMMUTING generators, on the grid spanned by per-axis
    coordinates: ``generators (ndim, heads, num_blocks, b, b)``, ``axis_positions[a]: (n_a,)`` -> ``(heads, N, num_blocks,
    b, b)``, positions row-major.

    ``sum_a n_a`` batched exponentials (one per axis coordinate, not per token), then one product per position and
    extra axis; in the generators' dtype. A TorchScript function.
    """
    table: Optional[torch.Tensor] = None
    for axis, positions in enumerate(axis_positions):
        factor = matrix_exp(positions[:, None, None, None, None].to(generators) * generators[axis])
        table = factor if table is None else (table[:, None] @ factor[None]).flatten(0, 1)  # (N so far, h, k, b, b)
    assert table is not None  # a grid has at least one axis
    return table.movedim(0, 1)


def with_identity_prefix(blocks: torch.Tensor, prefix: int) -> torch.Tensor:
    """Prepend ``prefix`` identity rows (prefix tokens are not rotated): ``(h, N, k, b, b) -> (h, P + N, k, b, b)`` (a
    TorchScript function)."""
    if prefix == 0:
        return blocks
    eye = torch.eye(blocks.shape[-1], dtype=blocks.dtype, device=blocks.device)
    return torch.cat([eye.expand(blocks.shape[0], prefix, blocks.shape[2], -1, -1), blocks], dim=1)


PACKED_SIZE = 8  # small blocks are multiplied as 8x8 block-diagonal groups: 2-3x faster than 4x4 products on CPU


def packing(num_blocks: int, size: int, packed_size: int = PACKED_SIZE) -> int:
    """How many ``size x size`` blocks :func:`pack_blocks` groups: the largest divisor ``g`` of ``num_blocks`` with
    ``g * size <= packed_size`` (at least 1)."""
    return max(g for g in range(1, num_blocks + 1) if num_blocks % g == 0 and (g == 1 or g * size <= packed_size))


def pack_blocks(blocks: torch.Tensor, packed_size: int = PACKED_SIZE) -> torch.Tensor:
    """``(..., m, b, b)`` -> ``(..., m / g, g b, g b)``: ``g`` consecutive blocks as one block-diagonal block (the same
    rotation of the same channels), so that a table of small blocks is applied in fewer, larger products."""
    m, size = blocks.shape[-3], blocks.shape[-1]
    g = packing(m, size, packed_size)
    if g == 1:
        return blocks
    eye = torch.eye(g, dtype=blocks.dtype, device=blocks.device)
    grouped = torch.einsum("...kgij,gq->...kgiqj", blocks.unflatten(-3, (m // g, g)), eye)
    return grouped.flatten(-2).flatten(-3, -2)


def unpack_blocks(packed: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size x size`` diagonal blocks of :func:`pack_blocks`'s output: ``(..., m / g, g b, g b) -> (..., m, b,
    b)``."""
    g = packed.shape[-1] // size
    grid = packed.unflatten(-1, (g, size)).unflatten(-3, (g, size))  # (..., k, g, b, g, b)
    return torch.diagonal(grid, dim1=-4, dim2=-2).movedim(-1, -3).flatten(-4, -3)


def apply_blocks(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Rotate ``x: (B, heads, T, head_dim)`` by block rotations ``(heads or 1, T, num_blocks, b, b)`` shared by the
    batch, or ``(B, heads or 1, T, num_blocks, b, b)`` per sample (a :class:`~visionpe.Layout` that keeps patches).

    In float32 (autocast off: the rotation is not rounded to half precision), cast back to ``x``'s dtype. A shared
    table multiplies every sample's columns at once (:class:`_SharedBlockProduct`), so it is read once, never copied
    per sample.
    """
    b = blocks.shape[-1]
    with autocast_off(x.device):
        if blocks.ndim == x.ndim + 2:  # per sample
            return multiply_blocks(x, blocks)
        out = _SharedBlockProduct.apply(blocks, x.float())
    return out.type_as(x)


def multiply_blocks(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``x: (B, heads, T, head_dim)`` times the block rotations ``([B,] heads or 1, T, num_blocks, b, b)`` broadcast,
    one ``b x b`` by ``b x 1`` product per token and block, in float32, cast back to ``x``'s dtype (a TorchScript
    function: the scripted models' block rotations)."""
    columns = x.float().unflatten(-1, [-1, blocks.shape[-1]])[..., None]  # (B, heads, T, k, b, 1)
    return (blocks @ columns).squeeze(-1).flatten(-2).type_as(x)


def _to_columns(x: torch.Tensor, b: int, shared_heads: bool) -> torch.Tensor:
    """``(B, heads, T, k b)`` -> the batch as columns of each token's blocks, contiguous: ``(heads, T, k, b, B)``, or
    ``(T, k, b, heads B)`` for a table shared by the heads."""
    pattern = "n h t (k b) -> t k b (h n)" if shared_heads else "n h t (k b) -> h t k b n"
    return rearrange(x, pattern, b=b).contiguous()


def _from_columns(columns: torch.Tensor, heads: int, shared_heads: bool) -> torch.Tensor:
    if shared_heads:
        return rearrange(columns, "t k b (h n) -> n h t (k b)", h=heads)
    return rearrange(columns, "h t k b n -> n h t (k b)")


class _SharedBlockProduct(torch.autograd.Function):
    """``R_t x_t`` for a table ``R (heads or 1, T, k, b, b)`` shared by the batch, as batched ``b x b`` by ``b x B``
    products with both operands contiguous, forward and backward (a permuted operand sends CPU batched products to a
    per-matrix loop). The output is contiguous ``(B, heads, T, d)``: SDPA's fused CPU kernel needs unit-stride
    channels (a strided q and k send attention to its unfused path). Saves the output, not
    ``x``: attention keeps the rotated q and k anyway, and ``x = R^T (R x)`` (orthogonal ``R``) gives the columns back
    for the table's gradient."""

    @staticmethod
    def forward(ctx, blocks: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        shared_heads = blocks.shape[0] == 1
        table = blocks[0] if shared_heads else blocks
        out = _from_columns(table @ _to_columns(x, blocks.shape[-1], shared_heads), x.shape[1], shared_heads)
        out = out.contiguous()
        ctx.save_for_backward(table, out if ctx.needs_input_grad[0] else None)
        ctx.shared_heads, ctx.heads = shared_heads, x.shape[1]
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        table, out = ctx.saved_tensors
        b = table.shape[-1]
        grad_columns = _to_columns(grad, b, ctx.shared_heads)
        grad_blocks = grad_x = None
        if ctx.needs_input_grad[0]:
            columns = table.transpose(-1, -2) @ _to_columns(out, b, ctx.shared_heads)
            grad_blocks = grad_columns @ columns.transpose(-1, -2)
            grad_blocks = grad_blocks[None] if ctx.shared_heads else grad_blocks
        if ctx.needs_input_grad[1]:
            grad_x = _from_columns(table.transpose(-1, -2) @ grad_columns, ctx.heads, ctx.shared_heads)
        return grad_blocks, grad_x


def change_basis(x: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``x -> P x`` per head: ``x: (B, heads, T, d)``, ``basis: (heads or 1, d, d)``; float32 (autocast off), cast
    back. A TorchScript function."""
    if torch.jit.is_scripting():
        return _change_basis(x, basis)
    else:
        with autocast_off(x.device):
            return _change_basis(x, basis)


def _change_basis(x: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    values = x.float()
    out = values @ basis[0].T if basis.shape[0] == 1 else torch.einsum("nhtj,hij->nhti", values, basis)
    return out.type_as(x)
