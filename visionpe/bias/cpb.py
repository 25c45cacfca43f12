"""Continuous position bias: an MLP on log-spaced relative coordinates (Swin-V2's, and timm's ``RelPosMlp`` modes)."""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from .._checks import check_choice, check_grid_ndim, check_positive_int, to_shape
from .._compat import autocast_off
from ..cache import TableCache
from ..coords import CoordinateSystem, axis_offsets
from ..grid import Grid, as_grid
from ..sharding import call_gathered
from ._base import BiasEncoding, PairScore, offset_pair_bias, offset_table_score, pair_bias


MODES = ("swin", "cr", "rw")  # timm RelPosMlp's modes


def log_relative_coords(shape, norm_window, device=None, offsets=None, units=None, mode: str = "swin") -> torch.Tensor:
    """Log-spaced offsets ``(prod(2 s - 1), ndim)`` for a grid ``shape`` (timm ``gen_relative_log_coords``).

    ``mode="swin"`` (Swin-V2): ``x = 8 d / (norm_window - 1)``, then ``sign(x) log2(1 + |x|) / log2(8)``;
    ``"rw"`` (timm 0.6's ``RelPosMlp(mode="rw")``): the same ``x``, then ``sign(x) log2(1 + |x|) / log2(9)`` (in
    ``[-1, 1]``); ``"cr"`` (timm's ``RelPosMlp`` default): the offsets themselves, ``sign(d) ln(1 + |d|)``.
    ``offsets`` (per axis ``(2 s - 1,)``, default: the integer offsets ``-(s-1) .. s-1``) and ``units`` (per axis,
    default ``norm_window - 1``) measure them in another coordinate system (:mod:`visionpe.coords`).
    """
    if offsets is None:
        offsets = index_offsets(shape, device)
    if units is None:
        units = window_units(norm_window)
    return log_offsets(offsets, units, mode)


def index_offsets(shape: List[int], device: Optional[torch.device] = None) -> List[torch.Tensor]:
    """The integer offsets ``-(s-1) .. s-1`` of each axis of a grid ``shape``, float32 ``(2 s - 1,)`` each."""
    return [torch.arange(-(s - 1), s, device=device, dtype=torch.float32) for s in shape]


def window_units(window) -> List[float]:
    """Swin-V2's unit per axis of a window: ``W - 1`` (at least 1)."""
    return [float(max(w - 1, 1)) for w in window]


def log_offsets(offsets: List[torch.Tensor], units: List[float], mode: str) -> torch.Tensor:
    """The MLP's inputs of every combination of the per-axis ``offsets`` (first axis slowest), ``(prod(len),
    ndim)``: ``8 d / unit`` (swin, rw; ``d`` itself in cr) through :func:`log_map` (a TorchScript function: the
    scripted models compute the table with it at each input's size)."""
    if mode != "cr":
        offsets = [o / u * 8 for o, u in zip(offsets, units)]  # per axis: no host-to-device copy of the units
    coords = torch.stack(torch.meshgrid(offsets, indexing="ij"), dim=-1).reshape(-1, len(offsets))
    return log_map(coords, mode)


def log_map(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The signed log of each mode: ``sign(x) log2(1 + |x|) / log2(8)`` (swin), ``/ log2(9)`` (rw),
    ``sign(x) ln(1 + |x|)`` (cr)."""
    if mode == "cr":
        return torch.sign(x) * torch.log(1.0 + x.abs())
    # log2(8) and log2(9) written out: a TorchScript function reads no math.log2 and no global float
    return torch.sign(x) * torch.log2(1.0 + x.abs()) / (3.0 if mode == "swin" else 3.169925001442312)


def bias_output(raw: torch.Tensor, mode: str) -> torch.Tensor:
    """The MLP's output as a bias: ``16 sigmoid`` (swin), ``4 tanh`` (rw), itself (cr)."""
    if mode == "swin":
        return 16 * torch.sigmoid(raw)
    return 4 * torch.tanh(raw) if mode == "rw" else raw


class ContinuousPositionBias(BiasEncoding):
    """Swin-V2 CPB (Liu et al. 2022): ``16 * sigmoid(MLP(log_coords(offset)))`` per head.

    ``cpb_mlp`` is ``Linear(ndim, hidden_dim) -> ReLU -> Linear(hidden_dim, num_heads, bias=False)``, named
    as in timm's ``SwinTransformerV2`` so its weights load unchanged. Offsets are normalised by
    ``pretrained_window_size - 1`` if given, else by ``window_size - 1``.

    ``mode`` (timm ``RelPosMlp``'s modes, :func:`log_relative_coords`): ``"swin"`` (the default, above); ``"cr"``
    (timm's default): ``MLP(sign(d) ln(1 + |d|))`` on the offsets themselves, no window normalisation (so no
    ``pretrained_window_size``), no output squashing; ``"rw"``: ``4 tanh(MLP(sign(x) log2(1 + |x|) / log2(9)))``
    with Swin-V2's ``x = 8 d / (W - 1)``. In ``cr`` and ``rw`` the second linear layer has a bias (``cpb_mlp.2.bias``),
    as timm's ``Mlp(bias=True)``. timm's MLP dropout (0.125 after the ReLU, training only) is not reproduced.

    Coordinates (:mod:`visionpe.coords`): ``coords="index"`` (default, Swin-V2) measures offsets ``d`` in patches
    and feeds ``8 d / (W - 1)`` to the log map (``W`` the window above); ``"normalized"`` measures them in DINOv3's
    centred coordinates (``normalize_coords`` ``"separate"``, ``"min"``, ``"max"``), in units of the grid extent,
    and feeds ``8 d / 2`` (the grid spans 2 normalised units; with ``"separate"`` this is ``8 d_patches / size``
    on every grid, Swin-V2's ``8 d / (W - 1)`` measured on the grid itself). ``shift_coords``, ``jitter_coords``,
    ``rescale_coords``: timm's train-time augmentation (training mode only, uncached); a shift cancels in offsets,
    jitter and rescale scale them. A grid's ``spacing`` (absolute time) is read: offsets are measured in its steps.

    Resolution change: the MLP is evaluated on the offsets of whatever grid it is called on.

    Call: ``pe(grid) -> (num_heads, P + N, P + N)``.
    """

    def __init__(self, num_heads: int, window_size=(7, 7), pretrained_window_size=None, hidden_dim: int = 512,
                 coords: str = "index", normalize_coords: str = "separate", shift_coords: float | None = None,
                 jitter_coords: float | None = None, rescale_coords: float | None = None, draw_coords: str = "forward",
                 mode: str = "swin"):
        super().__init__()
        check_choice("mode", mode, MODES)
        self.mode = mode
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.window_size = to_shape("window_size", window_size)
        self.ndim = len(self.window_size)
        if self.ndim > 3:
            raise ValueError(f"window_size={window_size!r} has {self.ndim} axes; allowed: 1, 2 or 3")
        p = pretrained_window_size
        if p == 0 or (isinstance(p, (tuple, list)) and len(p) and not any(p)):  # timm's (0, 0) means none
            p = None
        self.pretrained_window_size = None if p is None else to_shape("pretrained_window_size", p, self.ndim)
        if mode == "cr" and self.pretrained_window_size is not None:
            raise ValueError(f"pretrained_window_size={pretrained_window_size!r} normalises offsets by a window; "
                             "mode='cr' reads the offsets themselves: drop it, or use mode='swin' or 'rw'")
        check_positive_int("hidden_dim", hidden_dim)
        self.coordinates = CoordinateSystem(coords, normalize_coords, shift_coords, jitter_coords, rescale_coords,
                                            draw_coords)
        self.cpb_mlp = nn.Sequential(nn.Linear(self.ndim, hidden_dim, bias=True), nn.ReLU(inplace=True),
                                     nn.Linear(hidden_dim, num_heads, bias=mode != "swin"))
        self._cache = TableCache()

    def _offset_table(self, grid: Grid, device, transform=None) -> torch.Tensor:
        """The bias at every offset of ``grid`` (``16 * sigmoid(MLP)`` in Swin's mode), ``(prod(2 s - 1), heads)``
        float32 (Swin's order)."""
        window = self.pretrained_window_size or self.window_size
        offsets = units = None
        if self.coordinates.normalized or transform is not None or grid.spacing is not None:
            axes = self.coordinates.axis_positions(grid.shape, device=device, spacing=grid.spacing)
            if transform is not None:
                axes = [transform.on_axis(a, p) for a, p in enumerate(axes)]
            offsets = [axis_offsets(p) for p in axes]
            units = [2.0] * grid.ndim if self.coordinates.normalized else None
        coords = log_relative_coords(grid.shape, window, device, offsets, units, self.mode)
        with autocast_off(device):  # the table stays float32
            raw = call_gathered(self.cpb_mlp, coords.to(self.cpb_mlp[0].weight.dtype)).float()
            return bias_output(raw, self.mode)

    def scriptable(self) -> "ScriptedContinuousPositionBias":
        """The TorchScript form (:class:`ScriptedContinuousPositionBias`): index coordinates, no coordinate
        augmentation."""
        self.check_scriptable_class(ContinuousPositionBias)
        self.check_scriptable_coordinates()
        return ScriptedContinuousPositionBias(self)

    def set_window_size(self, window_size) -> None:
        """A new window (timm's ``set_window_size``): without a pretrained window, offsets are normalised by the new
        one from now on, as timm's Swin-V2; with one, nothing changes. The MLP is kept."""
        self.window_size = to_shape("window_size", window_size, self.ndim)

    def _build(self, grid: Grid, device, transform=None) -> torch.Tensor:
        return pair_bias(self._offset_table(grid, device, transform), grid, grid.shape)

    def forward(self, grid: Grid) -> torch.Tensor:
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "cpb")
        device = self.cpb_mlp[0].weight.device
        transform = self.coordinates.draw(self.training, self.ndim, device)
        if transform is not None:
            return self._build(grid, device, transform)
        key = (grid.shape, grid.prefix, grid.spacing, str(device), self.window_size)
        return self._cache.get(key, lambda: self._build(grid, device), self.parameters())

    def score_mod(self, grid: Grid) -> PairScore:
        """The MLP's table on the grid's offsets, read per token pair (one augmentation draw per call, as
        ``forward``)."""
        grid = as_grid(grid)
        check_grid_ndim(grid, self.ndim, "cpb")
        device = self.cpb_mlp[0].weight.device
        transform = self.coordinates.draw(self.training, self.ndim, device)
        return offset_table_score(self._offset_table(grid, device, transform), grid, grid.shape)

    @classmethod
    def model_defaults(cls, context) -> dict:
        """A window bias: the model's grid (a Swin window, or a ViT's patch grid) is ``window_size``."""
        return {"num_heads": context.num_heads, "window_size": tuple(context.grid_shape)}

    def adaptation_label(self) -> str:
        if self.coordinates.normalized:
            return f"MLP evaluated on the new offsets in {self.coordinates.label()}"
        return "MLP evaluated on the new offsets"

    def extra_repr(self) -> str:
        extra = self.coordinates.describe()
        mode = f", mode={self.mode!r}" if self.mode != "swin" else ""
        return (f"num_heads={self.num_heads}, window_size={self.window_size}, pretrained={self.pretrained_window_size}"
                f"{mode}{', ' + extra if extra else ''}")


class ScriptedContinuousPositionBias(nn.Module):
    """TorchScript form of :class:`ContinuousPositionBias` (index coordinates): ``forward(shape, prefix) -> (heads,
    P + N, P + N)`` float32, the MLP (the encoding's ``cpb_mlp``, shared) on the log-spaced offsets of the input's
    patch grid computed in the graph, zero prefix rows and columns. ``shape`` may be a window (Swin-V2's blocks pass
    theirs with ``prefix`` 0). The window that normalises the offsets (``pretrained_window_size``, else
    ``window_size``) is the encoding's when scripted."""

    def __init__(self, pe: ContinuousPositionBias):
        super().__init__()
        self.cpb_mlp, self.mode = pe.cpb_mlp, pe.mode
        self.units = window_units(pe.pretrained_window_size or pe.window_size)

    def forward(self, shape: List[int], prefix: int) -> torch.Tensor:
        weight = self.cpb_mlp[0].weight
        coords = log_offsets(index_offsets(shape, weight.device), self.units, self.mode)
        table = bias_output(self.cpb_mlp(coords.to(weight.dtype)).float(), self.mode)  # (offsets, heads)
        return offset_pair_bias(table, shape, shape, prefix)
