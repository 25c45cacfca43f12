#!/usr/bin/env python
"""Measure the small-folder recipe (configs/small_folder.yaml) against timm's ImageNet augmentation and against
plain resize + flip, on the two folders of scripts/make_image_folders.py, and write the table of
docs/small_folder.md.

    python scripts/small_folder_benchmark.py --seeds 0 1 2 --jobs 2
    python scripts/small_folder_benchmark.py --folders /tmp/folders --out runs/small_folder --seeds 0 1 2 --jobs 2
    python scripts/small_folder_benchmark.py --seeds 0 1 2 --collect-only    # the table from the runs finished so far

The folders are written first when missing (FOLDERS/objects; FOLDERS/photos from --photos-src, Debian's
mate-backgrounds nature photos by default: apt-get install mate-backgrounds). Every row trains the recipe's model,
sizes, schedule and loss; only the image augmentation differs (the recipe's transform, mixup and cutmix settings):

  timm          the recipe without its augmentation settings: timm's training transform at timm's defaults
                (random-resized crop of scale 0.08-1 and aspect ratio 3/4-4/3, flip, colour jitter 0.4), today's
                train_vit.py default
  resize+flip   the whole image resized to the training size (squashed), flipped with probability 0.5 (an image
                folder's default): scale 1 1, ratio 0.25 4 (wider than any image, so timm's crop falls back to the
                whole image), colour jitter 0
  small_folder  the recipe as it is

Each (folder, row, seed) is one `train_vit.py` process (--jobs at a time, one thread each) in OUT/FOLDER/ROW_sSEED;
a run finished with the same settings is not run again (one of an edited recipe is), so an interrupted
benchmark continues. The table holds the last
epoch's top-1 (mean +- std over seeds) at the training size and at --other-size, the epochs and the wall time of a
run; the verdict compares the recipe with each baseline by the seed-spread rule (a gap beyond std_a + std_b).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from visionpe import cli
from visionpe.cli import UserError, report
from visionpe.train import restore, settings

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "visionpe" / "configs" / "small_folder.yaml"
FOLDERS = ("objects", "photos")
PHOTOS_SRC = Path("/usr/share/backgrounds/mate/nature")
AUGMENTATION = (*settings.TRANSFORM_KEYS, "mixup", "cutmix")  # what the rows change; every other setting is shared
RESIZE_FLIP = {"scale": [1.0, 1.0], "ratio": [0.25, 4.0], "color_jitter": 0.0}  # the flip: imagefolder's default
ROWS = ("timm", "resize+flip", "small_folder")
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
SECTION = "small_folder_benchmark"


def row_settings(recipe: dict, row: str) -> dict:
    """The settings of ``row`` (one of :data:`ROWS`) made from the recipe's: the recipe's own, or without its
    augmentation (timm's defaults), or without it and with :data:`RESIZE_FLIP`."""
    if row == "small_folder":
        return dict(recipe)
    if row in CANDIDATES:
        return {**recipe, **CANDIDATES[row][0]}
    shared = {k: v for k, v in recipe.items() if k not in AUGMENTATION}
    return shared if row == "timm" else {**shared, **RESIZE_FLIP}


def make_folders(folders: Path, photos_src: Path, seed: int) -> None:
    """Write FOLDERS/objects and FOLDERS/photos with scripts/make_image_folders.py where they are missing."""
    for kind in FOLDERS:
        if (folders / kind / "val").is_dir():
            continue
        extra = ["--src", str(photos_src)] if kind == "photos" else []
        command = [sys.executable, str(ROOT / "scripts" / "make_image_folders.py"), kind, "--out",
                   str(folders / kind), "--seed", str(seed), *extra]
        print("$", shlex.join(command), flush=True)
        if subprocess.run(command).returncode:
            raise UserError(f"making the {kind} folder failed (its command is printed above)")


def stale_settings(run: Path, args: list[str]) -> list[tuple]:
    """What of the finished run in ``run`` differs from what ``train_vit.py ARGS`` would train now, as
    ``(setting, old, new)``; an image folder's class count is read from the data when a run starts (``None`` before),
    so it differs only when both are known."""
    asked = {**settings.parse_args(args, prog="small_folder_benchmark (a run's train_vit.py arguments)"),
             "output": str(run)}
    new = restore.new_config(asked)
    return [c for c in settings.refused_changes(restore.load_run(run), new) if not (c[0] == "num_classes" and c[2] is None)]


def train_args(run: Path, config: Path, folder: Path, seed: int) -> list[str]:
    """The ``train_vit.py`` arguments of one run."""
    return ["--config", str(config), "--data-dir", str(folder), "--seed", str(seed), "--output", str(run),
            "--threads", "1", "--no-progress"]


def train(run: Path, config: Path, folder: Path, seed: int) -> bool:
    """One training run in its own process, its output in ``run.log`` beside it and its wall time in
    ``run.wall``; True when it finished (results.json written). A finished run with the settings asked for is kept
    as it is; one trained with other settings (an edited recipe) is trained again."""
    args = train_args(run, config, folder, seed)
    if (run / "results.json").is_file() and not stale_settings(run, args):
        return True
    command = [sys.executable, str(ROOT / "train_vit.py"), *args, "--overwrite"]
    start, log_path = time.perf_counter(), run.with_suffix(".log")
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    run.with_suffix(".wall").write_text(f"{time.perf_counter() - start:.1f}\n")
    print(f"{run}: " + ("done" if code == 0 else f"FAILED (exit {code}; see {log_path})"), flush=True)
    return code == 0


def collect(out: Path, plan: dict, sizes) -> dict:
    """``{(folder, row): {"acc": {size: [per seed]}, "wall": [...], "epochs": int, "seeds": [...]}}`` from the
    finished runs of ``plan`` (``{row: seeds}``)."""
    table = {}
    for folder in FOLDERS:
        for row, seeds in plan.items():
            entry = {"acc": {s: [] for s in sizes}, "wall": [], "epochs": None, "seeds": []}
            for seed in seeds:
                run = out / folder / f"{row}_s{seed}"
                if not (run / "results.json").is_file():
                    continue
                results = json.loads((run / "results.json").read_text())
                for s in sizes:  # a run trained at another size (a candidate) may lack one
                    if str(s) in results["results"]["last"]:
                        entry["acc"][s].append(results["results"]["last"][str(s)]["acc"])
                wall = run.with_suffix(".wall")
                entry["wall"].append(float(wall.read_text()) if wall.is_file() else None)
                entry["epochs"] = results["epochs"]
                entry["seeds"].append(seed)
            table[folder, row] = entry
    return table


def cell(values) -> str:
    mean, std = report.mean_std(values)
    return (f"{mean:.1f} ± {std:.1f}" if len(values) > 1 else f"{mean:.1f}") if values else "-"


def verdict(table: dict, folder: str, size: int) -> str:
    """The recipe against each baseline at ``size`` by the seed-spread rule."""
    ours = table[folder, "small_folder"]["acc"][size]
    words = []
    for row in ("timm", "resize+flip"):
        theirs = table[folder, row]["acc"][size]
        if not ours or not theirs:
            continue
        gap, word = report.spread_gap(ours, theirs)
        if word == report.ONE_SEED:
            how = "one seed: no spread to judge by"
        else:
            how = ("better beyond the seed spread" if gap > 0 else "worse beyond the seed spread") \
                if word == "beyond" else "within the seed spread"
        words.append(f"{gap:+.1f} points vs {row} ({how})")
    return f"{folder} at {size} px: small_folder " + "; ".join(words) if words else ""


def changes_text(changes: dict) -> str:
    word = lambda v: f"{v:g}" if isinstance(v, float) else str(v)  # noqa: E731
    return ", ".join(f"{k} {' '.join(map(word, v)) if isinstance(v, list) else word(v)}" for k, v in changes.items())


def section(table: dict, sizes, recipe: dict, command: str, missing=()) -> str:
    header = ["folder", "recipe", *(f"top-1 % at {s} px" + (" (training size)" if i == 0 else "")
                                   for i, s in enumerate(sizes)), "seeds", "epochs", "wall per run (min)"]
    rows = []
    for (folder, row), entry in table.items():
        walls = [w for w in entry["wall"] if w is not None]
        rows.append([folder, row, *(cell(entry["acc"][s]) for s in sizes), " ".join(map(str, entry["seeds"])) or "-",
                     entry["epochs"] or "-", f"{sum(walls) / len(walls) / 60:.1f}" if walls else "-"])
    lines = [verdict(table, folder, s) for folder in FOLDERS for s in sizes]
    tried = [f"- `{row}`: the recipe with {changes_text(CANDIDATES[row][0])}" for row in dict.fromkeys(r for _, r in table)
             if row in CANDIDATES]
    begin, end = report.markers(SECTION)
    return "\n".join([
        begin,
        "Top-1 of the last epoch on the held-out val split (mean ± std over the seeds listed); model "
        f"`{recipe.get('model')}` {changes_text(recipe.get('model_kwargs') or {})} at {recipe.get('img_size')} px, "
        f"patch {recipe.get('patch_size')}, evaluated under the resize protocol (the whole image at each size). "
        "Wall time: one run on one thread of a shared 2-core machine (other jobs ran beside it).", "",
        report.markdown_table(header, rows), "",
        *(f"- {line}" for line in lines if line),
        *([""] + tried if tried else []), "",
        *([f"Not finished, so not in the table ({len(missing)} runs): {', '.join(missing)}.", ""] if missing else []),
        f"Made by `{command}`.",
        end, ""])


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="small_folder_benchmark", description=head, epilog=tail)
    p.add_argument("--recipe", type=Path, default=RECIPE, metavar="YAML", help="the recipe (default: "
                   "configs/small_folder.yaml)")
    p.add_argument("--folders", type=Path, default=Path("/tmp/folders"), metavar="DIR",
                   help="where the folders are (DIR/objects, DIR/photos), written when missing (default /tmp/folders)")
    p.add_argument("--photos-src", type=Path, default=PHOTOS_SRC, metavar="DIR",
                   help=f"the photographs of the photos folder (default {PHOTOS_SRC})")
    p.add_argument("--data-seed", type=int, default=0, metavar="N", help="seed of the folders (default 0)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="N", help="training seeds")
    p.add_argument("--candidates", action="store_true",
                   help="also train the candidates the recipe was chosen from (CANDIDATES: changes to the recipe, "
                        "each with its own seeds)")
    p.add_argument("--other-size", type=int, default=48, metavar="PX",
                   help="a second test size beside the training size (default 48)")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="runs at a time (default 2)")
    p.add_argument("--collect-only", action="store_true",
                   help="train nothing: write the table from the runs that have finished (the others are named)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "small_folder", metavar="DIR",
                   help="run directories (default runs/small_folder)")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "small_folder.md", metavar="MD",
                   help="the document whose marked section gets the table (default docs/small_folder.md)")
    p.add_debug()
    return p


def run(argv) -> dict:
    args = build_parser().parse_args(argv)
    if args.jobs < 1:
        raise UserError(f"--jobs must be an integer >= 1, got {args.jobs}")
    if any(s < 0 for s in args.seeds):
        raise UserError(f"--seeds must be integers >= 0, got {' '.join(map(str, args.seeds))}")
    recipe = settings.read_yaml(args.recipe, "recipe")
    size = recipe.get("img_size", settings.DEFAULTS["img_size"])
    sizes = [size] + ([args.other_size] if args.other_size != size else [])
    make_folders(args.folders, args.photos_src, args.data_seed)
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
            (args.out / folder).mkdir(parents=True, exist_ok=True)
            jobs += [(args.out / folder / f"{row}_s{seed}", configs[row], args.folders / folder, seed)
                     for row, seeds in plan.items() if seed in seeds]
    if args.collect_only:
        finished = [(run / "results.json").is_file() for run, *_ in jobs]
        stale = [str(run) for (run, config, folder, seed), done in zip(jobs, finished) if done and stale_settings(
            run, train_args(run, config, folder, seed))]
        if stale:
            raise UserError(f"--collect-only: {len(stale)} finished runs were trained with other settings than the "
                            f"recipe's now (run without --collect-only to train them again): {', '.join(stale)}")
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            finished = list(pool.map(lambda job: train(*job), jobs))
    table = collect(args.out, plan, sizes)
    missing = [f"{job[0].parent.name}/{job[0].name}" for job, done in zip(jobs, finished) if not done]
    command = "python scripts/small_folder_benchmark.py " + shlex.join(argv)
    report.write_section(args.doc, SECTION, section(table, sizes, recipe, command.strip(), missing))
    print(f"wrote the table to {args.doc} ({sum(finished)} of {len(jobs)} runs finished)")
    if not all(finished) and not args.collect_only:
        raise UserError(f"{len(jobs) - sum(finished)} runs failed; their logs are in {args.out}")
    return table


def main(argv=None) -> dict:
    return cli.run(run, prog="small_folder_benchmark", argv=argv)


if __name__ == "__main__":
    result = main()  # what main returned, for callers that use runpy
