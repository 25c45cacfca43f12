"""Checkpoints of other models converted on load: timm ViT/DeiT ``pos_embed``, timm's Eva rope-vit ports, Swin tables
and Swin-V2 MLPs, visionpe tables of another grid, and image weights inflated into video models (I3D)."""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from ..resample import resample_axis, resample_grid
from .._checks import check_bool, check_module
from .io import _check_strict, _where, check_finite, check_shapes, read_state_dict

logger = logging.getLogger("visionpe.weights")  # one name for every weights module


@dataclass
class LoadReport:
    """What :func:`load_timm_checkpoint` did with each key."""

    converted: list[str] = field(default_factory=list)  # "source -> target" positional weights mapped
    kept: list[str] = field(default_factory=list)  # loaded as they were
    new: list[str] = field(default_factory=list)  # model keys the checkpoint did not provide
    dropped: list[str] = field(default_factory=list)  # checkpoint keys with no place in the model

    def __str__(self) -> str:
        lines = [f"{len(self.kept)} kept, {len(self.converted)} converted, {len(self.new)} new, "
                 f"{len(self.dropped)} dropped"]
        lines += [f"  converted {k}" for k in self.converted]
        lines += [f"  new       {k}" for k in self.new]
        lines += [f"  dropped   {k}" for k in self.dropped]
        return "\n".join(lines)


_SWIN_POSITIONAL = re.compile(r"(.*\.attn)\.(relative_position_bias_table|cpb_mlp\..*)$")


_EVA_LAYER_SCALE = re.compile(r"^blocks\.(\d+)\.gamma_([12])$")


_EVA_QV_BIAS = re.compile(r"^(blocks\.\d+\.attn)\.([qv])_bias$")


def _eva_to_vit(state: dict, report: "LoadReport") -> dict:
    """timm ``Eva`` models (rope-vit ports ``vit_*_rope_*``, timm's SBB ``vit_*_rope_reg*_gap_256``) ->
    ``VisionTransformer`` names: ``gamma_1`` -> ``ls1.gamma``, mixed ``rope.freqs (2, depth, heads, d/2)`` -> each
    block's ``attn.rotary.freqs``, separate ``q_bias``/``v_bias`` -> one ``qkv.bias`` (the key bias is zero)."""
    out = {}
    for key, value in state.items():
        match = _EVA_QV_BIAS.match(key)
        if match and match.group(2) == "q" and f"{match.group(1)}.v_bias" in state:
            new_key = f"{match.group(1)}.qkv.bias"
            report.converted.append(f"{key} + {match.group(1)}.v_bias -> {new_key}")
            out[new_key] = torch.cat([value, torch.zeros_like(value), state[f"{match.group(1)}.v_bias"]])
            continue
        if match and match.group(2) == "v" and f"{match.group(1)}.q_bias" in state:
            continue
        match = _EVA_LAYER_SCALE.match(key)
        if match:
            new_key = f"blocks.{match.group(1)}.ls{match.group(2)}.gamma"
            report.converted.append(f"{key} -> {new_key}")
            out[new_key] = value
        elif key == "rope.freqs" and value.ndim == 4:
            for layer in range(value.shape[1]):
                new_key = f"blocks.{layer}.attn.rotary.freqs"
                report.converted.append(f"{key}[:, {layer}] -> {new_key}")
                out[new_key] = value[:, layer]
        else:
            out[key] = value
    return out


def pos_embed_tensors(tokens: nn.Module, pos_embed: torch.Tensor, source_grid=None) -> dict[str, torch.Tensor]:
    """timm ``pos_embed (1, P + N, D)`` -> a ``Learned`` module's state dict (its tables and ``prefix``), from
    ``source_grid`` ``(H, W)`` to the module's grid (:func:`spatial_tables`).

    Default ``source_grid``, as timm's checkpoint filter reads a ``pos_embed`` (a checkpoint stores no grid): the
    module's own image grid when it has ``N`` patches (loaded as is), else a square grid of ``N`` patches; any other
    ``N`` is a ``ValueError`` asking for ``source_grid``."""
    p = tokens.num_prefix_tokens
    patches = pos_embed.shape[1] - p
    space = tuple(tokens.grid_shape[-2:])
    if source_grid is None:
        side = math.isqrt(max(patches, 0))
        if math.prod(space) == patches:
            source_grid = space
        elif side * side == patches:
            source_grid = (side, side)
        else:
            raise ValueError(f"pos_embed of shape {tuple(pos_embed.shape)} holds {patches} patch positions, neither "
                             f"the model's grid {space} nor a square grid: give source_grid=(height, width) of the "
                             "checkpoint's patch grid")
    source_grid = tuple(source_grid) if isinstance(source_grid, (tuple, list)) else source_grid
    if not (isinstance(source_grid, tuple) and len(source_grid) == 2
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in source_grid)):
        raise ValueError(f"source_grid must be (height, width), two positive integers, got {source_grid!r}")
    if math.prod(source_grid) != patches:
        raise ValueError(f"source_grid={source_grid} has {math.prod(source_grid)} patches but pos_embed of shape "
                         f"{tuple(pos_embed.shape)} holds {patches} (after {p} prefix tokens)")
    tables = spatial_tables(tokens, pos_embed[0, p:].reshape(*source_grid, -1))
    return {**tables, "prefix": pos_embed[0, :p]} if p else tables


@torch.no_grad()
def spatial_tables(tokens: nn.Module, spatial: torch.Tensor) -> dict[str, torch.Tensor]:
    """An image's ``(H, W, dim)`` position table as a ``Learned`` module's own tables, resampled to its grid.

    For a video module ``(T, H, W)`` the image table is the spatial part and time starts at zero, so a static clip
    gets the image's positions (ViViT): joint: repeated over time; ``"space_time"``: ``table`` plus a zero
    ``time_table``. Per-axis factors (``factorized=True``) get the least-squares additive fit of the image table
    (row means and column means, the grand mean split between them) and a zero time table.
    """
    interpolation, antialias = tokens.interpolation, tokens.antialias
    space_shape = tokens.grid_shape[-2:]
    space = resample_grid(spatial, space_shape, interpolation, antialias)
    time = tokens.grid_shape[:-2]  # () for an image module, (T,) for a video one
    if tokens.factorized is True:
        half = space.mean((0, 1)) / 2
        tables = [space.new_zeros(t, space.shape[-1]) for t in time] + [space.mean(1) - half, space.mean(0) - half]
        return {f"axis_tables.{a}": t for a, t in enumerate(tables)}
    if tokens.factorized == "space_time":
        return {"table": space, "time_table": space.new_zeros(*time, space.shape[-1])}
    return {"table": space.expand(*time, *space.shape).clone()}


def inflate_patch_weight(weight: torch.Tensor, frames: int) -> torch.Tensor:
    """A 2D patch embedding's conv weight ``(D, C, p, p)`` as a tubelet's ``(D, C, frames, p, p)`` (I3D): repeated
    over time and divided by ``frames``, so a static clip gives the image's tokens."""
    return weight[:, :, None].repeat(1, 1, frames, 1, 1) / frames


@torch.no_grad()
def _image_to_video(model: nn.Module, key: str, value: torch.Tensor, want: torch.Tensor):
    """An image model's weight inflated for the video model, and how; None when ``key`` is no such weight.

    The 2D patch embedding is repeated over the tubelet's ``t`` frames and divided by ``t`` (I3D), so a static clip
    gives the image's tokens; a 2D RoPE-Mixed frequency vector gains a zero time component, so it starts as the image
    model's rotation and learns time.
    """
    if key in ("patch_embed.proj.weight",) and value.ndim == 4 and want.ndim == 5 \
            and value.shape == want.shape[:2] + want.shape[3:]:
        return inflate_patch_weight(value, want.shape[2]), f"inflated over {want.shape[2]} frames (I3D)"
    if key.endswith(".rotary.freqs") and value.ndim == 3 and want.ndim == 3 and value.shape[0] == 2 \
            and want.shape[0] == 3 and value.shape[1:] == want.shape[1:]:
        rotary = model.get_submodule(key.rsplit(".", 1)[0])
        zero = value.new_zeros(1, *value.shape[1:])
        # component order: xy puts time last (x, y, t); ij puts it first (t, y, x)
        freqs = torch.cat([value, zero] if getattr(rotary, "axis_order", "xy") == "xy" else [zero, value])
        return freqs, "zero time component added"
    return None


def load_timm_checkpoint(model: nn.Module, source, strict: bool = False, source_grid=None,
                         allow_nonfinite: bool = False) -> LoadReport:
    """Load a plain timm ViT/Swin state dict (or a visionpe one of another size) into a visionpe-patched model and
    report every key.

    ``pos_embed`` becomes the ``learned`` table (resampled to the model's grid), Swin
    ``relative_position_bias_table`` goes to ``swin_bias``, Swin-V2 ``cpb_mlp`` to ``cpb``, and timm's rope-vit ports
    (``Eva`` classes: ``vit_small_patch16_rope_224``, ``..._rope_mixed_224``) load into a ViT with
    ``pe="rope_axial"``/``"rope_mixed"``. A visionpe ``learned`` table (``pe_tokens.table``, or the factorized
    ``pe_tokens.axis_tables.N``) or relative-bias table saved at another grid or window size is resampled to the
    model's, as timm's ``pos_embed`` is. Everything else must match by name and shape.

    Keys that cannot be used are reported as ``dropped`` (checkpoint keys) and ``new`` (model keys left at their
    initial values); when any of them is more than the classifier head (``head.*``) a warning summary is logged on
    the ``visionpe.weights`` logger. ``strict=True`` raises a ``ValueError`` listing them instead, before the
    model is changed: only kept and converted keys are allowed.

    ``source_grid``: ``(height, width)`` of the checkpoint's ``pos_embed`` patch grid (a checkpoint does not store
    it); by default the model's grid when the counts agree, else square (:func:`pos_embed_tensors`).

    A NaN or infinite value in any tensor of the checkpoint is a ``ValueError`` naming it, as in
    :func:`~visionpe.weights.load_weights`, unless ``allow_nonfinite=True``; so is a converted tensor of another
    shape than the model's (a ``pos_embed`` of another width).
    """
    check_module("model", model)
    _check_strict(strict)
    check_bool("allow_nonfinite", allow_nonfinite)
    report, load = LoadReport(), {}
    state = read_state_dict(source)
    if not allow_nonfinite:
        check_finite(state, _where(source), "pass allow_nonfinite=True to load it anyway")
    state = _eva_to_vit(state, report)
    target = model.state_dict()
    mismatched: dict[str, str] = {}
    tokens = getattr(model, "pe_tokens", None)
    learned = tokens if hasattr(tokens, "factor_tables") else None
    for key, value in state.items():
        tables = None
        if key == "pos_embed" and learned is not None:
            tables = pos_embed_tensors(learned, value, source_grid)
        elif key == "pe_tokens.table" and learned is not None and value.ndim == 3 and \
                (learned.ndim == 3 or learned.factorized is not False):  # an image run's table
            tables = spatial_tables(learned, value)
        if tables is not None:
            for name, tensor in tables.items():
                new_key = f"pe_tokens.{name}"
                load[new_key] = tensor
                report.converted.append(f"{key} -> {new_key}")
            continue
        match = _SWIN_POSITIONAL.match(key)
        new_key = f"{match.group(1)}.bias.{match.group(2)}" if match else key
        if new_key in target and target[new_key].shape == value.shape:
            load[new_key] = value
            if match:
                report.converted.append(f"{key} -> {new_key}")
            elif not any(line.endswith(f"-> {key}") for line in report.converted):
                report.kept.append(key)
            continue
        resized = None
        if new_key in target:
            resized = _image_to_video(model, new_key, value, target[new_key]) or \
                _resample_positional(model, new_key, value, target)
        if resized is not None:
            load[new_key], how = resized
            report.converted.append(f"{key} -> {new_key} ({how})")
            continue
        if new_key in target:
            mismatched[key] = f"{tuple(value.shape)} in the checkpoint, {tuple(target[new_key].shape)} in the model"
        report.dropped.append(key)
    report.new = [k for k in target if k not in load]
    notable = [k for k in report.dropped + report.new if not is_classifier(k)]
    if strict and (report.new or report.dropped):
        raise ValueError(f"load_timm_checkpoint(strict=True): {_where(source)} does not fit {type(model).__name__} "
                         f"(nothing was loaded):\n" + _summary(report, mismatched, limit=None))
    check_shapes(load, target, f"{_where(source)} does not fit {type(model).__name__}", report.converted)
    model.load_state_dict(load, strict=False)
    if notable:
        logger.warning("load_timm_checkpoint: %s into %s left keys unused or unset (positional: %s):\n%s",
                       _where(source), type(model).__name__,
                       ", ".join(k for k in notable if is_positional(k)) or "none",
                       _summary(report, mismatched, limit=10))
    elif report.new or report.dropped:
        logger.info("load_timm_checkpoint: classifier head not loaded (%s)", ", ".join(report.dropped + report.new))
    return report


def is_classifier(key: str) -> bool:
    """``key`` belongs to the classifier head (timm's ``head.*``)."""
    return key.startswith("head.") or key == "head"


_POSITIONAL_PARTS = ("pos_embed", "pe_tokens.", ".rotary.", "rope.", "relative_position", "cpb_mlp", ".attn.bias.")


def is_positional(key: str) -> bool:
    """``key`` is a position weight of timm or visionpe (a table, frequencies, a bias MLP)."""
    return any(part in key for part in _POSITIONAL_PARTS)


def _summary(report: LoadReport, mismatched: dict[str, str], limit: int | None) -> str:
    """The dropped and new keys, one a line (``limit`` of each at most), shape mismatches annotated."""
    lines = []
    for label, keys in (("dropped", report.dropped), ("new", report.new)):
        shown = keys if limit is None else keys[:limit]
        lines += [f"  {label:7s} {k}" + (f" (shape {mismatched[k]})" if label == "dropped" and k in mismatched else "")
                  for k in shown]
        if len(keys) > len(shown):
            lines.append(f"  ... {len(keys) - len(shown)} more {label}")
    return "\n".join(lines)


@torch.no_grad()
def _resample_positional(model: nn.Module, key: str, value: torch.Tensor, target: dict):
    """A visionpe position table of another grid/window size resampled to the model's one, and how; None when
    ``key`` is no such table or the shapes cannot be matched (other width, heads or number of axes)."""
    want = target[key]
    if key.startswith("pe_tokens."):
        tokens = model.get_submodule("pe_tokens")
        interpolation, antialias = getattr(tokens, "interpolation", "bicubic"), getattr(tokens, "antialias", True)
        if key == "pe_tokens.table" and value.ndim == want.ndim and value.shape[-1] == want.shape[-1]:
            table = resample_grid(value, want.shape[:-1], interpolation, antialias)
            return table, f"resampled {_x(value.shape[:-1])} -> {_x(want.shape[:-1])}"
        if re.fullmatch(r"pe_tokens\.axis_tables\.\d+", key) and value.ndim == want.ndim == 2 \
                and value.shape[1] == want.shape[1]:
            return (resample_axis(value, 0, want.shape[0], interpolation, antialias),
                    f"resampled {value.shape[0]} -> {want.shape[0]}")
        return None
    if key.endswith(".relative_position_bias_table"):
        bias = model.get_submodule(key.rsplit(".", 1)[0])
        window = getattr(bias, "window_size", None)
        if window is None or value.ndim != 2 or value.shape[1] != want.shape[1]:
            return None
        extra = 3 if getattr(bias, "prefix_entries", False) else 0
        source_window = _window_from_rows(value.shape[0] - extra, len(window))
        if source_window is None:
            return None
        rows = value.shape[0] - extra
        spatial = value[:rows].reshape(*[2 * w - 1 for w in source_window], -1)
        resized = resample_grid(spatial, [2 * w - 1 for w in window], bias.interpolation, bias.antialias)
        return torch.cat([resized.reshape(-1, value.shape[1]), value[rows:]], 0), "resized"
    return None


def _x(shape) -> str:
    return "x".join(map(str, shape))


def _window_from_rows(rows: int, ndim: int = 2) -> tuple[int, ...] | None:
    """The cubic window whose relative-offset table has ``rows`` rows (``(2 w - 1) ** ndim``), or None."""
    side = int(round(rows ** (1 / ndim))) if rows > 0 else 0
    if side <= 0 or side ** ndim != rows or side % 2 == 0:
        return None
    return ((side + 1) // 2,) * ndim
