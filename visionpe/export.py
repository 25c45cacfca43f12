"""A model for deployment: a ``torch.export`` program or an ONNX file whose height and width (and a video's frame
count, and the batch) are free, checked against the eager model at sizes the export never traced.

    >>> from visionpe import export
    >>> model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed", img_size=64, patch_size=8).eval()
    >>> x = export.example_input(model)                       # (2, 3, 64, 64): the model's own size
    >>> program = export.export_program(model, x)              # dynamic batch, height and width (multiples of 8)
    >>> export.save(program, "model.pt2")                     # torch.export.load("model.pt2") reads it back
    >>> onnx_program = export.export_onnx(program, x, path="model.onnx")   # the dynamo exporter
    >>> checks = export.check_export(model, export.runner("model.onnx", "onnx"), export.check_sizes(model))
    >>> all(c.ok for c in checks)                              # onnxruntime at 64x64, 80x80 and 72x128 px
    True

Each spatial axis (and a video's time axis) is ``torch.export.Dim(name) * patch``: a multiple of the patch (tubelet)
size, traced symbolically, so the positional tables are computed in the graph from the input's size; the batch is a
``Dim`` too. torch.export specialises sizes 0 and 1, so the example has a batch of at least 2 and at least 2 patches
along each axis. A model whose forward specialises on its size (a Python ``int()`` of a traced size, a
value-dependent branch) fails to export (an :class:`ExportError`) or exports a program that refuses other sizes
("Guard failed"): :func:`check_export` finds the second, at sizes the trace never saw.

The check: ``max |exported(x) - eager(x)| <= atol + rtol * max |eager(x)|`` with ``atol = rtol = 1e-5``
(:data:`ATOL`, :data:`RTOL`), float32 on CPU, at each size of :func:`check_sizes` (the traced size, and, for a dynamic
export, a larger square one and a non-square one), the batch alternating between 2 and 1.

The files are written atomically (:func:`save`): ``torch.export.save`` for a program (``.pt2``), the ONNX model with
its weights inside (a model under 2 GB); :func:`to_bytes` gives the bytes, so a caller can check them
(:func:`runner` takes bytes too) before anything is written. Needs torch >= 2.6
(:data:`MIN_TORCH`); ONNX needs the ``export`` extra (``pip install 'visionpe[export]'``: onnx, onnxscript, and
onnxruntime for the check).
"""
from __future__ import annotations

import importlib.util
import io
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from .weights.io import atomic_write

ATOL = 1e-5  # the check's absolute tolerance
RTOL = 1e-5  # ... and its tolerance relative to the largest eager output
MIN_TORCH = (2, 6)  # torch.export's derived dims (Dim * patch) and the dynamo ONNX exporter taking an ExportedProgram
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")  # the export extra
FORMATS = ("pt2", "onnx")


class ExportError(RuntimeError):
    """The model did not export, or the exported model differs from the eager one (the message says which)."""


def torch_supports_export() -> bool:
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= MIN_TORCH


def missing_onnx_packages() -> list[str]:
    """The packages of the ``export`` extra that are not installed (none: ONNX export and its check can run)."""
    return [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]


def _require_torch() -> None:
    if not torch_supports_export():
        raise ExportError(f"exporting needs torch >= {'.'.join(map(str, MIN_TORCH))}, installed {torch.__version__}")


def _require_onnx(what: str = "ONNX export") -> None:
    missing = missing_onnx_packages()
    if missing:
        raise ModuleNotFoundError(f"{what} needs {', '.join(missing)}: pip install 'visionpe[export]' (the export "
                                  f"extra: {', '.join(ONNX_PACKAGES)})")


def patch_size_of(model: nn.Module) -> tuple[int, ...]:
    """The patch size per input axis, ``(p_h, p_w)`` or a video model's tubelet ``(t, p_h, p_w)``:
    ``model.patch_embed.patch_size``; a ``ValueError`` for a model without it (give ``patch=`` instead)."""
    size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if size is None:
        raise ValueError(f"cannot tell the patch size of {type(model).__name__} (no patch_embed.patch_size): pass "
                         "patch=(p_h, p_w), or (t, p_h, p_w) for a video model")
    return tuple(int(s) for s in ((size, size) if isinstance(size, int) else size))


def _patch(model: nn.Module, patch) -> tuple[int, ...]:
    if patch is None:
        return patch_size_of(model)
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    if len(patch) not in (2, 3) or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in patch):
        raise ValueError(f"patch must be 2 or 3 positive integers (an image's (p_h, p_w), a video's (t, p_h, p_w)), "
                         f"got {patch!r}")
    return patch


def native_size(model: nn.Module, patch=None) -> tuple[int, ...]:
    """The input size the model was built for (``patch_embed.img_size``): ``(H, W)``, or ``(T, H, W)`` for video."""
    patch = _patch(model, patch)
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if size is None:
        raise ValueError(f"cannot tell the input size of {type(model).__name__} (no patch_embed.img_size): pass an "
                         "example input")
    size = tuple(int(s) for s in ((size,) * len(patch) if isinstance(size, int) else size))
    if len(size) != len(patch):
        raise ValueError(f"input size {size} and patch {patch} differ in axes")
    return size


def in_chans_of(model: nn.Module) -> int:
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    return int(getattr(proj, "in_channels", 3))


def example_input(model: nn.Module, size: Sequence[int] | None = None, batch: int = 2, patch=None,
                  seed: int = 0) -> torch.Tensor:
    """A float32 ``(batch, C, *size)`` batch of the model's channels (``size`` default: its own input size, each axis
    raised to 2 patches where it had fewer, since torch.export specialises sizes 0 and 1), from a seeded generator."""
    if size is None:
        patch = _patch(model, patch)
        size = tuple(max(s, 2 * p) for s, p in zip(native_size(model, patch), patch))
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, in_chans_of(model), *size, generator=generator)


def dynamic_shapes(example: torch.Tensor, patch: Sequence[int], dynamic: bool = True,
                   max_size: int = 65536) -> tuple[dict]:
    """The ``dynamic_shapes`` of ``torch.export.export`` for a model taking ``example`` ``(B, C, *spatial)``: the batch
    a ``Dim``, and with ``dynamic`` each spatial axis ``Dim(name) * patch``, at most ``max_size`` pixels (frames)."""
    Dim = torch.export.Dim
    spec = {0: Dim("batch", min=1, max=max_size)}
    if dynamic:
        names = ("h", "w") if len(patch) == 2 else ("t", "h", "w")
        for axis, (name, p) in enumerate(zip(names, patch), start=2):
            spec[axis] = Dim(name, min=1, max=max(1, max_size // p)) * p
    return (spec,)


def _check_example(example, patch, dynamic: bool) -> None:
    if not isinstance(example, torch.Tensor) or example.ndim != 2 + len(patch):
        layout = "(B, C, T, H, W)" if len(patch) == 3 else "(B, C, H, W)"
        got = f"shape {tuple(example.shape)}" if isinstance(example, torch.Tensor) else type(example).__name__
        raise ValueError(f"example must be a {layout} tensor for a model of patch {patch}, got {got}")
    sides = tuple(example.shape[2:])
    if any(s % p or s < p for s, p in zip(sides, patch)):
        raise ValueError(f"example size {sides} must be a positive multiple of the patch {patch} on each axis")
    grid = tuple(s // p for s, p in zip(sides, patch))
    if example.shape[0] < 2 or (dynamic and min(grid) < 2):
        raise ValueError(f"torch.export specialises sizes 0 and 1, so a free size is traced at >= 2: the example has "
                         f"batch {example.shape[0]} and {grid} patches; use a batch of at least 2"
                         + (" and at least 2 patches an axis (example_input does)" if dynamic else ""))


def _first_line(err: BaseException, limit: int = 300) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text[:limit]


def export_program(model: nn.Module, example: torch.Tensor, *, dynamic: bool = True, patch=None,
                   strict: bool = False) -> torch.export.ExportedProgram:
    """``torch.export.export(model, (example,))`` with a free batch; with ``dynamic`` (default) the height and width
    (and a video's frame count) are symbolic too: multiples of the patch (:func:`dynamic_shapes`). ``model`` should
    be in eval mode. An :class:`ExportError` if torch.export cannot trace it (the first line of torch's reason)."""
    _require_torch()
    patch = _patch(model, patch)
    _check_example(example, patch, dynamic)
    shapes = dynamic_shapes(example, patch, dynamic)
    try:
        with torch.no_grad():
            return torch.export.export(model, (example,), dynamic_shapes=shapes, strict=strict)
    except Exception as err:
        kind = "with a dynamic size" if dynamic else "at a fixed size"
        raise ExportError(f"torch.export could not trace {type(model).__name__} {kind}: {type(err).__name__}: "
                          f"{_first_line(err)}") from err


def export_onnx(model_or_program, example: torch.Tensor, *, dynamic: bool = True, path=None, patch=None,
                opset: int | None = None, optimize: bool = True):
    """The dynamo ONNX exporter (``torch.onnx.export(..., dynamo=True)``) of a model or of an
    :func:`export_program` program (whose dynamic sizes it keeps); returns torch's ``ONNXProgram``, written to ``path``
    atomically when given (:func:`save`). Input ``x``, output ``output``."""
    _require_torch()
    _require_onnx()
    if isinstance(model_or_program, torch.export.ExportedProgram):
        program = model_or_program
    else:
        program = export_program(model_or_program, example, dynamic=dynamic, patch=patch)
    try:
        onnx_program = torch.onnx.export(program, (example,), dynamo=True, input_names=["x"], output_names=["output"],
                                         opset_version=opset, optimize=optimize, verbose=False)
    except Exception as err:
        raise ExportError(f"the ONNX exporter could not convert the program: {type(err).__name__}: "
                          f"{_first_line(err)}") from err
    if path is not None:
        save(onnx_program, path)
    return onnx_program


def to_bytes(exported) -> bytes:
    """The file's bytes: a ``torch.export`` program as ``torch.export.save`` writes it (``.pt2``), torch's
    ``ONNXProgram`` as an ONNX model with its weights inside (under 2 GB: protobuf's limit).

    A program is saved as its inference IR (``program.run_decompositions({})``: the same operators, functional,
    autocast regions inlined): torch 2.14 cannot serialize the training IR of a program whose
    ``torch.autocast(enabled=False)`` region (the rotary tables are built in float32 in one) takes a symbolic float."""
    if isinstance(exported, torch.export.ExportedProgram):
        buffer = io.BytesIO()
        try:
            torch.export.save(exported.run_decompositions({}), buffer)
        except Exception as err:
            raise ExportError(f"torch.export.save could not serialize the program: {type(err).__name__}: "
                              f"{_first_line(err)}") from err
        return buffer.getvalue()
    if hasattr(exported, "model_proto"):
        try:
            return exported.model_proto.SerializeToString()
        except ValueError as err:  # protobuf refuses a message over 2 GB
            raise ExportError(f"the ONNX model does not fit one file: {_first_line(err)}") from err
    raise TypeError(f"exported must be a torch.export.ExportedProgram or torch's ONNXProgram, got "
                    f"{type(exported).__name__}")


def save(exported, path) -> Path:
    """Write :func:`to_bytes` (or bytes) to ``path`` atomically (:func:`visionpe.weights.io.atomic_write`: a reader
    never sees a half-written file); ``torch.export.load(path)`` or onnxruntime reads it back."""
    data = exported if isinstance(exported, bytes) else to_bytes(exported)
    path = Path(path)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
    return path


def runner(source, format: str, threads: int | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A saved export as a function ``x -> output`` on tensors: ``source`` a path or the bytes of :func:`to_bytes`;
    ``format`` ``"pt2"`` (``torch.export.load(...).module()``) or ``"onnx"`` (an onnxruntime CPU session,
    ``threads`` its intra-op threads)."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if format == "pt2":
        serde = logging.getLogger("torch._export.serde.serialize")
        level = serde.level
        serde.setLevel(logging.ERROR)  # "Symbol ... did not appear in the graph" of a program specialised on its size
        try:
            return torch.export.load(io.BytesIO(source) if isinstance(source, bytes) else os.fspath(source)).module()
        finally:
            serde.setLevel(level)
    _require_onnx("running an ONNX model")
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failed run raises its error anyway
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(source if isinstance(source, bytes) else os.fspath(source), options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {name: x.detach().cpu().numpy()})[0])
    run.session = session
    return run


def check_sizes(model: nn.Module, size: Sequence[int] | None = None, *, dynamic: bool = True,
                patch=None) -> list[tuple[int, ...]]:
    """The input sizes :func:`check_export` runs: ``size`` (default the model's own, at least 2 patches an axis),
    twice for a static export (at two batch sizes); for a dynamic export, also two the trace never saw: 2 patches
    more on every axis, and a non-square one (a video's frame count doubled, height 1 patch more, width doubled)."""
    patch = _patch(model, patch)
    size = tuple(size) if size is not None else tuple(max(s, 2 * p) for s, p in zip(native_size(model, patch), patch))
    if not dynamic:
        return [size, size]  # at batch 2 and 1 (check_export's default batches)
    grid = [s // p for s, p in zip(size, patch)]
    larger = tuple((g + 2) * p for g, p in zip(grid, patch))
    other = [*grid[:-2], grid[-2] + 1, 2 * grid[-1]]
    if len(grid) == 3:
        other[0] = 2 * grid[0]
    if other[-2] == other[-1]:
        other[-1] += 1
    return [size, larger, tuple(g * p for g, p in zip(other, patch))]


@dataclass(frozen=True)
class Check:
    """One size of :func:`check_export`: ``max |exported - eager|`` against ``atol + rtol * max |eager|``, or the error
    the exported model raised at that size."""

    size: tuple[int, ...]
    batch: int
    max_diff: float = math.nan
    scale: float = math.nan  # max |eager|
    tolerance: float = math.nan
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.max_diff <= self.tolerance

    @property
    def size_text(self) -> str:
        return "x".join(map(str, self.size))


def check_export(model: nn.Module, exported: Callable[[torch.Tensor], torch.Tensor], sizes, *, atol: float = ATOL,
                 rtol: float = RTOL, batches: Sequence[int] = (2, 1), seed: int = 0) -> list[Check]:
    """``exported`` (``program.module()``, :func:`onnx_runner`, anything ``x -> output``) against ``model`` (eager, eval
    mode) at each size of ``sizes`` (``(H, W)`` or ``(T, H, W)``), on seeded random inputs, the batch cycling through
    ``batches``. Returns a :class:`Check` a size (``all(c.ok for c in checks)``); an exported model that refuses a
    size is a failed check holding its error."""
    checks = []
    for i, size in enumerate(sizes):
        batch = batches[i % len(batches)]
        x = example_input(model, tuple(size), batch=batch, seed=seed + i)
        with torch.no_grad():
            want = model(x)
            try:
                got = exported(x)
            except Exception as err:  # a guard of a program specialised on its size, onnxruntime's shape errors
                checks.append(Check(tuple(size), batch, error=f"{type(err).__name__}: {_first_line(err, 200)}"))
                continue
        got = got[0] if isinstance(got, (tuple, list)) else got
        if tuple(got.shape) != tuple(want.shape):
            checks.append(Check(tuple(size), batch, error=f"output shape {tuple(got.shape)}, eager "
                                                          f"{tuple(want.shape)}"))
            continue
        scale = want.abs().max().item()
        diff = (got.float() - want.float()).abs().max().item()
        checks.append(Check(tuple(size), batch, diff, scale, atol + rtol * scale))
    return checks
