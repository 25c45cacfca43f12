"""Weights and files on disk: atomic writes, safetensors in and out, state dicts read from any checkpoint file."""
from __future__ import annotations

import os
import reprlib
import secrets
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from .._checks import check_module, check_path


def atomic_write(path, write) -> None:
    """``write(tmp_path)`` next to ``path``, then ``os.replace`` onto it: readers never see a half-written file,
    and a kill mid-write leaves the previous file intact (and at most a stray ``.<name>.<random>.tmp`` beside it).

    The result has mode ``0o666`` minus the umask, as ``open(path, "w")`` would give, like any file the user writes
    (``tempfile.mkstemp`` would make it ``0o600``, and so does safetensors' own writer)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            break
        except FileExistsError:
            continue
    try:
        mode = os.fstat(fd).st_mode & 0o777  # 0o666 minus the umask
        os.close(fd)
        write(str(tmp))
        if os.stat(tmp).st_mode & 0o777 != mode:  # a writer that replaced the file (safetensors makes it 0o600)
            os.chmod(tmp, mode)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the data is on disk before the new name points at it
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path, text: str) -> None:
    """``text`` written to ``path`` atomically (:func:`atomic_write`)."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


TORCH_SUFFIXES = (".pth", ".pt")  # written with torch.save (read with torch.load(weights_only=True))


def save_weights(model_or_state: nn.Module | dict, path, metadata: dict[str, str] | None = None) -> None:
    """Write a model's state dict, or a state dict (string keys, tensor values), to ``path`` atomically: safetensors
    for a ``.safetensors`` name (with optional string ``metadata``), a torch file (``torch.save``) for ``.pth`` or
    ``.pt``, the formats :func:`read_state_dict` reads by those names; any other name is a ``ValueError``. Tied
    weights (names of one tensor) are written once, under their first name, as safetensors' ``save_model`` does;
    :func:`load_weights` fills the other names where the model ties them too. Anything but a model or a state dict is
    a ``TypeError`` naming the first wrong entry."""
    check_path("path", path)
    suffix = Path(path).suffix
    if suffix not in (".safetensors", *TORCH_SUFFIXES):
        raise ValueError(f"path {str(path)!r} must end in .safetensors (or {' or '.join(TORCH_SUFFIXES)} for a torch "
                         "file): the suffix names the format read_state_dict and load_weights read it in")
    if metadata is not None and suffix != ".safetensors":
        raise ValueError(f"metadata is stored in .safetensors files only, not in {str(path)!r}")
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    if not isinstance(state, Mapping):
        raise TypeError(f"model_or_state must be a torch.nn.Module or a state dict (a dict of tensors), got "
                        f"{type(state).__name__}")
    bad = non_tensor_entry(state)
    if bad:
        raise TypeError(f"model_or_state is not a state dict: entry {bad[0]!r} holds a {type(bad[1]).__name__}; "
                        "save_weights writes string keys with tensor values")
    state = {k: v.detach().cpu() for k, v in tied_once(state).items()}
    if suffix == ".safetensors":
        state = {k: v.contiguous() for k, v in state.items()}
        atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata))
    else:
        atomic_write(path, lambda tmp: torch.save(state, tmp))


def tied_once(state: Mapping) -> dict[str, torch.Tensor]:
    """``state`` with each tensor under one name: a later name of the same tensor (:func:`_view`: tied weights) is
    left out; another tensor in memory an earlier one uses (a slice of it) is copied, since safetensors stores no
    shared memory."""
    kept, views, storages = {}, set(), set()
    for key, value in state.items():
        if value.numel() == 0 or value.device.type == "meta":
            kept[key] = value
            continue
        view = _view(value)
        if view not in views:
            kept[key] = value.clone() if view[0] in storages else value
            views.add(view)
            storages.add(view[0])
    return kept


def weights_metadata(path) -> dict[str, str]:
    """The string metadata stored with a safetensors file (e.g. the epoch ``train_vit.py`` wrote it at)."""
    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}


def read_state_dict(source) -> dict[str, torch.Tensor]:
    """A state dict from a dict, a ``.safetensors`` file, or a torch file (loaded with ``weights_only=True``).

    Anything else, a file that cannot be read (garbage, truncated) or one that holds no state dict raises a
    ``ValueError`` naming the source."""
    if isinstance(source, Mapping):
        return _check_state_dict(_unwrap(source), "source")
    if not isinstance(source, (str, os.PathLike)):
        shown = "" if isinstance(source, torch.Tensor) else f" {reprlib.repr(source)}"
        raise ValueError(f"source must be a state dict (a dict of tensors) or the path of a checkpoint file, got "
                         f"{type(source).__name__}{shown}")
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist (or is not a file)")
    if path.suffix == ".safetensors":
        try:
            return _check_state_dict(load_file(path), f"checkpoint {str(path)!r}")
        except Exception as err:  # SafetensorError (garbage, truncated), OSError, ...
            if isinstance(err, ValueError) and str(path) in str(err):
                raise
            raise ValueError(f"checkpoint {str(path)!r} is not a readable safetensors file: {err}") from err
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError, a corrupt zip archive, EOFError, ...
        raise ValueError(f"checkpoint {str(path)!r} is not a readable torch checkpoint (corrupt or truncated, not a "
                         f"torch file, or it holds objects that torch.load(weights_only=True) refuses): "
                         f"{_load_error(err)}") from err
    return _check_state_dict(_unwrap(state), f"checkpoint {str(path)!r}")


def _unwrap(state):
    """A training checkpoint's model weights (``{"state_dict": ...}``, ``{"model": ...}``, ``{"module": ...}``)."""
    for key in ("state_dict", "model", "module"):
        if isinstance(state, Mapping) and key in state and isinstance(state[key], Mapping):
            state = state[key]
    return state


def _load_error(err: Exception) -> str:
    """The informative line of a ``torch.load`` error (the weights-only unpickler buries it under advice): the cause
    after ``WeightsUnpickler error:`` (on that line, or on the next one as older torch releases write it), without the
    advice to allow what it refused."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for i, line in enumerate(lines):
        _, found, cause = line.partition("WeightsUnpickler error:")
        cause = cause.strip() or (lines[i + 1] if found and i + 1 < len(lines) else "")
        if found and cause:
            return cause.split(" Please use ")[0][:300]
    return lines[0][:300] if lines else type(err).__name__


def _check_state_dict(state, where: str) -> dict[str, torch.Tensor]:
    """``state`` must be a mapping of string keys to tensors."""
    if not isinstance(state, Mapping):
        raise ValueError(f"{where} does not hold a state dict (a dict of tensors); it holds a "
                         f"{type(state).__name__}")
    bad = non_tensor_entry(state)
    if bad:
        raise ValueError(f"{where} is not a state dict: entry {bad[0]!r} holds a {type(bad[1]).__name__}, not a "
                         "tensor")
    return state if isinstance(state, dict) else dict(state)


def non_tensor_entry(state: Mapping) -> tuple | None:
    """The first ``(key, value)`` of ``state`` that is not a string key with a tensor value, or None."""
    return next(((k, v) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)


def check_finite(state: dict[str, torch.Tensor], where: str, opt_in: str = "") -> None:
    """Every floating-point tensor of ``state`` is finite: a NaN or infinite weight (a diverged run's checkpoint)
    is an error naming the tensor, not a model that outputs NaN; ``opt_in``: how to load it anyway, for the
    message."""
    for key, value in state.items():
        if (value.is_floating_point() or value.is_complex()) and not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).sum())
            raise ValueError(f"{where} holds {bad} NaN or infinite value(s) in {key!r} {tuple(value.shape)}; a "
                             "checkpoint must hold finite weights (was it written after the loss diverged?)"
                             f"{f'; {opt_in}' if opt_in else ''}")


def check_shapes(state: Mapping, target: Mapping, where: str, conversions: list[str] = ()) -> None:
    """Every tensor of ``state`` has the shape of the model's tensor of its name in ``target``: otherwise one line
    naming the first key that does not (and the conversion that made it, from ``conversions``, lines
    ``"source -> key"``), both shapes and how many more there are."""
    wrong = [k for k, v in state.items() if k in target and v.shape != target[k].shape]
    if wrong:
        key = wrong[0]
        made = next((f" ({line})" for line in conversions if line.split(" -> ")[-1].split(" (")[0] == key), "")
        more = f" (and {len(wrong) - 1} more: {', '.join(wrong[1:4])})" if len(wrong) > 1 else ""
        raise ValueError(f"{where}: {key} is {tuple(state[key].shape)} in the checkpoint{made}, "
                         f"{tuple(target[key].shape)} in the model{more}")


def _view(tensor: torch.Tensor) -> tuple:
    """What makes two tensors one: storage, offset, shape, strides, dtype."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            tensor.dtype)


def tied_names(state: Mapping, target: Mapping) -> dict[str, torch.Tensor]:
    """The names ``state`` lacks that the model's state dict ``target`` ties to a name ``state`` holds (one tensor
    under several names, which :func:`save_weights` writes once), each filled from that name."""
    names_of: dict[tuple, list[str]] = {}
    for key, value in target.items():
        if value.numel() and value.device.type != "meta":
            names_of.setdefault(_view(value), []).append(key)
    filled = {}
    for names in names_of.values():
        present = next((n for n in names if n in state), None)
        if present is not None:
            filled.update({n: state[present] for n in names if n not in state})
    return filled


def check_strict(strict) -> None:
    """``strict`` is a bool (the loaders' ``strict=``); a ValueError otherwise."""
    if not isinstance(strict, bool):
        raise ValueError(f"strict must be True or False, got {strict!r}")


def source_name(source) -> str:
    """How a message names a checkpoint source: ``state dict`` or ``checkpoint 'PATH'``."""
    return "state dict" if isinstance(source, Mapping) else f"checkpoint {str(source)!r}"


def load_weights(model: nn.Module, source, strict: bool = True):
    """Load a visionpe model's own checkpoint (as written by :func:`save_weights`).

    A checkpoint of another model (keys missing or unexpected with ``strict=True``, or any tensor of another
    shape) raises a ``ValueError`` naming the file and the keys; so does a NaN or infinite weight
    (:func:`check_finite`). Names the model ties to one tensor need to be in the file once (:func:`tied_names`)."""
    check_module("model", model)
    check_strict(strict)
    state = read_state_dict(source)
    check_finite(state, source_name(source))
    target = model.state_dict()
    state = {**state, **tied_names(state, target)}
    problems = [f"{k}: {tuple(v.shape)} in the checkpoint, {tuple(target[k].shape)} in the model"
                for k, v in state.items() if k in target and v.shape != target[k].shape]
    if strict:
        missing = [k for k in target if k not in state]
        unexpected = [k for k in state if k not in target]
        problems += [f"missing {k}" for k in missing[:10]] + ([f"... {len(missing) - 10} more missing"]
                                                              if len(missing) > 10 else [])
        problems += [f"unexpected {k}" for k in unexpected[:10]] + ([f"... {len(unexpected) - 10} more unexpected"]
                                                                    if len(unexpected) > 10 else [])
    if problems:
        raise ValueError(f"{source_name(source)} does not fit {type(model).__name__}"
                         f"{'' if strict else ' (strict=False)'}:\n  " + "\n  ".join(problems))
    return model.load_state_dict(state, strict=strict)
