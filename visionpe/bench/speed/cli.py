"""The command line of the speed benchmark (``visionpe bench-speed``): parse, run the parts, write the report."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from ... import cli, export
from ...cli import UserError
from ...cli.report import keep_hand_written
from ...weights import write_text
from ..machine import environment, machine_text
from . import __doc__ as DOC
from .loader import data_loader
from .flex import flex_cost
from .flex_models import flex_models
from .memory import memory_cost
from .steps import cache_hits, compiled_cost, compiled_train_cost, forward_cost, train_cost
from .onnx_latency import onnx_latency
from .plan import make_plan
from .profile import profile_cost
from .rope import rope_apply
from .scale import scale_cost
from .tables import Table
from .timing import Run, allow_recompiles
from .video import video_cost
from .versus_timm import versus_timm

PARTS = ["rope", "forward", "train", "memory", "compile", "timm", "cache", "scale"]  # the default run
OPT_IN = ["compile-train", "flex", "flex-models", "profile", "data", "video",  # run only when named in --parts
          "onnx"]
COMPILED_PAIRS = ("learned", "swin_bias", "control", "rope_axial", "rope_mixed")  # --compile-pairs: first two default
PES = ["learned", "sincos", "peg", "rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi"]  # the default rows
FRONTIER = ["string", "comrope", "liere", "lookhere", "fire",  # on request (--pes): the 2024-2026 image encodings
            "spiral_rope", "harope", "vit5_rope", "pape", "pape_ri", "v2pe", "circle_rope", "hope", "dype",
            "fourier", "spherical_rope", "geope", "mhrope", "decomposed_rel_pos", "preset:sam3",
            "preset:glm4v"]  # and presets
RUNNERS = {"rope": rope_apply, "forward": forward_cost, "train": train_cost, "memory": memory_cost,
           "compile": compiled_cost, "timm": versus_timm, "cache": cache_hits, "scale": scale_cost,
           "compile-train": compiled_train_cost, "flex": flex_cost, "flex-models": flex_models,
           "profile": profile_cost, "data": data_loader, "video": video_cost, "onnx": onnx_latency}
READING = "## Reading these numbers"
RECORD_FORMAT = "visionpe.bench.speed.record/1"
INVOCATION = "invocation.json"  # in the records' folder: the --report-only command that made the report
NOT_SETTINGS = ("out", "record", "debug", "report_only")  # where the results go, not what is measured
OLD_FLAGS = {"--sections": "--parts"}  # a flag's old spelling -> its name now (an error naming it)
OLD_KEYS = {"sections": "parts"}  # a record key's old name -> its name now (records written then still read)


def header(record: dict, lead: list[str] | None = None) -> list[str]:
    """The first lines of a record's report, from a speed record (:func:`speed_record`) alone: ``lead`` (default
    the title ``# Performance``), the command and its wall time, the machine and versions that measured (the GPU on
    CUDA, else the CPU and the threads torch used), the rounds; the parts a run stopped before (a record written as the run went, cut
    short) are named."""
    made, measured = record["made_by"], record["settings"]
    done = [part["name"] for part in record["parts"]]
    left = [name for name in measured.get("parts", []) if name not in done]
    threads = f"{made['cpu']}, {record.get('threads', '?')} threads"
    wall = record["wall_s"]
    took = f"{wall / 60:.1f} min" if wall >= 60 else f"{wall:.0f} s"
    return [*(lead or ["# Performance", ""]), f"Made by `{record['command']}` in {took}.", "",
            f"Device: {machine_text(made, cpu=threads)}; medians over {measured['repeats']} interleaved rounds "
            f"({measured['slow_repeats']} for the ViT-S/16 and Swin tables at batch {record.get('vit_batch', '?')}: "
            f"eval forward, training step, timm, cache) of at least {measured['min_run_time']} s per row. Only ratios "
            f"measured side by side mean anything. Targets: time and memory of an encoding <= 1.05x none (peg <= "
            f"1.10x).", "", *([f"The run stopped before the parts {', '.join(left)}: the tables below are those it "
                               "finished.", ""] if left else [])]


def report_text(record: dict, lead: list[str] | None = None) -> str:
    """The report of a speed record alone (:func:`header` after ``lead``, then every table of every part it holds):
    what the run that made it printed and wrote to ``--out``, rebuilt byte for byte on any machine."""
    out = header(record, lead)
    for part in record["parts"]:
        for table in part["tables"]:
            out += [Table(table["title"], table["header"], [tuple(row) for row in table["rows"]],
                          table["note"]).markdown(), ""]
    return "\n".join(out)


def read_reading(path: Path) -> list[str] | None:
    """The hand-written reading of the speed record ``path`` (``NAME.json``): the lines of ``NAME.md`` beside it,
    a ``## `` heading first (its section's title in a report of several records), or None when it has none."""
    reading = Path(path).with_suffix(".md")
    if not reading.is_file():
        return None
    lines = reading.read_text().rstrip("\n").split("\n")
    if not lines[0].startswith("## "):
        raise UserError(f"the reading {reading} of speed record {path} must begin with a '## ' heading (its "
                        f"section's title), not {lines[0]!r}")
    return [*lines, ""]


def sections_text(paths: list[Path], readings: list[list[str] | None], doc: Path | None) -> str:
    """The report of several speed records (or of one with a reading): ``# Performance``, a line linking each record
    (relative to ``doc``'s folder), then one section a record, in order: its reading (``readings``, one a record, of
    :func:`read_reading`; without one, a heading naming the record), then its report (:func:`report_text`)."""
    where = lambda path: Path(os.path.relpath(path, doc.parent)).as_posix() if doc else str(path)
    links = ", ".join(f"[{Path(path).stem}]({where(path)})" for path in paths)
    out = ["# Performance", "",
           f"Rebuilt by `visionpe bench-speed --report-only` from {len(paths)} speed records alone, one section each: "
           f"{links}. Each section names the command, the commit and the machine that measured it; how to read "
           "them: [Reading these numbers](#reading-these-numbers).", ""]
    for path, reading in zip(paths, readings):
        out.append(report_text(read_speed_record(path), reading or [f"## {Path(path).stem}", ""]))
    return "\n".join(out)


def build_parser() -> cli.Parser:
    head, _, tail = DOC.partition("\n\n")
    p = cli.Parser(prog="visionpe bench-speed", description=head, epilog=tail)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=8, help="batch of the ViT-S/16 parts, an integer >= 1 (default 8)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds per measurement, an integer >= 1")
    p.add_argument("--slow-repeats", type=int, default=5,
                   help="interleaved rounds of the ViT-S/16 and Swin tables (forward, train, timm, cache), whose rows "
                        "are single calls of 0.5-2.5 s on CPU; an integer >= 1 (default 5; fewer shortens the run)")
    p.add_argument("--min-run-time", type=float, default=0.25, help="seconds of calls per row and round, > 0")
    p.add_argument("--scale-repeats", type=int, default=1, help="timed rounds of the large-grid part, >= 1")
    p.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS + OPT_IN,
                   help=f"default: {' '.join(PARTS)}; opt-in: {' '.join(OPT_IN)}")
    p.add_argument("--pes", nargs="+", default=PES, choices=PES + FRONTIER,
                   help=f"encodings compared with none (default: {' '.join(PES)}; also {' '.join(FRONTIER)})")
    p.add_argument("--compile-pairs", nargs="*", default=list(COMPILED_PAIRS[:2]), choices=COMPILED_PAIRS,
                   metavar="PAIR", help="compile part: the visionpe-vs-timm pairs compiled at full size, of "
                   f"{' '.join(COMPILED_PAIRS)} (default: learned swin_bias; each pair takes 1-1.5 min of "
                   "compilation on 2 cores with an empty inductor cache; no names: none)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads, an integer >= 1 (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="tiny models, one short round: a smoke test")
    p.add_argument("--out", type=Path, help="write the tables as markdown to this file")
    p.add_argument("--record", type=Path, metavar="JSON",
                   help="also write the results as data to this file, after each part (a run cut short keeps the "
                        "parts it finished): the command, the settings and their hash, the machine and versions, "
                        "each part's tables and wall time (default with --out: data/<--out's name, lower "
                        "case>/speed/<UTC time>.json beside it; meant to be committed)")
    p.add_argument("--report-only", nargs="+", type=Path, metavar="JSON",
                   help="measure nothing: rebuild the report from these speed records alone (to --out, or "
                        "printed): one record, the run's own report; several, or one with a reading (NAME.md beside "
                        "NAME.json, a '## ' heading first), a section each naming its machine, and with --out the "
                        "command kept in the records' folder (invocation.json)")
    p.add_debug()
    return p


MAX_BATCH, MAX_REPEATS = 4096, 1000  # upper bounds: a benchmark that ends (a larger batch or count never would)
MAX_RUN_TIME = 3600.0  # seconds of calls per row and round
MAX_THREADS = 4096  # as visionpe train's --threads

def parse_args(argv: list[str]):
    for arg in argv:
        flag = arg.partition("=")[0]
        if flag in OLD_FLAGS:
            raise UserError(f"{flag} is now {OLD_FLAGS[flag]} (the speed report's parts: default "
                            f"{' '.join(PARTS)}; opt-in {' '.join(OPT_IN)})")
    args = build_parser().parse_args(argv)
    for name, most in (("batch", MAX_BATCH), ("repeats", MAX_REPEATS), ("slow_repeats", MAX_REPEATS),
                       ("scale_repeats", MAX_REPEATS)):
        if not 1 <= getattr(args, name) <= most:
            raise UserError(f"--{name.replace('_', '-')} must be an integer in [1, {most}], got {getattr(args, name)}")
    if not 0 < args.min_run_time <= MAX_RUN_TIME:
        raise UserError(f"--min-run-time must be a number of seconds in (0, {MAX_RUN_TIME}], got {args.min_run_time}")
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise UserError(f"--threads must be an integer in [1, {MAX_THREADS}], got {args.threads}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available")
    if "onnx" in args.parts and (export.missing_onnx_packages() or not export.torch_supports_export()):
        missing = export.missing_onnx_packages()
        raise UserError("--parts onnx needs " + (f"the export extra: pip install 'visionpe[export]' (missing: "
                                                    f"{', '.join(missing)})" if missing else
                                                    f"torch >= {'.'.join(map(str, export.MIN_TORCH))}"))
    for flag, path, what in (("--out", args.out, "a markdown file"), ("--record", args.record, "a JSON file")):
        if path is not None and path.is_dir():
            raise UserError(f"{flag} {str(path)!r} is a directory; give {what}")
    return args


def speed_record(args, argv: list[str], parts: list[dict], seconds: float, vit_batch: int | None = None) -> dict:
    """The results of ``visionpe bench-speed ARGV`` as data: the command, the settings (the parsed arguments less
    where the results go) and their sha256, the machine and versions (:func:`visionpe.bench.machine.environment`)
    with the device measured and the threads torch used, the batch of the ViT-S/16 tables, every part (``{name,
    seconds, tables: [{title, header, rows, note}]}``) and the wall time."""
    measured = {k: v for k, v in sorted(vars(args).items()) if k not in NOT_SETTINGS}
    return {"format": RECORD_FORMAT, "command": " ".join(["visionpe bench-speed", shlex.join(argv)]),
            "settings": json.loads(json.dumps(measured, default=str)),
            "settings_sha256": hashlib.sha256(json.dumps(measured, sort_keys=True, default=str).encode()).hexdigest(),
            "made_by": {**environment(), "device": args.device}, "threads": torch.get_num_threads(),
            "vit_batch": vit_batch, "parts": json.loads(json.dumps(parts, default=str)), "wall_s": seconds,
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def default_record(out: Path) -> Path:
    """Where a run with ``--out DOC`` and no ``--record`` writes its record: ``data/<DOC's name, lower
    case>/speed/<UTC time>.json`` beside DOC (one record an invocation)."""
    return out.parent / "data" / out.stem.lower() / "speed" / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"


def read_speed_record(path: Path) -> dict:
    """The speed record in ``path`` (written by ``--record``, layout of :func:`speed_record`); a record written
    before a key's rename (:data:`OLD_KEYS`: ``sections`` is now ``parts``, at the top and in ``settings``) is read
    with the key's name now. A file that is not such a record, or one giving a key under both names, is a
    :class:`~visionpe.cli.UserError` naming it."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise UserError(f"speed record {path} cannot be read ({err})") from None
    found = record.get("format") if isinstance(record, dict) else None
    if found != RECORD_FORMAT:
        raise UserError(f"speed record {path} is not a {RECORD_FORMAT} record (format {found!r})")
    for mapping in (record, record.get("settings")):
        for old, new in OLD_KEYS.items() if isinstance(mapping, dict) else ():
            if old in mapping and new in mapping:
                raise UserError(f"speed record {path}: {old!r} is the old name of {new!r}; give one of them")
            if old in mapping:
                mapping[new] = mapping.pop(old)
    return record


def rebuild(paths: list[Path], out: Path | None, command: str) -> str:
    """``--report-only``: the report of the speed records ``paths`` (:func:`report_text` of one record without a
    reading, else :func:`sections_text`), written to ``out`` (its hand-written part kept) or printed; returns it.
    With ``out`` and every record in one folder, that folder's ``invocation.json`` keeps ``command`` (the one that
    made ``out``: :mod:`visionpe.bench.rebuild` checks the report against it)."""
    readings = [read_reading(path) for path in paths]
    if readings == [None]:
        report = report_text(read_speed_record(paths[0]))
    else:
        report = sections_text(paths, readings, out)
    if not out:
        print(report)
        return report
    keep_hand_written(out, report, READING)
    if len({Path(path).resolve().parent for path in paths}) == 1:
        write_text(Path(paths[0]).parent / INVOCATION, json.dumps({"command": command}) + "\n")
    return report


def main(argv: list[str]) -> str:
    """``visionpe bench-speed ARGV``: run the parts, print each table as it is done, write the record after each
    part and the report to ``--out`` (both made from the record: :func:`report_text`); returns the report. A user
    mistake is a :class:`~visionpe.cli.UserError`."""
    args = parse_args(argv)
    command = [a for a in argv if a != "--debug"]
    if args.report_only:
        return rebuild(args.report_only, args.out, " ".join(["visionpe bench-speed", shlex.join(command)]))
    if args.out and not args.record:
        args.record = default_record(args.out)
    if args.quick:
        args.repeats, args.slow_repeats, args.min_run_time, args.scale_repeats = 1, 1, 0.01, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    allow_recompiles()
    plan = make_plan(args.quick, args.batch, args.device)
    run = Run(torch.device(args.device), args.repeats, args.min_run_time, plan,
              args.pes, args.scale_repeats, tuple(args.compile_pairs), args.slow_repeats)
    parts, t0 = [], time.perf_counter()
    record = speed_record(args, command, parts, 0.0, plan.vit.batch)
    for i, key in enumerate(args.parts):
        start, tables = time.perf_counter(), []
        for table in RUNNERS[key](run):
            print(table.markdown() + "\n", flush=True)
            tables.append({"title": table.title, "header": table.header, "rows": table.rows, "note": table.note})
        if not {"train", "memory"} & set(args.parts[i + 1:]):
            run.steps.clear()  # the training steps shared by train and memory: models and optimizer state
        parts.append({"name": key, "seconds": time.perf_counter() - start, "tables": tables})
        print(f"[{key}: {parts[-1]['seconds']:.0f} s]\n", file=sys.stderr, flush=True)
        record = speed_record(args, command, parts, time.perf_counter() - t0, plan.vit.batch)
        if args.record:  # after each part: a run stopped by a time limit keeps what it measured
            write_text(args.record, json.dumps(record, indent=1) + "\n")
    report = report_text(record)
    if args.out:
        keep_hand_written(args.out, report, READING)
    return report
