#!/usr/bin/env python
"""Train every encoding with one recipe, sweep test resolutions, write docs/BENCHMARK.md and plots.

    python scripts/benchmark.py --config configs/bench_vit_tiny.yaml \\
        --data shapes-position shapes-relation fashion-mnist --seeds 0 1 2 --res 24 32 48 64 --jobs 2

For each (data set, encoding, seed) it runs ``train_vit.py --config CONFIG --data D --pe P --seed S`` in its
own process (``--jobs`` at a time, one thread each), then ``resolution_sweep`` on the last weights: RoPE
encodings once per ``--scaling`` (none, pi, ntk, yarn), the others as trained. Finished runs (those with a
``sweep.csv``) are skipped, so an interrupted benchmark continues where it stopped. The report holds, per
data set, top-1 mean +- std over seeds at every resolution, the retention acc(res)/acc(train res),
parameters and training images/s, plus a plot, the recipe and the exact command.

``--swin`` adds the Swin list (swin_bias, cpb, rope_mixed, alibi) with ``--swin-config``.
"""
from __future__ import annotations

import csv
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout without `pip install -e .`
from visionpe.data import DATASETS  # noqa: E402
from visionpe.rotary.scaling import SCALINGS  # noqa: E402
from visionpe.train import cli, config, rundir  # noqa: E402
from visionpe.train.cli import UserError  # noqa: E402

VIT_LIST = ["none", "sincos", "learned", "peg", "rope_axial", "rope_mixed", "rope_mixed+learned", "rel_bias", "alibi"]
SWIN_LIST = ["swin_bias", "cpb", "rope_mixed", "alibi"]


def job(cfg_path: Path, data: str, pe: str, seed: int, run: Path, res, scalings, extra, log_dir: Path) -> dict:
    """Train one run (unless done: ``python train_vit.py ...``), then sweep it (``python scripts/resolution_sweep.py
    ...``), each in its own process; returns {'run', 'ok', 'seconds', 'log'}."""
    log = log_dir / f"{run.parent.parent.name}__{run.parent.name}__{run.name}.log"
    t0 = time.time()
    commands = []
    if not (run / "results.json").is_file():
        train = ["--config", str(cfg_path), "--data", data, "--pe", pe, "--seed", str(seed), "--output", str(run),
                 "--threads", "1", "--no-progress", "--eval-res"] + list(extra)
        # a run directory with a config.yaml is continued (from its last saved epoch, or from the start)
        train += ["--resume"] if (run / "config.yaml").is_file() else ["--overwrite"]
        commands.append([str(ROOT / "train_vit.py"), *train])
    if not (run / "sweep" / "sweep.csv").is_file():
        commands.append(sweep_command(run, res, scalings))
    return {"run": run, "ok": run_logged(commands, log), "seconds": time.time() - t0, "log": log}


def sweep_command(run: Path, res, scalings) -> list[str]:
    """``scripts/resolution_sweep.py`` on a run's last weights, writing ``run/sweep/``."""
    return [str(ROOT / "scripts" / "resolution_sweep.py"), str(run), "--res", *map(str, res), "--scaling", *scalings,
            "--out", str(run / "sweep")]


def run_logged(commands: list[list[str]], log: Path) -> bool:
    """Run each ``[script, *args]`` with this Python, one thread each, appending its output to ``log``; stop at the
    first failure. True when all succeeded."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    with open(log, "a") as f:
        for cmd in commands:
            f.write(f"$ python {shlex.join([str(Path(cmd[0]).relative_to(ROOT)), *cmd[1:]])}\n")
            f.flush()
            if subprocess.run([sys.executable, *cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode:
                return False
    return True


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


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
                key = (family, data, pe, row["adaptation"])
                entry = table.setdefault(key, {"acc": {}, "ret": {}, "params": results["params"], "img_s": [],
                                               "train_res": int(row["train_res"]), "seeds": set()})
                entry["acc"].setdefault(int(row["res"]), []).append(float(row["acc"]))
                entry["ret"].setdefault(int(row["res"]), []).append(float(row["retention"]))
                if seed not in entry["seeds"]:
                    entry["seeds"].add(seed)
                    entry["img_s"].append(results["train_img_per_s"])
    return table


def label(pe: str, adaptation: str) -> str:
    return pe if adaptation == "default" else f"{pe} [{adaptation}]"


def markdown_table(table: dict, family: str, data: str, res: list[int]) -> str:
    rows = [(k, v) for k, v in table.items() if k[0] == family and k[1] == data]
    if not rows:
        return "_no finished runs_\n"
    train_res = rows[0][1]["train_res"]
    head = ["encoding"] + [f"{r}px{' (train)' if r == train_res else ''}" for r in res]
    head += [f"retention {r}px" for r in res if r != train_res] + ["params", "train img/s", "seeds"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (_, _, pe, adaptation), v in rows:
        cells = [label(pe, adaptation)] + accuracy_cells(v, res, train_res)
        cells += [f"{v['params'] / 1e3:.1f}k", f"{mean_std(v['img_s'])[0]:.0f}", str(len(v["seeds"]))]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


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
    colour = {pe: plt.get_cmap("tab10")(i % 10) for i, pe in enumerate(pes)}  # one colour per encoding
    for (_, _, pe, adaptation), v in rows:
        rs = [r for r in res if v["acc"].get(r)]
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
        ax.set_xticks(res)
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
    rows = [r for r in res if learned and r > learned["train_res"]]
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
             f"({len(runs)} runs)." + (" Tables rebuilt from those runs with `--report-only`." if args.report_only
                                       else ""), ""]
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
    path.parent.mkdir(parents=True, exist_ok=True)
    # sections written by other scripts (scripts/convert_benchmark.py) between <!-- BEGIN x --> / <!-- END x -->
    # markers are kept at the end
    kept = re.findall(r"<!-- BEGIN [\w.-]+ -->.*?<!-- END [\w.-]+ -->\n?", path.read_text(), re.S) \
        if path.is_file() else []
    text = "\n".join(lines)
    for block in kept:
        text = text.rstrip("\n") + "\n\n" + block.rstrip("\n") + "\n"
    path.write_text(text)


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="benchmark", description=head, epilog=tail)
    what = p.add_argument_group("what to train")
    what.add_argument("--config", type=Path, default=ROOT / "configs" / "bench_vit_tiny.yaml", metavar="YAML",
                      help="train_vit.py recipe of the ViT list (default: configs/bench_vit_tiny.yaml)")
    what.add_argument("--data", nargs="+", default=["shapes-position", "shapes-relation", "fashion-mnist"],
                      metavar="NAME", help=f"data sets, each one of {', '.join(DATASETS)} "
                                           "(default: shapes-position shapes-relation fashion-mnist)")
    what.add_argument("--pe", nargs="+", default=VIT_LIST, metavar="NAME",
                      help=f"encodings of the ViT list, as train_vit.py --pe (default: {' '.join(VIT_LIST)})")
    what.add_argument("--swin", action="store_true", help="also run the Swin list with --swin-config")
    what.add_argument("--swin-config", type=Path, default=ROOT / "configs" / "bench_swin_tiny.yaml", metavar="YAML",
                      help="recipe of the Swin list (default: configs/bench_swin_tiny.yaml)")
    what.add_argument("--swin-pe", nargs="+", default=SWIN_LIST, metavar="NAME",
                      help=f"encodings of the Swin list (default: {' '.join(SWIN_LIST)})")
    what.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], metavar="N",
                      help="seeds, integers >= 0 (default: 0 1 2)")
    what.add_argument("extra", nargs="*", help="after --: extra train_vit.py arguments for every run")
    ev = p.add_argument_group("evaluation")
    ev.add_argument("--res", nargs="+", type=int, default=[24, 32, 48, 64], metavar="PX",
                    help="test resolutions in pixels (default: 24 32 48 64)")
    ev.add_argument("--scaling", nargs="+", default=["none", "pi", "ntk", "yarn"], choices=SCALINGS, metavar="NAME",
                    help=f"RoPE adaptations, of {', '.join(SCALINGS)} (default: all)")
    run = p.add_argument_group("run and report")
    run.add_argument("--jobs", type=int, default=2, metavar="N",
                     help="runs in parallel, one thread each; an integer >= 1 (default: 2)")
    run.add_argument("--out", type=Path, default=ROOT / "runs" / "benchmark", metavar="DIR",
                     help="folder of the runs and logs (default: runs/benchmark)")
    run.add_argument("--doc", type=Path, default=ROOT / "docs" / "BENCHMARK.md", metavar="MD",
                     help="report to write (default: docs/BENCHMARK.md)")
    run.add_argument("--note", default="", help="free text added to the report (e.g. what was left out)")
    run.add_argument("--report-only", action="store_true", help="only rebuild the report from finished runs")
    p.add_debug(run)
    return p


def check(args) -> None:
    """Every run's settings, resolved as train_vit.py will resolve them, before the first process starts."""
    if args.jobs < 1:
        raise UserError(f"--jobs must be an integer >= 1, got {args.jobs}")
    if any(s < 0 for s in args.seeds):
        raise UserError(f"--seeds must be integers >= 0, got {' '.join(map(str, args.seeds))}")
    if any(r < 1 for r in args.res):
        raise UserError(f"--res takes positive sizes, got {' '.join(map(str, args.res))}")
    extra = config.parse_args(list(args.extra), prog="benchmark (train_vit.py arguments after --)")
    recipes = {"vit": (args.config, args.pe)} | ({"swin": (args.swin_config, args.swin_pe)} if args.swin else {})
    for cfg_path, pes in recipes.values():
        for data in args.data:
            for pe in pes:
                cfg = config.resolve({**extra, "config": str(cfg_path), "data": data, "pe": pe})
                bad = [r for r in args.res if r % cfg["patch_size"]]
                if bad:
                    raise UserError(f"--res {' '.join(map(str, bad))}: not a multiple of {cfg_path.name}'s "
                                    f"patch_size {cfg['patch_size']}")


def main(argv=None) -> int:
    return cli.run(benchmark, prog="benchmark", argv=argv)


def benchmark(argv) -> int:
    args = build_parser().parse_args(argv)
    if not args.report_only:
        check(args)
    command = "python scripts/benchmark.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    configs = {"vit": args.config.resolve()}
    lists = {"vit": args.pe}
    if args.swin:
        configs["swin"], lists["swin"] = args.swin_config.resolve(), args.swin_pe
    runs = [(family, data, pe, seed, args.out / family / data / pe.replace("+", "-") / f"s{seed}")
            for family in configs for data in args.data for pe in lists[family] for seed in args.seeds]
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
            futures = [pool.submit(job, configs[f], d, pe, s, run, args.res, args.scaling, args.extra, log_dir)
                       for f, d, pe, s, run in runs]
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
    table = collect([(f, d, pe, s, run) for f, d, pe, s, run in runs])
    write_report(args.doc, args, table, runs, command, wall, configs)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    main()
