"""FIRE (Li et al., ICLR 2024, "Functional Interpolation for Relative Positions Improves Long Context Transformers"):
a small MLP of a log-transformed, progressively normalised relative distance, on 1D/2D/3D grids.

The paper's bias for query ``i`` and key ``j`` is ``f(psi(i - j) / psi(max(i, L)))``, ``psi(x) = log(|c x| + 1)``,
``f`` an MLP (1 -> 32 -> heads, ReLU), ``c`` and the threshold ``L`` learned (its appendix code: ``c`` starts at 0.1,
``L = |m L0|`` with a learned multiplier ``m`` from 1 and ``L0 = 512``, ``eps = 1e-6`` added to the normaliser). The
normaliser maps a causal query's visible range ``[0, i]`` onto ``[0, 1]`` (progressive interpolation); below the
threshold (``i < L``) it is the constant ``psi(L)``, so FIRE is its unnormalised form ``f(psi(i - j) / psi(L))``, a
function of the offset alone.

On a grid every query of an encoder sees the whole grid, whose extent ``E`` (the longest offset) takes the place of
the causal query's position ``i``; normalising by the grid, not by each query, keeps the bias a function of the
offset on every grid. Two forms (``distance``):

- ``"axes"`` (default): per axis ``u_a = sign(d_a) psi(|d_a|) / (psi(max(E_a, L)) + eps)``, ``d = c_q - c_k``, and
  ``bias = f(u_1, ..., u_n)`` (MLP ``ndim -> hidden -> heads``). Per axis and signed because an image bias must
  tell above from below and left from right (a function of the Euclidean distance cannot; the built-in
  shapes-relation task asks exactly that), and because each axis then meets the paper's 1D normalisation
  ``psi(max(E_a, L))`` on its own extent; for ``d >= 0`` in 1D it is the paper's formula.
- ``"euclidean"``: ``u = psi(||d||) / (psi(max(E, L)) + eps)``, ``E`` the grid's diagonal, ``f`` MLP ``1 -> heads``:
  the paper's 1D function of the Euclidean distance (isotropic, like 2D ALiBi).

The threshold's initial value ``L0`` (``threshold``) defaults to the extent of ``grid_shape`` (a model's training
grid: there the bias is exactly the unnormalised form, and larger grids are interpolated onto the trained range),
or the paper's 512 without one. Prefix tokens (the paper has none) get zero rows and columns.
"""
from __future__ import annotations

import math
from typing import List

import torch
from torch import nn

from .._checks import check_choice, check_grid_ndim, check_ndim, check_number, check_positive_int, to_shape
from .._compat import autocast_off
from ..cache import TableCache
from ..coords import CoordinateSystem, axis_offsets
from ..encoding import Knob
from ..grid import Grid, as_grid
from ..sharding import call_gathered, full_tensor
from ._base import BiasEncoding, PairScore, offset_pair_bias, offset_table_score, pair_bias

FIRE_DISTANCES = ("axes", "euclidean")
PAPER_THRESHOLD = 512.0


def fire_log(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``psi(x) = log(|c x| + 1)``."""
    return torch.log1p((c * x).abs())


def fire_threshold(multiplier: torch.Tensor, threshold_init: torch.Tensor, scale: float) -> torch.Tensor:
    """The learned threshold ``L = |m L0|`` times a fixed ``scale``, ``(1,)``."""
    return (multiplier * threshold_init).abs() * scale


def fire_inputs(offsets: List[torch.Tensor], c: torch.Tensor, threshold: torch.Tensor, eps: float,
                axes: bool) -> torch.Tensor:
    """FIRE's MLP inputs for every combination of the per-axis ``offsets`` (``c_q - c_k``, ``(2 S_a - 1,)`` each,
    first axis slowest): ``(prod(2 S_a - 1), ndim)`` signed per-axis log distances normalised by each axis's extent
    (``axes``), or ``(prod, 1)`` the log Euclidean distance normalised by the diagonal (module docstring)."""
    spans = torch.stack([o.abs().max() for o in offsets])  # (ndim,) the extent per axis
    d = torch.stack(torch.meshgrid(offsets, indexing="ij"), dim=-1).reshape(-1, len(offsets))
    if axes:
        scale = fire_log(torch.maximum(spans, threshold), c) + eps  # (ndim,)
        return torch.sign(d) * fire_log(d.abs(), c) / scale
    scale = fire_log(torch.maximum(spans.norm(), threshold), c) + eps
    return fire_log(d.norm(p=2, dim=-1, keepdim=True), c) / scale


class FIRE(BiasEncoding):
    """FIRE bias: ``pe(grid) -> (num_heads, P + N, P + N)``.

    Args:
        num_heads: heads of the attention.
        ndim: grid axes (1, 2 or 3).
        grid_shape: the training grid (a model's); sets the default threshold.
        distance: ``"axes"`` (signed per-axis log distances, default) or ``"euclidean"`` (module docstring).
        hidden_dim: width of the MLP's hidden layer (the paper's 32).
        init_c: initial ``c`` of ``psi`` (the paper's 0.1).
        threshold: initial threshold ``L0`` (default: the extent of ``grid_shape`` in ``coords``' units, else 512).
        eps: added to the normaliser (the paper's 1e-6).
        threshold_scale: a fixed factor on the learned threshold ``L`` (1: the paper's), the knob tuned per test size
            (:attr:`knob`, ``visionpe sweep --tune``); not a parameter, so trained weights load at any value.
        coords, normalize_coords, shift_coords, jitter_coords, rescale_coords: the coordinates offsets are measured
            in (:mod:`visionpe.coords`); with augmentation (training mode only) the extent is that of the augmented
            coordinates, as if the grid were that large.

    Parameters ``mlp``, ``c``, ``threshold_multiplier`` (all excluded from weight decay); the buffer
    ``threshold_init`` is ``L0``. The MLP runs once per distinct offset (``prod(2 S_a - 1)`` rows), gathered into
    the ``(T, T)`` bias; cached per grid in evaluation, rebuilt every call in training. The bias is a function of
    ``(head, query coordinates, key coordinates)`` through that per-offset table, which is also its FlexAttention
    pair form (:meth:`score_mod`: the table is read per token pair, no ``(heads, T, T)`` tensor).
    """

    knob = Knob("threshold_scale", (0.5, 1.0, 1.5, 2.0, 3.0, 4.0), relative=True)

    def __init__(self, num_heads: int, ndim: int = 2, grid_shape=None, distance: str = "axes", hidden_dim: int = 32,
                 init_c: float = 0.1, threshold: float | None = None, eps: float = 1e-6, coords: str = "index",
                 normalize_coords: str = "separate", shift_coords: float | None = None,
                 jitter_coords: float | None = None, rescale_coords: float | None = None, draw_coords: str = "forward",
                 threshold_scale: float = 1.0):
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.ndim = check_ndim(ndim)
        self.threshold_scale = check_number("threshold_scale", threshold_scale, minimum=0.0, inclusive=False)
        check_choice("distance", distance, FIRE_DISTANCES)
        check_positive_int("hidden_dim", hidden_dim)
        self.distance, self.eps = distance, check_number("eps", eps, minimum=0.0)
        self.coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                            draw_coords)
        self.grid_shape = None if grid_shape is None else to_shape("grid_shape", grid_shape, ndim)
        if threshold is None:
            threshold = PAPER_THRESHOLD if self.grid_shape is None else self.extent(self.grid_shape)
        threshold = check_number("threshold", threshold, minimum=0.0, inclusive=False)
        inputs = ndim if distance == "axes" else 1
        self.mlp = nn.Sequential(nn.Linear(inputs, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, num_heads))
        self.init_c, self.initial_threshold = check_number("init_c", init_c), float(threshold)
        self.c = nn.Parameter(torch.tensor([self.init_c]))  # (1,): FSDP shards no 0-d parameter
        self.threshold_multiplier = nn.Parameter(torch.tensor([1.0]))
        self.register_buffer("threshold_init", torch.tensor(self.initial_threshold))
        self._cache = TableCache()

    def initial_parameters(self, generator=None) -> dict:
        """``c = init_c`` and the threshold multiplier 1 (the MLP initialises itself)."""
        return {"c": torch.tensor([self.init_c]), "threshold_multiplier": torch.tensor([1.0])}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("c", "threshold_multiplier"):  # saved 0-d before they became (1,)
            value = state_dict.get(prefix + name)
            if isinstance(value, torch.Tensor) and value.ndim == 0:
                state_dict[prefix + name] = value.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def reset_parameters(self) -> None:
        """As :meth:`Encoding.reset_parameters`, and the threshold ``L0`` (a persistent buffer, loaded with the
        weights) back to its initial value."""
        super().reset_parameters()
        with torch.no_grad():
            self.threshold_init.copy_(torch.tensor(self.initial_threshold))

    def extent(self, shape) -> float:
        """The longest offset of a grid of ``shape`` in this module's coordinates: per axis for ``"axes"`` (the
        largest of them), the diagonal for ``"euclidean"``."""
        axes = self.coordinates.axis_positions(tuple(shape), device="cpu", dtype=torch.float64)
        spans = [float(p[-1] - p[0]) for p in axes]
        return max(spans) if self.distance == "axes" else math.sqrt(sum(s * s for s in spans))

    def threshold(self) -> torch.Tensor:
        """The learned threshold ``L = |m L0|``, times ``threshold_scale``."""
        return fire_threshold(full_tensor(self.threshold_multiplier), self.threshold_init, self.threshold_scale)

    def normalized_offsets(self, grid: Grid, device, transform=None) -> torch.Tensor:
        """The MLP's inputs for every offset of the grid, ``(prod(2 S_a - 1), ndim or 1)`` float32, offsets
        ``c_q - c_k`` with the first axis slowest (the order :func:`~visionpe.bias._base.pair_bias` reads)."""
        axes = self.coordinates.axis_positions(grid.shape, grid.offset, device=device, spacing=grid.spacing)
        if transform is not None:
            axes = [transform.on_axis(a, p) for a, p in enumerate(axes)]
        offsets = [axis_offsets(p) for p in axes]  # per axis (2 S_a - 1,)
        return fire_inputs(offsets, full_tensor(self.c), self.threshold(), self.eps, self.distance == "axes")

    def offset_table(self, grid: Grid, device, transform=None) -> torch.Tensor:
        """The MLP on every offset of the grid, ``(prod(2 S_a - 1), heads)`` float32 (Swin's offset order)."""
        with autocast_off(device):  # the table stays float32
            return call_gathered(self.mlp, self.normalized_offsets(grid, device, transform)).float()

    def forward(self, grid: Grid) -> torch.Tensor:
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "fire")
        device = self.c.device
        transform = self.coordinates.draw(self.training, self.ndim, device)
        if transform is not None:
            return pair_bias(self.offset_table(grid, device, transform), grid, grid.shape)
        return self._cache.get((grid, str(device)), lambda: pair_bias(self.offset_table(grid, device), grid, grid.shape),
                               self.parameters())

    def score_mod(self, grid: Grid) -> PairScore:
        """The MLP's per-offset table read per token pair (FlexAttention; one augmentation draw per call, as
        ``forward``): equal to ``self(grid)`` entry for entry, without its ``(heads, T, T)`` tensor."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "fire")
        device = self.c.device
        transform = self.coordinates.draw(self.training, self.ndim, device)
        return offset_table_score(self.offset_table(grid, device, transform), grid, grid.shape)

    def scriptable(self) -> "ScriptedFIRE":
        """The TorchScript form (:class:`ScriptedFIRE`): index coordinates, no coordinate augmentation."""
        self.check_scriptable_class(FIRE)
        self.check_scriptable_coordinates()
        return ScriptedFIRE(self)

    def adaptation_label(self) -> str:
        return "MLP on offsets normalised by the new grid's extent (beyond the threshold)"

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        return (f"num_heads={self.num_heads}, ndim={self.ndim}, distance={self.distance!r}, "
                f"threshold={float(self.threshold_init):g}{', ' + extra if extra else ''}")


class ScriptedFIRE(nn.Module):
    """TorchScript form of :class:`FIRE` (index coordinates): ``forward(shape, prefix) -> (heads, P + N, P + N)``
    float32, the MLP on every offset of the input's patch grid (:func:`fire_inputs`) computed in the graph and
    gathered per token pair, zero prefix rows and columns; the MLP, ``c``, the threshold multiplier and ``L0`` are
    the encoding's."""

    def __init__(self, pe: FIRE):
        super().__init__()
        self.mlp, self.c, self.threshold_multiplier = pe.mlp, pe.c, pe.threshold_multiplier
        self.register_buffer("threshold_init", pe.threshold_init)
        self.threshold_scale, self.eps, self.axes = float(pe.threshold_scale), float(pe.eps), pe.distance == "axes"

    def forward(self, shape: List[int], prefix: int) -> torch.Tensor:
        device = self.c.device
        offsets = [axis_offsets(torch.arange(s, dtype=torch.float32, device=device)) for s in shape]
        threshold = fire_threshold(self.threshold_multiplier, self.threshold_init, self.threshold_scale)
        table = self.mlp(fire_inputs(offsets, self.c, threshold, self.eps, self.axes)).float()  # (offsets, heads)
        return offset_pair_bias(table, shape, shape, prefix)
