"""torchvision's Video Swin (``swin3d_t/s/b``, ``SwinTransformer3d``) with visionpe encodings inside its 3D
shifted windows.

Each ``ShiftedWindowAttention3d`` becomes a :class:`VideoWindowAttention` that keeps its ``qkv``/``proj``
modules and does what torchvision's ``shifted_window_attention_3d`` does, step for step: per input size an
effective window and shift (an axis no longer than the window takes the whole axis and is not shifted), zero
padding at the end of each axis to whole windows, the cyclic shift, the shift mask (``-100`` between tokens of
different shifted regions; padded tokens are not masked, as in torchvision), partition into windows with the
tokens of a window row-major in ``(T, H, W)``. The encodings run on ``Grid(effective_window)``. They are built
per block for the block's configured window (``ndim=3``); ``swin_bias`` takes over torchvision's
``relative_position_bias_table`` (same Video-Swin index convention as :func:`visionpe.bias.grid_offset_index`).

A window that shrinks (an input axis shorter than the window): torchvision slices its full-window index,
``index[:n, :n]`` for the ``n`` tokens of the effective window, which is the bias of the effective window's true
offsets only when the shrunk window is a leading block of the full window in row-major order (``(t, Wh, Ww)``,
``(1, h, Ww)`` or ``(1, 1, w)``: e.g. a shorter clip); otherwise (small frames: ``(2, 2, 2)`` or ``(1, 2, 2)``
of ``(2, 4, 4)``) its rows and columns belong to other offsets. ``table_slicing="torchvision"`` (the default)
does the same for a table bias (``swin_bias``), so the patched model reproduces torchvision's logits at every
input size; ``table_slicing="offsets"`` gives the table bias the effective window's true offsets, as every other
encoding has. Set it per attention module (``for m in model.modules(): if isinstance(m, VideoWindowAttention): ...``).

Inputs: ``(B, C, T, H, W)`` floating, any ``T, H, W >= 1``. As in torchvision, sides that are not multiples of
the patch size are zero-padded at the end by the patch embedding, and feature maps that are not multiples of the
window are zero-padded inside each attention.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torchvision.models.video.swin_transformer import ShiftedWindowAttention3d, SwinTransformer3d

from .._checks import check_choice
from ..attention import attend
from ..bias import RelativePositionBias, SwinBias
from ..coords import shares_draws
from ..encoding import ModelContext
from ..grid import Grid
from .adapter import (WINDOW_FAMILIES, WINDOW_REFUSES, Adapter, EncodingSet, PositionalModel, check_input,
                      default_sections, register_adapter)
from .swin import WindowAttention
from .windows import shift_mask

TABLE_SLICINGS = ("torchvision", "offsets")


def effective_window(size, window, shift) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """torchvision's window and shift for a feature map of ``size``: an axis no longer than the window becomes one
    unshifted window of the whole axis."""
    pairs = [(s, 0) if s <= w else (w, sh) for s, w, sh in zip(size, window, shift)]
    return tuple(w for w, _ in pairs), tuple(sh for _, sh in pairs)


def leading_box(window, n: int) -> tuple[int, ...]:
    """The smallest grid ``(1, .., 1, k, W_a+1, .., W_last)`` whose first ``n`` row-major tokens are the first ``n``
    tokens of ``window``, at the same coordinates (so the table bias is gathered for them only)."""
    trailing = 1
    for axis in reversed(range(len(window))):
        if n <= trailing * window[axis]:
            return (1,) * axis + (-(-n // trailing),) + tuple(window[axis + 1:])
        trailing *= window[axis]
    raise ValueError(f"{n} tokens do not fit window {tuple(window)}")


class VideoWindowAttention(WindowAttention):
    """Replaces torchvision's ``ShiftedWindowAttention3d``: same ``qkv``/``proj``, same windows, shift and mask,
    encodings over the effective window's 3-axis grid. Call: ``(B, T, H, W, C) -> (B, T, H, W, C)``.

    A subclass of the Swin adapter's :class:`~visionpe.backbones.swin.WindowAttention` for
    :func:`~visionpe.encodings_of`; its own constructor takes a torchvision module.
    """

    cosine = False
    table_resize = None  # torchvision has no window change: a table keeps its own (bicubic) resize

    def __init__(self, source: nn.Module, rotary=None, bias=None, table_slicing: str = "torchvision"):
        nn.Module.__init__(self)
        self.num_heads = source.num_heads
        self.window_size = tuple(source.window_size)
        self.shift_size = tuple(source.shift_size)
        self.attention_dropout, self.dropout = source.attention_dropout, source.dropout
        self.qkv, self.proj = source.qkv, source.proj
        self.rotary, self.bias = rotary, bias
        self.table_slicing = table_slicing

    @property
    def table_slicing(self) -> str:
        """How a table bias (``swin_bias``) meets a shrunk window: ``"torchvision"`` or ``"offsets"`` (module doc)."""
        return self._table_slicing

    @table_slicing.setter
    def table_slicing(self, value: str) -> None:
        check_choice("table_slicing", value, TABLE_SLICINGS)
        self._table_slicing = value

    def set_window_size(self, window_size) -> None:
        """A new configured window (a table bias is resized); a shifted block shifts by half the new window."""
        shifted = any(self.shift_size)
        super().set_window_size(window_size)
        self.shift_size = tuple(w // 2 for w in self.window_size) if shifted else (0,) * len(self.window_size)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """torchvision's state dict loads as it is: its table goes to ``bias`` (a table bias), its index (derived
        from the window) is dropped."""
        state_dict.pop(prefix + "relative_position_index", None)
        table = prefix + "relative_position_bias_table"
        if table in state_dict and isinstance(self.bias, RelativePositionBias):
            state_dict[prefix + "bias.relative_position_bias_table"] = state_dict.pop(table)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _window_rotary(self, window):
        """The rotary encoding on an effective window: a window shrunk to a short axis is the configured window with
        fewer patches, so a scaled RoPE (``pi``/``ntk``/``yarn`` against ``ref_shape``) scales it as the configured
        window, i.e. against ``ref * effective / configured`` (the effective window itself when the reference is the
        window), never stretching the short axis. A shallow copy: parameters, buffers and cache are shared."""
        rotary = self.rotary
        ref = getattr(rotary, "ref_shape", None)
        if rotary is None or ref is None or getattr(rotary, "scaling", "none") == "none" \
                or tuple(window) == tuple(self.window_size):
            return rotary
        effective = copy.copy(rotary)
        effective.ref_shape = tuple(r * e // w if r * e % w == 0 else r * e / w
                                    for r, e, w in zip(ref, window, self.window_size))
        return effective

    def _table_bias(self, window) -> torch.Tensor | None:
        """torchvision's slice of the full-window table bias for a shrunk window, ``(heads, n, n)``; None when the
        bias goes through :func:`visionpe.attend` on the effective grid."""
        if self.table_slicing != "torchvision" or not isinstance(self.bias, RelativePositionBias) \
                or window == self.window_size:
            return None
        n = math.prod(window)
        return self.bias(Grid(leading_box(self.window_size, n)))[:, :n, :n]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h, w, c = x.shape
        window, shift = effective_window((t, h, w), self.window_size, self.shift_size)
        pad = [-s % k for s, k in zip((t, h, w), window)]
        x = F.pad(x, (0, 0, 0, pad[2], 0, pad[1], 0, pad[0]))
        padded = tuple(x.shape[1:4])
        if any(shift):
            x = torch.roll(x, shifts=tuple(-s for s in shift), dims=(1, 2, 3))
        wt, wh, ww = window
        windows = rearrange(x, "b (nt wt) (nh wh) (nw ww) c -> (b nt nh nw) (wt wh ww) c", wt=wt, wh=wh, ww=ww)
        q, k, v = rearrange(self.qkv(windows), "n t (three h d) -> three n h t d", three=3, h=self.num_heads)

        mask = self._table_bias(window)
        bias = self.bias if mask is None else None
        if mask is not None:
            mask = mask[None]
        if any(shift):
            shifted = shift_mask(padded, window, shift, x.device, q.dtype)
            shifted = rearrange(shifted[None].expand(b, -1, -1, -1), "b nw n m -> (b nw) 1 n m")
            mask = shifted if mask is None else mask + shifted
        out = attend(q, k, v, Grid(window), self._window_rotary(window), bias, mask,
                     dropout_p=self.attention_dropout if self.training else 0.0, attention=self.attention,
                     tokens=windows)
        out = F.dropout(self.proj(rearrange(out, "n h t d -> n t (h d)")), p=self.dropout, training=self.training)

        nt, nh, nw = (p // k for p, k in zip(padded, window))
        x = rearrange(out, "(b nt nh nw) (wt wh ww) c -> b (nt wt) (nh wh) (nw ww) c",
                      b=b, nt=nt, nh=nh, nw=nw, wt=wt, wh=wh, ww=ww)
        if any(shift):
            x = torch.roll(x, shifts=shift, dims=(1, 2, 3))
        return x[:, :t, :h, :w].contiguous()

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, window_size={self.window_size}, shift_size={self.shift_size}, "
                f"table_slicing={self.table_slicing!r}")


class _NoWeightDecayBase:
    """torchvision models have no ``no_weight_decay``: the encodings' names are the whole set."""

    def no_weight_decay(self) -> set[str]:
        return set()


class SwinTransformer3dPE(PositionalModel, _NoWeightDecayBase, SwinTransformer3d):
    """torchvision ``SwinTransformer3d`` with visionpe encodings inside its 3D windows; takes what torchvision
    takes: ``(B, C, T, H, W)``, any sizes (zero-padded to whole patches and windows)."""

    def check_input(self, x: torch.Tensor) -> None:
        check_input(x, (1, 1, 1), self.patch_embed.proj.in_channels, type(self).__name__)

    @shares_draws
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return super().forward(x)


def _attention_blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules()
            if isinstance(getattr(m, "attn", None), (ShiftedWindowAttention3d, VideoWindowAttention))]


def apply_video_swin(model: nn.Module, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into every 3D window attention of a torchvision Video Swin."""
    encodings = EncodingSet(names, kwargs)
    for block in _attention_blocks(model):
        source = block.attn
        dim = source.qkv.in_features
        head_dim = dim // source.num_heads
        context = ModelContext(tuple(source.window_size), dim, source.num_heads, head_dim)
        defaults = default_sections(names.get("rotary"), head_dim)
        rotary = encodings.block("rotary", context, getattr(source, "rotary", None), **defaults)
        bias = encodings.block("bias", context, getattr(source, "bias", None))
        take_over_table(bias, source)
        block.attn = VideoWindowAttention(source, rotary, bias, getattr(source, "table_slicing", "torchvision"))


@torch.no_grad()
def take_over_table(bias: nn.Module | None, source: nn.Module) -> None:
    """torchvision's ``relative_position_bias_table`` goes into a ``swin_bias`` (resized when the bias was built
    for another window)."""
    if not isinstance(bias, SwinBias) or not hasattr(source, "relative_position_bias_table"):
        return
    table = source.relative_position_bias_table
    if tuple(source.window_size) != bias.window_size:
        native = SwinBias(bias.num_heads, tuple(source.window_size), bias.interpolation, bias.antialias)
        native.relative_position_bias_table.copy_(table)
        table = native.resize(bias.window_size).relative_position_bias_table
    bias.relative_position_bias_table.copy_(table)


# torchvision's Video Swin sizes (swin3d_t/s/b); a model's own keywords override any of them
SWIN3D_SIZES = {"swin3d_t": dict(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=[8, 7, 7])}
SWIN3D_SIZES["swin3d_s"] = {**SWIN3D_SIZES["swin3d_t"], "depths": [2, 2, 18, 2]}
SWIN3D_SIZES["swin3d_b"] = {**SWIN3D_SIZES["swin3d_s"], "embed_dim": 128, "num_heads": [4, 8, 16, 32]}
SWIN3D_KEYWORDS = ("embed_dim", "depths", "num_heads", "window_size", "mlp_ratio", "dropout", "attention_dropout",
                   "stochastic_depth_prob")


def video_swin_constructor(name: str):
    """``build(**kwargs)`` of torchvision's ``name`` (``swin3d_t/s/b``) with random weights: timm's keyword names
    (``num_classes``, ``patch_size`` = the tubelet, ``drop_path_rate`` = ``stochastic_depth_prob``; ``in_chans``
    must be 3; ``img_size`` is ignored: the model takes any clip size) plus :data:`SWIN3D_KEYWORDS`."""
    def build(num_classes: int = 400, patch_size=(2, 4, 4), drop_path_rate: float = 0.0, in_chans: int = 3,
              img_size=None, **sizes) -> SwinTransformer3d:
        unknown = sorted(set(sizes) - set(SWIN3D_KEYWORDS))
        if unknown:
            raise ValueError(f"{name} (torchvision SwinTransformer3d) takes the keywords {', '.join(SWIN3D_KEYWORDS)}, "
                             f"not {', '.join(unknown)} (e.g. embed_dim=24 depths=[1,1] num_heads=[2,4] "
                             "window_size=[4,4,4])")
        if in_chans != 3:
            raise ValueError(f"{name} takes 3-channel clips (torchvision's patch embedding), got in_chans={in_chans}")
        kwargs = {**SWIN3D_SIZES[name], "stochastic_depth_prob": drop_path_rate, **sizes}
        return SwinTransformer3d(patch_size=list(patch_size), num_classes=num_classes, **kwargs)
    build.__name__ = name
    return build


register_adapter(Adapter(SwinTransformer3d, SwinTransformer3dPE, apply_video_swin,
                         (VideoWindowAttention,), library="torchvision",
                         constructors={name: video_swin_constructor(name) for name in SWIN3D_SIZES}, video=True,
                         native="swin_bias", families=WINDOW_FAMILIES, refuses=WINDOW_REFUSES,
                         examples=tuple(SWIN3D_SIZES)))
