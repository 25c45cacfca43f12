"""Train every encoding with one recipe, sweep test resolutions, write a report (OUT/BENCHMARK.md) and plots.

    visionpe benchmark --config bench_vit_tiny \\
        --data shapes-position shapes-relation fashion-mnist --seeds 0 1 2 --res 24 32 48 64 --jobs 2

For each (data set, encoding, seed) it runs ``visionpe train --config CONFIG --data D --pe P --seed S`` in its
own process (``--jobs`` at a time, one thread each), then ``visionpe sweep`` on the last weights: RoPE
encodings once per ``--scaling`` (none, pi, ntk, yarn), the others as trained. Each run brought up to date writes a
small record (``--records``: its settings and their hash, the machine and versions, the per-epoch metrics, the
sweep's table, the wall time; a few KB, meant to be committed), and the report is made from the current records.
A run whose record is current is not run again, whatever machine made it, so the next machine goes on where the
last one stopped; a record made with other settings than asked for now is stale, named in the output and the
report and left out. A finished run (a ``sweep.csv`` made with the arguments asked for) is not trained again either,
so an interrupted benchmark continues where it stopped. The runs and logs go to ``--out``, the records to
``--records`` and the report to ``--doc`` (default ``OUT/BENCHMARK.md``), relative to the working directory. The
report holds, per data set, top-1 mean +- std over seeds at every resolution, the retention acc(res)/acc(train res),
parameters and training images/s, plus a plot, the recipe and the exact command.

``--swin`` adds the Swin list (swin_bias, cpb, rope_mixed, alibi) with ``--swin-config``.

Rows (``--rows FILE``, a file or a shipped one by name, e.g. ``bench_rows_resolution``): instead of the encoding
lists, labelled rows each with its own ``visionpe train`` arguments and swept RoPE adaptations; rows with ``--pe
timm`` are timm's own models (reference rows). A rows file can give each data set its own recipe (``recipes:
{fashion-mnist: bench_fashion_mnist}``: each task its own budget; the others take ``--config``) and a row the data
sets it runs on (``data: [clutter-relation]``; default every ``--data``). The report is its own marked part of
the doc with a verdict against timm's best row and, per data set, the row to pick at each size (the best learned
row and those within its seed spread):

    visionpe benchmark --rows bench_rows_resolution --data shapes-position fashion-mnist \
        --seeds 0 1 2 --res 24 32 48 64 32x48 --jobs 2
    visionpe benchmark --rows bench_rows_comparison --data clutter-relation fashion-mnist \
        --seeds 0 1 2 --res 32 64 128 --tune --holdout 100

LookHere's protocol (``--tune [--holdout N]``, image recipes): each run's sweep also gets ``--tune`` (visionpe sweep
--tune: the encoding's declared knob chosen per test size on held-out training images), and the report adds, per
data set, a table with each row untuned (``label``: the run's own settings, e.g. RoPE's trained scaling, not the
swept --scaling values) and tuned (``label [tuned]``) side by side, the knob values the seeds chose at each size,
a plot and a verdict per row (tuned - untuned). RoPE-Mixed's knob is its scaling (all of none, pi, ntk, yarn,
whatever --scaling lists); axial RoPE's is theta under its own scaling. Adding or dropping --tune on a finished
benchmark re-sweeps its runs without retraining them:

    visionpe benchmark --data clutter-relation --seeds 0 1 2 --res 32 64 128 --tune -- --train-samples 4000

Every report marks a row whose top-1 at the training size is below chance + 5 points (chance = 100 / classes) as
*not learned* and leaves it out of the verdicts, and shows each row's top-1 after its last two epochs (*still
rising*: more than 1 point over the last one, its budget short of a plateau); ``OUT/table.csv`` holds every cell of the report (mean, std and
the per-seed values, the knob choices).

Video: a recipe with ``num_frames`` (or ``-- --num-frames T`` in the extra arguments) on a video data set trains
tubelet video ViTs; ``--frames`` gives the test frame counts, crossed with ``--res`` in the sweep. The report of a
video benchmark is its own marked part of the doc (``<!-- BEGIN video_benchmark -->``), so the image parts
are left as they are:

    visionpe benchmark --config bench_video_tiny --data moving-shapes \\
        --pe none sincos learned rope_axial rope_mixed --frames 4 8 16 --res 24 32 48 --scaling none pi --jobs 2

``--part NAME`` gives a video benchmark's part another name, so that one doc holds several (say, a baseline trained
with other ``--`` arguments beside the main comparison); each part has its own records folder and is rebuilt alone.
"""
from __future__ import annotations

import shlex
from pathlib import Path

from ... import cli
from ...data import DATASETS
from ...rotary.scaling import SCALINGS
from ...train import tuning
from ...train.loop import parse_size
from . import benchmark
from .benchmark import SWIN_LIST, VIT_LIST


def add_recipe_and_data(group, *, of: str, data: list[str]) -> None:
    """``--config`` (the recipe ``of`` what, a file or a shipped recipe's name) and ``--data`` (default ``data``),
    as both accuracy benchmarks take them."""
    group.add_argument("--config", default="bench_vit_tiny", metavar="YAML|NAME",
                       help=f"visionpe train recipe of {of}, a file or a shipped recipe's name "
                            "(default: bench_vit_tiny)")
    group.add_argument("--data", nargs="+", default=data, metavar="NAME",
                       help=f"data sets, each one of {', '.join(DATASETS)} (default: {' '.join(data)})")


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="visionpe benchmark", description=head, epilog=tail)
    what = p.add_argument_group("what to train")
    add_recipe_and_data(what, of="the ViT list", data=["shapes-position", "shapes-relation", "fashion-mnist"])
    what.add_argument("--pe", nargs="+", default=VIT_LIST, metavar="NAME",
                      help=f"encodings of the ViT list, as visionpe train --pe (default: {' '.join(VIT_LIST)})")
    what.add_argument("--swin", action="store_true", help="also run the Swin list with --swin-config")
    what.add_argument("--swin-config", default="bench_swin_tiny", metavar="YAML|NAME",
                      help="recipe of the Swin list, a file or a shipped recipe's name (default: bench_swin_tiny)")
    what.add_argument("--swin-pe", nargs="+", default=SWIN_LIST, metavar="NAME",
                      help=f"encodings of the Swin list (default: {' '.join(SWIN_LIST)})")
    what.add_argument("--rows", default=None, metavar="YAML|NAME",
                      help="a rows file (or a shipped one's name) instead of --pe/--swin: each row a label and its own "
                           "visionpe train arguments, "
                           "timm's own models (--pe timm_unpatched) as reference rows; its report is a marked part of --doc "
                           "(e.g. bench_rows_resolution)")
    what.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], metavar="N",
                      help="seeds, integers >= 0 (default: 0 1 2)")
    what.add_argument("extra", nargs="*", help="after --: extra visionpe train arguments for every run")
    ev = p.add_argument_group("evaluation")
    ev.add_argument("--res", nargs="+", type=parse_size, default=[24, 32, 48, 64], metavar="PX|HxW",
                    help="test sizes in pixels, square (32) or height x width (32x48; image recipes) "
                         "(default: 24 32 48 64)")
    ev.add_argument("--frames", nargs="+", type=int, default=[], metavar="T",
                    help="video recipes (num_frames): test frame counts, crossed with --res (default: the training "
                         "count only)")
    ev.add_argument("--scaling", nargs="+", default=["none", "pi", "ntk", "yarn"], choices=SCALINGS, metavar="NAME",
                    help=f"RoPE adaptations, of {', '.join(SCALINGS)} (default: all)")
    tuning.add_arguments(
        ev, tune="LookHere's protocol (image recipes): sweep every run with visionpe sweep --tune and report each row "
        "untuned (its own settings) and tuned (its encoding's knob chosen per test size on held-out training images) "
        "side by side; adding or dropping it re-sweeps, never retrains",
        holdout="with --tune: held-out training images per run, an integer >= 1 (default: the sweep's, 1%% of the "
        "run's training images, at least 100)")
    run = p.add_argument_group("run and report")
    run.add_argument("--jobs", type=int, default=2, metavar="N",
                     help="runs in parallel, one thread each; an integer >= 1 (default: 2)")
    run.add_argument("--out", type=Path, default=Path("runs/benchmark"), metavar="DIR",
                     help="folder of the runs and logs (default: runs/benchmark)")
    run.add_argument("--doc", type=Path, default=None, metavar="MD",
                     help=f"report to write (default: {benchmark.REPORT} in --out)")
    run.add_argument("--note", default="", help="free text added to the report (e.g. what was left out)")
    run.add_argument("--part", default=None, metavar="NAME",
                     help="video recipes: the marked part of --doc to write, letters, digits, '_', '.', '-' "
                          f"(default: {benchmark.VIDEO_PART}), so that one doc holds several video parts; image "
                          "benchmarks take theirs from --rows")
    run.add_argument("--records", type=Path, default=None, metavar="DIR",
                     help="folder of the runs' records, one JSON file a run (default: data/<doc's name, "
                          "lower case>/<part> beside --doc, the part being the rows file's, --part, video_benchmark "
                          "or benchmark)")
    run.add_argument("--report-only", action="store_true",
                     help="only rebuild the report, from the current records alone (no run, no --out needed)")
    cli.add_import(p, run)
    p.add_debug(run)
    return p


def main(argv) -> int:
    """``visionpe benchmark ARGV``: returns 0; a user mistake is a :class:`~visionpe.cli.UserError`."""
    args = build_parser().parse_args(argv)
    return benchmark.run(args, "visionpe benchmark " + shlex.join(argv))
