"""PaPE and PaPE-RI (Koo Øhrstrøm et al., 2026, "Where to Attend: A Principled Vision-Centric Position Encoding with
Parabolas", arXiv 2602.01418; official code ``DTU-PAS/parabolic-position-encoding``, ``pape/nn/positions/pape.py`` and
``pape_ri.py``, read at commit ``21cb390``): each query puts parabolas over the key positions, their curvature and
slope read from the query's own token.

PaPE: per head ``h`` and parabola ``m = 1 .. M``, positions are projected, ``u_m(c) = <w_hm, c>`` (a learned linear
map ``ndim -> heads * M``, per block), and the query token ``x_i`` (the attention's input) gives ``a_im =
softplus(<A_hm, x_i>) > 0`` and ``b_im = <B_hm, x_i>`` (one linear map ``dim -> 2 * heads * M``); the bias of query
``i`` on key ``j`` is

    bias_h(i, j) = s * sum_m [ -a_im (u_m(c_i) - u_m(c_j))^2 + b_im (u_m(c_i) - u_m(c_j)) ],

``s = head_dim^-1/2`` (the official model adds the parabolas to q and k, which attention scales by ``head_dim``'s own
``s``). Each query looks where its parabolas peak, at an offset it chooses; the bias is a function of the offset
``c_i - c_j`` and of the query's content, so it is defined on any grid (a resolution change evaluates the parabolas
farther out, as the official evaluation does).

PaPE-RI (rotation invariant): one parabola per head in the distance, ``bias_h(i, j) = -s a_ih r_h^2 ||c_i - c_j||^2``
with ``a_ih = softplus(<A_h, x_i>)`` and a fixed random scale per head ``r_h ~ U(-1/sqrt(ndim), 1/sqrt(ndim))`` (a
buffer, kept in the state dict as the official's).

Both are written as one product of per-token features, ``bias = Q K^T`` with ``Q (B, heads, T, C)`` from the queries
and ``K (heads, T, C)`` from the keys' positions (the official q/k concatenation, without its padding to a multiple of
8), so the FlexAttention pair form reads ``C`` numbers per side and pair (:meth:`score_mod`). Positions are centred on
the patches' mean before the products (the bias depends on offsets only; centring keeps the squares small in
float32). Official conventions kept: integer patch coordinates (``coords="index"``) in xy order for images
(``axis_order="xy"``; its video model reads (t, y, x): ``axis_order="ij"``), the class token one step before the first
patch on every axis (``prefix_position="corner"``: its position (0, 0) before patches from 1), ``M = 50``, PyTorch's
default ``nn.Linear`` initialisation, no bias in either map. Not reproduced: its ``normalize`` option (positions divided
by the grid size; ``coords="normalized"`` here is DINOv3's centred coordinates).

These biases read the attention's input tokens: ``pe(grid, tokens) -> (B, heads, T, T)``, and :func:`visionpe.attend`
passes ``tokens=`` (every visionpe attention does).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .._checks import check_choice, check_generator, check_grid_ndim, check_ndim, check_positive_int
from .._compat import autocast_off
from ..coords import CoordinateSystem, normalized_steps
from ..grid import Grid, Layout, as_grid, as_layout
from ..sharding import assign_
from ._base import BiasEncoding, PairScore

PREFIX_POSITIONS = ("corner", "none")
AXIS_ORDERS = ("xy", "ij")


class ParabolicBias(BiasEncoding):
    """What PaPE and PaPE-RI share: token-reading biases ``pe(grid, tokens) -> (B, heads, T, T)`` that are a product
    of query and key features (:meth:`features`); a subclass gives the features of its parabolas."""

    reads_tokens = True

    def __init__(self, dim: int, num_heads: int, head_dim: int, ndim: int, prefix_position: str, axis_order: str,
                 coordinates: CoordinateSystem):
        super().__init__()
        self.dim, self.num_heads = check_positive_int("dim", dim), check_positive_int("num_heads", num_heads)
        self.head_dim, self.ndim = check_positive_int("head_dim", head_dim), check_ndim(ndim)
        check_choice("prefix_position", prefix_position, PREFIX_POSITIONS)
        check_choice("axis_order", axis_order, AXIS_ORDERS)
        self.prefix_position, self.axis_order, self.coordinates = prefix_position, axis_order, coordinates
        self.scale = head_dim ** -0.5

    # -- positions --------------------------------------------------------------------------------------------------
    def positions(self, grid: Grid, device, transform=None) -> torch.Tensor:
        """Every token's position ``(P + N, ndim)`` float32, component order (``axis_order``), centred on the
        patches' mean: the prefix tokens at the corner (one step before the first patch on every axis) or 0 (their
        features are zeroed: ``prefix_position="none"``); ``transform``: an augmentation draw (training). The grid's
        offset cancels in every difference and is not read (exact at any offset, as ALiBi)."""
        check_grid_ndim(grid, self.ndim, type(self).__name__)
        grid = Grid(grid.shape, grid.prefix, None, grid.spacing)
        patches = self.coordinates.positions(grid, device)  # (N, ndim) grid order
        axes = self.coordinates.axis_positions(grid.shape, grid.offset, device=device, spacing=grid.spacing)
        if self.coordinates.normalized:
            steps = normalized_steps(grid.shape, self.coordinates.coords, self.coordinates.normalize_coords)
        else:
            steps = grid.steps
        corner = torch.stack([a[0] - step for a, step in zip(axes, steps)])
        coords = torch.cat([corner.expand(grid.prefix, -1), patches])
        if transform is not None:
            coords = transform(coords)
        coords = coords - coords[grid.prefix:].mean(0)
        return coords.flip(-1) if self.axis_order == "xy" else coords

    # -- features ---------------------------------------------------------------------------------------------------
    def _project(self, positions: torch.Tensor) -> torch.Tensor:
        """The positions ``(P + N, ndim)`` as the parabolas read them, ``(heads, P + N, F)``."""
        raise NotImplementedError

    def _features(self, u: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Query features ``(B, heads, T, C)`` from the tokens ``(B, T, dim)`` and the projected positions of the same
        tokens ``(B or 1, heads, T, F)``, key features ``(B or 1, heads, T, C)``: ``bias = Q K^T / sqrt(head_dim)``."""
        raise NotImplementedError

    def features(self, grid, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Q, K)`` of the layout's tokens, float32, ``Q`` scaled by ``head_dim^-1/2``; prefix rows zero with
        ``prefix_position="none"``. One augmentation draw per call in training."""
        layout = as_layout(grid)
        self._check_tokens(tokens, layout)
        device = tokens.device
        transform = self.coordinates.draw(self.training, self.ndim, device)
        with autocast_off(device):
            u = self._project(self.positions(layout.grid, device, transform))  # (heads, P + N, F): whole grid
            u = layout.rows(u) if layout.keep is not None else u[None]  # (B or 1, heads, T, F): the layout's tokens
            query, key = self._features(u, tokens.float())
            if self.prefix_position == "none" and layout.grid.prefix:
                patch = (torch.arange(layout.num_tokens, device=device) >= layout.grid.prefix)[:, None].float()
                query, key = query * patch, key * patch
        return query * self.scale, key

    def _check_tokens(self, tokens, layout: Layout) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 3 or not tokens.is_floating_point() \
                or tokens.shape[1:] != (layout.num_tokens, self.dim):
            got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, torch.Tensor) else repr(tokens)
            raise ValueError(f"tokens must be the attention's floating input (batch, {layout.num_tokens}, "
                             f"dim={self.dim}) for grid {layout.grid.shape} with prefix={layout.grid.prefix}, "
                             f"got {got}")
        layout.check_batch(tokens.shape[0], tokens.device)

    # -- the bias ---------------------------------------------------------------------------------------------------
    def forward(self, grid: Grid | Layout, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The bias of every query on every key of the layout, ``(B, heads, T, T)`` float32."""
        if tokens is None:
            raise ValueError(f"{type(self).__name__} reads the attention's input tokens: call pe(grid, tokens) with "
                             "tokens (batch, T, dim) (visionpe.attend passes them as tokens=x)")
        query, key = self.features(grid, tokens)
        return query @ key.expand_as(query).contiguous().transpose(-1, -2)  # one product per sample, keys shared or not

    def score_mod(self, grid, tokens: torch.Tensor | None = None) -> PairScore:
        """The bias per pair as a :class:`PairScore` over the call's token sequence (``per_sample``): the dot product
        of the query's and the key's ``C`` features."""
        if tokens is None:
            raise ValueError(f"{type(self).__name__}.score_mod reads the attention's input tokens: pass tokens")
        query, key = self.features(grid, tokens)
        return PairScore(_feature_product, (query, key.expand_as(query)), self.num_heads,
                         {"channels": query.shape[-1]}, per_sample=True)

    @torch.no_grad()
    def pair_map(self, grid) -> torch.Tensor:
        """The bias of a query whose token is zero (PaPE: ``a = softplus(0)``, ``b = 0``) on the grid's patches,
        ``(heads, N, N)``: the parabolas every query starts from before its content moves them."""
        grid = as_grid(grid).without_prefix()
        device = next(self.parameters()).device
        return self(grid, torch.zeros(1, grid.num_tokens, self.dim, device=device))[0].float().cpu()

    def similarity_label(self, head: int | None = None) -> str:
        return f"bias of a zero query token, {'mean over heads' if head is None else f'head {head}'}"

    def similarity_note(self) -> str:
        return "bias row of each query for a zero token (a = softplus(0))"

    def adaptation_label(self) -> str:
        if self.coordinates.normalized:
            return f"parabolas in {self.coordinates.label()}"
        return "parabolas over the new grid's offsets (no adaptation)"

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        return (f"dim={self.dim}, num_heads={self.num_heads}, ndim={self.ndim}, prefix_position="
                f"{self.prefix_position!r}{', ' + extra if extra else ''}")


def _feature_product(tables, batch, head, q, k, channels: int):
    """The :meth:`ParabolicBias.score_mod` function: ``sum_c Q[b, h, q, c] K[b, h, k, c]``."""
    query, key = tables
    return sum(query[batch, head, q, c] * key[batch, head, k, c] for c in range(channels))


class PaPE(ParabolicBias):
    """PaPE: ``pe(grid, tokens) -> (B, heads, T, T)``, ``tokens: (B, T, dim)`` the attention's input.

    Args:
        dim: token width (the maps read the tokens); num_heads, head_dim: the attention's (``head_dim`` sets ``s``).
        ndim: grid axes (1, 2 or 3).
        num_parabolas: ``M`` per head (official 50).
        prefix_position: ``"corner"`` (official: the class token one step before the first patch on every axis;
            every prefix token there) or ``"none"`` (zero rows and columns).
        axis_order: ``"xy"`` (the last grid axis first: the official image model's (x, y)) or ``"ij"`` (grid order:
            its video model's (t, y, x)); it names the columns of ``position``.
        coords, normalize_coords, shift_coords, jitter_coords, rescale_coords, draw_coords: the coordinates and their
            train-time augmentation (:mod:`visionpe.coords`).

    Parameters (all excluded from weight decay): ``position`` (``nn.Linear(ndim, heads * M, bias=False)``, the
    official name) and ``ab`` (``nn.Linear(dim, 2 * heads * M, bias=False)``: ``a`` then ``b``, each ``(heads, M)``).
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, ndim: int = 2, num_parabolas: int = 50,
                 prefix_position: str = "corner", axis_order: str = "xy", coords: str = "index",
                 normalize_coords: str = "separate", shift_coords: float | None = None,
                 jitter_coords: float | None = None, rescale_coords: float | None = None, draw_coords: str = "forward"):
        coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                       draw_coords)
        super().__init__(dim, num_heads, head_dim, ndim, prefix_position, axis_order, coordinates)
        self.num_parabolas = check_positive_int("num_parabolas", num_parabolas)
        self.position = nn.Linear(ndim, num_heads * num_parabolas, bias=False)
        self.ab = nn.Linear(dim, 2 * num_heads * num_parabolas, bias=False)

    def _project(self, positions):
        return rearrange(F.linear(positions, self.position.weight.float()), "t (h m) -> h t m", h=self.num_heads)

    def _features(self, u, tokens):
        a, b = rearrange(F.linear(tokens, self.ab.weight.float()), "b t (two h m) -> two b h t m", two=2,
                         h=self.num_heads)
        a = F.softplus(a)
        # -a (u_i - u_j)^2 + b (u_i - u_j) = (b u_i - a u_i^2) + (2 a u_i - b) u_j - a u_j^2, summed over m
        query = torch.cat([(b * u - a * u * u).sum(-1, keepdim=True), 2 * a * u - b, a], dim=-1)
        key = torch.cat([torch.ones_like(u[..., :1]), u, -u * u], dim=-1)
        return query, key

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_parabolas={self.num_parabolas}"


class PaPERI(ParabolicBias):
    """PaPE-RI: ``pe(grid, tokens) -> (B, heads, T, T)``, ``-s a_ih r_h^2 ||c_i - c_j||^2``.

    Args as :class:`PaPE` (no ``num_parabolas``: one per head); ``generator``: the random stream of the fixed
    per-head scales ``position_scales`` (a persistent buffer, as the official's). Parameter: ``a``
    (``nn.Linear(dim, heads, bias=False)``, excluded from weight decay).
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, ndim: int = 2, prefix_position: str = "corner",
                 axis_order: str = "xy", coords: str = "index", normalize_coords: str = "separate",
                 shift_coords: float | None = None, jitter_coords: float | None = None,
                 rescale_coords: float | None = None, draw_coords: str = "forward", generator=None):
        coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                       draw_coords)
        super().__init__(dim, num_heads, head_dim, ndim, prefix_position, axis_order, coordinates)
        check_generator(generator)
        self.a = nn.Linear(dim, num_heads, bias=False)
        self.register_buffer("position_scales", self.draw_scales(generator))

    def draw_scales(self, generator=None) -> torch.Tensor:
        """The fixed per-head scales, uniform in ``(-1/sqrt(ndim), 1/sqrt(ndim))``: ``(heads,)``."""
        bound = 1 / math.sqrt(self.ndim)
        return (2 * torch.rand(self.num_heads, generator=generator) - 1) * bound

    def reset_parameters(self) -> None:
        """As :meth:`Encoding.reset_parameters` (``a`` redrawn), then the scales redrawn as the constructor draws
        them (a persistent buffer, so a meta-device build holds none until this call)."""
        super().reset_parameters()
        assign_(self.position_scales, self.draw_scales())

    def _project(self, positions):
        return positions * self.position_scales.float()[:, None, None]  # (heads, P + N, ndim)

    def _features(self, u, tokens):
        a = F.softplus(rearrange(F.linear(tokens, self.a.weight.float()), "b t h -> b h t"))[..., None]
        squared = (u * u).sum(-1, keepdim=True)
        # -a |u_i - u_j|^2 = -a |u_i|^2 + 2 a u_i . u_j - a |u_j|^2
        query = torch.cat([-a * squared, a, 2 * a * u], dim=-1)
        key = torch.cat([torch.ones_like(squared), -squared, u], dim=-1)
        return query, key
