"""Memory per rank of data-parallel training, DDP against FSDP2, for docs/scaling.md's table.

    visionpe scaling-memory --models vit_small_patch16_224 vit_base_patch16_224 --modes ddp fsdp
    visionpe scaling-memory --processes 2 --batch-size 8 --img-size 224 --out memory.json
    visionpe scaling-memory --report-only memory.json other_machine.json

Each (model, mode) runs once under ``torchrun --standalone --nproc_per_node PROCESSES`` (gloo on the CPU, nccl with
--device cuda): one AdamW step on random images (visionpe.train.parallel.measure_memory), then rank 0 prints a
markdown table of what one rank holds: parameters, gradients, optimizer state (its own shards under FSDP), their sum,
and the peak resident memory of its process, and the machine that measured it. ``--out`` writes the measurements
as a record (a few KB, meant to be committed: the command, the settings and their sha256, the machine and versions,
each (model, mode)'s ranks, the wall time), from which the table is made: ``--report-only RECORD ...`` rebuilds it
byte for byte on any machine, the tables of several records one after another, each naming its machine. Errors
in the arguments exit with status 2 and one line.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .. import cli
from ..train import distributed, parallel
from ..weights import write_text
from .machine import environment, machine_text

MODELS = ("vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224")
FORMAT = "visionpe.bench.scaling_memory.record/1"  # what a record file is, and the version of its layout
SETTINGS = ("models", "modes", "processes", "batch_size", "img_size", "pe", "device")  # what is measured


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="visionpe scaling-memory", description=head, epilog=tail)
    p.add_argument("--models", nargs="+", default=list(MODELS), help="timm ViT names (default: ViT-S/B/L 16)")
    p.add_argument("--modes", nargs="+", default=list(parallel.MODES), choices=parallel.MODES)
    p.add_argument("--processes", type=int, default=2, help="processes (ranks) per run (default 2)")
    p.add_argument("--batch-size", type=int, default=8, help="images per rank (default 8)")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--pe", default="learned", help="the encoding (default learned, ViT's own)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--out", type=Path, metavar="JSON",
                   help="also write the measurements as a record here (the settings and their hash, the machine and "
                        "versions, the wall time)")
    p.add_argument("--report-only", nargs="+", type=Path, metavar="JSON",
                   help="measure nothing: print the tables of these records alone, each naming its machine")
    p.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)  # one torchrun process
    return p


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if args.device == "cuda" else torch.device("cpu")
    model_name, mode = args.worker
    got = parallel.measure_memory(model_name, mode, device, batch_size=args.batch_size, img_size=args.img_size,
                                  pe=args.pe)
    rows = distributed.all_gather([float(got[k]) for k in KEYS], device)
    if parallel.rank() == 0:
        print(json.dumps({"model": model_name, "mode": mode, "ranks": [dict(zip(KEYS, r)) for r in rows]}))
    distributed.leave()


KEYS = ("parameters", "gradients", "optimizer", "peak_rss", "rss_before")


def table(results: list[dict], processes: int, batch: int, img: int) -> str:
    gib = 2 ** 30
    lines = ["| model | mode | parameters | gradients | AdamW state | sum | peak RSS | (RSS before the model) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        rank = max(r["ranks"], key=lambda v: v["peak_rss"])  # the rank that held most
        total = rank["parameters"] + rank["gradients"] + rank["optimizer"]
        lines.append(f"| {r['model']} | {r['mode']} | " + " | ".join(
            f"{rank[k] / gib:.2f} GiB" for k in ("parameters", "gradients", "optimizer")) +
            f" | {total / gib:.2f} GiB | {rank['peak_rss'] / gib:.2f} GiB | {rank['rss_before'] / gib:.2f} GiB |")
    return "\n".join(lines) + f"\n\nper rank, {processes} processes, batch {batch} per rank at {img} px, one AdamW step"


def make_record(args, argv: list[str], results: list[dict], seconds: float) -> dict:
    """The measurements of ``visionpe scaling-memory ARGV`` as data: the command, the settings (:data:`SETTINGS`)
    and their sha256, the machine and versions (:func:`visionpe.bench.machine.environment`) with the device, each
    (model, mode)'s ranks, the wall time."""
    measured = {key: getattr(args, key) for key in SETTINGS}
    return {"format": FORMAT, "command": shlex.join(["visionpe", "scaling-memory", *map(str, argv)]),
            "settings": measured,
            "settings_sha256": hashlib.sha256(json.dumps(measured, sort_keys=True).encode()).hexdigest(),
            "made_by": {**environment(), "device": args.device}, "results": results, "wall_s": seconds,
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def read_record(path: Path) -> dict:
    """The record in ``path`` (:func:`make_record`); a file that is not one is a :class:`~visionpe.cli.UserError`
    naming it."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise cli.UserError(f"scaling-memory record {path} cannot be read ({err})") from None
    found = record.get("format") if isinstance(record, dict) else None
    if found != FORMAT:
        raise cli.UserError(f"scaling-memory record {path} is not a {FORMAT} record (format {found!r})")
    return record


def record_table(record: dict) -> str:
    """The table of a record alone (:func:`table`), with the command that made it and the machine that measured."""
    measured = record["settings"]
    return (table(record["results"], measured["processes"], measured["batch_size"], measured["img_size"])
            + f"; measured on {machine_text(record['made_by'])} by `{record['command']}` in "
              f"{record['wall_s'] / 60:.1f} min")


def main(argv) -> int:
    """``visionpe scaling-memory ARGV`` (also each torchrun process, ``--worker``): returns 0; a user mistake is a
    :class:`~visionpe.cli.UserError`."""
    args = build_parser().parse_args(argv)
    if args.processes < 1 or args.batch_size < 1 or args.img_size < 16:
        raise cli.UserError(f"--processes and --batch-size must be positive and --img-size at least 16, got "
                            f"{args.processes}, {args.batch_size}, {args.img_size}")
    if args.worker:
        worker(args)
        return 0
    if args.report_only:
        print("\n\n".join(record_table(read_record(path)) for path in args.report_only))
        return 0
    results, t0 = [], time.time()
    for model in args.models:
        for mode in args.modes:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(args.processes), "-m", "visionpe", "scaling-memory", "--worker", model, mode,
                   "--batch-size", str(args.batch_size), "--img-size", str(args.img_size), "--pe", args.pe,
                   "--device", args.device]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if proc.returncode != 0:
                raise cli.UserError(f"{model} {mode}: torchrun failed: {cli.one_line(proc.stderr[-400:])}")
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"measured {model} {mode}", file=sys.stderr, flush=True)
    record = make_record(args, argv, results, time.time() - t0)
    if args.out:
        write_text(args.out, json.dumps(record, indent=1) + "\n")
    print(record_table(record))
    return 0

