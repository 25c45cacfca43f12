"""Shared contract of the rotary family: rotations of queries and keys inside attention."""
from __future__ import annotations

import torch

from ..encoding import Encoding
from ..grid import Grid, as_grid


def rope_kernel(cis: torch.Tensor) -> torch.Tensor:
    """RoPE kernel ``(heads, N, pairs)`` complex -> ``(heads, N, N)``.

    ``K[h, i, j] = Re(sum_p conj(cis[h, i, p]) cis[h, j, p]) / pairs``: the expected score between an
    isotropic random vector rotated to position ``i`` and the same vector rotated to ``j``, over its norm.
    """
    return torch.einsum("hip,hjp->hij", cis.conj(), cis).real / cis.shape[-1]


class RotaryEncoding(Encoding):
    """Base class: ``pe(q, k, grid) -> (q, k)`` with ``q, k: (B, heads, P + N, head_dim)``.

    A subclass provides ``cis(grid) -> (heads or 1, P + N, head_dim / 2)`` complex rotations; the pairwise
    kernel that visualization draws follows from it.
    """

    family = "rotary"

    def cis(self, grid: Grid, device=None) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def pair_map(self, grid) -> torch.Tensor:
        """The positional kernel :func:`rope_kernel` on the grid's patches, ``(heads or 1, N, N)`` float32."""
        grid = as_grid(grid)
        return rope_kernel(self.cis(grid.without_prefix())).float().cpu()

    def similarity_label(self, head: int | None = None) -> str:
        return f"RoPE kernel, {'mean over heads' if head is None else f'head {head}'}"

    def similarity_note(self) -> str:
        return "score of one isotropic q rotated to i and to j"
