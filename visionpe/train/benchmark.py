"""The accuracy benchmark: every encoding (or every labelled row) trained with one recipe over seeds, swept over test
resolutions, reported in docs/BENCHMARK.md (``scripts/benchmark.py`` is its command line; what it does: there).

Each run is ``train_vit.py`` in its own process, then ``scripts/resolution_sweep.py`` on its last weights, from the
checkout (:data:`ROOT`); finished runs are skipped, interrupted ones resumed.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..data import PROTOCOLS
from ..rotary.scaling import SCALINGS
from ..weights import write_text
from . import cli, loop, models, restore, rundir, settings
from .cli import UserError
from .loop import key_text
from .report import markdown_table as report_table
from .report import mean_std, write_document, write_section

ROOT = Path(__file__).resolve().parents[2]  # the checkout: train_vit.py, scripts/, configs/, docs/

VIT_LIST = ["none", "sincos", "learned", "peg", "rope_axial", "rope_mixed", "rope_mixed+learned", "rel_bias", "alibi"]


SWIN_LIST = ["swin_bias", "cpb", "rope_mixed", "alibi"]


def job(cfg_path: Path, data: str, seed: int, run: Path, train_args: list[str], res, scalings, log_dir: Path,
        frames=(), protocols=()) -> dict:
    """Train one run (``python train_vit.py --config CFG --data D --seed S TRAIN_ARGS ...``) unless it is finished
    with the settings asked for now, then sweep it (``python scripts/resolution_sweep.py ...``, under ``protocols``,
    default the run's own) unless its sweep was made from these results with these arguments; each in its own
    process. Returns {'run', 'ok', 'seconds', 'log'}."""
    log = log_dir / f"{run.parent.parent.name}__{run.parent.name}__{run.name}.log"
    train = ["--config", str(cfg_path), "--data", data, "--seed", str(seed), "--output", str(run), "--threads", "1",
             "--no-progress", "--eval-res", *train_args]
    t0 = time.time()
    sweep = sweep_command(run, res, scalings, frames, protocols)
    return {"run": run, "ok": run_logged(plan_run(run, train, sweep, log), log), "seconds": time.time() - t0,
            "log": log}


def plan_run(run: Path, train: list[str], sweep: list[str], log: Path) -> list[list[str]]:
    """The commands that bring ``run`` up to date: train (fresh, ``--resume`` of an interrupted run with the same
    settings, or ``--overwrite`` when the recipe or the row changed since it was trained, as the log says) unless it
    is finished with the settings asked for, then sweep unless :func:`sweep_is_current`."""
    commands = []
    changed = stale_settings(run, train) if (run / rundir.CONFIG).is_file() else []
    if changed:
        with open(log, "a") as f:
            f.write(f"# {run}: trained with other settings than asked for now: {'; '.join(changed)}; retraining\n")
    if changed or not (run / rundir.RESULTS).is_file():
        resume = (run / rundir.CONFIG).is_file() and not changed  # continued from its last saved epoch
        commands.append([str(ROOT / "train_vit.py"), *train, "--resume" if resume else "--overwrite"])
    if commands or not sweep_is_current(run, sweep):
        commands.append(sweep)
    return commands


def stale_settings(run: Path, train: list[str]) -> list[str]:
    """What of the run in ``run`` differs from what ``train_vit.py TRAIN`` would train now (an edited recipe, another
    row), as ``setting (old -> new)``; settings that do not change what is trained (``settings.SAFE_ON_RESUME``) are
    not differences. Empty when the run is the one asked for."""
    asked = {**settings.parse_args(train, prog="benchmark (a run's train_vit.py arguments)"), "output": str(run)}
    try:
        old = restore.load_run(run)
    except cli.UserError as err:
        return [f"its config.yaml cannot be read ({err})"]
    return [f"{key} ({a!r} -> {b!r})" for key, a, b in settings.refused_changes(old, restore.new_config(asked))]


SWEEP_SOURCE = "made_by.json"  # in run/sweep/: the results file and the arguments the sweep was made from


def sweep_is_current(run: Path, sweep: list[str]) -> bool:
    """``run/sweep/sweep.csv`` exists and was made by ``sweep`` from the run's present ``results.json``."""
    source = run / "sweep" / SWEEP_SOURCE
    if not (run / "sweep" / "sweep.csv").is_file() or not source.is_file() or not (run / rundir.RESULTS).is_file():
        return False
    try:
        made_by = json.loads(source.read_text())
    except ValueError:
        return False
    return made_by == sweep_record(run, sweep)


def sweep_record(run: Path, sweep: list[str]) -> dict:
    """What :data:`SWEEP_SOURCE` holds: the sweep's arguments (without the run and output folders, so a benchmark
    folder can move) and the sha256 of the results it swept."""
    arguments = sweep[2:]
    if "--out" in arguments:
        at = arguments.index("--out")
        arguments = arguments[:at] + arguments[at + 2:]
    return {"arguments": arguments, "results_sha256": hashlib.sha256((run / rundir.RESULTS).read_bytes()).hexdigest()}


def record_sweep(run: Path, sweep: list[str]) -> None:
    """After a successful sweep of ``run``: remember what it was made from (:func:`sweep_is_current`)."""
    write_text(run / "sweep" / SWEEP_SOURCE, json.dumps(sweep_record(run, sweep)))


def unfinished_note(args) -> str:
    """The report's statement of the planned runs it leaves out (not finished or failed), or nothing."""
    missing = getattr(args, "unfinished", [])
    if not missing:
        return ""
    shown = ", ".join(f"`{r[4].relative_to(args.out)}`" for r in missing[:10])
    return (f" **{len(missing)} planned run(s) are not finished and are left out of the tables:** {shown}"
            + (" ..." if len(missing) > 10 else "") + ".")


def finished_runs_or_refuse(runs: list[Path], out: Path, doc: Path) -> list[Path]:
    """The planned runs that are finished and swept; none is a :class:`UserError` that leaves ``doc`` as it is (a
    wrong ``--out``, or every run failed): a report never replaces its tables with empty ones."""
    done = [run for run in runs if (run / "sweep" / "sweep.csv").is_file() and (run / rundir.RESULTS).is_file()]
    if not done:
        raise UserError(f"no finished runs under --out {out} (of {len(runs)} planned, e.g. {runs[0]}); {doc} is left "
                        "as it is (check --out, or the logs of the runs)")
    return done


def sweep_command(run: Path, res, scalings, frames=(), protocols=()) -> list[str]:
    """``scripts/resolution_sweep.py`` on a run's last weights, writing ``run/sweep/`` (``frames``: a video run's
    test frame counts; ``protocols``: evaluation protocols, default the run's own)."""
    return [str(ROOT / "scripts" / "resolution_sweep.py"), str(run), "--res", *map(key_text, res), "--scaling", *scalings,
            *(["--frames", *map(str, frames)] if frames else []),
            *(["--eval-protocol", *protocols] if protocols else []), "--out", str(run / "sweep")]


def run_logged(commands: list[list[str]], log: Path) -> bool:
    """Run each ``[script, *args]`` with this Python, one thread each, appending its output to ``log``; stop at the
    first failure. True when all succeeded. A sweep that succeeds records what it was made from."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    with open(log, "a") as f:
        for cmd in commands:
            f.write(f"$ python {shlex.join([str(Path(cmd[0]).relative_to(ROOT)), *cmd[1:]])}\n")
            f.flush()
            if subprocess.run([sys.executable, *cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode:
                return False
            if Path(cmd[0]).name == "resolution_sweep.py":
                record_sweep(Path(cmd[1]), cmd)
    return True


def accuracy_cells(entry: dict, res, train_res: int) -> list[str]:
    """``mean ± std`` of top-1 at every resolution, then of the retention at every other resolution."""
    cells = ["{:.1f} ± {:.1f}".format(*mean_std(entry["acc"].get(r, []))) for r in res]
    return cells + ["{:.3f} ± {:.3f}".format(*mean_std(entry["ret"].get(r, []))) for r in res if r != train_res]


def collect(runs: list[tuple[str, str, str, int, Path]]) -> dict:
    """{(family, data, pe, adaptation): {'acc': {res: [per seed]}, 'ret': ..., 'params', 'img_s', 'epochs'}}"""
    table = {}
    for family, data, pe, seed, run in runs:
        sweep = run / "sweep" / "sweep.csv"
        if not sweep.is_file():
            continue
        results = rundir.read_results(run)
        with open(sweep) as f:
            for row in csv.DictReader(f):
                key = (family, data, pe, adaptation_key(row))
                video = bool(row.get("frames"))  # a video run: columns are (frames, res)
                col = (int(row["frames"]), int(row["res"])) if video else loop.parse_size(row["res"])
                train = (int(row["train_frames"]), int(row["train_res"])) if video else int(row["train_res"])
                entry = table.setdefault(key, {"acc": {}, "ret": {}, "params": results["params"], "img_s": [],
                                               "train_res": train, "seeds": set()})
                entry["acc"].setdefault(col, []).append(float(row["acc"]))
                entry["ret"].setdefault(col, []).append(float(row["retention"]))
                if seed not in entry["seeds"]:
                    entry["seeds"].add(seed)
                    entry["img_s"].append(results["train_img_per_s"])
    return table


def adaptation_key(row: dict) -> str:
    """A sweep row's adaptation, with its evaluation protocol unless that is ``resize`` (the default, unmarked):
    ``pi``, ``pi/crop``, ``crop`` (the ``default`` adaptation under crop)."""
    protocol = row.get("protocol") or "resize"
    if protocol == "resize":
        return row["adaptation"]
    return protocol if row["adaptation"] == "default" else f"{row['adaptation']}/{protocol}"


def label(pe: str, adaptation: str) -> str:
    return pe if adaptation == "default" else f"{pe} [{adaptation}]"


def markdown_table(table: dict, family: str, data: str, res: list[int]) -> str:
    rows = [(k, v) for k, v in table.items() if k[0] == family and k[1] == data]
    if not rows:
        return "_no finished runs_\n"
    train_res = rows[0][1]["train_res"]
    head = ["encoding"] + [f"{key_text(r)}px{' (train)' if r == train_res else ''}" for r in res]
    head += [f"retention {key_text(r)}px" for r in res if r != train_res] + ["params", "train img/s", "seeds"]
    body = [[label(pe, adaptation), *accuracy_cells(v, res, train_res), f"{v['params'] / 1e3:.1f}k",
             f"{mean_std(v['img_s'])[0]:.0f}", str(len(v["seeds"]))] for (_, _, pe, adaptation), v in rows]
    return report_table(head, body) + "\n"


def plot(table: dict, family: str, data: str, res: list[int], path: Path) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [(k, v) for k, v in table.items() if k[0] == family and k[1] == data]
    if not rows:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    styles = {"none": "-", "pi": "--", "ntk": "-.", "yarn": ":", "default": "-"}
    markers = {"none": "o", "pi": "s", "ntk": "^", "yarn": "D", "default": "o"}
    pes = list(dict.fromkeys(k[2] for k, _ in rows))
    cmap, n = (plt.get_cmap("tab10"), 10) if len(pes) <= 10 else (plt.get_cmap("tab20"), 20)
    colour = {pe: cmap(i % n) for i, pe in enumerate(pes)}  # one colour per encoding (row)
    for (_, _, pe, adaptation), v in rows:
        rs = [r for r in res if isinstance(r, int) and v["acc"].get(r)]  # non-square sizes: in the tables only
        name = label(pe, adaptation)
        for ax, key in zip(axes, ("acc", "ret")):
            ms = [mean_std(v[key][r]) for r in rs]
            ax.errorbar(rs, [m for m, _ in ms], yerr=[s for _, s in ms], capsize=3, label=name, color=colour[pe],
                        linestyle=styles.get(adaptation.split("/")[0], "-"),
                        marker=markers.get(adaptation.split("/")[0], "o"), markersize=4)
    train_res = rows[0][1]["train_res"]
    for ax, ylabel in zip(axes, ("top-1 (%)", "retention acc(res) / acc(train res)")):
        ax.axvline(train_res, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("test resolution (px)")
        ax.set_ylabel(ylabel)
        ax.set_xticks([r for r in res if isinstance(r, int)])
        ax.grid(alpha=0.3)
    axes[0].set_title(f"{data} ({family}): mean ± std over seeds")
    axes[1].legend(fontsize=7, loc="lower left", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def verdict(table: dict, family: str, data: str, res: list[int]) -> str:
    """Plain statement on RoPE-ViT's ordering (mixed >= axial >= learned APE as the resolution grows), per RoPE
    adaptation, with every gap compared to the seed spread (a gap is "within spread" when
    |mean_a - mean_b| <= std_a + std_b)."""
    get = lambda pe, ad: table.get((family, data, pe, ad))
    learned = get("learned", "default")
    rows = [r for r in res if learned and isinstance(r, int) and r > learned["train_res"]]
    if not learned or not rows:
        return ""

    def gap(a, b, r):
        (ma, sa), (mb, sb) = mean_std(a["acc"][r]), mean_std(b["acc"][r])
        return f"{ma - mb:+.1f} ({'within' if abs(ma - mb) <= sa + sb else 'beyond'} spread)", ma >= mb

    lines = []
    for ad in ("none", "pi", "ntk", "yarn"):
        axial, mixed = get("rope_axial", ad), get("rope_mixed", ad)
        if not axial or not mixed:
            continue
        status, parts = 2, []  # 2 holds, 1 holds up to the seed spread, 0 does not hold
        for r in rows:
            for a, b in ((mixed, axial), (axial, learned)):
                text, ahead = gap(a, b, r)
                status = min(status, 2 if ahead else (1 if "within" in text else 0))
            parts.append(f"{r}px: mixed − axial {gap(mixed, axial, r)[0]}, axial − learned {gap(axial, learned, r)[0]}")
        word = ("holds", "holds only up to the seed spread", "does not hold")[2 - status]
        lines.append(f"- RoPE `{ad}`: mixed >= axial >= learned **{word}** at every size above training. "
                     + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n" if lines else ""


VIDEO_SECTION = "video_benchmark"


def video_table(table: dict, data: str, cols: list) -> str:
    """Top-1 mean ± std per encoding (and adaptation) at every (frames, res) cell of a video benchmark."""
    rows = [(k, v) for k, v in table.items() if k[1] == data]
    if not rows:
        return "_no finished runs_\n"
    train = rows[0][1]["train_res"]
    head = ["encoding"] + [f"{f}f {r}px{' (train)' if (f, r) == train else ''}" for f, r in cols]
    head += ["params", "train clips/s", "seeds"]
    body = [[label(pe, adaptation), *["{:.1f} ± {:.1f}".format(*mean_std(v["acc"].get(c, []))) for c in cols],
             f"{v['params'] / 1e3:.1f}k", f"{mean_std(v['img_s'])[0]:.0f}", str(len(v["seeds"]))]
            for (_, _, pe, adaptation), v in rows]
    return report_table(head, body) + "\n"


def video_verdict(table: dict, data: str, cols: list, chance: float) -> str:
    """Plain statements on a video benchmark, every gap compared to the seed spread (within when
    |mean_a - mean_b| <= std_a + std_b): learning above chance at the training cell; the best encoding per cell
    and its gap to the runner-up; RoPE pi against none where frames or size change."""
    rows = {label(k[2], k[3]): v for k, v in table.items() if k[1] == data}
    if not rows:
        return ""
    train = next(iter(rows.values()))["train_res"]

    def gap(a, b, c):
        (ma, sa), (mb, sb) = mean_std(rows[a]["acc"].get(c, [])), mean_std(rows[b]["acc"].get(c, []))
        if min(len(rows[a]["acc"].get(c, [])), len(rows[b]["acc"].get(c, []))) < 2:
            return f"{ma - mb:+.1f} points (one seed: no spread to compare with)"
        return f"{ma - mb:+.1f} points ({'within' if abs(ma - mb) <= sa + sb else 'beyond'} the seed spread)"

    lines = []
    m = {n: mean_std(v["acc"].get(train, [])) for n, v in rows.items()}
    above = [n for n, (mu, sd) in m.items() if mu - sd > chance + 5]
    lines.append(f"- Chance is {chance:.1f} %. At the training cell ({train[0]} frames, {train[1]} px) "
                 + (f"{', '.join(f'`{n}`' for n in above)} learned clearly above it (mean − std > chance + 5 points)"
                    if above else "no encoding learned clearly above it (mean − std > chance + 5 points)")
                 + (f"; {', '.join(f'`{n}`' for n in m if n not in above)} did not" if above and len(above) < len(m)
                    else "") + ".")
    for c in cols:
        ranked = sorted(rows, key=lambda n: -mean_std(rows[n]["acc"].get(c, []))[0])
        if len(ranked) < 2:
            break
        where = f"{c[0]} frames, {c[1]} px" + (" (training)" if c == train else "")
        lines.append(f"- {where}: best `{ranked[0]}` {mean_std(rows[ranked[0]]['acc'][c])[0]:.1f} %, "
                     f"ahead of `{ranked[1]}` by {gap(ranked[0], ranked[1], c)}.")
    for pe in ("rope_axial", "rope_mixed"):
        a, b = f"{pe} [pi]", f"{pe} [none]"
        if a in rows and b in rows:
            parts = [f"{c[0]}f {c[1]}px {gap(a, b, c)}" for c in cols if c != train]
            lines.append(f"- `{pe}` pi − none (interpolate vs extrapolate): " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def write_video_section(path: Path, args, table, runs, command: str, wall: float, configs: dict, cols) -> None:
    """The video benchmark's own marked section of the doc (replaced, or appended); the rest is left as it is."""
    import torch
    from visionpe.data import info
    cfg_path = configs["vit"]
    lines = [f"<!-- BEGIN {VIDEO_SECTION} -->", "## Video: positional encodings under frame-count and resolution "
             "change", "",
             "Generated by `scripts/benchmark.py` with a video recipe (numbers are measured, not edited). Tubelet "
             "video ViTs (`visionpe.create_video_model`) are trained on clips of one frame count and size and tested "
             "at others: the built-in task renders the same clip duration at every frame count (more frames = a "
             "higher frame rate) and size. Cells are top-1 % (mean ± std over seeds) on the validation split. RoPE "
             "rows show each adaptation on the same weights (`none` extrapolates integer positions, `pi` interpolates "
             "to the training token grid, per axis, time included); `learned` tables are resampled to the new "
             "(T, H, W) grid. `train clips/s` is per process (1 thread, "
             f"{args.jobs} processes side by side).", "",
             "```", command, "```", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}. Wall time of "
             f"this invocation: {wall / 60:.1f} min ({len(runs)} runs)." + unfinished_note(args)
             + (" Tables rebuilt from those runs with `--report-only`." if args.report_only else ""), "",
             f"Recipe `{cfg_path.relative_to(ROOT) if cfg_path.is_relative_to(ROOT) else cfg_path}`"
             + (f" with `{shlex.join(args.extra)}`" if args.extra else "") + ":", "",
             "```yaml", cfg_path.read_text().strip(), "```", ""]
    if args.note:
        lines += [args.note.strip(), ""]
    for data in args.data:
        lines += [f"### {data}", "", video_table(table, data, cols), "Verdict (generated):", "",
                  video_verdict(table, data, cols, 100.0 / info(data)["num_classes"])]
    write_section(path, VIDEO_SECTION, "\n".join(lines).rstrip("\n") + f"\n<!-- END {VIDEO_SECTION} -->\n")


ROW_KEYS = {"label": "the row's name in the table", "args": "train_vit.py arguments of the row (--pe ...)",
            "scaling": "RoPE adaptations to sweep (default: none)",
            "protocol": "evaluation protocols to sweep (default: the run's own)"}
SPEC_KEYS = ("section", "title", "note", "rows", "compare")


OWN_KEYS = ("config", "data", "seed", "output", "resume", "overwrite")  # set by the benchmark for every run


def read_rows(path: Path) -> dict:
    """A rows file (``--rows``): ``{section, title, note?, rows: [{label, args, scaling?}]}``, checked; each row gets
    ``train`` (its arguments as a list), ``timm`` (True for a ``--pe timm`` reference row) and ``slug`` (its folder)."""
    spec = settings.read_yaml(path, "rows file")
    where = f"rows file {str(path)!r}"
    for key in ("section", "title", "rows"):
        if key not in spec:
            raise UserError(f"{where}: missing {key!r} (keys: section, title, note, rows)")
    if not re.fullmatch(r"[\w.-]+", str(spec["section"])):
        raise UserError(f"{where}: section must be letters, digits, '_', '.', '-', got {spec['section']!r}")
    if not isinstance(spec["rows"], list) or not spec["rows"]:
        raise UserError(f"{where}: rows must be a non-empty list of mappings with keys {', '.join(ROW_KEYS)}")
    rows, slugs = [], set()
    for i, row in enumerate(spec["rows"]):
        if not isinstance(row, dict) or not {"label", "args"} <= set(row) or set(row) - set(ROW_KEYS):
            raise UserError(f"{where}: row {i} must be a mapping with keys label, args and optionally scaling, "
                            f"got {row!r}")
        train = shlex.split(str(row["args"]))
        parsed = settings.parse_args(train, prog=f"benchmark (row {row['label']!r} of {path.name})")
        own = [k for k in OWN_KEYS if parsed.get(k) not in (None, False)]
        if own:
            raise UserError(f"{where}: row {row['label']!r} sets {', '.join(own)}; the benchmark sets those for "
                            "every run")
        scaling = row.get("scaling", ["none"])
        if not isinstance(scaling, list) or not scaling or any(v not in SCALINGS for v in scaling):
            raise UserError(f"{where}: row {row['label']!r}: scaling must be a list of {', '.join(SCALINGS)}, "
                            f"got {scaling!r}")
        protocols = row.get("protocol", [])
        if not isinstance(protocols, list) or any(v not in PROTOCOLS for v in protocols):
            raise UserError(f"{where}: row {row['label']!r}: protocol must be a list of {', '.join(PROTOCOLS)}, "
                            f"got {protocols!r}")
        slug = re.sub(r"^[.-]+|-+$", "", re.sub(r"[^\w.+-]+", "-", str(row["label"])).replace("+", "-"))
        if not slug:
            raise UserError(f"{where}: row label {row['label']!r} has no letters or digits for its folder name")
        if slug in slugs:
            raise UserError(f"{where}: two rows share the label {row['label']!r} (or its folder name {slug!r})")
        slugs.add(slug)
        rows.append({"label": str(row["label"]), "train": train, "scaling": scaling, "protocol": protocols, "slug": slug,
                     "timm": parsed.get("pe") == models.TIMM_NATIVE})
    compare = spec.get("compare", [])
    if not isinstance(compare, list) or not all(isinstance(pair, list) and len(pair) == 2
                                                and all(isinstance(v, str) for v in pair) for pair in compare):
        raise UserError(f"{where}: compare must be a list of [label, label] pairs of table rows (e.g. "
                        f"['learned [crop]', 'learned']), got {compare!r}")
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)} (keys: {', '.join(SPEC_KEYS)})")
    return {**spec, "rows": rows, "compare": compare}


def compare_text(a: dict, b: dict, r) -> tuple[float, str]:
    """``(mean_a - mean_b, 'within' | 'beyond')`` at size ``r``: beyond the seed spread when the gap exceeds
    std_a + std_b."""
    (ma, sa), (mb, sb) = mean_std(a["acc"].get(r, [])), mean_std(b["acc"].get(r, []))
    return ma - mb, ("within" if abs(ma - mb) <= sa + sb else "beyond")


def rows_verdict(table: dict, data: str, rows: list[dict], res: list) -> str:
    """visionpe against timm's reference rows, every gap compared with the seed spread: the best row of each side
    (highest mean top-1 over the test sizes other than training) compared at every size, then the best of each side
    per size."""
    timm_labels = {r["label"] for r in rows if r["timm"]}
    entries = {label(k[2], k[3]): (k[2] in timm_labels, v) for k, v in table.items() if k[1] == data}
    ours = {n: v for n, (is_timm, v) in entries.items() if not is_timm}
    ref = {n: v for n, (is_timm, v) in entries.items() if is_timm}
    if not ours or not ref:
        return ""
    train = next(iter(entries.values()))[1]["train_res"]
    tests = [r for r in res if r != train]
    score = lambda v: statistics.fmean(mean_std(v["acc"].get(r, []))[0] for r in tests)
    best_ours, best_ref = max(ours, key=lambda n: score(ours[n])), max(ref, key=lambda n: score(ref[n]))
    gaps = {r: compare_text(ours[best_ours], ref[best_ref], r) for r in res}
    ahead = [r for r in tests if gaps[r][0] > 0 and gaps[r][1] == "beyond"]
    behind = [r for r in tests if gaps[r][0] < 0 and gaps[r][1] == "beyond"]
    word = ("beats it beyond the seed spread at every test size" if len(ahead) == len(tests) else
            f"is ahead beyond the seed spread at {len(ahead)} of {len(tests)} test sizes"
            + (f", behind beyond it at {len(behind)}" if behind else "") + ", within it elsewhere")
    lines = [f"- Best visionpe row (mean over the test sizes): `{best_ours}` ({score(ours[best_ours]):.1f} %); best "
             f"timm row: `{best_ref}` ({score(ref[best_ref]):.1f} %). visionpe's best **{word}**: "
             + "; ".join(f"{key_text(r)}px {gaps[r][0]:+.1f} ({gaps[r][1]})" for r in res) + "."]
    for r in tests:
        a = max(ours, key=lambda n: mean_std(ours[n]["acc"].get(r, []))[0])
        b = max(ref, key=lambda n: mean_std(ref[n]["acc"].get(r, []))[0])
        gap, spread = compare_text(ours[a], ref[b], r)
        lines.append(f"- {key_text(r)} px: best visionpe `{a}` {mean_std(ours[a]['acc'][r])[0]:.1f} %, best timm "
                     f"`{b}` {mean_std(ref[b]['acc'][r])[0]:.1f} %: {gap:+.1f} points ({spread} the seed spread).")
    return "\n".join(lines) + "\n"


def compare_verdict(table: dict, data: str, pairs: list, res: list) -> str:
    """For each ``[a, b]`` pair of table rows: ``a - b`` at every size, within or beyond the seed spread."""
    entries = {label(k[2], k[3]): v for k, v in table.items() if k[1] == data}
    lines = []
    for a, b in pairs:
        if a not in entries or b not in entries:
            lines.append(f"- `{a}` − `{b}`: no finished runs for {' and '.join(f'`{n}`' for n in (a, b) if n not in entries)}.")
            continue
        gaps = [(r, *compare_text(entries[a], entries[b], r)) for r in res]
        beyond = [key_text(r) for r, _, spread in gaps if spread == "beyond"]
        lines.append(f"- `{a}` − `{b}`: " + "; ".join(f"{key_text(r)}px {gap:+.1f} ({spread})" for r, gap, spread in gaps)
                     + f". Beyond the seed spread at {', '.join(beyond) + ' px' if beyond else 'no size'}.")
    return "\n".join(lines) + "\n" if lines else ""


def rows_section(path: Path, args, spec: dict, table: dict, runs, command: str, wall: float) -> None:
    """The rows benchmark's marked section of ``path`` (``<!-- BEGIN section -->``); the rest is left as it is."""
    import torch
    name, cfg_path = spec["section"], args.config.resolve()
    lines = [f"<!-- BEGIN {name} -->", f"## {spec['title']}", "",
             "Generated by `scripts/benchmark.py --rows` (numbers are measured, not edited). Every row is trained "
             "with the recipe below and its own `train_vit.py` arguments; rows marked *timm* are timm's own "
             "models (`--pe timm`: the model exactly as timm builds it, its position encoding included, run at new "
             "sizes the way timm does it). Cells are top-1 % (mean ± std over seeds) on the validation split; "
             "`HxW` columns are non-square test sizes (height x width). A gap is *beyond* the seed spread when "
             "|mean_a - mean_b| > std_a + std_b.", "", "```", command, "```", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}. Wall time of "
             f"this invocation: {wall / 60:.1f} min ({len(runs)} runs)." + unfinished_note(args)
             + (" Tables rebuilt from those runs with `--report-only`." if args.report_only else ""), "",
             f"Recipe `{cfg_path.relative_to(ROOT) if cfg_path.is_relative_to(ROOT) else cfg_path}`"
             + (f" with `{shlex.join(args.extra)}`" if args.extra else "") + ":", "",
             "```yaml", cfg_path.read_text().strip(), "```", "", "Rows:", "",
             "| row | train_vit.py arguments | swept adaptations | evaluation protocols |", "|---|---|---|---|"]
    own = "the run's own"
    lines += [f"| {r['label']}{' *(timm)*' if r['timm'] else ''} | `{shlex.join(r['train'])}` | "
              f"{', '.join(r['scaling'])} | {', '.join(r['protocol']) or own} |" for r in spec["rows"]]
    lines += ["", "A row label `[crop]` or `[native]` (or `[pi/crop]`) is that protocol of evaluation; unmarked rows "
              "are evaluated with the run's own protocol (`resize` unless the row says otherwise).", ""]
    for note in (spec.get("note"), args.note):
        if note:
            lines += [str(note).strip(), ""]
    for data in args.data:
        lines += [f"### {data}", ""]
        png = path.parent / f"{path.stem.lower()}_{name}_{data}.png"
        if plot(table, "rows", data, args.res, png):
            lines += [f"![{data}]({png.name})", ""]
        lines += [markdown_table(table, "rows", data, args.res), "Verdict (generated):", "",
                  rows_verdict(table, data, spec["rows"], args.res)
                  + compare_verdict(table, data, spec["compare"], args.res)]
    write_section(path, name, "\n".join(lines).rstrip("\n") + f"\n<!-- END {name} -->\n")


def write_report(path: Path, args, table, runs, command: str, wall: float, configs: dict) -> None:
    import torch
    lines = ["# Benchmark: positional encodings under resolution change", "",
             "Generated by `scripts/benchmark.py` (numbers are measured, not edited). Every encoding is trained with",
             "the identical recipe; only `--pe` changes. Each model is trained at one resolution and tested at",
             "several: built-in tasks are re-rendered natively (same scene, more pixels), Fashion-MNIST is resized",
             "with antialiasing. Cells are top-1 % (mean ± std over seeds) on the validation split; retention is",
             "acc(res) / acc(train res) per seed, then averaged. RoPE rows show each resolution adaptation",
             "(`none` = extrapolate integer positions, `pi` = position interpolation to the training grid, `ntk`,",
             "`yarn`), evaluated on the same trained weights. `train img/s` is per process (1 thread, "
             f"{args.jobs} processes side by side on a shared machine), so treat it as a rough cost ratio.", "",
             "## Command", "", "```", command, "```", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
             f"Python {platform.python_version()}. Wall time of this invocation: {wall / 60:.1f} min "
             f"({len(runs)} runs)." + unfinished_note(args)
             + (" Tables rebuilt from those runs with `--report-only`." if args.report_only else ""), ""]
    for family, cfg_path in configs.items():
        lines += [f"## Recipe ({family}): `{cfg_path.relative_to(ROOT) if cfg_path.is_relative_to(ROOT) else cfg_path}`",
                  "", "```yaml", cfg_path.read_text().strip(), "```", ""]
    if args.note:
        lines += ["## Notes", "", args.note.strip(), ""]
    for family in configs:
        for data in args.data:
            lines += [f"## {data} — {family}", ""]
            png = path.parent / f"{path.stem.lower()}_{family}_{data}.png"
            if plot(table, family, data, args.res, png):
                lines += [f"![{data} {family}]({png.name})", ""]
            lines += [markdown_table(table, family, data, args.res), ""]
            v = verdict(table, family, data, args.res)
            if v:
                lines += ["RoPE-ViT's ordering (Heo et al. 2024: mixed >= axial >= learned APE as resolution grows):", "",
                          v]
    write_document(path, "\n".join(lines))  # sections other commands wrote into the doc are kept


def check(args) -> int | None:
    """Every run's settings, resolved as train_vit.py will resolve them, before the first process starts; returns
    the training frame count of a video benchmark (None for images)."""
    if args.jobs < 1:
        raise UserError(f"--jobs must be an integer >= 1, got {args.jobs}")
    if any(s < 0 for s in args.seeds):
        raise UserError(f"--seeds must be integers >= 0, got {' '.join(map(str, args.seeds))}")
    extra = settings.parse_args(list(args.extra), prog="benchmark (train_vit.py arguments after --)")
    if args.rows is not None and args.swin:
        raise UserError("--rows replaces the encoding lists: give --rows or --swin, not both")
    row_specs = read_rows(args.rows)["rows"] if args.rows is not None else [{"pe": pe} for pe in args.pe]
    vit_runs = [settings.parse_args(r["train"]) if args.rows is not None else r for r in row_specs]
    protocols = {i: r.get("protocol", []) for i, r in enumerate(row_specs)}
    recipes = {"vit": (args.config, vit_runs)}
    if args.swin:
        recipes["swin"] = (args.swin_config, [{"pe": pe} for pe in args.swin_pe])
    frames = set()
    for cfg_path, rows in recipes.values():
        for data in args.data:
            for i, own in enumerate(rows):
                cfg = settings.resolve({**extra, **own, "config": str(cfg_path), "data": data})
                for protocol in protocols.get(i, []) if rows is vit_runs else []:
                    settings.check_evaluation({**cfg, "eval_protocol": protocol})
                bad = [r for r in args.res if any(side % cfg["patch_size"] for side in loop.size_order(r))]
                if bad:
                    raise UserError(f"--res {' '.join(map(key_text, bad))}: not a multiple of {cfg_path.name}'s "
                                    f"patch_size {cfg['patch_size']}")
                if cfg["num_frames"] and not all(isinstance(r, int) for r in args.res):
                    raise UserError("--res HxW (non-square) is for image recipes; video sizes are square")
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
    if video and args.rows:
        raise UserError("--rows is for image recipes: give an image recipe (no num_frames) with --rows")
    return video


def run(args, command: str) -> int:
    """Train and sweep every run of ``args`` (the parsed ``scripts/benchmark.py`` command line, ``command`` its text)
    that is not finished, then write the report; returns 0."""
    args.out, args.doc = args.out.resolve(), args.doc.resolve()  # the runs' processes work in the checkout
    imported = cli.import_user_code(getattr(args, "imports", None))
    args.extra = [*args.extra, *[arg for target in imported for arg in ("--import", target)]]  # every run records it
    video = check(args)
    configs = {"vit": args.config.resolve()}
    lists = {"vit": args.pe}
    if args.swin:
        configs["swin"], lists["swin"] = args.swin_config.resolve(), args.swin_pe
    spec = read_rows(args.rows) if args.rows else None
    if spec:  # rows: (family "rows", data, row label, seed, folder) and each row's own arguments and adaptations
        rows = {r["label"]: r for r in spec["rows"]}
        runs = [("rows", data, r["label"], seed, args.out / data / r["slug"] / f"s{seed}")
                for data in args.data for r in spec["rows"] for seed in args.seeds]
        configs = {"rows": configs["vit"]}
        plan = lambda pe: ([*rows[pe]["train"], *args.extra], rows[pe]["scaling"], rows[pe]["protocol"])
    else:
        runs = [(family, data, pe, seed, args.out / family / data / pe.replace("+", "-") / f"s{seed}")
                for family in configs for data in args.data for pe in lists[family] for seed in args.seeds]
        plan = lambda pe: (["--pe", pe, *args.extra], args.scaling, [])
    # order: seed-major, so that an early stop leaves every encoding with the same number of seeds
    runs.sort(key=lambda r: (r[3], list(configs).index(r[0]), args.data.index(r[1])))
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only and (args.out / "command.txt").is_file():  # report of an earlier invocation
        command = (args.out / "command.txt").read_text().strip()
    if not args.report_only:
        (args.out / "command.txt").write_text(command + "\n")
        log_dir = args.out / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(job, configs[f], d, s, run, plan(pe)[0], args.res, plan(pe)[1], log_dir,
                                   args.frames, plan(pe)[2]) for f, d, pe, s, run in runs]
            for i, fut in enumerate(futures, 1):
                r = fut.result()
                status = "ok" if r["ok"] else f"FAILED (see {r['log']})"
                print(f"[{i}/{len(runs)}] {time.time() - t0:7.0f}s  {r['run'].relative_to(args.out)}  "
                      f"{r['seconds']:.0f}s  {status}", flush=True)
        for d in {r[4].parent for r in runs}:
            d.mkdir(parents=True, exist_ok=True)
    wall = time.time() - t0
    if args.report_only:
        wall = json.loads((args.out / "wall.json").read_text())["wall_s"] if (args.out / "wall.json").is_file() else 0.0
    else:
        (args.out / "wall.json").write_text(json.dumps({"wall_s": wall}))
    finished = finished_runs_or_refuse([r[4] for r in runs], args.out, args.doc)
    if len(finished) < len(runs):
        missing = [str(r[4].relative_to(args.out)) for r in runs if r[4] not in finished]
        print(f"benchmark: {len(missing)} of {len(runs)} runs are not finished (the report says which): "
              f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}", file=sys.stderr)
    args.unfinished = [r for r in runs if r[4] not in finished]
    table = collect([(f, d, pe, s, run) for f, d, pe, s, run in runs])
    if spec:
        rows_section(args.doc, args, spec, table, runs, command, wall)
    elif video:
        cols = [(f, r) for f in sorted(set(args.frames) | {video}) for r in sorted(args.res)]
        write_video_section(args.doc, args, table, runs, command, wall, configs, cols)
    else:
        write_report(args.doc, args, table, runs, command, wall, configs)
    print(f"wrote {args.doc}")
    return 0
