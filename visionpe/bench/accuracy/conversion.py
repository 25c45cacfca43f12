"""Convert a trained learned-APE model to RoPE and fine-tune it, against training RoPE (and APE) from scratch.

    visionpe convert-benchmark --config bench_vit_tiny --data shapes-position \\
        --seeds 0 1 2 --pretrain-epochs 3 --finetune-epochs 2 --to rope_mixed rope_mixed+learned \\
        --res 24 32 48 64 --scaling none pi --jobs 2

Per data set and seed, with one recipe (--config; only --epochs, --pe and --init-from change):

- ``learned_eN``: learned APE trained N = --pretrain-epochs epochs (the model to convert);
- ``learned_eN_to_P_eM``: that run converted to each target P (``visionpe train --init-from``) and fine-tuned
  M = --finetune-epochs epochs (a new optimizer and schedule), and ``learned_eN_to_learned_eM``: the same
  restart without changing the encoding (APE continued for M epochs);
- ``P_eN+M`` and ``learned_eN+M``: each encoding trained from scratch for the same total N + M epochs.

Every run is ``visionpe train ...`` in its own process (``--jobs`` at a time, one thread each), then
``visionpe sweep RUN --res ... --scaling ...`` on its last weights (RoPE rows once per
scaling). Finished runs (with ``sweep/sweep.csv``) are skipped and interrupted ones resumed, so an interrupted
benchmark continues where it stopped. The report (mean ± std over seeds per resolution, retention, the command,
the machine and a verdict that compares every gap with the seed spread) replaces the part "Converting a
trained APE model to RoPE" of --doc (between its markers; appended when absent).
"""
from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ... import cli
from ...backbones import parse_pe
from ...cli import UserError, user_errors
from ...cli.recipes import recipe_path, shown
from ...cli.report import markdown_table as report_table
from ...cli.report import ONE_SEED, mean_std, spread_gap, spread_text, write_part
from ...rotary.scaling import SCALINGS
from ...train import metrics, restore, settings
from .benchmark import REPORT
from .cli import add_recipe_and_data
from .collect import finished_runs_or_refuse
from .jobs import plan_run, run_logged, sweep_command
from .parts import accuracy_cells

PART = "convert_benchmark"
BEGIN, END = f"<!-- BEGIN {PART} -->", f"<!-- END {PART} -->"
TITLE = "## Converting a trained APE model to RoPE"
SOURCE_PE = "learned"


def slug(pe: str) -> str:
    return pe.replace("+", "-")


def plan(args) -> list[dict]:
    """Every run: ``{'data', 'seed', 'kind', 'pe', 'run', 'train': [visionpe train args], 'after': source run}``."""
    n, m = args.pretrain_epochs, args.finetune_epochs
    runs = []
    for data in args.data:
        for seed in args.seeds:
            base = args.out / data
            common = ["--config", str(args.config), "--data", data, "--seed", str(seed)]
            source = base / f"{SOURCE_PE}_e{n}" / f"s{seed}"
            runs.append({"data": data, "seed": seed, "kind": "source", "pe": SOURCE_PE, "run": source, "after": None,
                         "train": [*common, "--pe", SOURCE_PE, "--epochs", str(n)]})
            for pe in [SOURCE_PE, *args.to]:
                runs.append({"data": data, "seed": seed, "kind": "converted", "pe": pe, "after": source,
                             "run": base / f"{SOURCE_PE}_e{n}_to_{slug(pe)}_e{m}" / f"s{seed}",
                             "train": ["--init-from", str(source), *common, "--pe", pe, "--epochs", str(m)]})
            for pe in [SOURCE_PE, *args.to]:
                runs.append({"data": data, "seed": seed, "kind": "scratch", "pe": pe, "after": None,
                             "run": base / f"{slug(pe)}_e{n + m}" / f"s{seed}",
                             "train": [*common, "--pe", pe, "--epochs", str(n + m)]})
    # sources first (the conversions wait for them), then the conversions, then the long runs from scratch
    order = {"source": 0, "converted": 1, "scratch": 2}
    return sorted(runs, key=lambda r: (order[r["kind"]], r["seed"], args.data.index(r["data"])))


def job(spec: dict, args, waits: dict, log_dir: Path) -> dict:
    """Train one run unless it is finished with the settings asked for now, then sweep it unless its sweep is current
    (:func:`.jobs.plan_run`), each in its own process; a conversion waits for its source."""
    run = spec["run"]
    if spec["after"] is not None:
        source = waits[spec["after"]].result()
        if not source["ok"]:
            return {"run": run, "ok": False, "seconds": 0.0, "log": source["log"]}
    log = log_dir / ("__".join(run.relative_to(args.out).parts) + ".log")
    train = [*spec["train"], "--output", str(run), "--threads", "1", "--no-progress", "--eval-res"]
    t0 = time.time()
    commands = plan_run(run, train, sweep_command(run, args.res, args.scaling), log)
    return {"run": run, "ok": run_logged(commands, log), "seconds": time.time() - t0, "log": log}


def collect(runs: list[dict]) -> dict:
    """``{(data, kind, pe, adaptation): {'acc': {res: [per seed]}, 'ret': {...}, 'train_res', 'seeds', 'train_s'}}``"""
    table = {}
    for spec in runs:
        sweep = spec["run"] / "sweep" / "sweep.csv"
        if not sweep.is_file():
            continue
        results = metrics.read_results(spec["run"])
        train_s = sum(h.get("epoch_time_s", 0.0) for h in metrics.epochs(metrics.read_history(spec["run"])))
        with open(sweep) as f:
            for row in csv.DictReader(f):
                key = (spec["data"], spec["kind"], spec["pe"], row["adaptation"])
                entry = table.setdefault(key, {"acc": {}, "ret": {}, "train_res": int(row["train_res"]),
                                               "seeds": set(), "train_s": [], "params": results["params"]})
                entry["acc"].setdefault(int(row["res"]), []).append(float(row["acc"]))
                entry["ret"].setdefault(int(row["res"]), []).append(metrics.read_retention(row["retention"]))
                if spec["seed"] not in entry["seeds"]:
                    entry["seeds"].add(spec["seed"])
                    entry["train_s"].append(train_s)
    return table


def row_label(kind: str, pe: str, adaptation: str, n: int, m: int) -> str:
    text = {"source": f"{pe}, {n} ep (the source)",
            "converted": f"{SOURCE_PE} {n} ep → {pe} +{m} ep" + (" (APE continued)" if pe == SOURCE_PE else ""),
            "scratch": f"{pe}, {n + m} ep from scratch"}[kind]
    return text if adaptation == "default" else f"{text} [{adaptation}]"


def row_order(args) -> list[tuple[str, str]]:
    """(kind, pe) in the order of the table: APE rows, then per target scratch and converted side by side."""
    rows = [("source", SOURCE_PE), ("scratch", SOURCE_PE), ("converted", SOURCE_PE)]
    for pe in args.to:
        rows += [("scratch", pe), ("converted", pe)]
    return rows


def markdown_table(table: dict, data: str, args) -> str:
    n, m = args.pretrain_epochs, args.finetune_epochs
    rows = []
    for kind, pe in row_order(args):
        rows += [(k, v) for k, v in table.items() if k[:3] == (data, kind, pe)]
    if not rows:
        return "_no finished runs_\n"
    train_res = rows[0][1]["train_res"]
    res = args.res
    head = ["model"] + [f"{r}px{' (train)' if r == train_res else ''}" for r in res]
    head += [f"retention {r}px" for r in res if r != train_res] + ["train s", "seeds"]
    body = [[row_label(kind, pe, adaptation, n, m), *accuracy_cells(v, res, train_res),
             f"{mean_std(v['train_s'])[0]:.0f}", str(len(v["seeds"]))] for (_, kind, pe, adaptation), v in rows]
    return report_table(head, body) + "\n"


def compare(a: dict, b: dict, res: list[int]) -> tuple[str, list[int], list[int], list[int]]:
    """Per resolution ``mean_a - mean_b`` and whether it is beyond the seed spread (|gap| > std_a + std_b): the text,
    the sizes ahead and behind beyond it, and those over one seed (no spread: neither)."""
    parts, beyond_pos, beyond_neg, single = [], [], [], []
    for r in res:
        gap, word = spread_gap(a["acc"].get(r, []), b["acc"].get(r, []))
        spread = mean_std(a["acc"].get(r, []))[1] + mean_std(b["acc"].get(r, []))[1]
        if word == "beyond":
            (beyond_pos if gap > 0 else beyond_neg).append(r)
        if word == ONE_SEED:
            single.append(r)
            parts.append(f"{r}px {gap:+.1f} ({ONE_SEED})")
            continue
        d = 2 if spread < 0.5 or f"{abs(gap):.1f}" == f"{spread:.1f}" else 1  # enough digits to see it
        parts.append(f"{r}px {gap:+.{d}f} ({word} ±{spread:.{d}f})")
    return ", ".join(parts), beyond_pos, beyond_neg, single


def sentence(name_a: str, name_b: str, a: dict, b: dict, res: list[int]) -> str:
    detail, ahead, behind, single = compare(a, b, res)
    px = lambda rs: ", ".join(f"{r}" for r in rs) + " px"
    if single:
        verdict = f"one seed at {px(single)}: no spread to tell a gap from noise"
    elif not ahead and not behind:
        verdict = "within the seed spread (noise) at every resolution"
    else:
        verdict = "; ".join(([f"**ahead beyond the seed spread at {px(ahead)}**"] if ahead else [])
                            + ([f"**behind beyond the seed spread at {px(behind)}**"] if behind else []))
        rest = [r for r in res if r not in ahead + behind]
        if rest:
            verdict += f"; within noise at {px(rest)}"
    return f"- {name_a} vs {name_b}: {verdict}. Gaps: {detail}."


def verdicts(table: dict, data: str, args) -> str:
    """Converted vs the same encoding from scratch (per scaling); converted (best scaling: the last of --scaling)
    vs APE continued and APE from scratch; APE continued vs APE from scratch."""
    n, m = args.pretrain_epochs, args.finetune_epochs
    get = lambda kind, pe, ad="default": table.get((data, kind, pe, ad))
    ape_scratch, ape_cont = get("scratch", SOURCE_PE), get("converted", SOURCE_PE)
    ape_scratch_name = f"`{SOURCE_PE}` {n + m} ep from scratch"
    ape_cont_name = f"`{SOURCE_PE}` {n} ep → +{m} ep (APE continued)"
    lines = []
    for pe in args.to:
        for ad in args.scaling:
            conv, scratch = get("converted", pe, ad), get("scratch", pe, ad)
            name = f"`{SOURCE_PE}` {n} ep → `{pe}` +{m} ep [{ad}]"
            if conv and scratch:
                lines.append(sentence(name, f"`{pe}` {n + m} ep from scratch [{ad}]", conv, scratch, args.res))
        ad = args.scaling[-1]
        conv, name = get("converted", pe, ad), f"`{SOURCE_PE}` {n} ep → `{pe}` +{m} ep [{ad}]"
        for other, other_name in ((ape_cont, ape_cont_name), (ape_scratch, ape_scratch_name)):
            if conv and other:
                lines.append(sentence(name, other_name, conv, other, args.res))
    if ape_scratch and ape_cont:
        lines.append(sentence(ape_cont_name, ape_scratch_name, ape_cont, ape_scratch, args.res))
    return "\n".join(lines) + "\n" if lines else ""


def part(args, table: dict, runs: list[dict], command: str, wall: float) -> str:
    import torch
    n, m = args.pretrain_epochs, args.finetune_epochs
    recipe = f"`{shown(args.config)}`"
    lines = [BEGIN, TITLE, "",
             f"Generated by `visionpe convert-benchmark` (numbers are measured, not edited). A learned-APE ViT is "
             f"trained {n} epochs, then converted with `visionpe train --init-from RUN --pe P` (every non-positional "
             "weight kept; the APE table dropped, or kept when P has `learned` too; RoPE frequencies start fresh) and "
             f"fine-tuned {m} epochs with a new optimizer and schedule. Controls: each encoding trained from scratch "
             f"for the same total of {n + m} epochs, and APE continued the same way ({n} epochs, then +{m} with a "
             "restarted schedule, `--init-from` with `--pe learned`). Recipe: "
             f"{recipe} for every run; only `--epochs`, `--pe` and `--init-from` change. "
             "Cells are top-1 % (mean ± std over seeds) on the validation split at each test resolution (last "
             "weights; the built-in tasks are re-rendered natively, Fashion-MNIST resized); retention is "
             "acc(res) / acc(train res) per seed, then averaged; RoPE rows are evaluated with `scaling=none` "
             "(extrapolated integer positions) and `scaling=pi` (position interpolation to the training grid) on the "
             "same weights. `train s`: training time of the run itself (the fine-tunes' on top of their source's). A "
             "gap is called beyond the seed spread when |mean_a − mean_b| > std_a + std_b, otherwise within noise.",
             "", "```", command, "```", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, Python "
             f"{platform.python_version()}; {args.jobs} runs side by side, one thread each. Wall time: "
             f"{wall / 60:.1f} min ({len(runs)} runs, each trained and swept).", ""]
    if args.note:
        lines += [args.note.strip(), ""]
    for data in args.data:
        lines += [f"### {data}", ""]
        source = table.get((data, "source", SOURCE_PE, "default"))
        if source:
            classes = restore.load_run(next(r["run"] for r in runs if r["data"] == data and r["kind"] == "source"))
            lines += [f"The {SOURCE_PE} source reaches {spread_text(source['acc'][source['train_res']])} % at its "
                      f"training resolution after {n} epochs (chance: {100 / classes['num_classes']:.1f} %).", ""]
        lines += [markdown_table(table, data, args), ""]
        v = verdicts(table, data, args)
        if v:
            lines += ["Verdict (each gap against the seed spread):", "", v]
    lines.append(END)
    return "\n".join(lines) + "\n"


def check(args) -> None:
    if args.jobs < 1:
        raise UserError(f"--jobs must be an integer >= 1, got {args.jobs}")
    if args.pretrain_epochs < 1 or args.finetune_epochs < 1:
        raise UserError("--pretrain-epochs and --finetune-epochs must be integers >= 1")
    if any(s < 0 for s in args.seeds):
        raise UserError(f"--seeds must be integers >= 0, got {' '.join(map(str, args.seeds))}")
    for pe in args.to:  # first: the recipe is resolved with each of them below
        with user_errors(f"--to {pe}"):
            if "rotary" not in parse_pe(pe):
                raise UserError(f"--to {pe}: not a RoPE encoding (rope_axial, rope_mixed, or a combination)")
    for data in args.data:
        for pe in [SOURCE_PE, *args.to]:
            cfg = settings.resolve({"config": str(args.config), "data": data, "pe": pe,
                                  "epochs": max(args.finetune_epochs, args.pretrain_epochs)})
            bad = [r for r in args.res if r < 1 or r % cfg["patch_size"]]
            if bad:
                raise UserError(f"--res {' '.join(map(str, bad))}: not a positive multiple of patch_size "
                                f"{cfg['patch_size']}")
            if cfg["warmup_epochs"] > args.finetune_epochs:
                raise UserError(f"the recipe's warmup_epochs {cfg['warmup_epochs']} exceeds --finetune-epochs")


def run(args, command: str) -> int:
    """Train, convert, fine-tune and sweep every run of ``args`` (the parsed ``visionpe convert-benchmark`` command
    line, ``command`` its text) that is not finished, then rewrite the report's part; returns 0."""
    args.config, args.out = recipe_path(args.config).resolve(), args.out.resolve()
    args.doc = (args.doc or args.out / REPORT).resolve()
    check(args)
    runs = plan(args)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if args.report_only:
        if (args.out / "command.txt").is_file():
            command = (args.out / "command.txt").read_text().strip()
    else:
        (args.out / "command.txt").write_text(command + "\n")
        log_dir = args.out / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            waits = {}
            for spec in runs:  # sources are submitted first: a conversion only waits for one already started
                waits[spec["run"]] = pool.submit(job, spec, args, waits, log_dir)
            failed = 0
            for i, spec in enumerate(runs, 1):
                r = waits[spec["run"]].result()
                failed += not r["ok"]
                status = "ok" if r["ok"] else f"FAILED (see {r['log']})"
                print(f"[{i}/{len(runs)}] {time.time() - t0:7.0f}s  {r['run'].relative_to(args.out)}  "
                      f"{r['seconds']:.0f}s  {status}", flush=True)
    finished_runs_or_refuse([spec["run"] for spec in runs], args.out, args.doc)
    wall_file = args.out / "wall.json"
    previous = json.loads(wall_file.read_text())["wall_s"] if wall_file.is_file() else 0.0
    wall = previous + (0.0 if args.report_only else time.time() - t0)  # summed over the invocations that ran
    wall_file.write_text(json.dumps({"wall_s": wall}))
    write_part(args.doc, PART, part(args, collect(runs), runs, command, wall))
    print(f"wrote the part '{TITLE[3:]}' of {args.doc}")
    return 0


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="visionpe convert-benchmark", description=head, epilog=tail)
    what = p.add_argument_group("what to train")
    add_recipe_and_data(what, of="every run", data=["shapes-position"])
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
    run.add_argument("--out", type=Path, default=Path("runs/convert_benchmark"), metavar="DIR",
                     help="folder of the runs and logs (default: runs/convert_benchmark)")
    run.add_argument("--doc", type=Path, default=None, metavar="MD",
                     help="report whose part 'Converting a trained APE model to RoPE' is (re)written "
                          f"(default: {REPORT} in --out)")
    run.add_argument("--note", default="", help="free text added to the part (e.g. what shared the machine)")
    run.add_argument("--report-only", action="store_true", help="only rebuild the part from finished runs")
    p.add_debug(run)
    return p


def main(argv) -> int:
    """``visionpe convert-benchmark ARGV``: returns 0; a user mistake is a :class:`~visionpe.cli.UserError`."""
    args = build_parser().parse_args(argv)
    return run(args, "visionpe convert-benchmark " + shlex.join(argv))
