"""Draw what a positional encoding knows about space, from a fresh encoding or a trained run.

Kinds (see ``visionpe.viz`` for what each family shows):
  similarity  every patch's similarity to every other, tiled in grid layout (ViT paper figure)
  heatmap     position x channel table (tokens: position vectors; RoPE: cos|sin of the rotations)
  freqs       RoPE frequency vectors per head in the (fx, fy) plane against the axial ones
  resolution  similarity on the native grid and on a larger grid after the encoding's adaptation
  video       similarity of one query to every (t, h, w), as a strip of frames
  explore     one self-contained HTML page: point at a patch to see its map, per layer, head and grid (native or
              larger after each adaptation), a frame slider for video; a run's page holds all its encodings

Examples:
  visionpe visualize --pe sincos --grid 14 14 --kind similarity --out sim.png
  visionpe visualize --pe rope_axial --grid 14 14 --kind resolution --scaling pi --out res.png
  visionpe visualize --pe rope_mixed --grid 4 14 14 --kind video --query 2 7 7 --out video.png
  visionpe visualize --run runs/x --pe rope_mixed --layer 3 --kind freqs --out freqs.png
  visionpe visualize --checkpoint runs/x/best.safetensors --kind similarity --out sim.png
  visionpe visualize --pe rope_mixed --grid 14 14 --kind explore --out page.html
  visionpe visualize --run runs/x --kind explore --out page.html

User mistakes exit with status 2 and one line on stderr.
"""
from __future__ import annotations

from pathlib import Path

from .. import cli, viz
from ..cli import UserError
from ..registry import available
from ..rotary.scaling import SCALINGS
from . import models, restore

KINDS = (*viz.KINDS, "explore")
MAX_DPI = 1200  # a 6.4-inch figure at 1200 dpi is 7680 px wide; matplotlib's renderer refuses far larger ones


def build_parser() -> cli.Parser:
    p = cli.Parser(prog="visionpe visualize", description=__doc__.split("\n\n")[0],
                   epilog=__doc__.split("\n\n", 2)[2])
    what = p.add_argument_group("what to draw")
    what.add_argument("--kind", default="similarity", metavar="KIND",
                      help=f"one of {', '.join(KINDS)} (default: similarity)")
    what.add_argument("--pe", metavar="NAME",
                      help="encoding name (fresh: required; from a run: which of its encodings, default the first in "
                           f"its config); one of {', '.join(available())}, or one registered by --import")
    what.add_argument("--grid", nargs="+", type=int, metavar="N",
                      help="patch grid: H W (image) or T H W (video), positive sizes; fresh default 14 14; for a "
                           "run, the trained grid unless given (then the encoding is adapted to it)")
    what.add_argument("--new-grid", nargs="+", type=int, metavar="N",
                      help="larger grid of --kind resolution/explore, positive sizes (default: 2x the spatial axes)")
    what.add_argument("--scaling", metavar="NAME", help=f"RoPE adaptation on another grid: {', '.join(SCALINGS)} "
                                                       "(default: as the encoding is configured)")
    what.add_argument("--head", type=int, metavar="H",
                      help="one head, 0..heads-1 (rotary, bias; default: mean over heads)")
    what.add_argument("--layer", type=int, default=0, metavar="L",
                      help="block whose encoding is shown (per-block encodings; default: 0)")
    what.add_argument("--query", nargs="+", type=int, metavar="I",
                      help="query position of --kind video, one index per axis (default: the centre)")
    trained = p.add_argument_group("trained encoding (from a visionpe train run)")
    source = trained.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", metavar="FILE", help="a .safetensors file inside a visionpe train run directory")
    source.add_argument("--run", metavar="DIR",
                        help="a visionpe train run directory (config.yaml + best/last.safetensors)")
    trained.add_argument("--which", default="best", choices=("best", "last", "ema"),
                         help="weights of --run: best, last or ema (the EMA weights of a --model-ema run) "
                              "(default: best)")
    fresh = p.add_argument_group("fresh encoding")
    fresh.add_argument("--dim", type=int, default=384, metavar="D", help="token width (tokens family; default: 384)")
    fresh.add_argument("--head-dim", type=int, metavar="D", help="per-head width (rotary; default 64 in 2D, 96 in 3D)")
    fresh.add_argument("--num-heads", type=int, default=6, metavar="H", help="heads (rotary, bias; default: 6)")
    fresh.add_argument("--theta", type=float, help="RoPE theta, a number > 0 (default: the encoding's)")
    fresh.add_argument("--factorized", action="store_true", help="learned: one table per axis")
    fresh.add_argument("--seed", type=int, default=0, metavar="N", help="seed of random initialisations (default: 0)")
    out = p.add_argument_group("output and misc")
    out.add_argument("--out", metavar="FILE",
                     help="output PNG, HTML for --kind explore (default: <pe>_<kind>.png or .html)")
    out.add_argument("--dpi", type=int, default=90, help="PNG resolution, an integer >= 1 (default: 90)")
    cli.add_import(p, out)
    p.add_debug(out)
    return p


def check_shape(parser, name: str, values):
    if values is None:
        return None
    if not 1 <= len(values) <= 3 or any(v <= 0 for v in values):
        parser.error(f"{name} takes 1 to 3 positive sizes (H W or T H W), got {' '.join(map(str, values))}")
    return tuple(values)


def check_applies(args, parser) -> None:
    """Flags of another kind than ``--kind`` are refused, never ignored; ``--out`` names a format the kind writes."""
    for flag, value, kinds in (("--new-grid", args.new_grid, ("resolution", "explore")), ("--query", args.query,
                                                                                           ("video",))):
        if value is not None and args.kind not in kinds:
            parser.error(f"{flag} is for --kind {' or '.join(kinds)}, not --kind {args.kind}: leave it out")
    if args.run or args.checkpoint:
        fresh = [f"--{name.replace('_', '-')}" for name in ("dim", "head_dim", "num_heads", "theta", "factorized",
                                                            "seed") if getattr(args, name) != parser.get_default(name)]
        if fresh:
            one = len(fresh) == 1
            parser.error(f"{', '.join(fresh)} {'builds' if one else 'build'} a fresh encoding; --run/--checkpoint "
                         f"shows the trained one: leave {'it' if one else 'them'} out")
    suffix = Path(args.out).suffix.lstrip(".").lower() if args.out else ""
    if suffix and args.kind == "explore" and suffix not in ("html", "htm"):
        parser.error(f"--out {args.out}: --kind explore writes an HTML page (.html)")
    if suffix and args.kind != "explore":
        from matplotlib.figure import Figure  # noqa: PLC0415  (matplotlib is imported when a figure is drawn)
        formats = sorted(Figure().canvas.get_supported_filetypes())
        if suffix not in formats:
            parser.error(f"--out {args.out}: a figure is written as one of {', '.join(formats)} (the suffix names the "
                         "format)")


def fresh_encoding(args, shape):
    """Build ``args.pe`` for the grid ``shape`` as a model of the CLI's sizes would (any registered encoding)."""
    kwargs = {"theta": args.theta} if args.theta is not None else {}
    if args.factorized:
        kwargs["factorized"] = True
    return viz.fresh_encoding(args.pe, shape, dim=args.dim, num_heads=args.num_heads, head_dim=args.head_dim,
                              seed=args.seed, **kwargs)


def trained_encoding(args):
    """``(encoding, trained grid, label)`` from --run/--checkpoint."""
    model, settings = restore.load_model(args.run or args.checkpoint, args.which)
    name = args.pe or str(settings.pe).split("+")[0]
    pe = viz.pick_encoding(model, name, args.layer)
    if args.layer and viz.family_of(pe) == "tokens":
        raise UserError(f"--layer {args.layer} picks a block's encoding; {name} is a tokens encoding (one for the "
                        "whole model): leave out --layer")
    where = f"layer {args.layer}" if viz.family_of(pe) != "tokens" else "tokens"
    native = viz.native_grid(pe, models.run_grid(settings))
    return pe, native, f"{name} ({Path(args.run or args.checkpoint).name}, {where})"


def explore(args, parser, shape, new_shape) -> Path:
    """--kind explore: the page of a fresh encoding on its grid, or of every encoding of a run's model."""
    scalings = None if args.scaling is None else (args.scaling,)
    out = Path(args.out or f"{args.pe or 'run'}_explore.html")
    if args.run or args.checkpoint:
        if shape is not None:
            parser.error("--grid does not apply to --kind explore of a run: the page starts from the trained grid "
                         "(the larger grid is --new-grid)")
        model, settings = restore.load_model(args.run or args.checkpoint, args.which)
        return viz.write_explorer(model, out, models.run_grid(settings), new_shape=new_shape, scalings=scalings,
                                  title=f"{settings.pe} ({Path(args.run or args.checkpoint).name})")
    if args.pe is None:
        parser.error("--pe is required for a fresh encoding (or give --run/--checkpoint)")
    if args.pe not in available():
        parser.error(f"unknown encoding --pe {args.pe!r}; available: {', '.join(available())}")
    shape = shape or (14, 14)
    return viz.write_explorer(fresh_encoding(args, shape), out, shape, new_shape=new_shape, scalings=scalings)


def run(args, parser) -> Path:
    cli.import_user_code(args.imports)
    if args.kind not in KINDS:
        parser.error(f"unknown --kind {args.kind!r}; choose from {', '.join(KINDS)}")
    if args.scaling is not None and args.scaling not in SCALINGS:
        parser.error(f"unknown --scaling {args.scaling!r}; choose from {', '.join(SCALINGS)}")
    shape = check_shape(parser, "--grid", args.grid)
    new_shape = check_shape(parser, "--new-grid", args.new_grid)
    check_applies(args, parser)
    if args.kind == "explore":
        return explore(args, parser, shape, new_shape)
    if args.run or args.checkpoint:
        pe, native, title = trained_encoding(args)  # loading the run imports its own code first
    else:
        if args.pe is not None and args.pe not in available():
            parser.error(f"unknown encoding --pe {args.pe!r}; available: {', '.join(available())}")
        if args.pe is None:
            parser.error("--pe is required for a fresh encoding (or give --run/--checkpoint)")
        native = shape or (14, 14)
        pe, title = fresh_encoding(args, native), args.pe
    if args.head is not None and viz.family_of(pe) == "tokens":
        parser.error(f"--head picks a head of a rotary or bias encoding; {viz.name_of(pe)} is a tokens encoding (one "
                     "table for every head): leave out --head")
    if args.kind not in viz.kinds_for(pe):
        parser.error(f"--kind {args.kind} does not apply to {viz.name_of(pe)} ({viz.family_of(pe)}); kinds for it: "
                     f"{', '.join(viz.kinds_for(pe))}")
    shape = shape or native
    if len(shape) != len(native):
        parser.error(f"--grid {' '.join(map(str, shape))} has {len(shape)} axes but the encoding has {len(native)}")
    fig = viz.render(pe, args.kind, shape, head=args.head, new_shape=new_shape, scaling=args.scaling,
                     query=args.query, native_shape=native, title=title)
    out = Path(args.out or f"{(args.pe or 'run')}_{args.kind}.png")
    return viz.save(fig, out, dpi=args.dpi)


def main(argv) -> int:
    """``visionpe visualize ARGV``: 0 once the picture is written; a user mistake is a :class:`UserError`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("dim", "num_heads", "dpi"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(args, name)}")
    if args.dpi > MAX_DPI:
        parser.error(f"--dpi must be an integer in [1, {MAX_DPI}], got {args.dpi}")
    if args.head_dim is not None and args.head_dim < 1:
        parser.error(f"--head-dim must be an integer >= 1, got {args.head_dim}")
    if args.theta is not None and not args.theta > 0:
        parser.error(f"--theta must be a number > 0, got {args.theta}")
    if args.layer < 0:
        parser.error(f"--layer must be an integer >= 0, got {args.layer}")
    try:
        out = run(args, parser)
    except (ValueError, OSError) as err:  # the library's checks of what the user asked for: one line
        raise UserError(str(err)) from err
    print(out)
    return 0
