#!/usr/bin/env python
"""Evaluate trained runs at several resolutions, with each encoding's resolution adaptation.

    python scripts/resolution_sweep.py runs/A runs/B --res 24 32 48 64 --scaling none pi ntk yarn --out runs/sweep
    python scripts/resolution_sweep.py runs/A --res 32 32x48 48x32          # non-square sizes: HEIGHTxWIDTH
    python scripts/resolution_sweep.py runs/VIDEO --frames 4 8 16 --res 24 32 48 --scaling none pi   # video runs
    python scripts/resolution_sweep.py runs/A --res 24 32 48 --eval-protocol resize crop native   # protocols

What each adaptation and protocol is, how video and non-square sizes are swept, and what OUT/sweep.csv and
OUT/sweep.png hold:
visionpe/train/sweep.py. Errors in the arguments exit with status 2 and one line.
"""
from __future__ import annotations

from pathlib import Path

import torch

from visionpe.data import PROTOCOLS
from visionpe.resample import INTERPOLATIONS
from visionpe.rotary.scaling import SCALINGS
from visionpe.train import cli, loop, sweep
from visionpe.train.cli import UserError


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="resolution_sweep", description=head, epilog=tail)
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories written by train_vit.py")
    ev = p.add_argument_group("evaluation")
    ev.add_argument("--res", nargs="+", type=loop.parse_size, required=True, metavar="PX|HxW",
                    help="test resolutions in pixels: PX (square) or HxW (height x width, image runs only), each side "
                         "a positive multiple of the runs' patch_size, at most 65536 patches per image (required)")
    ev.add_argument("--frames", nargs="+", type=int, default=[], metavar="T",
                    help="video runs: test frame counts, crossed with --res; each a positive multiple of the runs' "
                         "tubelet frames (default: the training frame count only)")
    ev.add_argument("--scaling", nargs="+", default=["none"], choices=SCALINGS, metavar="NAME",
                    help=f"RoPE adaptations to compare: {', '.join(SCALINGS)} (default: none)")
    ev.add_argument("--interpolation", nargs="*", default=[], choices=INTERPOLATIONS, metavar="MODE",
                    help=f"learned-table resampling modes to compare: {', '.join(INTERPOLATIONS)} "
                         "(default: the run's own)")
    ev.add_argument("--eval-protocol", nargs="+", default=None, choices=PROTOCOLS, metavar="NAME",
                    help=f"how each validation image is shown at a test size, of {', '.join(PROTOCOLS)}: resize (the "
                         "whole image), crop (timm's eval transform: shorter side to size / crop_pct, centre crop), "
                         "native (its own aspect ratio within the patch budget of the size); several compare them on "
                         "the same weights (default: each run's own)")
    ev.add_argument("--crop-pct", type=float, default=None, metavar="PCT",
                    help="the crop protocol's crop fraction, in (0, 1] (default: each run's crop_pct)")
    ev.add_argument("--weights", default="last", choices=["last", "best", "ema"],
                    help="which weights of each run: last, best or ema (the EMA weights of a --model-ema run) "
                         "(default: last)")
    ev.add_argument("--val-samples", type=int, default=None, metavar="N",
                    help="validation images, an integer >= 1 (default: the run's)")
    ev.add_argument("--batch-size", type=int, default=256, metavar="N",
                    help="evaluation batch size, an integer >= 1 (default: 256)")
    ev.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu or cuda (default: cpu)")
    out = p.add_argument_group("output and misc")
    cli.add_import(p, out)
    out.add_argument("--out", type=Path, default=Path("runs/sweep"), metavar="DIR",
                     help="folder for sweep.csv and sweep.png (default: runs/sweep)")
    p.add_debug(out)
    return p


def run(argv) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.val_samples is not None and args.val_samples < 1:
        raise UserError(f"--val-samples must be an integer >= 1, got {args.val_samples}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be an integer >= 1, got {args.batch_size}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is available")
    if args.crop_pct is not None and not 0 < args.crop_pct <= 1:
        raise UserError(f"--crop-pct must be in (0, 1], got {args.crop_pct}")
    if any(f < 1 for f in args.frames):
        raise UserError(f"--frames takes positive frame counts, got {' '.join(map(str, args.frames))}")
    cli.import_user_code(args.imports)
    rows = sweep.sweep_runs(args.runs, args.res, args.scaling, args.interpolation, args.weights, args.val_samples,
                            args.device, args.batch_size, frames=args.frames, out=args.out,
                            protocols=args.eval_protocol, crop_pct=args.crop_pct)
    print(f"wrote {args.out / 'sweep.csv'} and {args.out / 'sweep.png'}")
    return rows


def main(argv=None) -> list[dict]:
    """The command line: returns the rows; a user mistake prints one line and exits with status 2."""
    return cli.run(run, prog="resolution_sweep", argv=argv)


if __name__ == "__main__":
    result = main()  # what main returned, for callers that use runpy
