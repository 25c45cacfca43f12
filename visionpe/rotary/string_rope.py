"""STRING (Schenck et al., ICML 2025, "Learning the RoPEs: Better 2D and 3D Position Encodings with STRING"): RoPE
after a learned orthogonal change of basis, the most general translation-invariant rotation."""
from __future__ import annotations

import math
from typing import Tuple

import torch
from torch import nn

from .._checks import check_choice, check_generator, check_number
from .._compat import autocast_off, is_exporting
from ..coords import CoordinateSystem
from ..sharding import full_tensor
from ..grid import as_grid, grid_coordinates
from ._base import pair_blocks
from .blocks import change_basis, num_upper, skew_from_upper
from .learned import LearnedRotation
from .rope import ScriptedRoPE, apply_rotary, mixed_frequencies, resolve_sections

VARIANTS = ("cayley", "circulant")


# Newton-Schulz steps of the Cayley transform while exporting: the residual squares each step from at most
# 1 - 1/||I + S||_inf^2, so 40 steps reach float64's precision for every S with row sums below ~1e5.
CAYLEY_EXPORT_STEPS = 40


def cayley(skew_matrices: torch.Tensor) -> torch.Tensor:
    """Cayley transform ``P = (I - S)(I + S)^-1 = (I + S)^-1 (I - S)`` of skew-symmetric ``S (..., d, d)``: orthogonal,
    ``det P = 1`` (``I + S`` is invertible for every skew ``S``); one linear solve, or while exporting (ONNX has no
    solve) ``cayley_by_iteration``. A TorchScript function (scripted, the solve)."""
    if not torch.jit.is_scripting():
        if is_exporting():
            return cayley_by_iteration(skew_matrices, steps=CAYLEY_EXPORT_STEPS)
    eye = torch.eye(skew_matrices.shape[-1], dtype=skew_matrices.dtype, device=skew_matrices.device)
    return torch.linalg.solve(eye + skew_matrices, eye - skew_matrices)


def cayley_by_iteration(skew_matrices: torch.Tensor, *, steps: int) -> torch.Tensor:
    """The Cayley transform by matrix products only: ``P = (I + S)^-1 (I - S) = 2 (I + S)^-1 - I``, the inverse of
    ``A = I + S`` by Newton-Schulz ``X <- X (2I - A X)`` from ``X = A^T / ||A||_inf^2`` (``||A||_1 = ||A||_inf`` for
    a skew ``S``; the singular values of ``A`` are ``>= 1``), whose residual ``I - X A`` squares each step.
    ``skew_matrices (..., d, d)`` -> ``(..., d, d)``."""
    eye = torch.eye(skew_matrices.shape[-1], dtype=skew_matrices.dtype, device=skew_matrices.device)
    matrix = eye + skew_matrices  # A  (..., d, d)
    row_sums = matrix.abs().sum(-1).amax(-1)[..., None, None]  # ||A||_inf  (..., 1, 1)
    inverse = matrix.mT / row_sums.square()
    for _ in range(steps):
        inverse = inverse @ (2 * eye - matrix @ inverse)
    return 2 * inverse - eye


def fourier_basis(size: int, dtype=torch.float64) -> torch.Tensor:
    """Orthonormal real Fourier basis ``(size, size)`` (rows), ``size`` even: rows ``2(m-1), 2(m-1)+1`` are
    ``sqrt(2/d) cos(2 pi m l / d)`` and ``sqrt(2/d) sin(2 pi m l / d)`` for ``m = 1 .. d/2 - 1``, then the constant
    ``1/sqrt(d)`` and the alternating ``(-1)^l / sqrt(d)``: the planes on which every circulant matrix acts."""
    l = torch.arange(size, dtype=dtype)
    m = torch.arange(1, size // 2, dtype=dtype)[:, None]
    waves = torch.stack([torch.cos(2 * math.pi * m * l / size), torch.sin(2 * math.pi * m * l / size)], dim=1)
    rows = [math.sqrt(2 / size) * waves.flatten(0, 1), torch.ones(1, size, dtype=dtype) / math.sqrt(size),
            (1 - 2 * (l % 2))[None] / math.sqrt(size)]
    return torch.cat(rows)


def circulant_spectrum(size: int, dtype=torch.float64) -> torch.Tensor:
    """``M (size/2, size)``, row ``m - 1`` = ``2 sin(2 pi m l / d)`` (last row zero): the frequency of Fourier plane
    ``m`` under the generator ``C - C^T`` of the circulant ``C_{ij} = c_{(i - j) mod d}`` is ``(M c)_m`` (the
    constant and alternating channels, the last pair of :func:`fourier_basis`, never turn)."""
    l = torch.arange(size, dtype=dtype)
    m = torch.arange(1, size // 2, dtype=dtype)[:, None]
    return torch.cat([2 * torch.sin(2 * math.pi * m * l / size), torch.zeros(1, size, dtype=dtype)])


class StringRoPE(LearnedRotation):
    """STRING (Schenck et al., ICML 2025): ``R(c) = exp(sum_k c_k L_k)`` with commuting skew-symmetric generators,
    computed as RoPE after a learned orthogonal change of basis ``P`` (the paper's Theorem 3.4: ``R = P^T RoPE P``;
    the leading ``P^T`` cancels in ``q . k``, so q and k become ``RoPE(c) P q``, scores ``q_i^T R(c_i)^T R(c_j) k_j``,
    a function of ``c_j - c_i`` only: translation invariant by construction).

    ``variant="cayley"`` (Cayley-STRING, Eq. 10): ``P = (I - S)(I + S)^-1`` with ``S`` learned skew-symmetric per head
    (``skew``: its entries above the diagonal, initialised to 0, so ``P = I``) and learned RoPE frequency vectors
    ``freqs (ndim, heads, head_dim/2)`` (RoPE-Mixed's: the plane of pair ``p`` turns by ``<c, f_p>``); at
    initialisation it is ``rope_mixed`` (rope-vit's init, ``theta``, ``sections`` as there). ``P`` is one linear
    solve per head per forward in training, cached in evaluation; applying it is one ``d x d`` product per token (the
    paper notes that at inference ``P`` can be folded into the q and k projections; not done here).

    ``variant="circulant"`` (Circulant-STRING): ``L_k = C_k - C_k^T`` with ``C_k`` the circulant matrix of a learned
    first column ``circulant[k] (heads, head_dim)`` (``C_{ij} = c_{(i-j) mod d}``). Circulants share the real Fourier
    basis (:func:`fourier_basis`, fixed), in which ``L_k`` turns plane ``m`` at frequency ``2 sum_l c_l
    sin(2 pi m l / d)``; the constant and alternating channels never turn. Initialised so those frequencies are
    RoPE-Mixed's initial ones (the last band of the last group dropped). The basis is applied as one ``d x d`` product
    (the paper uses an FFT, ``O(d log d)``; a real matrix product compiles everywhere: inductor generates no complex
    code).

    Frequency components and generators are in ``xy`` order (last grid axis first), as ``rope_mixed``.
    Coordinates (:mod:`visionpe.coords`): ``coords="index"`` (default; ``scaling="pi"`` interpolates positions to
    ``ref_shape`` on another grid, ``"none"`` extrapolates; in a model ``"pi"`` against the model's grid) or
    ``"normalized"`` (centred ``[-1, 1]`` on every grid; initial magnitudes ``2 pi theta^(-i/n)``). On a new grid
    the learned generators are evaluated at the new coordinates: the rotation stays relative. ``shift_coords``,
    ``jitter_coords``, ``rescale_coords``: train-time augmentation (see :mod:`visionpe.rotary.learned`).
    """

    def __init__(self, head_dim: int, num_heads: int = 1, ndim: int = 2, variant: str = "cayley", theta: float = 10.0,
                 sections=None, scaling: str = "none", ref_shape=None, coords: str = "index",
                 normalize_coords: str = "separate", shift_coords: float | None = None,
                 jitter_coords: float | None = None, rescale_coords: float | None = None,
                 draw_coords: str = "forward", generator=None):
        check_choice("variant", variant, VARIANTS)
        check_number("theta", theta, minimum=1.0, inclusive=False)
        check_generator(generator)
        sections = resolve_sections(head_dim, ndim, sections, "string")
        coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                       draw_coords)
        super().__init__(head_dim, num_heads, ndim, scaling, ref_shape, coordinates)
        self.variant, self.theta, self.sections = variant, float(theta), sections
        self.bands = dict(per_turn=coordinates.normalized)
        self.register_derived_buffers()
        for name, value in self.initial_parameters(generator).items():
            setattr(self, name, nn.Parameter(value))

    def derived_buffers(self) -> dict:
        """The circulant variant's spectrum and Fourier basis (functions of ``head_dim``)."""
        if self.variant == "cayley":
            return {}
        return {"spectrum": circulant_spectrum(self.head_dim).float(),
                "fourier": fourier_basis(self.head_dim).float()[None]}

    def initial_parameters(self, generator=None) -> dict:
        """rope-vit's random frequencies ``(ndim, heads, pairs)`` in the basis ``P``: as they are with a zero skew
        (Cayley: ``P = I``), or as the minimal-norm first columns that give them (circulant)."""
        initial = mixed_frequencies(self.sections[::-1], self.num_heads, self.theta, generator, **self.bands)
        if self.variant == "cayley":
            return {"freqs": initial, "skew": torch.zeros(self.num_heads, num_upper(self.head_dim))}
        # minimal-norm first columns with the initial frequencies: M M^T = 2 d I on the turning planes
        spectrum = circulant_spectrum(self.head_dim)
        return {"circulant": (initial.double() @ spectrum / (2 * self.head_dim)).float()}

    def frequency_vectors(self) -> torch.Tensor:
        """``(ndim, heads, head_dim/2)``, xy order: the plane of pair ``p`` (in the basis ``P``) turns by ``<c, f_p>``."""
        return self.frequencies(torch.float32).detach()

    def frequencies(self, dtype: torch.dtype) -> torch.Tensor:
        if self.variant == "cayley":
            return full_tensor(self.freqs).to(dtype)
        return circulant_frequencies(full_tensor(self.circulant).to(dtype), self.spectrum.to(dtype))

    def basis(self, device=None) -> torch.Tensor:
        """The orthogonal change of basis ``P (heads or 1, d, d)`` float32 (cached in evaluation)."""
        if self.variant == "circulant":
            return self.fourier.to(device)
        device = device or self._device()

        def build():
            with autocast_off(device):
                return cayley_basis(full_tensor(self.skew), self.head_dim, device)

        return self._cache.get(("basis", str(device)), build, (self.skew,))

    def _patch_rotations(self, axis_positions, dtype) -> torch.Tensor:
        coords = grid_coordinates(axis_positions).flip(-1)  # component (xy) order
        angles = torch.einsum("na,ahp->hnp", coords, self.frequencies(dtype))
        return torch.stack([angles.cos(), angles.sin()], dim=-1)  # (heads, N, pairs, 2)

    def _finish(self, rows: torch.Tensor, prefix: int) -> torch.Tensor:
        identity = torch.tensor([1.0, 0.0], dtype=rows.dtype, device=rows.device)
        return torch.cat([identity.expand(rows.shape[0], prefix, *rows.shape[2:]), rows], dim=1)

    def _rotate(self, tensors, rows: torch.Tensor) -> tuple:
        basis = self.basis(tensors[0].device)
        return tuple(apply_rotary(change_basis(x, basis), rows) for x in tensors)

    def rotation_blocks(self, grid, device=None) -> torch.Tensor:
        """The RoPE pairs in the basis ``P`` as 2x2 blocks ``(heads, N, head_dim/2, 2, 2)``: ``R_i = P^T blocks_i P``."""
        return pair_blocks(self.rotations(as_grid(grid).without_prefix(), device))

    def scriptable(self) -> ScriptedRoPE:
        """The TorchScript form: RoPE's (:class:`~visionpe.rotary.rope.ScriptedRoPE`) on the learned frequencies, after
        the change of basis computed in the graph from the shared parameters (Cayley: :class:`ScriptedCayleyBasis`;
        circulant: the fixed Fourier basis); any coordinates without augmentation, ``scaling`` ``"none"`` or
        ``"pi"``."""
        self.check_scriptable_class(StringRoPE)
        self.check_scriptable_coordinates(normalized=True)
        common = dict(freq_mask=None, coordinates=self.coordinates, axis_order="xy", pairs="interleaved",
                      ref_shape=self.ref_shape if self.scaling == "pi" else None)
        if self.variant == "cayley":
            return ScriptedRoPE(freqs=self.freqs, maps=ScriptedCayleyBasis(self), **common)
        return ScriptedCirculantRoPE(freqs=self.circulant, spectrum=self.spectrum, maps=FixedBasis(self.fourier),
                                     **common)

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, {super().extra_repr()}"


def circulant_frequencies(columns: torch.Tensor, spectrum: torch.Tensor) -> torch.Tensor:
    """Circulant-STRING's frequency vectors ``(ndim, heads, head_dim/2)`` from the first columns ``(ndim, heads,
    head_dim)`` and :func:`circulant_spectrum` ``(head_dim/2, head_dim)`` (a TorchScript function)."""
    return columns @ spectrum.T


def cayley_basis(upper: torch.Tensor, size: int, device: torch.device) -> torch.Tensor:
    """Cayley-STRING's ``P (heads, size, size)`` float32 from the skew's upper triangles ``(heads, size (size - 1) /
    2)``, computed on ``device`` in float64 (a TorchScript function)."""
    return cayley(skew_from_upper(upper.to(device=device, dtype=torch.float64), size)).float()


class ScriptedCayleyBasis(nn.Module):
    """Cayley-STRING's basis in a TorchScript form (:class:`~visionpe.rotary.rope.ScriptedRoPE`'s ``maps``): the
    encoding's ``skew`` (shared) and ``forward(device) -> (P, P)`` (:func:`cayley_basis`), q's and k's."""

    def __init__(self, pe: StringRoPE):
        super().__init__()
        self.skew, self.size = pe.skew, pe.head_dim

    def forward(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        basis = cayley_basis(self.skew, self.size, device)
        return basis, basis


class FixedBasis(nn.Module):
    """A fixed change of basis as :class:`~visionpe.rotary.rope.ScriptedRoPE`'s ``maps``: ``forward(device) -> (P,
    P)``, ``P (heads or 1, d, d)`` (Circulant-STRING's Fourier basis, shared)."""

    def __init__(self, basis: torch.Tensor):
        super().__init__()
        self.register_buffer("basis", basis, persistent=False)

    def forward(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        basis = self.basis.to(device)
        return basis, basis


class ScriptedCirculantRoPE(ScriptedRoPE):
    """:class:`~visionpe.rotary.rope.ScriptedRoPE` whose frequencies are Circulant-STRING's, computed in the graph
    from the learned first columns (``freqs``, shared) and the ``spectrum`` (:func:`circulant_frequencies`)."""

    def __init__(self, *, spectrum: torch.Tensor, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("spectrum", spectrum, persistent=False)

    def frequencies(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return circulant_frequencies(self.freqs.to(device=device, dtype=dtype),
                                     self.spectrum.to(device=device, dtype=dtype))
