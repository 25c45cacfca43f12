"""The accuracy benchmark's plan: every run's settings checked as ``visionpe train`` will resolve them, the runs
without a current record trained and swept in parallel (:mod:`.jobs`), each one's record written (:mod:`.records`),
then the report from the current records (:mod:`.parts`); ``visionpe benchmark`` is its command line
(:mod:`.cli`)."""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...cli import UserError, import_user_code
from ...cli.recipes import recipe_path
from ...cli.report import markers
from ...train import models, settings, tuning
from ...train.sampling import size_order
from ...train.metrics import key_text
from ...weights import write_text
from .collect import collect
from .jobs import job, sweep_command, train_command
from .records import make_record, read_record, record_path, write_record
from .rows import read_rows, recipe_of, trained_pairs
from .parts import TABLE_CSV, VIDEO_PART, write_rows_part, write_csv, write_report, write_video_part
from .staleness import stale_record

REPORT = "BENCHMARK.md"  # the report's file in --out unless --doc names one
MAIN_PART = "benchmark"  # the records' folder of a whole report (the encoding lists)
INVOCATION = "invocation.json"  # in the records' folder: the command and wall time of the invocation that ran last
VIT_LIST = ["none", "sincos", "learned", "peg", "rope_axial", "rope_mixed", "rope_mixed+learned", "rel_bias", "alibi"]
SWIN_LIST = ["swin_bias", "cpb", "rope_mixed", "alibi"]


def check(args) -> int | None:
    """Every run's settings, resolved as ``visionpe train`` will resolve them, before the first process starts; returns
    the training frame count of a video benchmark (None for images)."""
    if args.jobs < 1:
        raise UserError(f"--jobs must be an integer >= 1, got {args.jobs}")
    if any(s < 0 for s in args.seeds):
        raise UserError(f"--seeds must be integers >= 0, got {' '.join(map(str, args.seeds))}")
    if args.holdout is not None and not args.tune:
        raise UserError(f"--holdout {args.holdout} sets the held-out images of --tune; give --tune too")
    if args.holdout is not None and args.holdout < 1:
        raise UserError(f"--holdout must be an integer >= 1, got {args.holdout}")
    extra = settings.parse_args(list(args.extra), prog="benchmark (visionpe train arguments after --)")
    if args.rows is not None and args.swin:
        raise UserError("--rows replaces the encoding lists: give --rows or --swin, not both")
    spec = read_rows(args.rows) if args.rows is not None else None
    if spec:  # (recipe, data set, the run's own train arguments, evaluation protocols)
        plans = [(recipe_of(spec, data, args.config), data, r["parsed"], r["protocol"])
                 for data, r in trained_pairs(spec, args.data)]
    else:
        plans = [(args.config, data, {"pe": pe}, []) for data in args.data for pe in args.pe]
    if args.swin:
        plans += [(args.swin_config, data, {"pe": pe}, []) for data in args.data for pe in args.swin_pe]
    frames = set()
    for cfg_path, data, own, protocols in plans:
        cfg = settings.resolve({**extra, **own, "config": str(cfg_path), "data": data})
        for protocol in protocols:
            settings.check_evaluation(cfg.replace(eval_protocol=protocol))
        bad = [r for r in args.res if any(side % cfg["patch_size"] for side in size_order(r))]
        if bad:
            raise UserError(f"--res {' '.join(map(key_text, bad))}: not a multiple of {cfg_path.name}'s "
                            f"patch_size {cfg['patch_size']}")
        if cfg["num_frames"] and not all(isinstance(r, int) for r in args.res):
            raise UserError("--res HxW (non-square) is for image recipes; video sizes are square")
        if args.tune and not cfg["num_frames"]:
            tuning.check_holdout(cfg, args.holdout, args.res)  # something to hold out, within memory
        frames.add(cfg["num_frames"])
        t = models.tubelet(cfg)[0] if cfg["num_frames"] else 1
        bad = [f for f in args.frames if f < 1 or f % t]
        if bad:
            raise UserError(f"--frames {' '.join(map(str, bad))}: not a positive multiple of the tubelet's "
                            f"{t} frames")
    if len(frames) > 1:
        raise UserError("mix of video and image runs (or of frame counts): give one video recipe or only image ones")
    video = frames.pop()
    if args.frames and not video:
        raise UserError("--frames is for video recipes (num_frames, video data); these runs are image runs")
    if video and args.swin:
        raise UserError("--swin has no video recipe: give a video recipe without --swin")
    if video and args.tune:
        raise UserError("--tune (LookHere's protocol) is for image recipes; this is a video recipe")
    if video and args.rows:
        raise UserError("--rows is for image recipes: give an image recipe (no num_frames) with --rows")
    if args.part is not None and not video:
        raise UserError(f"--part {args.part} names a video benchmark's part; an image benchmark's part is its "
                        "--rows file's (part:)")
    if args.part == MAIN_PART:
        raise UserError(f"--part {MAIN_PART} is the image report's own records folder: give another name")
    if args.part is not None:
        try:
            markers(args.part)
        except ValueError as e:
            raise UserError(f"--part: {e}") from None
    return video


def default_records(doc: Path, part: str) -> Path:
    """Where the records of a report's ``part`` live by default: ``data/<doc's name>/<part>`` beside the doc
    (``docs/reports/BENCHMARK_COMPARISON.md``, part ``comparison``:
    ``docs/reports/data/benchmark_comparison/comparison``)."""
    return doc.parent / "data" / doc.stem.lower() / part


def record_state(path: Path, train: list[str], sweep: list[str], run: Path) -> dict | list[str] | None:
    """The record in ``path`` when it is current (made with the settings and sweep asked for now), else what
    differs (a stale record), or None when there is none."""
    record = read_record(path)
    if record is None:
        return None
    return stale_record(record, train, sweep, run) or record


def take_shared_records(runs: list, commands: dict, records: Path, out: Path) -> None:
    """Copy into a rows part's ``records`` the current record of each run that has no record there but has one in
    another part of the same report (``records``' sibling folders): rows files that share ``--out`` share the runs of
    a row they both have (the same label, recipe, seed and sweep: the same settings hash), and so, on a machine
    without those runs, do their records. The copy is the record as it was made, its ``part`` the part that made
    it; a stale record here is redone, never replaced. ``commands``: ``{run: (train, sweep)}``."""
    taken = {}
    siblings = sorted(p for p in records.parent.iterdir() if p.is_dir() and p != records) \
        if records.parent.is_dir() else []
    for *_, run in runs:
        here = record_path(records, out, run)
        if here.exists():
            continue
        for other in siblings:
            there = record_path(other, out, run)
            if there.is_file() and isinstance(record_state(there, *commands[run], run), dict):
                write_text(here, there.read_text())
                taken[other.name] = taken.get(other.name, 0) + 1
                break
    for part, count in taken.items():
        print(f"benchmark: {count} current record{'s' * (count != 1)} taken from the report's part {part} (the "
              "same runs: a row both parts have)", flush=True)


def current_records(command: str, runs: list, states: dict, key, where, records: Path, doc: Path) -> tuple[list, list]:
    """``runs`` sorted by their records' ``states`` (``{key(run): record_state}``): ``([(run, record)] of the current
    ones, [(record path, reasons)] of the stale ones)``; each stale record named on stderr (``command: stale record
    ...``) and left out; no current record at all is a :class:`UserError` (``doc`` is left as it is). ``where(run)``:
    the run's record path."""
    stale = [(where(r), states[key(r)]) for r in runs if isinstance(states[key(r)], list)]
    for path, reasons in stale:
        print(f"{command}: stale record {path} (left out): {'; '.join(reasons)}", file=sys.stderr)
    current = [(r, states[key(r)]) for r in runs if isinstance(states[key(r)], dict)]
    if not current:
        raise UserError(f"no current records in --records {records} (of {len(runs)} planned runs, {len(stale)} "
                        f"stale, e.g. {where(runs[0])}); {doc} is left as it is (check --records, or the logs of "
                        "the runs under --out)")
    return current, stale


def run(args, command: str) -> int:
    """Train and sweep every run of ``args`` (the parsed ``visionpe benchmark`` command line, ``command`` its text)
    that is not finished, then write the report; returns 0."""
    args.out = args.out.resolve()  # the same folders for every run's processes
    args.doc = (args.doc or args.out / REPORT).resolve()
    args.config = recipe_path(args.config).resolve()  # a file, or the name of a shipped recipe
    args.swin_config = recipe_path(args.swin_config).resolve()
    imported = import_user_code(getattr(args, "imports", None))
    args.extra = [*args.extra, *[arg for target in imported for arg in ("--import", target)]]  # every run records it
    video = check(args)
    configs = {"vit": args.config}
    lists = {"vit": args.pe}
    if args.swin:
        configs["swin"], lists["swin"] = args.swin_config, args.swin_pe
    spec = read_rows(args.rows) if args.rows else None
    if spec:  # rows: (family "rows", data, row label, seed, folder) and each row's own arguments and adaptations
        rows = {r["label"]: r for r in spec["rows"]}
        runs = [("rows", data, r["label"], seed, args.out / data / r["slug"] / f"s{seed}")
                for data, r in trained_pairs(spec, args.data) for seed in args.seeds]
        configs = {"rows": configs["vit"]}
        recipe = lambda family, data: recipe_of(spec, data, args.config)  # each data set its own budget
        plan = lambda pe: ([*rows[pe]["train"], *args.extra], rows[pe]["scaling"], rows[pe]["protocol"])
    else:
        runs = [(family, data, pe, seed, args.out / family / data / pe.replace("+", "-") / f"s{seed}")
                for family in configs for data in args.data for pe in lists[family] for seed in args.seeds]
        recipe = lambda family, data: configs[family]
        plan = lambda pe: (["--pe", pe, *args.extra], args.scaling, [])
    # order: seed-major, so that an early stop leaves every encoding with the same number of seeds
    runs.sort(key=lambda r: (r[3], list(configs).index(r[0]), args.data.index(r[1])))
    tune = (["--tune"] + (["--holdout", str(args.holdout)] if args.holdout is not None else [])) if args.tune else []
    part = spec["part"] if spec else ((args.part or VIDEO_PART) if video else MAIN_PART)
    args.records = (args.records or default_records(args.doc, part)).resolve()
    commands = {r[4]: (train_command(recipe(r[0], r[1]), r[1], r[3], r[4], plan(r[2])[0]),
                       sweep_command(r[4], args.res, plan(r[2])[1], args.frames, plan(r[2])[2], tune)) for r in runs}
    path = lambda run: record_path(args.records, args.out, run)
    # the invocation's command and wall time, one pair per report (rows parts may share a folder and their runs)
    invocation = args.records / INVOCATION
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        if spec:
            take_shared_records(runs, commands, args.records, args.out)
        todo = [r for r in runs if not isinstance(record_state(path(r[4]), *commands[r[4]], r[4]), dict)]
        if len(todo) < len(runs):
            print(f"benchmark: {len(runs) - len(todo)} of {len(runs)} runs have a current record in {args.records}; "
                  "not run again", flush=True)
        log_dir = args.out / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(job, recipe(f, d), d, s, run, plan(pe)[0], args.res, plan(pe)[1], log_dir,
                                   args.frames, plan(pe)[2], tune) for f, d, pe, s, run in todo]
            for i, ((f, d, pe, s, run), fut) in enumerate(zip(todo, futures), 1):
                r = fut.result()
                if r["ok"]:
                    identity = {"benchmark": args.doc.name, "part": part, "family": f, "data": d, "row": pe,
                                "seed": s, "run": run.relative_to(args.out).as_posix()}
                    write_record(path(run), make_record(run, identity, *commands[run]))
                status = "ok" if r["ok"] else f"FAILED (see {r['log']})"
                print(f"[{i}/{len(todo)}] {time.time() - t0:7.0f}s  {r['run'].relative_to(args.out)}  "
                      f"{r['seconds']:.0f}s  {status}", flush=True)
        write_text(invocation, json.dumps({"command": command, "wall_s": time.time() - t0}) + "\n")
    if invocation.is_file():  # this invocation's, or (--report-only) that of the one that ran last
        made = json.loads(invocation.read_text())
        command, wall = made["command"], made["wall_s"]
    else:
        wall = 0.0
    states = {r[4]: record_state(path(r[4]), *commands[r[4]], r[4]) for r in runs}
    found, args.stale = current_records("benchmark", runs, states, lambda r: r[4], lambda r: path(r[4]),
                                        args.records, args.doc)
    current = [(f, d, pe, s, record) for (f, d, pe, s, _), record in found]
    args.unfinished = [r for r in runs if not isinstance(states[r[4]], dict)]
    if args.unfinished:
        missing = [str(r[4].relative_to(args.out)) for r in args.unfinished]
        print(f"benchmark: {len(missing)} of {len(runs)} runs have no current record (the report says which): "
              f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}", file=sys.stderr)
    table = collect(current)
    write_csv(args.out / TABLE_CSV, table)
    if spec:
        write_rows_part(args.doc, args, spec, table, runs, command, wall)
    elif video:
        cols = [(f, r) for f in sorted(set(args.frames) | {video}) for r in sorted(args.res)]
        write_video_part(args.doc, args, table, runs, command, wall, configs, cols, part=part)
    else:
        write_report(args.doc, args, table, runs, command, wall, configs)
    print(f"wrote {args.doc}")
    return 0
