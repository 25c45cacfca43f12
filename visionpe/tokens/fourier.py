"""XCiT's Fourier position encoding: sines and cosines of each axis's normalised coordinate, through a learned
linear projection to the token width. Computed from coordinates, so it is defined on any grid."""
from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn

from .._checks import angle_dtype, check_divisible, check_grid_ndim, check_ndim, check_number, check_positive_int
from ..cache import TableCache
from ..grid import Grid, Layout, as_grid, as_layout
from ..sharding import call_gathered
from ._base import TokenEncoding, check_tokens
from .sincos import sincos_table


def fourier_coords(shape, eps: float, device=None) -> torch.Tensor:
    """Patch coordinates ``(N, ndim)`` of a grid of ``shape`` (row-major), float64 (float32 on MPS): patch ``i`` of an
    axis of ``n`` sits at ``2 pi (i + 1) / (n + eps)``, so every axis spans ``(0, 2 pi]`` whatever its size."""
    wide = angle_dtype(device)
    axes = [torch.arange(1, n + 1, dtype=wide, device=device) * (2 * math.pi / (n + eps)) for n in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(shape))


def fourier_features(coords: torch.Tensor, hidden_dim: int, temperature: float) -> torch.Tensor:
    """XCiT's Fourier features of ``coords: (N, ndim)`` -> ``(N, ndim * hidden_dim)`` float32.

    Per axis, in grid order, ``hidden_dim`` channels: the sine and cosine of each band interleaved,
    ``[sin(c w_0), cos(c w_0), sin(c w_1), cos(c w_1), ...]`` with ``w_j = temperature ** (-2 j / hidden_dim)`` (the
    frequencies of :func:`~visionpe.tokens.sincos_table`, whose sines come before its cosines)."""
    ndim = coords.shape[-1]
    table = sincos_table(coords, ndim * hidden_dim, temperature, layout="timm")  # (N, ndim * 2 * bands)
    return rearrange(table, "n (a s b) -> n (a b s)", a=ndim, s=2)


class Fourier(TokenEncoding):
    """XCiT's Fourier position encoding (El-Nouby et al. 2021; timm's ``PositionalEncodingFourier``): each patch's
    :func:`fourier_features` of its normalised coordinates (:func:`fourier_coords`: patch ``i`` of ``n`` at
    ``2 pi (i + 1) / (n + eps)``), projected to the token width by a learned linear layer, added to the patch tokens;
    prefix tokens get none.

    Args:
        dim: token width.
        ndim: grid axes.
        hidden_dim: Fourier channels per axis (even): ``hidden_dim / 2`` frequency bands, a sine and a cosine each.
        temperature: the base of the band frequencies ``w_j = temperature ** (-2 j / hidden_dim)``.
        eps: added to each axis's size before the normalisation (XCiT's ``1e-6``).

    Parameters: ``projection`` (``nn.Linear(ndim * hidden_dim, dim)``, XCiT's ``1 x 1`` convolution
    ``token_projection``); the features are recomputed on every grid, so any grid size works without a resampled
    table. A grid's offset or spacing is refused: each axis is normalised by the grid's own size.

    Call: ``pe(x, grid)`` with ``x: (B, P + N, dim)`` -> same shape.
    """

    reads_spacing = False  # each axis normalised by its own size: a grid's spacing is refused (spacing_refusal)

    def __init__(self, *, dim: int, ndim: int = 2, hidden_dim: int = 32, temperature: float = 10000.0,
                 eps: float = 1e-6):
        super().__init__()
        self.ndim = check_ndim(ndim)
        self.dim = check_positive_int("dim", dim)
        check_positive_int("hidden_dim", hidden_dim)
        check_divisible("hidden_dim", hidden_dim, 2, "each band has a sine and a cosine channel")
        check_number("temperature", temperature, minimum=0.0, inclusive=False)
        check_number("eps", eps, minimum=0.0)
        self.hidden_dim, self.temperature, self.eps = hidden_dim, float(temperature), float(eps)
        self.projection = nn.Linear(ndim * hidden_dim, dim)
        self._cache = TableCache(maxsize=4)

    def patch_table(self, grid: Grid) -> torch.Tensor:
        """Position vectors of the grid's patches, ``(N, dim)`` in the projection's dtype; cached per grid while the
        projection's weights are unchanged and take no gradient."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "fourier")
        weight = self.projection.weight
        key = (grid.shape, str(weight.device), weight.dtype)
        return self._cache.get(key, lambda: self._build(grid.shape, weight.device), self.parameters())

    def _build(self, shape, device) -> torch.Tensor:
        features = fourier_features(fourier_coords(shape, self.eps, device), self.hidden_dim, self.temperature)
        return call_gathered(self.projection, features.to(self.projection.weight.dtype))  # (N, dim)

    def check_offset(self, grid: Grid) -> None:
        if grid.offset is not None:
            raise ValueError(f"fourier normalises each axis by the grid's own size, so a grid offset={grid.offset} "
                             "(a crop or a later clip) has no place in it; leave the offset out, or use sincos or "
                             "learned")

    def forward(self, x: torch.Tensor, grid: Grid | Layout) -> torch.Tensor:
        layout = as_layout(grid)
        check_grid_ndim(layout.grid, self.ndim, "fourier")
        self.check_spacing(layout.grid)
        self.check_offset(layout.grid)
        check_tokens(x, layout, self.dim)
        return self.add_to_patches(x, self.patch_table(layout.grid), layout)

    def position_vectors(self, grid) -> torch.Tensor:
        grid = as_grid(grid).without_prefix()
        self.check_offset(grid)
        with torch.no_grad():
            return self.patch_table(grid).float().cpu()

    def spacing_refusal(self) -> str | None:
        return ("normalises each axis by the grid's own size (patch i of n at 2 pi (i + 1) / n) whatever its step "
                "(use sincos or a rotary encoding, which read coordinates)")

    def adaptation_label(self) -> str:
        return "recomputed on the new grid's normalised coordinates"

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, ndim={self.ndim}, hidden_dim={self.hidden_dim}, temperature={self.temperature}"
                f"{'' if self.eps == 1e-6 else f', eps={self.eps}'}")
