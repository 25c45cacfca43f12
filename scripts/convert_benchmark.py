#!/usr/bin/env python
"""Convert a trained learned-APE model to RoPE and fine-tune it, against training RoPE (and APE) from scratch.

    python scripts/convert_benchmark.py --config configs/bench_vit_tiny.yaml --data shapes-position \\
        --seeds 0 1 2 --pretrain-epochs 3 --finetune-epochs 2 --to rope_mixed rope_mixed+learned \\
        --res 24 32 48 64 --scaling none pi --jobs 2

Per data set and seed, with one recipe (--config; only --epochs, --pe and --init-from change):

- ``learned_eN``: learned APE trained N = --pretrain-epochs epochs (the model to convert);
- ``learned_eN_to_P_eM``: that run converted to each target P (``train_vit.py --init-from``) and fine-tuned
  M = --finetune-epochs epochs (a new optimizer and schedule), and ``learned_eN_to_learned_eM``: the same
  restart without changing the encoding (APE continued for M epochs);
- ``P_eN+M`` and ``learned_eN+M``: each encoding trained from scratch for the same total N + M epochs.

Every run is ``python train_vit.py ...`` in its own process (``--jobs`` at a time, one thread each), then
``python scripts/resolution_sweep.py RUN --res ... --scaling ...`` on its last weights (RoPE rows once per
scaling). Finished runs (with ``sweep/sweep.csv``) are skipped and interrupted ones resumed, so an interrupted
benchmark continues where it stopped. The report (mean ± std over seeds per resolution, retention, the command,
the machine and a verdict that compares every gap with the seed spread) replaces the section "Converting a
trained APE model to RoPE" of --doc (between its markers; appended when absent).
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from visionpe.data import DATASETS
from visionpe.rotary.scaling import SCALINGS
from visionpe.train import cli, convert_benchmark
from visionpe.train.benchmark import ROOT


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="convert_benchmark", description=head, epilog=tail)
    what = p.add_argument_group("what to train")
    what.add_argument("--config", type=Path, default=ROOT / "configs" / "bench_vit_tiny.yaml", metavar="YAML",
                      help="train_vit.py recipe of every run (default: configs/bench_vit_tiny.yaml)")
    what.add_argument("--data", nargs="+", default=["shapes-position"], metavar="NAME",
                      help=f"data sets, each one of {', '.join(DATASETS)} (default: shapes-position)")
    what.add_argument("--to", nargs="+", default=["rope_mixed", "rope_mixed+learned"], metavar="PE",
                      help="encodings to convert the learned-APE runs to (default: rope_mixed rope_mixed+learned)")
    what.add_argument("--pretrain-epochs", type=int, default=3, metavar="N",
                      help="epochs of the learned-APE source runs (default: 3)")
    what.add_argument("--finetune-epochs", type=int, default=2, metavar="M",
                      help="epochs of fine-tuning after the conversion; runs from scratch train N + M (default: 2)")
    what.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], metavar="N", help="seeds (default: 0 1 2)")
    ev = p.add_argument_group("evaluation")
    ev.add_argument("--res", nargs="+", type=int, default=[24, 32, 48, 64], metavar="PX",
                    help="test resolutions in pixels (default: 24 32 48 64)")
    ev.add_argument("--scaling", nargs="+", default=["none", "pi"], choices=SCALINGS, metavar="NAME",
                    help=f"RoPE adaptations, of {', '.join(SCALINGS)} (default: none pi)")
    run = p.add_argument_group("run and report")
    run.add_argument("--jobs", type=int, default=2, metavar="N", help="runs in parallel, one thread each (default: 2)")
    run.add_argument("--out", type=Path, default=ROOT / "runs" / "convert_benchmark", metavar="DIR",
                     help="folder of the runs and logs (default: runs/convert_benchmark)")
    run.add_argument("--doc", type=Path, default=ROOT / "docs" / "BENCHMARK.md", metavar="MD",
                     help="report whose section 'Converting a trained APE model to RoPE' is (re)written "
                          "(default: docs/BENCHMARK.md)")
    run.add_argument("--note", default="", help="free text added to the section (e.g. what shared the machine)")
    run.add_argument("--report-only", action="store_true", help="only rebuild the section from finished runs")
    p.add_debug(run)
    return p


def run(argv) -> int:
    args = build_parser().parse_args(argv)
    command = "python scripts/convert_benchmark.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    return convert_benchmark.run(args, command)


def main(argv=None) -> int:
    return cli.run(run, prog="convert_benchmark", argv=argv)


if __name__ == "__main__":
    result = main()  # what main returned, for callers that use runpy
