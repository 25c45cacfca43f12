"""Measure the small-folder recipe (the shipped recipe ``small_folder``) against timm's ImageNet augmentation and
against plain resize + flip, on the two folders of ``visionpe make-image-folders``, and write the table as a marked
part of a document.

    visionpe small-folder-benchmark --seeds 0 1 2 --jobs 2
    visionpe small-folder-benchmark --folders /tmp/folders --out runs/small_folder --seeds 0 1 2 --jobs 2
    visionpe small-folder-benchmark --seeds 0 1 2 --collect-only    # the table from the runs finished so far
    visionpe small-folder-benchmark --seeds 0 1 2 --doc docs/small_folder.md --report-only   # from the records alone

The folders are written first when missing (FOLDERS/objects; FOLDERS/photos from --photos-src, Debian's
mate-backgrounds nature photos by default: apt-get install mate-backgrounds). Every row trains the recipe's model,
sizes, schedule and loss; only the image augmentation differs (the recipe's transform, mixup and cutmix settings):

  timm          the recipe without its augmentation settings: timm's training transform at timm's defaults
                (random-resized crop of scale 0.08-1 and aspect ratio 3/4-4/3, flip, colour jitter 0.4),
                visionpe train's default
  resize+flip   the whole image resized to the training size (squashed), flipped with probability 0.5 (an image
                folder's default): scale 1 1, ratio 0.25 4 (wider than any image, so timm's crop falls back to the
                whole image), colour jitter 0
  small_folder  the recipe as it is

Each (folder, row, seed) is one run in OUT/FOLDER/ROW_sSEED, trained and swept as the accuracy benchmark's runs are
(``visionpe train``, then ``visionpe sweep`` at the test sizes under the run's own adaptation; --jobs at a time, one
thread each; the log beside the run): a run finished with the settings asked for is not trained again (one of an
edited recipe is), so an interrupted benchmark continues. Each finished run writes a small record (``--records``,
default ``data/<doc's name>/small_folder_benchmark`` beside the doc; the accuracy benchmark's records: settings and
their hash, machine and versions, per-epoch metrics, the sweep's table, wall time; meant to be committed), and the
table is made from the current records alone: a run whose record is current is not run again, whatever machine
made it; a record made with other settings than asked for now (an edited recipe, another --folders) is stale,
named and left out; ``--report-only`` rebuilds the table from the records without runs or folders. The table
holds the last epoch's top-1 (mean +- std over
seeds) at the training size and at --other-size, the retention between them, the epochs and the wall time of a run;
the verdict compares the recipe with each baseline by the seed-spread rule (a gap beyond std_a + std_b).
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from ... import cli
from ...cli import UserError
from ...cli.recipes import recipe_path
from ...cli.report import markdown_table, markers, write_part
from ...train import settings
from ...weights import write_text
from ..image_folders import FOLDER_KINDS, write_folder
from .benchmark import default_records, record_state
from .collect import collect, label
from .jobs import plan_run, run_logged, sweep_command
from .records import make_record, record_path, write_record
from .parts import accuracy_cells, machine_labels, machines_table, made_by_cell
from .staleness import stale_settings, sweep_is_current
from .verdicts import compare_verdict

FAMILY = "small_folder"  # the family of every run in the accuracy table (collect's keys)
FOLDERS = FOLDER_KINDS
PHOTOS_SRC = Path("/usr/share/backgrounds/mate/nature")
AUGMENTATION = (*settings.TRANSFORM_KEYS, "mixup", "cutmix")  # what the rows change; every other setting is shared
RESIZE_FLIP = {"scale": [1.0, 1.0], "ratio": [0.25, 4.0], "color_jitter": 0.0}  # the flip: imagefolder's default
ROWS = ("timm", "resize+flip", "small_folder")
BASELINES = ("timm", "resize+flip")  # what the recipe is compared with
# what else was tried on the way to the recipe: changes to it, and the seeds they were trained with (--candidates)
CANDIDATES = {
    "scale0.6": ({"scale": [0.6, 1.0]}, [0, 1, 2]),
    "scale0.35": ({"scale": [0.35, 1.0]}, [0, 1]),
    "scale0.5_jitter0.2": ({"scale": [0.5, 1.0], "color_jitter": 0.2}, [0]),
    "ratio_timm": ({"ratio": [0.75, 4 / 3]}, [0]),
    "randaugment_m5": ({"aa": "rand-m5-mstd0.5-inc1"}, [0]),
    "erasing0.25": ({"reprob": 0.25}, [0]),
    "lr4e-3": ({"lr": 4.0e-3}, [0]),
    "epochs20": ({"epochs": 20}, [0]),
    "img48": ({"img_size": 48}, [0]),
}
PART = "small_folder_benchmark"
REPORT = "small_folder.md"  # the document in --out unless --doc names one
INVOCATION = "invocation.json"  # in the records' folder: the command and wall time of the invocation that ran last


def row_settings(recipe: dict, row: str) -> dict:
    """The settings of ``row`` (one of :data:`ROWS` or :data:`CANDIDATES`) made from the recipe's: the recipe's own,
    a candidate's change to it, or the recipe without its augmentation (timm's defaults), with :data:`RESIZE_FLIP`
    for ``resize+flip``."""
    if row == "small_folder":
        return dict(recipe)
    if row in CANDIDATES:
        return {**recipe, **CANDIDATES[row][0]}
    shared = {k: v for k, v in recipe.items() if k not in AUGMENTATION}
    return shared if row == "timm" else {**shared, **RESIZE_FLIP}


def make_folders(folders: Path, photos_src: Path, seed: int) -> None:
    """Write FOLDERS/objects and FOLDERS/photos (:func:`visionpe.bench.image_folders.write_folder`, the default
    sizes) where they are missing."""
    for kind in FOLDERS:
        if (folders / kind / "val").is_dir():
            continue
        if kind == "photos" and not photos_src.is_dir():
            raise UserError(f"--photos-src {photos_src} is not a folder of photographs (apt-get install "
                            "mate-backgrounds gives the default), and --folders has no photos folder yet")
        print(f"writing the {kind} folder to {folders / kind}", flush=True)
        write_folder(kind, folders / kind, seed, src=photos_src if kind == "photos" else None)


def train_args(run: Path, config: Path, folder: Path, seed: int) -> list[str]:
    """The ``visionpe train`` arguments of one run."""
    return ["--config", str(config), "--data-dir", str(folder), "--seed", str(seed), "--output", str(run),
            "--threads", "1", "--no-progress"]


def job(run: Path, config: Path, folder: Path, seed: int, sizes: list[int]) -> bool:
    """Train and sweep one run as far as it is not up to date (:func:`.jobs.plan_run`), its output in ``run.log``
    beside it; True when it is finished and swept."""
    log = run.with_suffix(".log")
    commands = plan_run(run, train_args(run, config, folder, seed), sweep_command(run, sizes, []), log)
    ok = run_logged(commands, log)
    print(f"{run}: " + ("done" if ok else f"FAILED (see {log})"), flush=True)
    return ok


def commands(job: tuple, sizes: list[int]) -> tuple[list[str], list[str]]:
    """The ``visionpe train`` arguments and the ``visionpe sweep`` command of a job (``(run, config, folder,
    seed)``)."""
    run, config, folder, seed = job
    return train_args(run, config, folder, seed), sweep_command(run, sizes, [])


def write_records(jobs: list[tuple], sizes: list[int], out: Path, records: Path, doc: Path) -> int:
    """The record (:func:`.records.make_record`) of every job that is finished and swept with the settings asked
    for now, written to ``records`` (the run ``OUT/FOLDER/ROW_sSEED``'s is ``RECORDS/FOLDER/ROW_sSEED.json``) unless
    a current one is there; returns how many were written."""
    written = 0
    for job in jobs:
        run, seed = job[0], job[3]
        train, sweep = commands(job, sizes)
        path = record_path(records, out, run)
        if not sweep_is_current(run, sweep) or stale_settings(run, train) or \
                isinstance(record_state(path, train, sweep, run), dict):
            continue
        identity = {"benchmark": doc.name, "part": PART, "family": FAMILY, "data": run.parent.name,
                    "row": run.name.rpartition("_s")[0], "seed": seed, "run": run.relative_to(out).as_posix()}
        write_record(path, make_record(run, identity, train, sweep))
        written += 1
    return written


def keys_of(table: dict, folder: str) -> dict[str, tuple]:
    """``{row: its key in the accuracy table}`` of one folder (one adaptation a row: the run's own)."""
    return {k[2]: k for k in table if k[1] == folder}


def changes_text(changes: dict) -> str:
    word = lambda v: f"{v:g}" if isinstance(v, float) else str(v)  # noqa: E731
    return ", ".join(f"{k} {' '.join(map(word, v)) if isinstance(v, list) else word(v)}" for k, v in changes.items())


def part(table: dict, plan: dict, sizes: list[int], recipe: dict, command: str, missing=(), stale=()) -> str:
    """The marked part of the document: per folder and row (``plan``: ``{row: seeds}``), top-1 at ``sizes`` and
    the retention, mean ± std over the seeds (:func:`.parts.accuracy_cells`), the seeds, epochs and wall time of a
    run and the machine that made it (``made by``, the machines listed below the table:
    :func:`.parts.machines_table`); then the recipe against each baseline per folder
    (:func:`.verdicts.compare_verdict`), the runs ``missing`` (``FOLDER/ROW_sSEED``) and the ``stale`` records
    (``(run, what changed)``)."""
    train = sizes[0]
    header = ["folder", "recipe", *(f"top-1 % at {s} px" + (" (training size)" if s == train else "") for s in sizes),
              *(f"retention at {s} px" for s in sizes if s != train), "seeds", "epochs", "wall per run (min)",
              "made by"]
    rows, lines, machines = [], [], machine_labels(table)
    for folder in FOLDERS:
        keys = keys_of(table, folder)
        for row in plan:
            entry = table[keys[row]] if row in keys else None
            epochs = row_settings(recipe, row).get("epochs", settings.DEFAULTS["epochs"])
            if entry is None:
                rows.append([folder, row, *["-"] * (2 * len(sizes) - 1), "-", epochs, "-", "-"])
                continue
            walls = list(entry.get("wall_s", {}).values())
            rows.append([folder, row, *accuracy_cells(entry, sizes, train), " ".join(map(str, sorted(entry["seeds"]))),
                         epochs, f"{sum(walls) / len(walls) / 60:.1f}" if walls else "-",
                         made_by_cell(entry, machines)])
        if "small_folder" in keys:
            labels = {row: label(*key[2:]) for row, key in keys.items()}  # the row, with its adaptation
            pairs = [[labels["small_folder"], labels[b]] for b in BASELINES if b in labels]
            verdict = compare_verdict(table, folder, pairs, sizes)
            lines += [f"{folder}: {line[2:]}" for line in verdict.splitlines()]
    tried = [f"- `{row}`: the recipe with {changes_text(CANDIDATES[row][0])}" for row in plan if row in CANDIDATES]
    begin, end = markers(PART)
    return "\n".join([
        begin,
        "Top-1 of the last epoch on the held-out val split (mean ± std over the seeds listed) and its retention "
        f"(top-1 at a size over top-1 at {train} px, per seed); model `{recipe.get('model')}` "
        f"{changes_text(recipe.get('model_kwargs') or {})} at {recipe.get('img_size')} px, patch "
        f"{recipe.get('patch_size')}, evaluated by `visionpe sweep` under the resize protocol (the whole image at each "
        "size) and the run's own adaptation. Wall time: one run (training and sweep) on one thread.", "",
        markdown_table(header, rows), "",
        *([line for line in machines_table(table) if line] + [""] if machines else []),
        *(f"- {line}" for line in lines),
        *([""] + tried if tried else []), "",
        *([f"Not finished, so not in the table ({len(missing)} runs): {', '.join(missing)}.", ""] if missing else []),
        *([f"Stale records, made with other settings than asked for now and left out ({len(stale)}): "
           + "; ".join(f"{run} ({', '.join(reasons)})" for run, reasons in stale) + ".", ""] if stale else []),
        f"Made by `{command}`.",
        end, ""])


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="visionpe small-folder-benchmark", description=head, epilog=tail)
    p.add_argument("--recipe", default="small_folder", metavar="YAML|NAME",
                   help="the recipe, a file or a shipped recipe's name (default: small_folder)")
    p.add_argument("--folders", type=Path, default=Path("/tmp/folders"), metavar="DIR",
                   help="where the folders are (DIR/objects, DIR/photos), written when missing (default /tmp/folders)")
    p.add_argument("--photos-src", type=Path, default=PHOTOS_SRC, metavar="DIR",
                   help=f"the photographs of the photos folder (default {PHOTOS_SRC})")
    p.add_argument("--data-seed", type=int, default=0, metavar="N", help="seed of the folders (default 0)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="N", help="training seeds")
    p.add_argument("--candidates", action="store_true",
                   help="also train the candidates the recipe was chosen from (changes to the recipe, each with its "
                        "own seeds)")
    p.add_argument("--other-size", type=int, default=48, metavar="PX",
                   help="a second test size beside the training size (default 48)")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="runs at a time (default 2)")
    p.add_argument("--collect-only", action="store_true",
                   help="train nothing: write the records of the runs that have finished, and the table (the others "
                        "are named)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing, read no run: rebuild the table from the current records alone")
    p.add_argument("--out", type=Path, default=Path("runs/small_folder"), metavar="DIR",
                   help="run directories (default runs/small_folder)")
    p.add_argument("--doc", type=Path, default=None, metavar="MD",
                   help=f"the document whose marked part gets the table (default: {REPORT} in --out)")
    p.add_argument("--records", type=Path, default=None, metavar="DIR",
                   help=f"folder of the runs' records, one JSON file a run (default: data/<doc's name, lower "
                        f"case>/{PART} beside --doc)")
    p.add_debug()
    return p


def main(argv) -> dict:
    """``visionpe small-folder-benchmark ARGV``: the accuracy table (:func:`.collect.collect`); a user mistake is a
    :class:`~visionpe.cli.UserError`."""
    args = build_parser().parse_args(argv)
    if args.jobs < 1:
        raise UserError(f"--jobs must be an integer >= 1, got {args.jobs}")
    if any(s < 0 for s in args.seeds):
        raise UserError(f"--seeds must be integers >= 0, got {' '.join(map(str, args.seeds))}")
    args.out, args.folders = args.out.resolve(), args.folders.resolve()  # the same folders for every run's processes
    doc = (args.doc or args.out / REPORT).resolve()
    recipe = settings.read_yaml(recipe_path(args.recipe, "--recipe"), "recipe")
    size = recipe.get("img_size", settings.DEFAULTS["img_size"])
    sizes = [size] + ([args.other_size] if args.other_size != size else [])
    if args.collect_only and args.report_only:
        raise UserError("--collect-only reads the runs, --report-only the records alone: give one of them")
    args.records = (args.records or default_records(doc, PART)).resolve()
    plan = {row: args.seeds for row in ROWS}
    plan.update({row: seeds for row, (_, seeds) in CANDIDATES.items()} if args.candidates else {})
    (args.out / "configs").mkdir(parents=True, exist_ok=True)
    configs = {}
    for row in plan:  # each row's settings as a recipe file of its own, kept beside the runs
        configs[row] = args.out / "configs" / f"{row}.yaml"
        configs[row].write_text(yaml.safe_dump({**row_settings(recipe, row), "eval_res": sizes}, sort_keys=False))
    jobs = []
    for seed in sorted({s for seeds in plan.values() for s in seeds}):
        for folder in FOLDERS:
            jobs += [(args.out / folder / f"{row}_s{seed}", configs[row], args.folders / folder, seed)
                     for row, seeds in plan.items() if seed in seeds]
    state = lambda job: record_state(record_path(args.records, args.out, job[0]), *commands(job, sizes), job[0])
    command = shlex.join(["visionpe", "small-folder-benchmark", *map(str, argv)])
    invocation, t0, ok, written = args.records / INVOCATION, time.time(), [], 0
    if not args.report_only:
        todo = [] if args.collect_only else [job for job in jobs if not isinstance(state(job), dict)]
        if todo:
            make_folders(args.folders, args.photos_src, args.data_seed)
        if len(todo) < len(jobs) and not args.collect_only:
            print(f"{len(jobs) - len(todo)} of {len(jobs)} runs have a current record in {args.records}; not run "
                  "again", flush=True)
        for folder in FOLDERS:
            (args.out / folder).mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            ok = list(pool.map(lambda j: job(*j, sizes), todo))
        written = write_records(jobs, sizes, args.out, args.records, doc)
        write_text(invocation, json.dumps({"command": command, "wall_s": time.time() - t0}) + "\n")
    if invocation.is_file():  # this invocation's, or (--report-only) that of the one that ran last
        command = json.loads(invocation.read_text())["command"]
    states = {job[0]: state(job) for job in jobs}
    found = [(FAMILY, run.parent.name, run.name.rpartition("_s")[0], seed, states[run])
             for run, _, _, seed in jobs if isinstance(states[run], dict)]
    stale = [(f"{run.parent.name}/{run.name}", states[run]) for run, *_ in jobs if isinstance(states[run], list)]
    for run, reasons in stale:
        print(f"small-folder-benchmark: stale record of {run} (left out): {'; '.join(reasons)}", file=sys.stderr)
    table = collect(found)
    missing = [f"{run.parent.name}/{run.name}" for run, *_ in jobs if not isinstance(states[run], dict)]
    write_part(doc, PART, part(table, plan, sizes, recipe, command, missing, stale))
    print(f"wrote the table to {doc} ({len(found)} of {len(jobs)} runs with a current record in {args.records}, "
          f"{written} written now)")
    if not all(ok):
        raise UserError(f"{ok.count(False)} runs failed; their logs are in {args.out}")
    return table
