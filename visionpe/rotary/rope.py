"""Rotary position embeddings on nD grids: axial (fixed per-axis bands) and mixed (learned directions).

Both are one mechanism. Each rotation pair ``p`` of a head has a frequency *vector* ``f_p`` in
coordinate space; the pair at position ``c`` turns by ``angle = <c, f_p>``. Axial RoPE uses axis-aligned
vectors (``f_p = w_i e_a``), shared by all heads; mixed RoPE (Heo et al., RoPE-ViT 2024) learns them
per head. The coordinates ``c`` are one of the systems of :mod:`visionpe.coords` (``coords="index"``: integer
patch positions; ``"normalized"``: DINOv3's centred ``[-1, 1]``), optionally augmented in training
(``shift_coords``, ``jitter_coords``, ``rescale_coords``). Coordinates and frequency components are in ``xy``
order (last grid axis first), as in rope-vit and timm (``grid_indexing='xy'``), so 2D pairs ``[0, d/4)`` rotate
with x and ``[d/4, d/2)`` with y.
"""
from __future__ import annotations

import copy
import math
from typing import List, Tuple

import torch
from einops import rearrange
from torch import nn

from .._checks import (angle_dtype, check_choice, check_divisible, check_generator, check_grid_ndim, check_ndim,
                       check_number, check_positive_int, device_angle_dtype, to_shape)
from .._compat import TorchScriptRefusal, autocast_off, is_compiling
from ..cache import TableCache
from ..coords import CoordinateSystem, patch_positions
from ..grid import Grid, Layout, as_grid, as_layout, grid_coordinates
from ..sharding import full_tensor
from ..encoding import Knob
from ._base import RotaryEncoding
from .blocks import change_basis
from .conventions import (AXIAL_CONVENTIONS, SECTION_RULES, ChannelLayout, FlatKeywords, FrequencyBands,
                          ResolutionScaling, check_records)
from .layouts import (AXIS_LETTERS, DIRECTIONS, band_frequencies, golden_directions, head_axes_layout, parse_head_axes,
                      rotated_count, rotated_pairs)
from .scaling import SCALINGS, attention_factor, axis_scales, scale_frequencies, scale_positions


def band_fractions(sizes) -> torch.Tensor:
    """``i / (n - 1)`` for band ``i`` of each group of ``n`` pairs, concatenated: NTK's exponents."""
    return torch.cat([torch.arange(n, dtype=torch.float32) / max(n - 1, 1) for n in sizes])


def axial_frequencies(sections_xy, theta: float, dtype=torch.float32, **bands) -> torch.Tensor:
    """Axis-aligned frequency vectors ``(ndim, 1, pairs)``: pairs of section ``a`` turn along axis ``a``
    (``bands``: :func:`band_frequencies`'s ``per_turn`` and ``periods``)."""
    ndim, pairs = len(sections_xy), sum(sections_xy)
    freqs = torch.zeros(ndim, 1, pairs, dtype=dtype)
    start = 0
    for axis, n in enumerate(sections_xy):
        freqs[axis, 0, start:start + n] = band_frequencies(n, theta, dtype, **bands)
        start += n
    return freqs


def mrope_axes(sections, num_pairs: int, interleaved: bool) -> list[int]:
    """Grid axis of each rotation pair of M-RoPE's one spectrum.

    Chunked (Qwen2-VL): the first ``sections[0]`` pairs turn with axis 0 (time), the next ``sections[1]`` with
    axis 1, ... Interleaved (Qwen3-VL; timm ``RotaryEmbeddingMRope``): pairs ``a, a + n, a + 2n, ...`` (``n`` axes)
    below ``sections[a] * n`` turn with axis ``a >= 1``; every other pair with axis 0.
    """
    if not interleaved:
        return [axis for axis, n in enumerate(sections) for _ in range(n)]
    ndim, axes = len(sections), [0] * num_pairs
    for axis in range(1, ndim):
        for pair in range(axis, min(sections[axis] * ndim, num_pairs), ndim):
            axes[pair] = axis
    return axes


def videorope_axes(sections, num_pairs: int) -> list[int]:
    """Grid axis of each rotation pair of VideoRoPE's low-frequency temporal allocation on one spectrum (pair 0 the
    highest frequency): the last ``sections[0]`` pairs turn with axis 0 (time); the others alternate axes 1, 2
    (h, w), starting with h, an axis whose ``sections`` budget is spent leaving the rest to the other (the official
    ``apply_m_modify_multimodal_rotary_pos_emb``: h, w, h, w, ..., then t)."""
    time, budget = sections[0], list(sections[1:])
    axes, turn = [], 0
    for _ in range(num_pairs - time):
        if budget[turn] == 0:
            turn = 1 - turn
        axes.append(1 + turn)
        budget[turn] -= 1
        turn = 1 - turn
    return axes + [0] * time


def spectrum_frequencies(pair_components, ndim: int, theta: float, dtype=torch.float32, **bands) -> torch.Tensor:
    """One spectrum ``1/theta^(p/n)`` over all ``n`` pairs (M-RoPE), pair ``p`` turning along coordinate
    component ``pair_components[p]`` (None: an inert axis, the pair stays unrotated): ``(ndim, 1, n)``."""
    n = len(pair_components)
    freqs = torch.zeros(ndim, 1, n, dtype=dtype)
    turning = [p for p, c in enumerate(pair_components) if c is not None]
    if turning:
        index = torch.tensor(turning)
        components = torch.tensor([pair_components[p] for p in turning])
        freqs[components, 0, index] = band_frequencies(n, theta, dtype, **bands)[index]
    return freqs


def random_rotations(num: int, ndim: int, generator=None) -> torch.Tensor:
    """``num`` uniformly random rotation matrices ``(num, ndim, ndim)`` (det +1), columns orthonormal."""
    if ndim == 2:  # rope-vit's parametrisation: one angle per head
        angle = torch.rand(num, generator=generator) * 2 * math.pi
        c, s = angle.cos(), angle.sin()
        return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)
    q, r = torch.linalg.qr(torch.randn(num, ndim, ndim, generator=generator))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    det = torch.linalg.det(q)
    q[:, :, 0] = q[:, :, 0] * det[:, None]
    return q


def mixed_frequencies(sections_xy, num_heads: int, theta: float, generator=None, **bands) -> torch.Tensor:
    """RoPE-Mixed initial frequencies ``(ndim, num_heads, sum(sections))``.

    Per head a random rotation ``R``; the ``n_g`` bands of group ``g`` point along ``R``'s column ``g`` with the
    axial magnitudes ``1/theta^(i/n_g)``. In 2D with equal groups this is rope-vit's ``init_random_2d_freqs``
    (directions ``phi`` and ``phi + pi/2``, magnitudes ``1/theta^(4i/d)``).
    """
    rot = random_rotations(num_heads, len(sections_xy), generator)  # (heads, ndim components, ndim groups)
    groups = [rot[:, :, g, None] * band_frequencies(n, theta, **bands) for g, n in enumerate(sections_xy)]
    return rearrange(torch.cat(groups, dim=-1), "h a p -> a h p").contiguous()


def apply_rotary(x: torch.Tensor, cis: torch.Tensor, pairs: str = "interleaved") -> torch.Tensor:
    """Rotate channel pairs of ``x: (B, heads, T, head_dim)`` by ``cis: ([B,] heads or 1, T, head_dim/2)`` complex,
    or the same rotations as real ``(cos, sin)`` pairs ``(..., head_dim/2, 2)`` (:meth:`RoPE.rotations`); a leading
    batch axis when each sample keeps its own tokens.

    ``pairs="interleaved"`` rotates ``(x[2p], x[2p+1])`` (rope-vit, timm ``apply_rot_embed``);
    ``"half"`` rotates ``(x[p], x[p + d/2])`` (GPT-NeoX ``rotate_half``). In float32: eagerly one complex multiply
    (one kernel), under ``torch.compile`` the real products (inductor fuses them; it generates no complex code).
    """
    if is_compiling():
        return rotate_real(x, torch.view_as_real(cis) if cis.is_complex() else cis, pairs)
    cis = cis if cis.is_complex() else torch.view_as_complex(cis)
    if heads_inside_tokens(x):
        # multiply in memory order, so the loop runs over contiguous (heads, pairs) rows and the output keeps the
        # layout (1.2-1.6x faster than token by token)
        return _multiply(x.transpose(-3, -2), cis.transpose(-3, -2), pairs).transpose(-3, -2)
    return _multiply(x, cis, pairs)


def heads_inside_tokens(x: torch.Tensor) -> bool:
    """``x: (..., heads, T, head_dim)`` stores each token's heads together (token-major), as q and k sliced from a
    fused qkv do."""
    return x.ndim >= 3 and x.stride(-3) < x.stride(-2)


def _multiply(x: torch.Tensor, cis: torch.Tensor, pairs: str) -> torch.Tensor:
    """``x`` times complex ``cis`` (broadcast), channel pairs as :func:`apply_rotary` reads them."""
    if pairs == "interleaved":
        x_pairs = rearrange(x.float(), "... (p two) -> ... p two", two=2)
        if x_pairs.stride(-1) != 1 or any(s % 2 for s in x_pairs.stride()[:-1]):
            x_pairs = x_pairs.contiguous()  # q, k sliced from a fused qkv are viewed in place, without a copy
        rotated = _Rotate.apply(torch.view_as_complex(x_pairs), cis)
        return rearrange(torch.view_as_real(rotated), "... p two -> ... (p two)").type_as(x)
    first, second = x.float().chunk(2, dim=-1)
    xc = _Rotate.apply(torch.complex(first, second), cis)
    return torch.cat([xc.real, xc.imag], dim=-1).type_as(x)


class _Rotate(torch.autograd.Function):
    """``x * cis`` for complex ``x`` and ``cis`` that saves the product, not ``x``, for the gradient of a learned
    ``cis``: ``grad_cis = sum(grad * conj(x)) = sum(grad * conj(out)) / conj(cis)``, summed over the axes ``cis``
    is broadcast along. Attention keeps the rotated q and k for its own backward anyway; saving the unrotated ones
    too would keep the whole fused qkv buffer alive."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
        out = x * cis
        ctx.save_for_backward(out if ctx.needs_input_grad[1] else None, cis)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out, cis = ctx.saved_tensors
        grad_x = grad * cis.conj() if ctx.needs_input_grad[0] else None
        grad_cis = None
        if ctx.needs_input_grad[1]:
            grad_cis = (grad * out.conj()).sum_to_size(cis.shape) / cis.conj()
        return grad_x, grad_cis


def rotate_real(x: torch.Tensor, rotations: torch.Tensor, pairs: str = "interleaved") -> torch.Tensor:
    """:func:`apply_rotary` in real arithmetic, ``rotations: (..., head_dim/2, 2)`` holding ``(cos, sin)``.

    ``(a, b) -> (a cos - b sin, b cos + a sin)`` written as ``x * cos + partner(x) * (-sin, sin)``: one pointwise
    expression that inductor compiles to one pass writing each output once."""
    cos, sin = rotations.float().unbind(-1)  # (..., pairs)
    sign = torch.tensor([-1.0, 1.0], device=x.device)
    if pairs == "interleaved":
        # tables as wide as x, (..., head_dim): a product that broadcasts a trailing size-1 axis is slow in
        # onnxruntime (3 ms of a 10 ms ViT-Ti forward, against 0.25 ms for timm's rotate-half form)
        cos, sin = cos.repeat_interleave(2, -1), (sin[..., None] * sign).flatten(-2)  # (..., head_dim)
        wide = x.float()
        partner = wide.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (b, a) of each pair (a, b)
        return (wide * cos + partner * sin).type_as(x)
    x_pairs = x.float().unflatten(-1, (2, -1))  # (..., 2, pairs)
    cos, sin = cos[..., None, :], sin[..., None, :] * sign[:, None]
    return (x_pairs * cos + x_pairs.flip(-2) * sin).flatten(-2).type_as(x)


def rotate_channels(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs ``(x[2p], x[2p+1])`` of ``x: (..., head_dim)`` whose two channels turn by their own angles,
    ``rotations: (..., head_dim/2, 2, 2)`` holding ``(cos, sin)`` of each channel: ``(a, b) -> (a cos_0 - b sin_0,
    b cos_1 + a sin_1)``, in float32. V-JEPA 2's repeated frequencies (``channel_frequencies="repeated"``); a
    rotation only where both channels' angles agree (then it is :func:`rotate_real`)."""
    cos, sin = rotations.float().unbind(-1)  # (..., pairs, 2 channels)
    sign = torch.tensor([-1.0, 1.0], device=x.device)
    x_pairs = x.float().unflatten(-1, (-1, 2))  # (..., pairs, 2)
    return (x_pairs * cos + x_pairs.flip(-1) * sin * sign).flatten(-2).type_as(x)


class RoPE(FlatKeywords, RotaryEncoding):
    """Rotary embedding from frequency vectors; use :class:`AxialRoPE` or :class:`MixedRoPE`.

    Call: ``pe(q, k, grid) -> (q, k)`` with ``q, k: (B, num_heads, P + N, head_dim)``; the ``P`` prefix
    tokens are not rotated. Angles are computed in float64 (exact on long axes), the rotations stored as float32
    ``(cos, sin)`` pairs (:meth:`rotations`; :meth:`cis` is their complex view), cached per grid and layout (and
    per parameter version for learned frequencies when gradients are off), and applied in float32.

    Coordinates (``coordinates``, a :class:`~visionpe.coords.CoordinateSystem`): ``coords="index"`` (integer patch
    positions; ``scaling`` adapts them to other grids against ``ref_shape``: ``"pi"`` is interpolation to the
    reference grid) or ``"normalized"`` (DINOv3's centred ``[-1, 1]``, ``normalize_coords`` ``"separate"``,
    ``"min"``, ``"max"``: every grid spans the same range, so it takes no ``scaling``). Augmentation
    (``shift_coords``, ``jitter_coords``, ``rescale_coords``) runs in :meth:`forward` in training mode: one draw
    per call shared by q, k and all heads, on the coordinates in component order (``axis_order``, timm's
    ``grid_indexing``), so the same RNG state gives timm's transform; augmented rotations are never cached.

    ``freq_mask`` (learned frequencies only, ``(ndim, heads or 1, pairs)``): 1 where a frequency may move, 0 where
    it stays 0 whatever is learned or loaded (p-RoPE's unrotated pairs, the components a per-head axis assignment
    leaves out); its gradient there is 0.

    ``grid_offset`` (index coordinates): a constant added to every patch coordinate before resolution scaling, as
    timm's ``grid_offset`` (Perception Encoder and Llama 4 count patches from 1, leaving 0 to the class token).
    ``channel_index`` (``(head_dim/2, 2)`` long, or None): the pair whose angle each channel of each pair takes,
    when the two channels of a pair turn by different angles (V-JEPA 2, see :func:`rotate_channels`); the rotations
    are then ``(..., head_dim/2, 2 channels, 2)``.
    """

    scalings = SCALINGS  # the adaptations to a new grid it takes (the sweep reads them)

    def __init__(self, *, head_dim: int, num_heads: int, ndim: int, freqs: torch.Tensor, band_fraction: torch.Tensor,
                 ref_shape, channels: ChannelLayout, coordinates: CoordinateSystem, resolution: ResolutionScaling,
                 grid_offset: float = 0.0):
        """``freqs: (ndim, heads or 1, pairs)``, an ``nn.Parameter`` when learned (else a buffer); ``band_fraction``:
        NTK's exponent of each pair ``(pairs,)`` (or ``(heads, pairs)``); ``channels`` gives ``pairs`` and
        ``axis_order``. ``freq_mask`` and ``channel_index`` start as None (a subclass registers its own)."""
        super().__init__()
        self.head_dim, self.num_heads, self.ndim, self.axis_order = head_dim, num_heads, ndim, channels.axis_order
        self.pairs, self.scaling = channels.pairs, resolution.scaling
        self.coordinates = coordinates
        check_scaling(self.scaling, self.coordinates)
        self.ref_shape = None if ref_shape is None else to_shape("ref_shape", ref_shape, ndim)
        if self.scaling != "none" and self.ref_shape is None:
            raise ValueError(f"scaling={self.scaling!r} needs ref_shape, the training grid (e.g. ref_shape=(14, 14))")
        self.yarn_alpha, self.yarn_beta = resolution.yarn_alpha, resolution.yarn_beta
        if isinstance(freqs, nn.Parameter):
            self.freqs = freqs
        else:
            self.register_buffer("freqs", freqs, persistent=False)
        self.register_buffer("band_fraction", band_fraction, persistent=False)
        self.register_buffer("freq_mask", None, persistent=False)
        self.grid_offset = check_number("grid_offset", grid_offset)
        if self.grid_offset and self.coordinates.normalized:
            raise ValueError(f"grid_offset={grid_offset!r} shifts index coordinates; "
                             f"coords={self.coordinates.coords!r} puts every grid on [-1, 1]: use grid_offset=0")
        self.register_buffer("channel_index", None, persistent=False)
        self._cache = TableCache(maxsize=16)

    def initial_state(self, generator=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What the constructor computes from the settings: the initial frequencies ``(ndim, heads or 1, pairs)``
        (learned ones drawn from ``generator``), the band fractions ``(pairs,)`` and ``freq_mask`` (or None)."""
        raise NotImplementedError

    def derived_buffers(self) -> dict:
        """``band_fraction``, ``freq_mask`` and fixed ``freqs`` (which do not depend on the draw of learned ones)."""
        freqs, fraction, mask = self.initial_state(torch.Generator().manual_seed(0))
        buffers = {"band_fraction": fraction, "freq_mask": mask}
        return buffers if "freqs" in self._parameters else {**buffers, "freqs": freqs.float().contiguous()}

    def initial_parameters(self, generator=None) -> dict:
        return {"freqs": self.initial_state(generator)[0]} if "freqs" in self._parameters else {}

    def cis(self, grid: Grid, device=None, augment: bool = False) -> torch.Tensor:
        """Complex rotations ``(heads or 1, P + N, head_dim / 2)``; prefix rows are the identity: a complex view of
        :meth:`rotations`."""
        if self.channel_index is not None:
            raise ValueError("the two channels of each pair turn by different angles (channel_frequencies="
                             "'repeated'), so a pair has no single complex rotation: use rotations() or "
                             "rotation_blocks()")
        return torch.view_as_complex(self.rotations(grid, device, augment))

    def rotations(self, grid: Grid, device=None, augment: bool = False, tokens_first: bool = False) -> torch.Tensor:
        """Rotations as ``(cos, sin)`` pairs ``(heads or 1, P + N, head_dim / 2, 2)`` float32 (times YaRN's
        attention factor); prefix rows are the identity ``(1, 0)``. Real rather than complex so that a compiled
        graph holds no complex tensor (inductor has no complex code generation).

        ``tokens_first=True`` gives every head's rows (``num_heads``, filled even where the frequencies are shared)
        stored token-major, heads inside tokens: the layout of q and k sliced from a fused qkv, which
        :func:`apply_rotary` multiplies in memory order. ``augment=True`` (:meth:`forward` in training mode) applies
        a fresh coordinate augmentation draw, uncached, when one is set; otherwise the rotations are cached per grid
        and layout."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, type(self).__name__)
        self.check_table(grid, what="rotation table")
        device = device or self.freqs.device
        transform = self.draw_transform(augment, device)
        if transform is not None:
            return self._build(grid, device, tokens_first, transform)
        key = (grid, str(device), self.scaling, self.ref_shape, tokens_first)
        return self._cache.get(key, lambda: self._build(grid, device, tokens_first), [self.freqs])

    def draw_transform(self, augment: bool, device):
        """The train-time transform of the placed positions ``(N, components) -> (N, components)`` for one call
        (None: none, and the table is cached): the coordinate augmentation's draw (:mod:`visionpe.coords`)."""
        return self.coordinates.draw(augment, self.ndim, device)

    def _build(self, grid: Grid, device, tokens_first: bool, transform=None) -> torch.Tensor:
        wide = angle_dtype(device)  # float64 angles: exact to float32 rounding of cos/sin on any axis length
        with autocast_off(device):
            coords = self.coordinates.positions(grid, device, wide) + self.grid_offset  # (N, ndim) in grid order
            coords = coords.flip(-1) if self.axis_order == "xy" else coords  # in component order
            freqs = self.frequencies(wide).to(device)
            coords, freqs, scales = self.rescale(coords, freqs, grid, self.ref_shape)
            coords = self.place(coords, grid, scales)
            if transform is not None:  # after PI, as timm augments after ref_feat_shape
                coords = transform(coords)
            angles = torch.einsum("na,ahp->nhp", coords, freqs)  # (N, heads or 1, pairs)
            if self.channel_index is not None:
                angles = angles[..., self.channel_index.to(angles.device)]  # (N, heads or 1, pairs, 2 channels)
            magnitude = attention_factor(scales, self.scaling)
            rotations = torch.stack([angles.cos(), angles.sin()], dim=-1)
            rotations = (rotations * magnitude if self.scaling == "yarn" else rotations).float()
        prefix = self.prefix_rotations(grid.prefix, device) * magnitude  # (P, 1, pairs, 2)
        if self.channel_index is not None:  # both channels of a prefix pair keep the pair's rotation
            prefix = prefix.unsqueeze(-2)  # (P, 1, pairs, 1, 2)
        rotations = torch.cat([prefix.expand(grid.prefix, *rotations.shape[1:]), rotations])  # (P + N, heads or 1, pairs, [2 channels,] 2)
        if tokens_first:
            every_head = rotations.expand(-1, self.num_heads, *rotations.shape[2:]).contiguous()
            return rearrange(every_head, "t h ... -> h t ...")
        return rearrange(rotations, "t h ... -> h t ...").contiguous()

    def frequencies(self, dtype: torch.dtype) -> torch.Tensor:
        """The frequency vectors ``(ndim, heads or 1, pairs)`` in ``dtype`` (learned ones: as stored, times
        ``freq_mask``)."""
        freqs = full_tensor(self.freqs).to(dtype)
        return freqs if self.freq_mask is None else freqs * self.freq_mask.to(dtype)

    def rescale(self, coords: torch.Tensor, freqs: torch.Tensor, grid: Grid, ref_shape):
        """Resolution scaling of ``grid`` against ``ref_shape`` (grid order; None: none): the coordinates ``(N,
        ndim)`` (component order) and frequencies ``(ndim, heads or 1, pairs)`` as the rotation reads them, and the
        per-component size ratios ``(ndim,)``. RIFLEx keeps time out of it and lowers its intrinsic frequency."""
        scales = torch.ones(self.ndim, dtype=coords.dtype)
        if ref_shape is None:
            return coords, freqs, scales
        ref = self.components(ref_shape)
        scales = axis_scales(self.components(grid.shape), ref, coords.dtype)
        absolute = torch.tensor(self.components(grid.absolute_axes))
        scales = torch.where(absolute, torch.ones_like(scales), scales)  # an absolute axis keeps its own steps
        if grid.offset is not None and self.scaling != "none" and bool((scales != 1).any()):
            check_unscaled_placement(grid, self.scaling, self.ref_shape)
        coords = scale_positions(coords, scales, self.scaling)
        freqs = scale_frequencies(freqs, self.band_fraction, scales, ref, self.scaling, self.yarn_alpha,
                                  self.yarn_beta)
        return coords, freqs, scales

    def prefix_rotations(self, prefix: int, device) -> torch.Tensor:
        """The rotations of a grid's ``prefix`` tokens, ``(prefix, 1, pairs, 2)`` float32 ``(cos, sin)``: the identity
        (prefix tokens have no spatial position; ViT-5's register RoPE gives its registers one)."""
        return torch.tensor([1.0, 0.0], device=device).expand(prefix, 1, self.head_dim // 2, 2)

    def place(self, coords: torch.Tensor, grid: Grid, scales: torch.Tensor) -> torch.Tensor:
        """Where the patches sit for the rotation: ``coords (N, ndim)`` in component order after resolution scaling
        (``scales``: per-component size ratios), before augmentation. The identity here; VideoRoPE's diagonal
        layout moves them."""
        return coords

    def components(self, per_axis) -> tuple:
        """Per-grid-axis values in coordinate-component order: reversed for ``axis_order="xy"`` (x, the last grid
        axis, first), as given for ``"ij"``."""
        return tuple(per_axis)[::-1] if self.axis_order == "xy" else tuple(per_axis)

    def with_scaling(self, scaling: str, ref_shape=None) -> "RoPE":
        """A copy with the same frequencies that adapts to other grids by ``scaling`` against ``ref_shape``
        (default: this module's ``ref_shape``). Used to compare adaptations of one trained model."""
        check_choice("scaling", scaling, SCALINGS)
        check_scaling(scaling, self.coordinates)
        ref_shape = self.ref_shape if ref_shape is None else to_shape("ref_shape", ref_shape, self.ndim)
        if scaling != "none" and ref_shape is None:
            raise ValueError(f"scaling={scaling!r} needs ref_shape, the training grid (e.g. ref_shape=(14, 14))")
        other = copy.deepcopy(self)
        other.scaling, other.ref_shape, other._cache = scaling, ref_shape, TableCache(maxsize=16)
        return other

    def rotate(self, x: torch.Tensor, grid: Grid | Layout, cis: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate one tensor ``(B, heads, P + N, head_dim)`` (``P + K`` tokens for a layout keeping ``K`` patches:
        each kept token is rotated by its own position) by ``cis``, complex or real as :func:`apply_rotary` takes them
        (default: :meth:`rotations` of the grid, never augmented: augmentation belongs to :meth:`forward`, which
        draws once for q and k)."""
        layout = as_layout(grid)
        self.check_input("x", x, layout, self.freqs.shape[1], leading_axes=True)
        if cis is None:
            cis = self.rotations(layout.grid, x.device, tokens_first=heads_inside_tokens(x))
        return self._rotate_rows(x, layout.rows(cis))

    def _rotate_rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``x`` rotated by its rows of :meth:`rotations` (per channel with ``channel_index``)."""
        return apply_rotary(x, rows, self.pairs) if self.channel_index is None else rotate_channels(x, rows)

    def rotation_blocks(self, grid, device=None) -> torch.Tensor:
        """The 2x2 block of each pair, ``(heads or 1, N, pairs, 2, 2)``: ``[[cos_0, -sin_0], [sin_1, cos_1]]`` with
        the angles of the pair's two channels (a rotation unless they differ: ``channel_frequencies="repeated"``)."""
        if self.channel_index is None:
            return super().rotation_blocks(grid, device)
        cos, sin = self.rotations(as_grid(grid).without_prefix(), device).unbind(-1)  # (heads, N, pairs, 2)
        return torch.stack([torch.stack([cos[..., 0], -sin[..., 0]], -1), torch.stack([sin[..., 1], cos[..., 1]], -1)],
                           -2)

    def frequency_vectors(self) -> torch.Tensor:
        if self.channel_index is not None:
            raise ValueError("the two channels of each pair turn at different frequencies (channel_frequencies="
                             "'repeated'): a pair has no one frequency vector")
        return super().frequency_vectors()

    def forward(self, q: torch.Tensor, k: torch.Tensor, grid: Grid | Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k by one table (in training mode with augmentation set: one fresh draw for both)."""
        layout = as_layout(grid)
        self.check_input("q", q, layout, self.freqs.shape[1], leading_axes=True)
        self.check_input("k", k, layout, self.freqs.shape[1], leading_axes=True)
        rotations = self.rotations(layout.grid, q.device, augment=self.training, tokens_first=heads_inside_tokens(q))
        rows = layout.rows(rotations)
        return self._rotate_rows(q, rows), self._rotate_rows(k, rows)

    def scriptable(self) -> "ScriptedRoPE":
        """The TorchScript form (:class:`ScriptedRoPE`) of :class:`AxialRoPE` and :class:`MixedRoPE` (see
        :meth:`scripted_rope`); other classes (the subclasses that place, rescale or rotate otherwise) are a
        ``NotImplementedError`` naming them unless they write their own."""
        self.check_scriptable_class(AxialRoPE, MixedRoPE)
        return self.scripted_rope()

    def scripted_rope(self, maps: nn.Module | None = None) -> "ScriptedRoPE":
        """:class:`ScriptedRoPE` of this encoding's rotation (``maps``: a change of basis before it, see there): any
        coordinates without augmentation, ``scaling`` ``"none"`` or ``"pi"``, the two channels of a pair turning
        together; other settings are a ``NotImplementedError`` naming them."""
        self.check_scriptable_coordinates(normalized=True)
        name = type(self).__name__
        if self.scaling not in ("none", "pi"):
            raise TorchScriptRefusal(f"{name} with scaling={self.scaling!r}",
                                      "its TorchScript form scales positions only (scaling 'none' or 'pi')")
        if self.channel_index is not None:
            raise TorchScriptRefusal(f"{name} with channel_frequencies='repeated'",
                                      "its TorchScript form turns both channels of a pair by one angle")
        learned = "freqs" in self._parameters
        if learned and type(self).frequencies is not RoPE.frequencies:
            raise TorchScriptRefusal(name, "its learned frequencies are not RoPE's stored ones")
        # fixed frequencies as RoPE.rotations reads them (float64, masked); learned ones the parameter and its mask
        return ScriptedRoPE(freqs=self.freqs if learned else self.frequencies(torch.float64).detach(),
                            freq_mask=self.freq_mask if learned else None, coordinates=self.coordinates,
                            axis_order=self.axis_order, pairs=self.pairs,
                            ref_shape=self.ref_shape if self.scaling == "pi" else None, grid_offset=self.grid_offset,
                            maps=maps)

    @classmethod
    def model_defaults(cls, context) -> dict:
        """The model's training grid is the reference of resolution scaling (used unless ``scaling="none"``)."""
        return {**super().model_defaults(context), "ref_shape": tuple(context.grid_shape)}

    @classmethod
    def for_model(cls, context, **kwargs) -> "RoPE":
        """In a model, RoPE on integer positions interpolates to the model's grid by default (``scaling="pi"``: the
        adaptation that holds best in docs/BENCHMARK.md; at the model's own grid it is the identity);
        ``scaling="none"`` extrapolates. Normalised coordinates take no scaling."""
        coords = kwargs.get("coords", getattr(kwargs.get("coordinates"), "coords", "index"))
        if coords == "index" and "resolution" not in kwargs:  # a ResolutionScaling given says its own scaling
            kwargs = {"scaling": "pi", **kwargs}
        return super().for_model(context, **kwargs)

    def adapt(self, shape, new_shape, scaling: str | None = None) -> tuple["RoPE", str]:
        """``scaling=None`` keeps this module's own ``scaling``/``ref_shape``; ``"none"``, ``"pi"``, ``"ntk"``,
        ``"yarn"`` choose one, with ``ref_shape`` = this module's or else ``shape``."""
        pe = self if scaling is None else self.with_scaling(scaling, self.ref_shape or tuple(shape))
        if tuple(new_shape) == tuple(shape):
            return pe, "native grid"
        return pe, pe.adaptation_label()

    def adaptation_label(self) -> str:
        if self.coordinates.normalized:
            return f"RoPE on {self.coordinates.label()}"
        if self.scaling == "none":
            return "RoPE extrapolated (integer positions)"
        return f"RoPE scaling={self.scaling}, ref_shape={'x'.join(map(str, self.ref_shape))}"

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        return (f"head_dim={self.head_dim}, num_heads={self.num_heads}, ndim={self.ndim}, pairs={self.pairs!r}, "
                f"scaling={self.scaling!r}, ref_shape={self.ref_shape}{', ' + extra if extra else ''}")


class ScriptedRoPE(nn.Module):
    """TorchScript form of RoPE (:meth:`RoPE.scripted_rope`; STRING's): ``forward(q, k, shape, prefix)`` rotates ``q,
    k: (B, heads, P + N, head_dim)`` by the rotations of the input's patch grid ``shape``, computed in the graph as
    :meth:`RoPE.rotations` computes them (float64 angles of the coordinates
    :func:`~visionpe.coords.patch_positions` plus ``grid_offset``, in component order, over the ``ref_shape`` ratios
    with ``ref_shape`` given: ``scaling="pi"``; identity prefix rows), applied in real arithmetic (:func:`rotate_real`).

    ``freqs``: ``(ndim, heads or 1, pairs)`` in component order, an ``nn.Parameter`` (learned: the encoding's own,
    shared, times ``freq_mask`` when one is given) or a tensor (fixed, float64). ``maps``: a module whose
    ``forward(device)`` gives ``(query map, key map)``, each ``(heads or 1, head_dim, head_dim)``, by which q and k are
    multiplied before the rotation (:func:`~visionpe.rotary.blocks.change_basis`: STRING's ``P``, HARoPE's ``M`` and
    ``M^-T``), or None."""

    def __init__(self, *, freqs: torch.Tensor, freq_mask: torch.Tensor | None, coordinates: CoordinateSystem,
                 axis_order: str, pairs: str, ref_shape=None, grid_offset: float = 0.0,
                 maps: nn.Module | None = None):
        super().__init__()
        if isinstance(freqs, nn.Parameter):
            self.freqs = freqs
        else:
            self.register_buffer("freqs", freqs, persistent=False)
        self.register_buffer("freq_mask", freq_mask, persistent=False)
        self.coords, self.normalize_coords = coordinates.coords, coordinates.normalize_coords
        self.offset, self.xy, self.pairs = float(grid_offset), axis_order == "xy", pairs
        self.scaled = ref_shape is not None
        ndim = freqs.shape[0]
        ref = [1] * ndim if ref_shape is None else list(ref_shape)
        self.ref = ref[::-1] if self.xy else ref  # component order
        self.maps = maps

    def frequencies(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The frequency vectors ``(ndim, heads or 1, pairs)`` in ``dtype`` (times ``freq_mask``)."""
        freqs = self.freqs.to(device=device, dtype=dtype)
        mask = self.freq_mask
        if mask is not None:
            freqs = freqs * mask.to(device=device, dtype=dtype)
        return freqs

    def rotations(self, shape: List[int], prefix: int, device: torch.device) -> torch.Tensor:
        """``(cos, sin)`` pairs ``(heads or 1, P + N, head_dim / 2, 2)`` float32, prefix rows the identity."""
        wide = device_angle_dtype(device)
        axes = patch_positions(shape, self.coords, self.normalize_coords, wide, device)
        coords = grid_coordinates(axes) + self.offset  # (N, ndim) in grid order
        sizes = shape
        if self.xy:
            coords, sizes = coords.flip(-1), shape[::-1]
        freqs = self.frequencies(device, wide)
        if self.scaled:  # scale_positions(..., "pi")
            scales = torch.tensor([float(n) / float(r) for n, r in zip(sizes, self.ref)], dtype=wide, device=device)
            coords = coords / scales
        angles = torch.einsum("na,ahp->nhp", coords, freqs)  # (N, heads or 1, pairs)
        rotations = torch.stack([angles.cos(), angles.sin()], dim=-1).float()
        identity = torch.tensor([1.0, 0.0], device=device).expand(prefix, rotations.shape[1], rotations.shape[2], 2)
        return torch.cat([identity, rotations]).permute(1, 0, 2, 3)

    def forward(self, q: torch.Tensor, k: torch.Tensor, shape: List[int],
                prefix: int) -> Tuple[torch.Tensor, torch.Tensor]:
        maps = self.maps
        if maps is not None:
            query, key = maps(q.device)
            q, k = change_basis(q, query), change_basis(k, key)
        rotations = self.rotations(shape, prefix, q.device)
        return rotate_real(q, rotations, self.pairs), rotate_real(k, rotations, self.pairs)


def check_unscaled_placement(grid: Grid, scaling: str, ref_shape) -> None:
    """A grid placed in a longer one (``offset``) must not be rescaled as a whole input (PI, NTK, YaRN against
    ``ref_shape``): that would silently move it. (An axis with a spacing is absolute and is never rescaled.)"""
    raise ValueError(f"grid offset {grid.offset} places a {grid.shape} grid in a longer one, but "
                     f"scaling={scaling!r} would rescale it as a whole input against ref_shape={ref_shape}; for "
                     "streaming clips build RoPE with scaling='none'")


def check_scaling(scaling: str, coordinates: CoordinateSystem) -> None:
    """Resolution scaling (PI, NTK, YaRN) works on index coordinates against a reference grid; normalised
    coordinates span [-1, 1] on every grid and take none."""
    if coordinates.normalized and scaling != "none":
        raise ValueError(f"scaling={scaling!r} applies to coords='index'; coords={coordinates.coords!r} maps every "
                         "grid onto [-1, 1] already (a form of interpolation): use scaling='none'")


def resolve_sections(head_dim: int, ndim: int, sections, who: str) -> tuple[int, ...]:
    """Rotation pairs per grid axis: ``sections`` checked, or ``head_dim / (2 ndim)`` each by default."""
    check_positive_int("head_dim", head_dim)
    if sections is None:
        check_divisible("head_dim", head_dim, 2 * ndim, f"{who} in {ndim}D needs an equal band of rotation pairs per "
                                                        "axis; pass sections=... to split channels unevenly")
        return (head_dim // (2 * ndim),) * ndim
    check_divisible("head_dim", head_dim, 2, "rotation pairs")
    sections = to_shape("sections", sections, ndim)
    if sum(sections) != head_dim // 2:
        raise ValueError(f"sections={sections} must sum to head_dim / 2 = {head_dim // 2}")
    return sections


def section_rule(rule: str, head_dim: int, ndim: int) -> tuple[tuple[int, ...], int]:
    """``(sections, unrotated pairs)`` of a rule: every axis gets ``f = floor(P / ndim)`` of the ``P = head_dim / 2``
    pairs and the ``r = P - ndim f`` left over go to the first grid axis (``"rest_first"``: Wan's and Cosmos'
    ``[P - 2 (P // 3), P // 3, P // 3]`` over (t, h, w)) or stay unrotated at the end of the head
    (``"rest_unrotated"``: V-JEPA 2's ``head_dim // 3`` channels per axis)."""
    check_choice("sections", rule, SECTION_RULES)
    check_positive_int("head_dim", head_dim)
    check_divisible("head_dim", head_dim, 2, "rotation pairs")
    pairs = head_dim // 2
    per_axis, rest = divmod(pairs, ndim)
    if per_axis == 0:
        raise ValueError(f"sections={rule!r} gives each of {ndim} axes floor({pairs} / {ndim}) = 0 pairs: head_dim="
                         f"{head_dim} is too small")
    if rule == "rest_first":
        return (per_axis + rest,) + (per_axis,) * (ndim - 1), 0
    return (per_axis,) * ndim, rest


def pair_permutation(components, pair_order: str, ndim: int) -> list[int] | None:
    """Where each slot's pair comes from when the pairs of a spectrum layout (``components``: the coordinate
    component of each pair, in spectrum order) are reordered: ``"by_axis"`` puts each component's pairs together
    in component order (keeping their order: Pixtral's h block then w block), ``"alternate"`` deals them out in
    turn, one pair of each component (MoonViT: x, y, x, y, ...). None for ``"spectrum"`` (the layout's own
    order)."""
    if pair_order == "spectrum":
        return None
    seen = [0] * ndim
    rank = []
    for c in components:
        rank.append(seen[c])
        seen[c] += 1
    n = len(components)
    key = [c * n + p for p, c in enumerate(components)] if pair_order == "by_axis" else \
        [r * ndim + c for r, c in zip(rank, components)]
    return sorted(range(n), key=key.__getitem__)


def repeated_channel_index(band_sizes, num_pairs: int) -> torch.Tensor:
    """``(num_pairs, 2)``: the pair whose angle each channel of each pair reads under V-JEPA 2's repeated frequencies.
    Band ``b`` of ``n`` pairs starting at pair ``s`` lays its frequencies ``w_0 .. w_{n-1}`` out twice over its ``2n``
    channels (``.repeat(..., 2)`` where a rotation has ``.repeat_interleave(2)``), so channel ``c`` of the band reads
    ``w_{c mod n}``: pair ``s + j`` turns its channels at ``w_{2j mod n}`` and ``w_{(2j + 1) mod n}``. Pairs after
    the bands map to themselves."""
    index = torch.arange(num_pairs)[:, None].repeat(1, 2)
    start = 0
    for n in band_sizes:
        j = torch.arange(n)
        index[start:start + n] = start + torch.stack([(2 * j) % n, (2 * j + 1) % n], dim=-1)
        start += n
    return index


def check_layout(ndim: int, directions: str, allowed, head_axes, spectrum: str = "axial") -> None:
    """Layout options that exclude each other: golden directions are 2D; a per-head axis assignment keeps each
    head on its own axes with a spectrum per axis."""
    check_choice("directions", directions, allowed)
    if directions == "golden" and ndim != 2:
        raise ValueError(f"directions='golden' spreads frequency directions over the plane (2D); got ndim={ndim}")
    if head_axes is not None and (directions == "golden" or spectrum != "axial"):
        raise ValueError(f"head_axes assigns whole axes to heads (each with its own spectrum); it does not combine "
                         f"with directions={directions!r} or spectrum={spectrum!r}")


class AxialRoPE(RoPE):
    """Axial RoPE: each axis owns a block of rotation pairs with frequencies ``1/theta^(i/n)``.

    Matches rope-vit ``compute_axial_cis`` and timm ``RotaryEmbeddingCat(in_pixels=False)`` in 2D
    (``theta=100`` is rope-vit's default). ``sections`` gives the pairs per axis in grid order
    (``(T, H, W)``); they must sum to ``head_dim / 2``.

    The constructor takes the sizes (``head_dim``, ``num_heads``, ``ndim``), ``theta``, ``ref_shape`` and
    ``grid_offset`` directly and the conventions as records (:mod:`visionpe.rotary.conventions`): ``bands``
    (:class:`FrequencyBands`: ``spectrum``, ``min_period``/``max_period``, ``max_res``/``linear_bands``,
    ``ntk_factor``, ``rotate_fraction``), ``channels`` (:class:`ChannelLayout`: ``pairs``, ``sections``,
    ``axis_order``, ``pair_order``, ``channel_frequencies``, ``inert_axes``, ``directions``, ``head_axes``),
    ``coordinates`` (:class:`~visionpe.coords.CoordinateSystem`: ``coords``, ``normalize_coords``, the augmentation)
    and ``resolution`` (:class:`ResolutionScaling`: ``scaling``, ``yarn_alpha``, ``yarn_beta``). Built by name
    (``vpe.build("rope_axial", ...)``, :meth:`for_model`, presets) it takes every field as a flat keyword of the same
    name (:meth:`~visionpe.rotary.conventions.FlatKeywords.from_keywords`); the keywords below are those fields.

    ``axis_order``: which axis owns the first block of pairs: ``"xy"`` (the last grid axis, x: rope-vit, timm
    ``grid_indexing="xy"``) or ``"ij"`` (grid order, y first: timm Eva's default ``grid_indexing="ij"``).

    ``spectrum``: ``"axial"`` restarts the spectrum on every axis (``n`` bands each); ``"mrope"`` is Qwen2-VL's
    M-RoPE: ONE spectrum ``1/theta^(p/(d/2))`` over all pairs, cut into consecutive chunks of ``sections`` pairs
    for (t, h, w); ``"mrope_interleaved"`` assigns the pairs of that spectrum in a t, h, w stride (Qwen3-VL, timm
    ``RotaryEmbeddingMRope``; ``sections`` bound the strided extents, pairs left over turn with axis 0). Use
    ``pairs="half"`` and ``theta=10000`` for Qwen's layout. ``"videorope"`` (3D) is VideoRoPE's low-frequency
    temporal allocation on that one spectrum: the last (lowest) ``sections[0]`` pairs turn with time, the others
    alternate h, w from the highest frequency down (``videorope`` adds its diagonal layout, see
    :class:`~visionpe.rotary.videorope.VideoRoPE`).

    Frequency layouts (:mod:`visionpe.rotary.layouts`): ``directions="axial"`` (default) or ``"golden"`` (2D:
    golden-angle directions, one set per head, so the module holds ``num_heads`` tables); ``rotate_fraction=p``
    (p-RoPE: only the highest ``floor(p n)`` frequencies of each band rotate); ``head_axes`` (one string of axis
    letters per head, ``""`` for an unrotated head).

    Coordinates and augmentation (:mod:`visionpe.coords`, the same keywords as every coordinate-reading encoding):
    ``coords="index"`` (default; ``theta`` gives ``w_i = theta^(-i/n)`` radians per patch) or ``"normalized"``
    (DINOv3: centred ``[-1, 1]`` by ``normalize_coords`` ``"separate"``, ``"min"``, ``"max"``; ``theta`` is then
    DINOv3's ``temperature``: periods ``theta^(i/n)`` in normalised units, ``w_i = 2 pi theta^(-i/n)``).
    ``min_period``/``max_period`` (both or neither) give DINOv3's geometric periods instead,
    ``w_i = 2 pi / (min_period (max_period/min_period)^(i/(n-1)))``, in the units of ``coords``.
    ``shift_coords``, ``jitter_coords``, ``rescale_coords``: timm's train-time augmentation (see :class:`RoPE`).
    ``build("rope_axial", head_dim=d, theta=T, coords="normalized", axis_order="ij", pairs="half")`` is timm's
    ``RotaryEmbeddingDinoV3(d, temperature=T)`` (its ``rotate_half`` layout, y pairs first).
    A grid's ``spacing`` (e.g. Qwen2.5-VL's absolute time) is read with the coordinates (``coords="index"``); an
    axis with a spacing is absolute, so resolution scaling leaves it alone (the others are scaled as usual).

    Conventions of foundation models (:mod:`visionpe.presets` composes them):

    - ``sections="rest_first"`` / ``"rest_unrotated"``: sections by rule (:func:`section_rule`): ``floor(P / ndim)``
      pairs per axis, the rest to the first grid axis (Wan, Cosmos) or left unrotated at the end of the head
      (V-JEPA 2).
    - ``grid_offset``: a constant added to every index coordinate (patches counted from 1: Perception Encoder,
      Llama 4); see :class:`RoPE`.
    - ``ntk_factor``: a fixed NTK-aware factor per grid axis (one number: all axes), ``s_a >= 1`` whatever the grid:
      band ``i`` of the ``n`` pairs of an axis is scaled by ``s_a^(-i/(n-1))``, i.e. ``theta_a = theta *
      s_a^(n/(n-1))`` (Cosmos' ``rope_scale``, ``(2, 1, 1)`` over (t, h, w)). ``scaling="ntk"`` derives the same
      factor from the grid instead.
    - ``pair_order``: the order of the rotation pairs in the head: ``"spectrum"`` (the spectrum's own layout),
      ``"by_axis"`` (each axis's pairs together, axes in component order: Pixtral, whose h and w take alternate
      frequencies of one spectrum, ``spectrum="mrope_interleaved", pair_order="by_axis"``) or ``"alternate"`` (one
      pair of each axis in turn: MoonViT's x, y, x, y).
    - ``max_res`` (with ``linear_bands``): timm's pixel-frequency bands (``RotaryEmbeddingCat(in_pixels=True)``,
      ``pixel_freq_bands``) in place of ``theta``'s: ``w_i = pi * linspace(1, max_res / 2, n)_i``
      (``linear_bands=True``) or ``pi * 2 ** linspace(0, log2(max_res) - 1, n)_i`` (the default), lowest first, in
      radians per unit of ``coords`` (timm reads them on ``coords="pixel"``, its grid of the end patches on -1 and
      1). Resolution scaling ``"none"`` or ``"pi"``; all pairs rotate.
    - ``inert_axes`` (``spectrum="mrope"`` or ``"mrope_interleaved"``): leading axes of the M-RoPE layout that the grid
      does not have, at coordinate 0, so their pairs stay unrotated; ``sections`` then has ``ndim + inert_axes``
      entries. timm's ``RotaryEmbeddingMRope`` on an image is ``ndim=2, inert_axes=1, sections=(t, h, w)``: the
      (t, h, w) interleave with time at 0 (Qwen3-VL's vision tower on one image).
    - ``channel_frequencies="repeated"`` (axial spectrum, interleaved pairs): V-JEPA 2's layout, where each axis's
      frequencies are laid out twice over its channels instead of once per pair, so the two channels of a pair turn
      by different angles (:func:`repeated_channel_index`, :func:`rotate_channels`): not a rotation, and scores are
      not relative. ``"paired"`` (default) is RoPE.

    Tuned per test size (:attr:`knob`, ``visionpe sweep --tune``): ``theta``, as factors on the trained one
    (LookHere's protocol: base 100 -> 1250 at 1024 px from 224).
    """

    knob = Knob("theta", (0.5, 1.0, 2.0, 4.0, 8.0, 16.0), relative=True)

    def __init__(self, *, head_dim: int, num_heads: int = 1, ndim: int = 2, theta: float = 100.0, ref_shape=None,
                 grid_offset: float = 0.0, bands: FrequencyBands = FrequencyBands(),
                 channels: ChannelLayout = ChannelLayout(), coordinates: CoordinateSystem = CoordinateSystem(),
                 resolution: ResolutionScaling = ResolutionScaling()):
        check_records("AxialRoPE", AxialRoPE.refused, bands=bands, channels=channels, coordinates=coordinates,
                      resolution=resolution)
        check_ndim(ndim)
        check_positive_int("num_heads", num_heads)
        check_number("theta", theta, minimum=1.0, inclusive=False)
        spectrum, sections = bands.spectrum, channels.sections
        check_layout(ndim, channels.directions, ("axial", "golden"), channels.head_axes, spectrum)
        self.unrotated_pairs = 0
        if isinstance(sections, str):
            sections, self.unrotated_pairs = section_rule(sections, head_dim, ndim)
        check_model_conventions(bands, channels, self.unrotated_pairs)
        self.ntk_factor = None if bands.ntk_factor is None else check_ntk_factor(bands.ntk_factor, ndim)
        self.pair_order, self.channel_frequencies = channels.pair_order, channels.channel_frequencies
        self.head_axes = parse_head_axes(channels.head_axes, ndim, num_heads)
        self.directions, self.rotate_fraction = channels.directions, bands.rotate_fraction
        self.inert_axes = check_inert_axes(channels.inert_axes, spectrum, channels.pair_order)
        layout_ndim = ndim + self.inert_axes  # the axes the spectrum's layout deals pairs to
        if spectrum == "videorope" and ndim != 3:
            raise ValueError(f"spectrum='videorope' gives time (axis 0 of a (T, H, W) grid) the lowest frequencies; "
                             f"it needs ndim=3, got ndim={ndim}")
        if self.head_axes is not None and sections is None:  # each head splits its pairs over its own axes
            check_divisible("head_dim", head_dim, 2, "rotation pairs")
        elif spectrum == "mrope_interleaved":
            check_divisible("head_dim", head_dim, 2, "rotation pairs")
            default = (head_dim // (2 * layout_ndim),) * layout_ndim
            sections = to_shape("sections", sections if sections is not None else default, layout_ndim)
            if sum(sections) > head_dim // 2:  # less is allowed: time takes the pairs left over (timm, GenLIP)
                raise ValueError(f"sections={sections} ask for {sum(sections)} rotation pairs but head_dim / 2 = "
                                 f"{head_dim // 2}; with spectrum='mrope_interleaved' they may sum to at most "
                                 f"head_dim / 2 (pairs left over turn with axis 0)")
        else:
            sections = resolve_sections(head_dim - 2 * self.unrotated_pairs, layout_ndim, sections, "rope_axial")
        self.theta, self.sections, self.spectrum, self.num_pairs = float(theta), sections, spectrum, head_dim // 2
        pixel = check_pixel_bands(bands, resolution.scaling)
        self.max_res, self.linear_bands = (None, False) if pixel is None else pixel
        self.band_options = dict(per_turn=coordinates.normalized, periods=bands.periods, pixel=pixel)
        self.num_heads, self.ndim = num_heads, ndim  # the golden and per-head layouts build a table per head
        self.axis_order = channels.axis_order
        freqs, fraction, _ = self.initial_state()  # (ndim, heads or 1, pairs), (pairs,) or (heads, pairs)
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, freqs=freqs, band_fraction=fraction,
                         ref_shape=ref_shape, channels=channels, coordinates=coordinates, resolution=resolution,
                         grid_offset=grid_offset)
        self.register_buffer("channel_index", self._channel_index(), persistent=False)  # (head_dim/2, 2) or None

    def initial_state(self, generator=None) -> tuple[torch.Tensor, torch.Tensor, None]:
        """The fixed frequencies ``(ndim, heads or 1, pairs)`` float32 and band fractions (see :meth:`RoPE.initial_state`);
        nothing is drawn."""
        if self.head_axes is not None:
            fraction = self._head_layout(self.axis_order, torch.float32)[1]
        else:
            fraction = self._arrange(self._band_fraction(self.axis_order), self.axis_order)
        return self._frequencies(self.axis_order, torch.float32), fraction, None

    def _channel_index(self) -> torch.Tensor | None:
        """V-JEPA 2's per-channel pair index ``(head_dim/2, 2)`` (``channel_frequencies="repeated"``), else None."""
        if self.channel_frequencies != "repeated":
            return None
        return repeated_channel_index(self.sections[::-1] if self.axis_order == "xy" else self.sections, self.num_pairs)

    def derived_buffers(self) -> dict:
        return {**super().derived_buffers(), "channel_index": self._channel_index()}

    def _head_layout(self, axis_order: str, dtype: torch.dtype):
        return head_axes_layout(self.head_axes, self.num_pairs, self.ndim, axis_order, self.theta,
                                self.rotate_fraction, self.sections, dtype, bands=self.band_options)

    def _pair_components(self, axis_order: str) -> list[int | None]:
        """The coordinate component each rotated pair turns along, in the spectrum's own order (before
        ``pair_order``); None for a pair of an inert axis (``inert_axes``)."""
        ndim, inert = self.ndim, self.inert_axes
        if self.spectrum == "axial":
            order = self.sections[::-1] if axis_order == "xy" else self.sections
            return [c for c, n in enumerate(order) for _ in range(n)]
        if self.spectrum == "videorope":
            axes = videorope_axes(self.sections, self.num_pairs)
        else:
            axes = mrope_axes(self.sections, self.num_pairs, interleaved=self.spectrum == "mrope_interleaved")
        axes = [None if a < inert else a - inert for a in axes]  # grid axes
        return [a if a is None or axis_order == "ij" else ndim - 1 - a for a in axes]

    def _band_fraction(self, axis_order: str) -> torch.Tensor:
        """NTK's exponent ``i / (n - 1)`` of each rotated pair, in the spectrum's own order."""
        if self.spectrum != "axial":
            return band_fractions([self.num_pairs])
        return band_fractions(self.sections[::-1] if axis_order == "xy" else self.sections)

    def _arrange(self, values: torch.Tensor, axis_order: str) -> torch.Tensor:
        """Per-pair ``values (..., rotated pairs)`` put in the head's pair order (``pair_order``), the unrotated pairs
        (``sections="rest_unrotated"``) appended as zeros: ``(..., head_dim / 2)``."""
        perm = pair_permutation(self._pair_components(axis_order), self.pair_order, self.ndim)
        if perm is not None:
            values = values[..., perm]
        tail = values.new_zeros(*values.shape[:-1], self.unrotated_pairs)
        return torch.cat([values, tail], dim=-1)

    def _frequencies(self, axis_order: str, dtype: torch.dtype) -> torch.Tensor:
        if self.head_axes is not None:
            return self._head_layout(axis_order, dtype)[0]
        ndim = self.ndim
        if self.spectrum == "axial":
            order = self.sections[::-1] if axis_order == "xy" else self.sections
            freqs, bands = axial_frequencies(order, self.theta, dtype, **self.band_options), order
        else:
            components = self._pair_components(axis_order)
            freqs = spectrum_frequencies(components, ndim, self.theta, dtype, **self.band_options)
            bands = [self.num_pairs]
        if self.directions == "golden":
            freqs = golden_directions(freqs.abs().sum(0)[0], self.num_heads)
        freqs = freqs * rotated_pairs(bands, self.rotate_fraction).to(dtype)
        if self.ntk_factor is not None:  # a fixed factor per axis, in component order
            factor = torch.tensor(self.ntk_factor[::-1] if axis_order == "xy" else self.ntk_factor, dtype=dtype)
            freqs = freqs * factor[:, None, None] ** -self._band_fraction(axis_order).to(dtype)
        return self._arrange(freqs, axis_order)

    def frequencies(self, dtype: torch.dtype) -> torch.Tensor:
        """Fixed frequencies recomputed in ``dtype`` (float64: exact angles on long axes; the float32 buffer is
        off by ~2e-9 relative, 5e-4 rad at position 262 144)."""
        return self._frequencies(self.axis_order, dtype).to(self.freqs.device)

    def extra_repr(self) -> str:
        parts = [f"sections={self.sections}"] if self.unrotated_pairs else []
        parts += [f"unrotated_pairs={self.unrotated_pairs}"] if self.unrotated_pairs else []
        parts += [f"grid_offset={self.grid_offset}"] if self.grid_offset else []
        parts += [f"max_res={self.max_res}, linear_bands={self.linear_bands}"] if self.max_res is not None else []
        parts += [f"spectrum={self.spectrum!r}, sections={self.sections}, inert_axes={self.inert_axes}"] \
            if self.inert_axes else []
        parts += [f"ntk_factor={self.ntk_factor}"] if self.ntk_factor is not None else []
        parts += [f"pair_order={self.pair_order!r}"] if self.pair_order != "spectrum" else []
        parts += ["channel_frequencies='repeated'"] if self.channel_frequencies != "paired" else []
        return super().extra_repr() + layout_repr(self) + "".join(", " + p for p in parts)


def check_pixel_bands(bands: FrequencyBands, scaling: str) -> tuple[float, bool] | None:
    """timm's pixel-frequency bands ``(max_res, linear_bands)``, or None without ``max_res``. Their bands go from the
    lowest frequency up, so NTK's and YaRN's per-band rules and p-RoPE's (which read bands from the highest down) do
    not apply; DINOv3's periods are another spectrum."""
    if bands.pixel is None:
        return None
    clash = [name for name, on in (("min_period/max_period", bands.periods is not None),
                                   (f"scaling={scaling!r}", scaling not in ("none", "pi")),
                                   (f"rotate_fraction={bands.rotate_fraction}", bands.rotate_fraction != 1.0)) if on]
    if clash:
        raise ValueError(f"max_res={bands.max_res} gives timm's pixel-frequency bands (lowest first); it does not "
                         f"combine with {', '.join(clash)} (use scaling 'none' or 'pi', every pair rotating)")
    return bands.pixel


def check_inert_axes(inert_axes: int, spectrum: str, pair_order: str) -> int:
    """Inert leading axes of an M-RoPE layout: only on M-RoPE's one spectrum, in its own pair order."""
    if inert_axes and spectrum not in ("mrope", "mrope_interleaved"):
        raise ValueError(f"inert_axes={inert_axes} deals M-RoPE's pairs to axes the grid does not have; it needs "
                         f"spectrum='mrope' or 'mrope_interleaved', got spectrum={spectrum!r}")
    if inert_axes and pair_order != "spectrum":
        raise ValueError(f"inert_axes={inert_axes} keeps M-RoPE's own pair order; got pair_order={pair_order!r}")
    return inert_axes


def check_ntk_factor(ntk_factor, ndim: int) -> tuple[float, ...]:
    """One NTK factor per grid axis (a single number for all; each checked ``>= 1`` by :class:`FrequencyBands`)."""
    values = ntk_factor if isinstance(ntk_factor, tuple) else (ntk_factor,) * ndim
    if len(values) != ndim:
        raise ValueError(f"ntk_factor={ntk_factor!r} must be one number >= 1 or one per grid axis ({ndim})")
    return values


def check_model_conventions(bands: FrequencyBands, channels: ChannelLayout, unrotated: int) -> None:
    """The foundation-model conventions of :class:`AxialRoPE` are defined on axis-aligned frequencies shared by the
    heads; the repeated channel frequencies also on per-axis bands of interleaved pairs in the spectrum's order
    (``unrotated``: the pairs ``sections="rest_unrotated"`` leaves unrotated)."""
    spectrum, pairs, pair_order = bands.spectrum, channels.pairs, channels.pair_order
    directions, head_axes, channel_frequencies = channels.directions, channels.head_axes, channels.channel_frequencies
    chosen = [name for name, on in (("sections='rest_unrotated'", unrotated),
                                    ("ntk_factor", bands.ntk_factor is not None),
                                    (f"pair_order={pair_order!r}", pair_order != "spectrum"),
                                    ("channel_frequencies='repeated'", channel_frequencies != "paired")) if on]
    if chosen and (directions != "axial" or head_axes is not None):
        raise ValueError(f"{', '.join(chosen)} need axis-aligned frequencies shared by the heads (directions='axial', "
                         f"no head_axes); got directions={directions!r}, head_axes={head_axes!r}")
    if unrotated and spectrum != "axial":
        raise ValueError(f"sections='rest_unrotated' splits the pairs into per-axis bands; spectrum={spectrum!r} has "
                         "one spectrum over all pairs: use spectrum='axial'")
    if channel_frequencies == "repeated" and (spectrum, pairs, pair_order) != ("axial", "interleaved", "spectrum"):
        raise ValueError(f"channel_frequencies='repeated' is V-JEPA 2's layout of per-axis bands over interleaved "
                         f"pairs: it needs spectrum='axial', pairs='interleaved', pair_order='spectrum'; got "
                         f"spectrum={spectrum!r}, pairs={pairs!r}, pair_order={pair_order!r}")


class MixedRoPE(RoPE):
    """RoPE-Mixed (Heo et al. 2024): learned frequency vectors per head, ``freqs: (ndim, heads, head_dim/2)``.

    Initialised as rope-vit's ``init_random_2d_freqs`` (``theta=10``), generalised to nD with one random
    rotation per head; ``sections`` sets the bands per direction group (grid order), as for ``rope_axial``.
    ``freqs`` (timm's ``RotaryEmbeddingMixed.freqs[:, layer]``) is excluded from weight decay through
    ``no_weight_decay()``.

    The constructor takes ``head_dim``, ``num_heads`` (positionally too), then keywords: ``ndim``, ``theta``,
    ``ref_shape``, ``generator`` and the records of :class:`AxialRoPE` but the fields of fixed axial frequencies
    (:data:`refused`); the default ``channels`` is ``ChannelLayout(directions="random")``. By name it takes their
    fields as flat keywords.

    Frequency layouts of the initialisation (:mod:`visionpe.rotary.layouts`): ``directions="random"`` (default,
    rope-vit), ``"axial"`` (start as ``rope_axial``) or ``"golden"`` (2D golden-angle directions);
    ``rotate_fraction=p`` (p-RoPE: the lowest ``n - floor(p n)`` frequencies of each band are 0 and stay 0 while
    the others learn); ``head_axes`` (one string of axis letters per head: a head learns frequency vectors inside
    its own axes only, ``""`` stays unrotated). What stays 0 is held by ``freq_mask`` (see :class:`RoPE`).

    Coordinates and augmentation (:mod:`visionpe.coords`, the same keywords as every coordinate-reading encoding):
    ``coords="index"`` (default; initial magnitudes ``|f_i| = theta^(-i/n)`` radians per patch) or
    ``"normalized"`` (DINOv3: centred ``[-1, 1]`` by ``normalize_coords`` ``"separate"``, ``"min"``, ``"max"``;
    initial magnitudes ``|f_i| = 2 pi theta^(-i/n)``, periods ``theta^(i/n)`` in normalised units).
    ``min_period``/``max_period`` (both or neither) initialise DINOv3's geometric periods instead,
    ``|f_i| = 2 pi / (min_period (max_period/min_period)^(i/(n-1)))``, in the units of ``coords``; the
    directions are drawn as above. ``shift_coords``, ``jitter_coords``, ``rescale_coords``: timm's train-time
    augmentation (see :class:`RoPE`).

    Tuned per test size (:attr:`knob`): the resolution ``scaling`` (its learned frequencies do not read ``theta``
    once trained); nothing on normalised coordinates, which take no scaling.
    """

    @property
    def knob(self) -> Knob | None:
        return None if self.coordinates.normalized else Knob("scaling", tuple(self.scalings))

    refused = AXIAL_CONVENTIONS

    def __init__(self, head_dim: int, num_heads: int, *, ndim: int = 2, theta: float = 10.0, ref_shape=None,
                 generator=None, bands: FrequencyBands = FrequencyBands(),
                 channels: ChannelLayout = ChannelLayout(directions="random"),
                 coordinates: CoordinateSystem = CoordinateSystem(),
                 resolution: ResolutionScaling = ResolutionScaling()):
        check_records("MixedRoPE", MixedRoPE.refused, bands=bands, channels=channels, coordinates=coordinates,
                      resolution=resolution)
        check_ndim(ndim)
        check_positive_int("num_heads", num_heads)
        check_generator(generator)
        check_layout(ndim, channels.directions, DIRECTIONS, channels.head_axes)
        head_axes, sections = parse_head_axes(channels.head_axes, ndim, num_heads), channels.sections
        if head_axes is not None and sections is None:
            check_positive_int("head_dim", head_dim)
            check_divisible("head_dim", head_dim, 2, "rotation pairs")
        else:
            sections = resolve_sections(head_dim, ndim, sections, "rope_mixed")
        check_number("theta", theta, minimum=1.0, inclusive=False)
        self.head_dim, self.num_heads, self.ndim, self.axis_order = head_dim, num_heads, ndim, channels.axis_order
        self.theta, self.sections = float(theta), sections
        self.band_options = dict(per_turn=coordinates.normalized, periods=bands.periods)
        self.directions, self.rotate_fraction, self.head_axes = channels.directions, bands.rotate_fraction, head_axes
        freqs, band_fraction, free = self.initial_state(generator)  # (ndim, heads, pairs), (pairs,), mask or None
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim,
                         freqs=nn.Parameter(freqs.contiguous()),  # FSDP shards contiguous parameters only
                         band_fraction=band_fraction, ref_shape=ref_shape, channels=channels, coordinates=coordinates,
                         resolution=resolution)
        self.register_buffer("freq_mask", free, persistent=False)  # (ndim, heads, pairs) or None

    def initial_state(self, generator=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """rope-vit's random initial frequencies drawn from ``generator`` (see :meth:`RoPE.initial_state`), the band
        fractions and the mask of frequencies that may move (None: all)."""
        head_axes, directions, sections, bands = self.head_axes, self.directions, self.sections, self.band_options
        if head_axes is not None:
            def rotations(k):
                return random_rotations(1, k, generator)[0] if directions == "random" else torch.eye(k)
            return head_axes_layout(head_axes, self.head_dim // 2, self.ndim, self.axis_order, self.theta,
                                    self.rotate_fraction, sections, bands=bands, rotations=rotations)
        order = sections[::-1] if self.axis_order == "xy" else sections
        if directions == "random":
            freqs = mixed_frequencies(order, self.num_heads, self.theta, generator, **bands)
        else:
            freqs = axial_frequencies(order, self.theta, torch.float64, **bands).expand(-1, self.num_heads, -1)
            if directions == "golden":  # angles up to heads * pairs * 2.4 rad: computed in float64
                freqs = golden_directions(freqs.abs().sum(0)[0], self.num_heads)
            freqs = freqs.float()
        rotating = rotated_pairs(order, self.rotate_fraction).float()
        every = all(rotated_count(n, self.rotate_fraction) == n for n in order)  # not read from a (meta) tensor
        free = None if every else rotating.expand_as(freqs).clone()
        return freqs * rotating, band_fractions(order), free

    def extra_repr(self) -> str:
        return super().extra_repr() + layout_repr(self)


def layout_repr(pe: RoPE) -> str:
    """The frequency layout options that differ from the defaults, for ``extra_repr``."""
    default = "random" if isinstance(pe, MixedRoPE) else "axial"
    parts = [f"directions={pe.directions!r}"] if pe.directions != default else []
    if pe.rotate_fraction != 1.0:
        parts.append(f"rotate_fraction={pe.rotate_fraction}")
    if pe.head_axes is not None:
        letters = AXIS_LETTERS[pe.ndim]
        parts.append(f"head_axes={tuple(''.join(letters[a] for a in axes) for axes in pe.head_axes)}")
    return "".join(", " + p for p in parts)
