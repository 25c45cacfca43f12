"""Checkpoints of other models converted on load: timm ViT/DeiT ``pos_embed``, Swin tables and Swin-V2 MLPs, visionpe
tables of another grid, image weights inflated into video models (I3D), and what a backbone's adapter adds (its
``checkpoint_hooks``: e.g. timm's Eva rope-vit ports into a ViT)."""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from .._checks import check_bool, check_choice, check_module
from ..resample import TABLE_RESIZES, resample_axis, resample_grid, resample_offsets_geometric
from .io import check_finite, check_shapes, check_strict, read_state_dict, source_name

logger = logging.getLogger("visionpe.weights")  # one name for every weights module


@dataclass
class LoadReport:
    """What :func:`load_timm_checkpoint` did with each key, and what it had to assume."""

    converted: list[str] = field(default_factory=list)  # "source -> target" positional weights mapped
    kept: list[str] = field(default_factory=list)  # loaded as they were
    new: list[str] = field(default_factory=list)  # model keys the checkpoint did not provide
    dropped: list[str] = field(default_factory=list)  # checkpoint keys with no place in the model
    assumed: list[str] = field(default_factory=list)  # what the checkpoint does not say and the loader assumed

    def counts(self) -> str:
        return (f"{len(self.kept)} kept, {len(self.converted)} converted, {len(self.new)} new, "
                f"{len(self.dropped)} dropped")

    def __str__(self) -> str:
        lines = [self.counts()]
        lines += [f"  converted {k}" for k in self.converted]
        lines += [f"  new       {k}" for k in self.new]
        lines += [f"  dropped   {k}" for k in self.dropped]
        lines += [f"  assumed   {k}" for k in self.assumed]
        return "\n".join(lines)


# timm's attention-held position tables (Swin, BEiT) and Swin-V2's MLP -> the attention's visionpe bias slot
_ATTENTION_TABLES = re.compile(r"(.*\.attn)\.(relative_position_bias_table|cpb_mlp\..*)$")


def pos_embed_tensors(tokens: nn.Module, pos_embed: torch.Tensor, source_grid=None) -> dict[str, torch.Tensor]:
    """timm ``pos_embed (1, P + N, D)`` -> a ``Learned`` module's state dict (its tables and ``prefix``), from
    ``source_grid`` ``(H, W)`` to the module's grid (:func:`spatial_tables`); by default the grid
    :func:`pos_embed_grid` assumes."""
    p = tokens.num_prefix_tokens
    source_grid = pos_embed_grid(tokens, pos_embed, source_grid)[0]
    tables = spatial_tables(tokens, pos_embed[0, p:].reshape(*source_grid, -1))
    return {**tables, "prefix": pos_embed[0, :p]} if p else tables


def pos_embed_grid(tokens: nn.Module, pos_embed: torch.Tensor, source_grid=None) -> tuple[tuple[int, int], str | None]:
    """The patch grid ``(H, W)`` of a timm ``pos_embed (1, P + N, D)`` read into the ``Learned`` module ``tokens``,
    and what was assumed (None when ``source_grid`` gave it).

    A checkpoint stores no grid, so without ``source_grid`` the grid is a guess, as timm's checkpoint filter makes
    it: the module's own image grid when it has ``N`` patches, else a square grid of ``N`` patches; the note says
    which, and which other grids ``N`` fits (``16 x 4 = 64`` reads as ``8 x 8`` into an 8x8 model). Any other ``N``
    is a ``ValueError`` asking for ``source_grid``."""
    p = tokens.num_prefix_tokens
    patches = pos_embed.shape[1] - p
    space = tuple(tokens.grid_shape[-2:])
    if source_grid is None:
        side = math.isqrt(max(patches, 0))
        if math.prod(space) == patches:
            grid, why = space, "the model's grid"
        elif side * side == patches:
            grid, why = (side, side), "a square grid"
        else:
            raise ValueError(f"pos_embed of shape {tuple(pos_embed.shape)} holds {patches} patch positions, neither "
                             f"the model's grid {space} nor a square grid: give source_grid=(height, width) of the "
                             "checkpoint's patch grid")
        others = [_x(g) for g in grids_of(patches) if g != grid]
        fits = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        note = None if not others else (
            f"pos_embed: {patches} patch positions read as the grid {_x(grid)} ({why}; a checkpoint stores no grid, "
            f"and {patches} also fits {fits}): give {GRID_HINT} if it was another")
        return grid, note
    source_grid = tuple(source_grid) if isinstance(source_grid, (tuple, list)) else source_grid
    if not (isinstance(source_grid, tuple) and len(source_grid) == 2
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in source_grid)):
        raise ValueError(f"source_grid must be (height, width), two positive integers, got {source_grid!r}")
    if math.prod(source_grid) != patches:
        raise ValueError(f"source_grid={source_grid} has {math.prod(source_grid)} patches but pos_embed of shape "
                         f"{tuple(pos_embed.shape)} holds {patches} (after {p} prefix tokens)")
    return source_grid, None


GRID_HINT = "source_grid=(height, width)"  # how to give the grid (the training CLI names its own flag instead)


def grids_of(patches: int) -> list[tuple[int, int]]:
    """The grids ``(H, W)`` with both sides at least 2 holding ``patches`` patches, the squarest first."""
    grids = [(h, patches // h) for h in range(2, patches // 2 + 1) if patches % h == 0]
    return sorted(grids, key=lambda g: (abs(math.log(g[0] / g[1])), -g[0]))


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
                         table_resize: str | None = None, allow_nonfinite: bool = False) -> LoadReport:
    """Load a plain timm checkpoint (a ViT, DeiT, Eva, Swin or BEiT state dict, a file, or a timm model), or a visionpe
    one of another size, into a visionpe-patched model and report every key.

    ``pos_embed`` becomes the ``learned`` table (resampled to the model's grid), a Swin or BEiT
    ``relative_position_bias_table`` goes to ``swin_bias`` / ``rel_bias``, Swin-V2 ``cpb_mlp`` to ``cpb``, and the
    model's adapter converts what its family needs (its ``checkpoint_hooks``: timm's rope-vit ports, Eva classes such
    as ``vit_small_patch16_rope_224``, load into a ViT with ``pe="rope_axial"``/``"rope_mixed"``; a mixed RoPE's
    ``rope.freqs`` into each block's). A visionpe ``learned`` table (``pe_tokens.table``, or the factorized
    ``pe_tokens.axis_tables.N``) or relative-bias table saved at another grid or window size is resampled to the
    model's, as timm's ``pos_embed`` is. Everything else must match by name and shape.

    One report per load on the ``visionpe.weights`` logger, each key named once (a key of every block once, as
    ``blocks.*.name``): a warning when a non-positional weight beyond the classifier head (``head.*``) is dropped
    (checkpoint keys) or new (model keys left at their initial values), or when a grid had to be assumed; else
    information (the position weights the encoding change leaves behind). ``strict=True`` raises a ``ValueError``
    listing them instead, before the model is changed: only kept and converted keys are allowed.

    ``source_grid``: ``(height, width)`` of the checkpoint's ``pos_embed`` patch grid. A state dict does not store
    it: by default the model's grid when the counts agree, else square, and the report says so with the other grids
    the count fits (:func:`pos_embed_grid`); from a timm model (``source`` an ``nn.Module``) it is that model's. Given
    where nothing reads it (no ``pos_embed`` in the checkpoint, or no ``learned`` table in the model) it is a
    ``ValueError``.
    ``table_resize``: how a relative position table of another window is resized: None (default) as its source
    does it, timm's geometric ``resize_rel_pos_bias_table`` for a timm (BEiT, Swin) checkpoint and the table's own
    interpolation for a visionpe one; ``"geometric"``, or an interpolation (``"bicubic"``, ...) for every table. A
    bias that takes a timm table keeps that method as its ``interpolation`` (how ``rel_bias`` grows its table on a
    larger grid), so the model at another size matches timm's model built there from the same checkpoint.

    A NaN or infinite value in any tensor of the checkpoint is a ``ValueError`` naming it, as in
    :func:`~visionpe.weights.load_weights`, unless ``allow_nonfinite=True``; so is a converted tensor of another
    shape than the model's (a ``pos_embed`` of another width).

    timm's feature wrappers (``features_only=True``): the intermediate-layer getter of a ViT, DeiT or Eva
    (``FeatureGetterNet``, the model under ``model.``) is seen through, the checkpoint loading into the model it wraps
    (the report names that model's keys); a stage list or hook wrapper (Swin's ``FeatureListNet``), whose keys timm
    renames, is a ``ValueError``: load the checkpoint while timm builds it (``pretrained=True`` with
    ``pretrained_cfg_overlay=dict(file=...)``) or into the model before wrapping it.
    """
    check_module("model", model)
    model = _unwrap_features(model)
    check_strict(strict)
    check_bool("allow_nonfinite", allow_nonfinite)
    if table_resize is not None:
        check_choice("table_resize", table_resize, TABLE_RESIZES)
    given_grid = source_grid
    if isinstance(source, nn.Module):
        grid = getattr(getattr(source, "patch_embed", None), "grid_size", None)
        source_grid = tuple(grid) if source_grid is None and grid is not None else source_grid
        where, source = f"{type(source).__name__} model", source.state_dict()
    else:
        where = source_name(source)
    report, load = LoadReport(), {}
    state = read_state_dict(source)
    if not allow_nonfinite:
        check_finite(state, where, "pass allow_nonfinite=True to load it anyway")
    for hook in getattr(getattr(model, "pe_adapter", None), "checkpoint_hooks", ()):  # the model's backbone record
        state = hook(state, report)
    target = model.state_dict()
    mismatched: dict[str, str] = {}
    learned = pos_embed_reader(model)
    if given_grid is not None and (learned is None or "pos_embed" not in state):
        raise ValueError(f"load_timm_checkpoint: source_grid={given_grid} is the grid of a timm pos_embed read into "
                         f"a learned table, but " + ("the model has no learned table" if learned is None else
                                                     f"{where} holds no pos_embed (a visionpe table stores its grid)")
                         + "; leave out source_grid")
    timm_tables = []  # the bias modules that take a timm relative position table
    for key, value in state.items():
        tables = None
        if key == "pos_embed" and learned is not None:
            grid, assumed = pos_embed_grid(learned, value, source_grid)
            tables = pos_embed_tensors(learned, value, grid)
            report.assumed += [assumed] if assumed else []
        elif key == "pe_tokens.table" and learned is not None and value.ndim == 3 and \
                (learned.ndim == 3 or learned.factorized is not False):  # an image run's table
            tables = spatial_tables(learned, value)
        if tables is not None:
            for name, tensor in tables.items():
                new_key = f"pe_tokens.{name}"
                load[new_key] = tensor
                report.converted.append(f"{key} -> {new_key}")
            continue
        match = _ATTENTION_TABLES.match(key)
        new_key = f"{match.group(1)}.bias.{match.group(2)}" if match else key
        if match and new_key.endswith(".relative_position_bias_table") and new_key in target:
            timm_tables.append(new_key.rsplit(".", 1)[0])
        if new_key in target and target[new_key].shape == value.shape:
            load[new_key] = value
            if match:
                report.converted.append(f"{key} -> {new_key}")
            elif not any(line.endswith(f"-> {key}") for line in report.converted):
                report.kept.append(key)
            continue
        resized = None
        if new_key in target:
            resize = table_resize or ("geometric" if match else None)  # a timm table: timm's resize
            resized = _image_to_video(model, new_key, value, target[new_key]) or \
                _resample_positional(model, new_key, value, target, resize)
        if resized is not None:
            load[new_key], how = resized
            report.converted.append(f"{key} -> {new_key} ({how})")
            continue
        if new_key in target:
            mismatched[key] = f"{tuple(value.shape)} in the checkpoint, {tuple(target[new_key].shape)} in the model"
        report.dropped.append(key)
    report.new = [k for k in target if k not in load]
    if strict and (report.new or report.dropped):
        raise ValueError(f"load_timm_checkpoint(strict=True): {where} does not fit {type(model).__name__} "
                         f"(nothing was loaded):\n" + _summary(report, mismatched, limit=None))
    if state and all(k.startswith("head.") for k in load):  # another model's or size's checkpoint (its classifier
        # head aside): the model would keep its initial weights
        first = next(iter(mismatched.items()), None)
        shown = (f"{first[0]} is {first[1]}" + (f" (and {len(mismatched) - 1} more of another shape)"
                                                if len(mismatched) > 1 else "")) if first else \
            f"none of its {len(state)} keys is the model's (e.g. {next(iter(state))})"
        raise NothingFits(f"load_timm_checkpoint: nothing of {where} fits {type(model).__name__}: {shown}; the "
                          "model would keep its initial weights", report)
    check_shapes(load, target, f"{where} does not fit {type(model).__name__}", report.converted)
    model.load_state_dict(load, strict=False)
    for name in timm_tables:  # a larger grid later grows the table as timm would build its model there
        model.get_submodule(name).interpolation = table_resize or "geometric"
    _log_report(report, mismatched, f"{where} into {type(model).__name__}")
    return report


class NothingFits(ValueError):
    """:func:`load_timm_checkpoint` of a checkpoint of which nothing but the classifier head fits the model (another
    model's, or another size's); ``report``: what was found, nothing loaded."""

    def __init__(self, message: str, report: LoadReport):
        super().__init__(message)
        self.report = report


def pos_embed_reader(model: nn.Module) -> nn.Module | None:
    """The ``learned`` table of ``model`` that a timm ``pos_embed`` loads into, None when it has none."""
    tokens = getattr(model, "pe_tokens", None)
    return tokens if hasattr(tokens, "factor_tables") else None


def _unwrap_features(model: nn.Module) -> nn.Module:
    """The model a timm feature wrapper holds (``FeatureGetterNet.model``), ``model`` itself when it is none; a
    ValueError for the wrappers whose keys timm renames (``FeatureDictNet``, ``FeatureListNet``, ``FeatureHookNet``,
    ``FeatureGraphNet``), where the positional tables would silently stay at their initial values."""
    from timm.models._features import FeatureGetterNet
    if isinstance(model, FeatureGetterNet):
        return _unwrap_features(model.model)
    if type(model).__module__.startswith("timm.models._features"):
        raise ValueError(f"load_timm_checkpoint: model is timm's feature wrapper {type(model).__name__}, whose keys "
                         f"timm renamed from the model's ('layers.0' -> 'layers_0'), so the checkpoint's position "
                         f"tables would not load; load it while timm builds the model (timm.create_model('vpe_<name>', "
                         f"features_only=True, pretrained=True, pretrained_cfg_overlay=dict(file=PATH))) or into the "
                         f"model before wrapping it")
    return model


def _log_report(report: LoadReport, mismatched: dict[str, str], what: str) -> None:
    """One report of a load: a warning when a non-positional weight (beyond the classifier head) did not load or a
    grid was assumed, information when only the position weights of another encoding and the head differ."""
    unexpected = [k for k in report.dropped + report.new if not is_classifier(k) and not is_positional(k)]
    if not (report.dropped or report.new or report.assumed):
        return
    lines = [f"load_timm_checkpoint: {what}: {report.counts()}"]
    if unexpected:
        lines.append(_summary(LoadReport(new=[k for k in report.new if k in unexpected],
                                         dropped=[k for k in report.dropped if k in unexpected]), mismatched, limit=10))
    for label, test in (("positional", is_positional), ("classifier head", is_classifier)):
        kinds = [f"{grouped(keys)} ({kind})" for kind, keys in
                 (("dropped", [k for k in report.dropped if test(k) and k not in unexpected]),
                  ("new", [k for k in report.new if test(k) and k not in unexpected])) if keys]
        if kinds:
            lines.append(f"  {label}, not loaded: {'; '.join(kinds)}")
    lines += [f"  assumed {note}" for note in report.assumed]
    logger.log(logging.WARNING if unexpected or report.assumed else logging.INFO, "\n".join(lines))


def grouped(keys: list[str]) -> str:
    """Keys with each block's copy named once: ``blocks.0.attn.rotary.freqs, blocks.1.attn.rotary.freqs`` ->
    ``blocks.*.attn.rotary.freqs (2)``."""
    counts: dict[str, int] = {}
    for key in keys:
        pattern = re.sub(r"(?<=\.)\d+(?=\.)", "*", key)
        counts[pattern] = counts.get(pattern, 0) + 1
    return ", ".join(k if n == 1 else f"{k} ({n})" for k, n in counts.items())


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
def _resample_positional(model: nn.Module, key: str, value: torch.Tensor, target: dict, table_resize: str | None):
    """A visionpe position table of another grid/window size resampled to the model's one, and how; None when
    ``key`` is no such table or the shapes cannot be matched (other width, heads or number of axes).
    ``table_resize``: how a relative table is resized (``"geometric"``, an interpolation; None: the table's own)."""
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
        offsets = [2 * w - 1 for w in window]
        how = table_resize or bias.interpolation
        if how == "geometric":  # BEiT's, timm resize_rel_pos_bias_table
            resized = resample_offsets_geometric(spatial, offsets)
        else:
            resized = resample_grid(spatial, offsets, how, bias.antialias)
        return (torch.cat([resized.reshape(-1, value.shape[1]), value[rows:]], 0),
                f"resized {_x(source_window)} -> {_x(window)} ({how})")
    return None


def _x(shape) -> str:
    return "x".join(map(str, shape))


def _window_from_rows(rows: int, ndim: int = 2) -> tuple[int, ...] | None:
    """The cubic window whose relative-offset table has ``rows`` rows (``(2 w - 1) ** ndim``), or None."""
    side = int(round(rows ** (1 / ndim))) if rows > 0 else 0
    if side <= 0 or side ** ndim != rows or side % 2 == 0:
        return None
    return ((side + 1) // 2,) * ndim
