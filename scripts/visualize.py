#!/usr/bin/env python
"""Draw what a positional encoding knows about space, from a fresh encoding or a trained run.

Kinds (see ``visionpe.viz`` for what each family shows):
  similarity  every patch's similarity to every other, tiled in grid layout (ViT paper figure)
  heatmap     position x channel table (tokens: position vectors; RoPE: cos|sin of the rotations)
  freqs       RoPE frequency vectors per head in the (fx, fy) plane against the axial ones
  resolution  similarity on the native grid and on a larger grid after the encoding's adaptation
  video       similarity of one query to every (t, h, w), as a strip of frames

Examples:
  python scripts/visualize.py --pe sincos --grid 14 14 --kind similarity --out sim.png
  python scripts/visualize.py --pe rope_axial --grid 14 14 --kind resolution --scaling pi --out res.png
  python scripts/visualize.py --pe rope_mixed --grid 4 14 14 --kind video --query 2 7 7 --out video.png
  python scripts/visualize.py --run runs/x --pe rope_mixed --layer 3 --kind freqs --out freqs.png
  python scripts/visualize.py --checkpoint runs/x/best.safetensors --kind similarity --out sim.png

User mistakes exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

import visionpe  # noqa: E402
from visionpe import viz  # noqa: E402

SCALINGS = ("none", "pi", "ntk", "yarn")


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a mistake as ONE line on stderr (no usage block) and exits with status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())}\n")


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="visualize.py", description=__doc__.split("\n\n")[0],
                      epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pe", help="encoding name (fresh: required; from a run: which of its encodings, "
                                f"default the first in its config); one of {', '.join(visionpe.available())}")
    p.add_argument("--kind", default="similarity", help=f"one of {', '.join(viz.KINDS)} (default similarity)")
    p.add_argument("--out", help="output PNG (default <pe>_<kind>.png)")
    p.add_argument("--grid", nargs="+", type=int, metavar="N",
                   help="patch grid: H W (image) or T H W (video); fresh default 14 14; for a run, "
                        "the trained grid unless given (then the encoding is adapted to it)")
    p.add_argument("--new-grid", nargs="+", type=int, metavar="N",
                   help="larger grid of --kind resolution (default: 2x the spatial axes)")
    p.add_argument("--scaling", help=f"RoPE adaptation on another grid: {', '.join(SCALINGS)} "
                                     "(default: as the encoding is configured)")
    p.add_argument("--head", type=int, help="one head (rotary, bias; default: mean over heads)")
    p.add_argument("--layer", type=int, default=0, help="block whose encoding is shown (per-block encodings)")
    p.add_argument("--query", nargs="+", type=int, metavar="I", help="query position of --kind video "
                                                                       "(default: the centre)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", help="a .safetensors file inside a train_vit.py run directory")
    source.add_argument("--run", help="a train_vit.py run directory (config.yaml + best/last.safetensors)")
    p.add_argument("--which", default="best", choices=("best", "last"), help="checkpoint of --run (default best)")
    fresh = p.add_argument_group("fresh encoding")
    fresh.add_argument("--dim", type=int, default=384, help="token width (tokens family; default 384)")
    fresh.add_argument("--head-dim", type=int, help="per-head width (rotary; default 64 in 2D, 96 in 3D)")
    fresh.add_argument("--num-heads", type=int, default=6, help="heads (rotary, bias; default 6)")
    fresh.add_argument("--theta", type=float, help="RoPE theta (default: the encoding's)")
    fresh.add_argument("--factorized", action="store_true", help="learned: one table per axis")
    fresh.add_argument("--seed", type=int, default=0, help="seed of random initialisations (default 0)")
    p.add_argument("--dpi", type=int, default=90, help="PNG resolution (default 90)")
    return p


def check_shape(parser, name: str, values):
    if values is None:
        return None
    if not 1 <= len(values) <= 3 or any(v <= 0 for v in values):
        parser.error(f"{name} takes 1 to 3 positive sizes (H W or T H W), got {' '.join(map(str, values))}")
    return tuple(values)


def fresh_encoding(args, shape):
    """Build ``args.pe`` for the grid ``shape`` with the CLI's sizes."""
    ndim = len(shape)
    family = visionpe.available()[args.pe]
    if family == "tokens":
        kwargs = {"dim": args.dim, "ndim": ndim}
        if args.pe == "learned":
            kwargs.update(grid=shape, factorized=args.factorized)
    elif family == "rotary":
        kwargs = {"head_dim": args.head_dim or (64 if ndim < 3 else 96), "num_heads": args.num_heads, "ndim": ndim}
        if args.theta is not None:
            kwargs["theta"] = args.theta
    else:
        kwargs = {"num_heads": args.num_heads}
        kwargs.update({"swin_bias": {"window_size": shape}, "cpb": {"window_size": shape},
                       "rel_bias": {"grid": shape}, "alibi": {"ndim": ndim}}[args.pe])
    torch.manual_seed(args.seed)
    return visionpe.build(args.pe, **kwargs)


def trained_encoding(args):
    """``(encoding, trained grid, label)`` from --run/--checkpoint."""
    model, cfg = viz.load_model(args.run or args.checkpoint, args.which)
    name = args.pe or str(cfg["pe"]).split("+")[0]
    pe = viz.pick_encoding(model, name, args.layer)
    where = f"layer {args.layer}" if viz.family_of(pe) != "tokens" else "tokens"
    return pe, viz.run_grid(cfg), f"{name} ({Path(args.run or args.checkpoint).name}, {where})"


def run(args, parser) -> Path:
    if args.kind not in viz.KINDS:
        parser.error(f"unknown --kind {args.kind!r}; choose from {', '.join(viz.KINDS)}")
    if args.pe is not None and args.pe not in visionpe.available():
        parser.error(f"unknown encoding --pe {args.pe!r}; available: {', '.join(visionpe.available())}")
    if args.scaling is not None and args.scaling not in SCALINGS:
        parser.error(f"unknown --scaling {args.scaling!r}; choose from {', '.join(SCALINGS)}")
    shape = check_shape(parser, "--grid", args.grid)
    new_shape = check_shape(parser, "--new-grid", args.new_grid)
    if args.run or args.checkpoint:
        pe, native, title = trained_encoding(args)
    else:
        if args.pe is None:
            parser.error("--pe is required for a fresh encoding (or give --run/--checkpoint)")
        native = shape or (14, 14)
        pe, title = fresh_encoding(args, native), args.pe
    shape = shape or native
    if len(shape) != len(native):
        parser.error(f"--grid {' '.join(map(str, shape))} has {len(shape)} axes but the encoding has {len(native)}")
    fig = viz.render(pe, args.kind, shape, head=args.head, new_shape=new_shape, scaling=args.scaling,
                     query=args.query, native_shape=native, title=title)
    out = Path(args.out or f"{(args.pe or 'run')}_{args.kind}.png")
    return viz.save(fig, out, dpi=args.dpi)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = run(args, parser)
    except (ValueError, OSError) as err:  # user mistakes: one line, status 2
        parser.error(str(err))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
