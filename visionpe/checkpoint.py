"""Weights in and out: safetensors files written atomically, and plain timm checkpoints converted on load."""
from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from .resample import resample_grid


def atomic_write(path, write) -> None:
    """``write(tmp_path)`` next to ``path``, then ``os.replace`` onto it: readers never see a half-written file,
    and a kill mid-write leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_weights(model_or_state: nn.Module | dict, path, metadata: dict[str, str] | None = None) -> None:
    """Write a state dict to ``path`` (safetensors) atomically, with optional string ``metadata``."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata))


def weights_metadata(path) -> dict[str, str]:
    """The string metadata stored with a safetensors file (e.g. the epoch ``train_vit.py`` wrote it at)."""
    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}


def read_state_dict(source) -> dict[str, torch.Tensor]:
    """A state dict from a dict, a ``.safetensors`` file, or a torch file (loaded with ``weights_only=True``)."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        return load_file(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "module"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    return state


def load_weights(model: nn.Module, source, strict: bool = True):
    """Load a visionpe model's own checkpoint (as written by :func:`save_weights`)."""
    return model.load_state_dict(read_state_dict(source), strict=strict)


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


def _eva_to_vit(state: dict, report: "LoadReport") -> dict:
    """timm ``Eva`` rope-vit ports (``vit_*_rope_*``) -> ``VisionTransformer`` names: ``gamma_1`` -> ``ls1.gamma``,
    mixed ``rope.freqs (2, depth, heads, d/2)`` -> each block's ``attn.rotary.freqs``."""
    out = {}
    for key, value in state.items():
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
    """timm ``pos_embed (1, P + N, D)`` -> a ``Learned`` module's state dict (``table``, ``prefix``), resampled
    from ``source_grid`` (default: a square grid of ``N`` patches) to the module's grid."""
    p = tokens.num_prefix_tokens
    patches = pos_embed.shape[1] - p
    if source_grid is None:
        side = int(round(patches ** 0.5))
        source_grid = (side, side)
    if math.prod(source_grid) != patches or tokens.factorized:
        raise ValueError(f"cannot convert pos_embed of shape {tuple(pos_embed.shape)} into {tokens!r}")
    table = resample_grid(pos_embed[0, p:].reshape(*source_grid, -1), tokens.grid_shape,
                          tokens.interpolation, tokens.antialias)
    return {"table": table, "prefix": pos_embed[0, :p]} if p else {"table": table}


def load_timm_checkpoint(model: nn.Module, source) -> LoadReport:
    """Load a plain timm ViT/Swin state dict into a visionpe-patched model and report every key.

    ``pos_embed`` becomes the ``learned`` table (resampled to the model's grid), Swin
    ``relative_position_bias_table`` goes to ``swin_bias``, Swin-V2 ``cpb_mlp`` to ``cpb``, and timm's rope-vit ports
    (``Eva`` classes: ``vit_small_patch16_rope_224``, ``..._rope_mixed_224``) load into a ViT with
    ``pe="rope_axial"``/``"rope_mixed"``; positional weights the model's encoding has no use for are dropped,
    everything else must match by name and shape.
    """
    report, load = LoadReport(), {}
    state = _eva_to_vit(read_state_dict(source), report)
    target = model.state_dict()
    for key, value in state.items():
        if key == "pos_embed" and "pe_tokens.table" in target:
            for name, tensor in pos_embed_tensors(model.pe_tokens, value).items():
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
        elif match and match.group(2) == "relative_position_bias_table" and new_key in target:
            bias = model.get_submodule(f"{match.group(1)}.bias")
            source_window = _window_from_rows(value.shape[0])
            resized = resample_grid(value.reshape(*[2 * w - 1 for w in source_window], -1),
                                    [2 * w - 1 for w in bias.window_size], bias.interpolation, bias.antialias)
            load[new_key] = resized.reshape(-1, value.shape[1])
            report.converted.append(f"{key} -> {new_key} (resized)")
        else:
            report.dropped.append(key)
    report.new = [k for k in target if k not in load]
    model.load_state_dict(load, strict=False)
    return report


def _window_from_rows(rows: int) -> tuple[int, int]:
    side = int(round(rows ** 0.5))
    if side * side != rows or side % 2 == 0:
        raise ValueError(f"cannot infer a square window from a bias table of {rows} rows")
    return ((side + 1) // 2,) * 2
