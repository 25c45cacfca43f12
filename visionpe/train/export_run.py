"""Export a trained run's model for deployment (torch.export or ONNX), checked against the eager model.

    visionpe export runs/A --format onnx --dynamic                  # runs/A's best weights -> A.onnx, any HxW
    visionpe export runs/A --format pt2 --dynamic --out model.pt2   # torch.export.save of the ExportedProgram
    visionpe export runs/A --format onnx                            # static: the training size only
    visionpe export runs/A --format onnx --dynamic --sizes 32 48x64 # checked at these sizes (and the traced one)
    visionpe export runs/VIDEO --format onnx --dynamic              # a video run: frames, height and width free

The run's model is rebuilt from its config.yaml and its weights loaded as ``visionpe sweep`` and ``visionpe
visualize`` load them (visionpe.train.restore.load_model), in eval mode, float32, on CPU. With ``--dynamic`` the
batch, the height and the width (a video run's frame count too) are symbolic, multiples of the patch (tubelet) size:
the positional tables are computed in the graph from the input's size. Without it the export takes the training
size only (the batch is free either way).

Before anything is written the export is read back from its bytes (torch.export.load; onnxruntime's CPU session)
and compared with the eager model on seeded random inputs: at the traced size and, with ``--dynamic``, at sizes the
trace never saw (``--sizes``, default: 2 patches more on each axis, and a non-square one), printing the largest
absolute difference per size. It passes where ``max |exported - eager| <= 1e-5 + 1e-5 * max |eager|``
(visionpe.export.ATOL, RTOL); otherwise, or when the model does not export (a forward that specialises on its
size), the command prints one line and exits with status 1, and writes nothing. The file is written atomically.

``--format onnx`` needs the export extra: ``pip install 'visionpe[export]'`` (onnx, onnxscript, onnxruntime).
Mistakes in the arguments exit with status 2 and one line. The library behind it: visionpe/export.py.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from .. import cli, export
from ..cli import UserError
from ..cli.report import markdown_table
from . import models, restore
from .settings import TrainSettings

SUFFIX = {"pt2": ".pt2", "onnx": ".onnx"}
SPECIALISED = "(the model's forward specialises on its size: export without --dynamic, at the size you serve; " \
              "docs/deploy.md)"


def parse_size(text: str) -> tuple[int, ...]:
    """One ``--sizes`` entry: ``PX`` (square), ``HxW``, or a video run's ``TxHxW`` -> a tuple of 1 to 3 sides."""
    parts = text.strip().lower().split("x")
    if len(parts) > 3 or not all(p.isascii() and p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give PX, HxW or (video) TxHxW, e.g. 32, 32x48 or "
                                         "8x32x48")
    sides = tuple(int(p) for p in parts)
    if min(sides) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes are positive")
    return sides


def build_parser() -> cli.Parser:
    head, examples = __doc__.split("\n\n")[:2]
    p = cli.Parser(prog="visionpe export", description=head,
                   epilog=examples + "\n\nWhat is checked, the tolerance and what is written: python -m pydoc "
                   "visionpe.train.export_run. Errors in the arguments exit with status 2 and one line; an export that fails or "
                   "differs from the eager model exits with status 1 and one line.")
    p.add_argument("run", type=Path, metavar="RUN",
                   help="a run directory written by visionpe train (or a .safetensors weights file inside one)")
    what = p.add_argument_group("export")
    what.add_argument("--format", required=True, choices=export.FORMATS,
                      help="pt2: torch.export.save of the ExportedProgram; onnx: the dynamo ONNX exporter, checked in "
                           "onnxruntime (needs pip install 'visionpe[export]') (required)")
    what.add_argument("--dynamic", action="store_true",
                      help="free batch, height and width (and a video run's frame count), multiples of the patch "
                           "(tubelet) size (default: the training size only)")
    what.add_argument("--weights", default="best", choices=["best", "last", "ema"],
                      help="which weights of the run: best, last or ema (the EMA weights of a --model-ema run) "
                           "(default: best)")
    what.add_argument("--sizes", nargs="+", type=parse_size, default=[], metavar="PX|HxW",
                      help="with --dynamic: the sizes checked besides the traced one, PX or HxW (a video run: TxHxW "
                           "or its training frame count), each side a positive multiple of the run's patch (tubelet) "
                           "size (default: 2 patches more on each axis, and a non-square size)")
    out = p.add_argument_group("output and misc")
    out.add_argument("--out", type=Path, metavar="FILE",
                     help="the file to write, ending in .pt2 or .onnx as --format (default: <run name>.pt2 or .onnx in "
                          "the current directory)")
    cli.add_import(p, out)
    p.add_debug(out)
    return p


def run_geometry(settings: TrainSettings) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(training input size, patch)`` of a run: ``(H, W)`` and ``(p_h, p_w)``, or a video run's ``(T, H, W)`` and
    tubelet."""
    img = settings.img_size
    img = (img, img) if isinstance(img, int) else tuple(int(s) for s in img)
    patch = settings.patch_size
    patch = (patch, patch) if isinstance(patch, int) else tuple(int(s) for s in patch)
    if settings.num_frames:
        return (int(settings.num_frames), *img), models.tubelet(settings)
    return img, patch


def check_size(size: tuple[int, ...], train: tuple[int, ...], patch: tuple[int, ...]) -> tuple[int, ...]:
    """A ``--sizes`` entry as a full input size of the run (a square ``PX``; a video's ``HxW`` at its training frame
    count), each side a positive multiple of the patch."""
    text = "x".join(map(str, size))
    if len(size) == 1:
        size = size * 2
    if len(train) == 3 and len(size) == 2:
        size = (train[0], *size)
    if len(size) != len(train):
        raise UserError(f"--sizes {text}: an image run takes PX or HxW" if len(train) == 2 else
                        f"--sizes {text}: a video run takes PX, HxW or TxHxW")
    if any(s % p for s, p in zip(size, patch)):
        raise UserError(f"--sizes {text}: each side must be a multiple of the run's patch (tubelet) size "
                        f"{'x'.join(map(str, patch))}")
    if math.prod(s // p for s, p in zip(size, patch)) > 65536:
        raise UserError(f"--sizes {text}: at most 65536 patches")
    return size


def check_args(args) -> None:
    if args.sizes and not args.dynamic:
        raise UserError("--sizes checks a dynamic export at other sizes: give --dynamic too (a static export takes "
                        "the training size only)")
    if args.out is not None:
        if args.out.is_dir():
            raise UserError(f"--out {str(args.out)!r} is a directory; give a file ending in {SUFFIX[args.format]}")
        if args.out.suffix != SUFFIX[args.format]:
            raise UserError(f"--out {str(args.out)!r}: a --format {args.format} export is written to a file ending "
                            f"in {SUFFIX[args.format]}")
    # the arguments' own errors first, then what the machine lacks
    if args.format == "onnx":
        missing = export.missing_onnx_packages()
        if missing:
            raise UserError(f"--format onnx needs the export extra: pip install 'visionpe[export]' "
                            f"({', '.join(export.ONNX_PACKAGES)}; missing: {', '.join(missing)})")


def default_out(run: Path, fmt: str) -> Path:
    folder = run.parent if run.suffix == ".safetensors" else run
    return Path(f"{folder.resolve().name}{SUFFIX[fmt]}")


def checks_table(checks: list[export.Check], traced: tuple[int, ...]) -> str:
    rows = [(c.size_text + (" (traced)" if c.size == traced else ""), c.batch,
             "-" if c.error else f"{c.max_diff:.2e}", "-" if c.error else f"{c.scale:.3g}",
             "-" if c.error else f"{c.tolerance:.2e}", "yes" if c.ok else "NO") for c in checks]
    return markdown_table(["size", "batch", "max abs diff", "max abs eager", "tolerance", "ok"], rows)


def main(argv) -> dict:
    """``visionpe export ARGV``: returns ``{"out", "format", "dynamic", "checks"}``; a user mistake is a
    :class:`~visionpe.cli.UserError` (status 2); an export that fails or differs from eager exits with status 1."""
    args = build_parser().parse_args(argv)
    check_args(args)
    cli.import_user_code(args.imports)
    out = args.out or default_out(args.run, args.format)
    model, settings = restore.load_model(args.run, args.weights)
    model = model.float().cpu().eval()
    train, patch = run_geometry(settings)
    sizes = [check_size(s, train, patch) for s in args.sizes]
    if not export.torch_supports_export():
        raise UserError(f"visionpe export needs torch >= {'.'.join(map(str, export.MIN_TORCH))}, installed "
                        f"{torch.__version__}")
    try:
        return export_checked(model, settings, args, out, train, patch, sizes)
    except export.ExportError as err:
        if args.debug:
            raise
        print(f"visionpe export: error: {cli.one_line(err)}", file=sys.stderr, flush=True)
        sys.exit(1)


def export_checked(model, settings: TrainSettings, args, out: Path, train, patch, sizes) -> dict:
    """Export, read back from the bytes, check, then write ``out``; an :class:`~visionpe.export.ExportError` when the
    model does not export or a check fails (nothing written)."""
    # a dynamic trace needs >= 2 patches an axis (torch.export specialises 0 and 1); a static one takes the run's size
    traced = tuple(max(s, 2 * p) for s, p in zip(train, patch)) if args.dynamic else train
    example = export.example_input(model, traced, batch=2)
    start = time.perf_counter()
    program = export.export_program(model, example, dynamic=args.dynamic, patch=patch)
    check = [traced, *dict.fromkeys(s for s in sizes if s != traced)] if sizes else \
        export.check_sizes(model, traced, dynamic=args.dynamic, patch=patch)
    if args.format == "onnx":  # the ONNX file keeps no guards: a program specialised on its size is refused here
        refused = [c for c in export.check_export(model, program.module(), check) if c.error]
        if refused:
            raise export.ExportError(f"the exported program refuses {refused[0].size_text}: {refused[0].error} "
                                     f"{SPECIALISED}; nothing written to {out}")
        program = export.export_onnx(program, example)
    data = export.to_bytes(program)
    seconds = time.perf_counter() - start
    checks = export.check_export(model, export.runner(data, args.format), check, atol=export.ATOL, rtol=export.RTOL)
    kind = "batch, frames, height and width" if len(patch) == 3 else "batch, height and width"
    what = f"dynamic {kind} (multiples of {'x'.join(map(str, patch))})" if args.dynamic else \
        f"static {'x'.join(map(str, traced))}, dynamic batch"
    print(f"{settings.pe} model of {args.run} ({args.weights} weights) as {args.format}, {what}, exported in "
          f"{seconds:.1f} s; checked against eager ({'onnxruntime' if args.format == 'onnx' else 'torch.export.load'}"
          f", tolerance {export.ATOL:g} + {export.RTOL:g} x max |eager|):\n")
    print(checks_table(checks, traced) + "\n", flush=True)
    failed = [c for c in checks if not c.ok]
    if failed:
        first = failed[0]
        why = (f"refuses {first.size_text}: {first.error}" if first.error else
               f"differs from eager at {first.size_text} by {first.max_diff:.2e} > {first.tolerance:.2e}")
        hint = f" {SPECIALISED}" if first.error and first.size != traced else ""
        raise export.ExportError(f"the exported model {why}{hint}; nothing written to {out}")
    export.save(data, out)
    print(f"wrote {out} ({len(data) / 2 ** 20:.1f} MiB)")
    return {"out": out, "format": args.format, "dynamic": args.dynamic, "checks": checks}
