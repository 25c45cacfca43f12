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
scaling). Each run that is finished and swept writes a small record (``--records``, default
``data/<doc's name, lower case>/convert_benchmark`` beside --doc; the accuracy benchmark's records,
:mod:`.records`: settings and their hash, machine and versions, per-epoch metrics, the sweep's table, wall time;
meant to be committed), and the report is made from the current records alone: a run whose record is current is
not run again, whatever machine made it (a source whose record is current is trained again here only when a
conversion of it has no current record: its weights are what the conversion starts from); a record made with other
settings than asked for now is stale, named and left out; ``--report-only`` rebuilds the part from the records
without any run. Finished runs in --out are not trained again and interrupted ones are resumed, so an interrupted
benchmark continues where it stopped. The report (mean ± std over seeds per resolution, retention, the command,
the machines that made each row and a verdict that compares every gap with the seed spread) replaces the part
"Converting a trained APE model to RoPE" of --doc (between its markers; appended when absent).
"""
from __future__ import annotations

import json
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
from ...train import settings
from ...weights import write_text
from . import collect as shared
from .benchmark import INVOCATION, REPORT, current_records, default_records, record_state
from .cli import add_recipe_and_data
from .jobs import plan_run, run_logged, sweep_command
from .parts import accuracy_cells, machine_labels, made_by_cell, provenance_lines
from .records import make_record, record_path, write_record

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


def commands(spec: dict, args) -> tuple[list[str], list[str]]:
    """The ``visionpe train`` arguments and the ``visionpe sweep`` command of one run (one thread, no progress bar,
    no extra evaluation)."""
    run = spec["run"]
    return ([*spec["train"], "--output", str(run), "--threads", "1", "--no-progress", "--eval-res"],
            sweep_command(run, args.res, args.scaling))


def job(spec: dict, args, waits: dict, log_dir: Path) -> dict:
    """Train one run unless it is finished with the settings asked for now, then sweep it unless its sweep is current
    (:func:`.jobs.plan_run`), each in its own process; a conversion waits for its source. ``ran``: whether a
    command ran (else the run's folder was up to date)."""
    run = spec["run"]
    if spec["after"] is not None:
        source = waits[spec["after"]].result()
        if not source["ok"]:
            return {"run": run, "ok": False, "ran": False, "seconds": 0.0, "log": source["log"]}
    log = log_dir / ("__".join(run.relative_to(args.out).parts) + ".log")
    t0 = time.time()
    todo = plan_run(run, *commands(spec, args), log)
    return {"run": run, "ok": run_logged(todo, log), "ran": bool(todo), "seconds": time.time() - t0, "log": log}


def identity(spec: dict, args) -> dict:
    """A run's identity in its record (:func:`.records.make_record`): the kind (``source``, ``converted``,
    ``scratch``) is its family, the encoding its row; a conversion names its source run."""
    rel = lambda run: run.relative_to(args.out).as_posix()  # noqa: E731
    return {"benchmark": args.doc.name, "part": PART, "family": spec["kind"], "data": spec["data"], "row": spec["pe"],
            "seed": spec["seed"], "run": rel(spec["run"]),
            **({"source": rel(spec["after"])} if spec["after"] is not None else {})}


def collect(found: list[tuple[dict, dict]]) -> dict:
    """``{(kind, data, pe, adaptation): entry}`` from the runs' current records (``found``: ``(run spec, record)``):
    the shared table (:func:`.collect.collect`: 'acc', 'ret', 'train_res', 'seeds', 'num_classes', 'made_by', ...)
    with 'train_s', per seed the training time of the run itself (its epochs' ``epoch_time_s``)."""
    table = shared.collect([(s["kind"], s["data"], s["pe"], s["seed"], record) for s, record in found])
    train_s = {(s["kind"], s["data"], s["pe"], s["seed"]): sum(e.get("epoch_time_s", 0.0) for e in record["epochs"])
               for s, record in found}
    for key, entry in table.items():
        entry["train_s"] = [train_s[(*key[:3], seed)] for seed in sorted(entry["seeds"])]
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
        rows += [(k, v) for k, v in table.items() if k[:3] == (kind, data, pe)]
    if not rows:
        return "_no finished runs_\n"
    train_res = rows[0][1]["train_res"]
    res = args.res
    head = ["model"] + [f"{r}px{' (train)' if r == train_res else ''}" for r in res]
    head += [f"retention {r}px" for r in res if r != train_res] + ["train s", "seeds", "made by"]
    machines = machine_labels(table)
    body = [[row_label(kind, pe, adaptation, n, m), *accuracy_cells(v, res, train_res),
             f"{mean_std(v['train_s'])[0]:.0f}", str(len(v["seeds"])), made_by_cell(v, machines)]
            for (kind, _, pe, adaptation), v in rows]
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
    get = lambda kind, pe, ad="default": table.get((kind, data, pe, ad))
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
    """The marked part: what was trained, the command, wall time and machines (:func:`.parts.provenance_lines`: the
    runs left out and the stale records named), then per data set the table and the verdicts; the same whether the
    runs were made now or the part is rebuilt from their records (``--report-only``)."""
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
             "gap is called beyond the seed spread when |mean_a − mean_b| > std_a + std_b, otherwise within noise. "
             f"{args.jobs} runs side by side, one thread each, each trained and swept.",
             "", *provenance_lines(args, table, runs, command, wall)]
    if args.note:
        lines += [args.note.strip(), ""]
    for data in args.data:
        lines += [f"### {data}", ""]
        source = table.get(("source", data, SOURCE_PE, "default"))
        if source:
            lines += [f"The {SOURCE_PE} source reaches {spread_text(source['acc'][source['train_res']])} % at its "
                      f"training resolution after {n} epochs (chance: {100 / source['num_classes']:.1f} %).", ""]
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


def todo_of(runs: list[dict], states: dict) -> tuple[list[dict], int]:
    """The runs to bring up to date, in ``runs``' order: those without a current record (``states``: run folder ->
    :func:`.benchmark.record_state`), and the source of each such conversion (its weights are what the conversion
    starts from); and how many of those sources have a current record."""
    todo = {spec["run"] for spec in runs if not isinstance(states[spec["run"]], dict)}
    sources = {spec["after"] for spec in runs if spec["run"] in todo and spec["after"] is not None} - todo
    return [spec for spec in runs if spec["run"] in todo | sources], len(sources)


def run(args, command: str) -> int:
    """Train, convert, fine-tune and sweep every run of ``args`` (the parsed ``visionpe convert-benchmark`` command
    line, ``command`` its text) that has no current record, write each one's record, then rewrite the report's part
    from the current records; returns 0."""
    args.config, args.out = recipe_path(args.config).resolve(), args.out.resolve()
    args.doc = (args.doc or args.out / REPORT).resolve()
    args.records = (args.records or default_records(args.doc, PART)).resolve()
    check(args)
    runs = plan(args)
    path = lambda spec: record_path(args.records, args.out, spec["run"])  # noqa: E731
    state = lambda spec: record_state(path(spec), *commands(spec, args), spec["run"])  # noqa: E731
    invocation = args.records / INVOCATION  # the command and wall time of the invocation that ran last
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if not args.report_only:
        states = {spec["run"]: state(spec) for spec in runs}
        todo, again = todo_of(runs, states)
        if len(todo) < len(runs) or again:
            print(f"convert-benchmark: {sum(isinstance(v, dict) for v in states.values())} of {len(runs)} runs have "
                  f"a current record in {args.records}; not run again"
                  + (f" (but {again} source(s), for the weights of a conversion without one)" if again else ""),
                  flush=True)
        log_dir = args.out / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            waits = {}
            for spec in todo:  # sources are submitted first: a conversion only waits for one already started
                waits[spec["run"]] = pool.submit(job, spec, args, waits, log_dir)
            for i, spec in enumerate(todo, 1):
                r = waits[spec["run"]].result()
                if r["ok"] and (r["ran"] or not isinstance(states[spec["run"]], dict)):
                    write_record(path(spec), make_record(spec["run"], identity(spec, args), *commands(spec, args)))
                status = "ok" if r["ok"] else f"FAILED (see {r['log']})"
                print(f"[{i}/{len(todo)}] {time.time() - t0:7.0f}s  {r['run'].relative_to(args.out)}  "
                      f"{r['seconds']:.0f}s  {status}", flush=True)
        write_text(invocation, json.dumps({"command": command, "wall_s": time.time() - t0}) + "\n")
    wall = 0.0
    if invocation.is_file():  # this invocation's, or (--report-only) that of the one that ran last
        made = json.loads(invocation.read_text())
        command, wall = made["command"], made["wall_s"]
    states = {spec["run"]: state(spec) for spec in runs}
    found, args.stale = current_records("convert-benchmark", runs, states, lambda spec: spec["run"], path,
                                        args.records, args.doc)
    args.unfinished = [(spec["kind"], spec["data"], spec["pe"], spec["seed"], spec["run"]) for spec in runs
                       if not isinstance(states[spec["run"]], dict)]
    write_part(args.doc, PART, part(args, collect(found), runs, command, wall))
    print(f"wrote the part '{TITLE[3:]}' of {args.doc} ({len(found)} of {len(runs)} runs with a current record in "
          f"{args.records})")
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
    run.add_argument("--records", type=Path, default=None, metavar="DIR",
                     help=f"folder of the runs' records, one JSON file a run (default: data/<doc's name, lower "
                          f"case>/{PART} beside --doc)")
    run.add_argument("--note", default="", help="free text added to the part (e.g. what shared the machine)")
    run.add_argument("--report-only", action="store_true",
                     help="train nothing, read no run: rebuild the part from the current records alone")
    p.add_debug(run)
    return p


def main(argv) -> int:
    """``visionpe convert-benchmark ARGV``: returns 0; a user mistake is a :class:`~visionpe.cli.UserError`."""
    args = build_parser().parse_args(argv)
    return run(args, "visionpe convert-benchmark " + shlex.join(argv))
