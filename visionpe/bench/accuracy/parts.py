"""The accuracy benchmark's report: its tables (mean ± std over seeds at every test size, then retention; rows that
did not learn marked), LookHere's tuned and untuned rows side by side, its figures
(:func:`visionpe.cli.report.accuracy_plot`), its CSV of every cell and its documents: the whole report, or a marked
part of it (the video benchmark's, a rows file's), the rest of the document left as it is."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import shlex
from collections import Counter
from pathlib import Path

from ...cli.recipes import shown
from ...cli.report import Curve, accuracy_plot, mean_std, spread_text, write_document, write_part
from ...cli.report import markdown_table as report_table
from ...data import info
from ...train.metrics import key_text
from ...weights import write_text
from .collect import label, tune_label, tune_of
from .rows import recipe_of
from .verdicts import (LEARNED_MARGIN, PLATEAU_MARGIN, chance, compare_verdict, not_learned, pick_verdict,
                       rising, rows_verdict, tune_verdict, verdict, video_verdict)

VIDEO_PART = "video_benchmark"
TABLE_CSV = "table.csv"  # in --out: every cell of the report
NOT_LEARNED = "*not learned*"
RISING = "*still rising*"


def unfinished_note(args) -> str:
    """The report's statement of the planned runs it leaves out (no current record: not run yet, failed, or a stale
    record), and of each stale record with what changed since it was made, or nothing."""
    missing = getattr(args, "unfinished", [])
    if not missing:
        return ""
    listed = ", ".join(f"`{r[4].relative_to(args.out)}`" for r in missing[:10])
    text = (f" **{len(missing)} planned run(s) have no current record and are left out of the tables:** {listed}"
            + (" ..." if len(missing) > 10 else "") + ".")
    stale = getattr(args, "stale", [])
    if stale:
        text += (f" **{len(stale)} of them have a stale record** (made with other settings than asked for now; never "
                 "mixed in): " + "; ".join(f"`{records_text(args, path)}` ({', '.join(reasons)})"
                                           for path, reasons in stale[:10]) + (" ..." if len(stale) > 10 else "") + ".")
    return text


def records_text(args, path: Path) -> str:
    """A records path as a report shows it: relative to the doc's folder (the same on every machine)."""
    return Path(os.path.relpath(path, args.doc.parent)).as_posix()


def machine_labels(table: dict) -> dict:
    """{machine (:func:`.records.machine_of`): ``M1``, ``M2``, ...} in the order the table's runs name them."""
    found = [m for v in table.values() for seed in sorted(v.get("made_by", {})) for m in v["made_by"][seed] if m]
    return {m: f"M{i}" for i, m in enumerate(dict.fromkeys(found), 1)}


def made_by_cell(entry: dict, labels: dict) -> str:
    """Which machine made a row's runs: ``M1`` (every seed), ``M1/M2`` (trained on M1, swept on M2), per seed when
    they differ (``s0 M1, s1 M2``); ``?`` for a step no record names."""
    per_seed = {seed: "/".join(dict.fromkeys(labels.get(m, "?") for m in pair))
                for seed, pair in sorted(entry.get("made_by", {}).items())}
    if len(set(per_seed.values())) <= 1:
        return next(iter(per_seed.values()), "?")
    return ", ".join(f"s{seed} {text}" for seed, text in per_seed.items())


def provenance_lines(args, table: dict, runs, command: str, wall: float) -> list[str]:
    """Who made the report's numbers: the command and wall time of the invocation that ran last, the runs left out
    (:func:`unfinished_note`), and the machines that made the runs (:func:`machines_table`); the same whether the
    invocation ran the runs or rebuilt the report from their records (``--report-only``), so that a committed report
    is its records' rebuild byte for byte."""
    lines = ["```", command, "```", "",
             f"Wall time of the invocation that ran last: {wall / 60:.1f} min ({len(runs)} runs planned)."
             + unfinished_note(args), ""]
    pairs = [pair for v in table.values() for pair in v.get("made_by", {}).values()]
    if not pairs:  # a table made without records
        return lines
    records = getattr(args, "records", None)
    where = f" (`{records_text(args, records)}`)" if records else ""
    unknown = "; `?`: a step whose machine no record names, a run made before records were" if any(
        None in pair for pair in pairs) else ""
    return lines + [f"Made by, from the runs' records{where}: the `made by` column of each table names the machine of "
                    f"its row's runs (`M1/M2`: trained on M1, swept on M2{unknown}). Compute: the training and sweep "
                    "wall time of those runs.", "", *machines_table(table)]


def machines_table(table: dict) -> list[str]:
    """The machines that made a table's runs (:func:`machine_labels`), one line each: device, platform, versions,
    the runs it trained or swept and their compute; nothing when no record names one."""
    labels = machine_labels(table)
    made = {}  # machine label: {(family, data, row, seed): seconds}
    for (family, data, pe, _), v in table.items():
        for seed, pair in v.get("made_by", {}).items():
            for m in filter(None, dict.fromkeys(pair)):
                made.setdefault(labels[m], {})[family, data, pe, seed] = v.get("wall_s", {}).get(seed, 0.0)
    if not labels:
        return []
    keys = ("device", "platform", "python", "torch", "timm", "visionpe")
    body = [[label, *(json.loads(m)[k] for k in keys), str(len(made[label])),
             f"{sum(made[label].values()) / 60:.1f} min"] for m, label in labels.items()]
    return [report_table(["machine", *keys, "runs", "compute"], body), ""]


def accuracy_cells(entry: dict, res, train_res: int) -> list[str]:
    """``mean ± std`` of top-1 at every resolution, then of the retention at every other resolution over the seeds
    where it is defined (``n/a`` where it is for none: every seed's training-size accuracy was 0)."""
    cells = [spread_text(entry["acc"].get(r, [])) for r in res]
    for r in (r for r in res if r != train_res):
        values = entry["ret"].get(r, [])  # None: undefined for that seed, left out of the mean (mean_std)
        undefined = bool(values) and all(v is None for v in values)
        cells.append("n/a" if undefined else spread_text(values, 3))
    return cells


def entries_of(table: dict, family: str, data: str, tuned: bool = False) -> list:
    """``[(key, entry)]`` of one family and data set: the adaptations, or (``tuned``) LookHere's untuned and tuned
    rows."""
    return [(k, v) for k, v in table.items() if k[:2] == (family, data) and bool(tune_of(k[3])) == tuned]


def learned_note(rows: list, data: str) -> str:
    """The line under a table that explains its *not learned* marks, or nothing when no row has one."""
    if not any(not_learned(v, data) for _, v in rows):
        return ""
    return (f"{NOT_LEARNED}: top-1 at the training size below chance ({chance(rows[0][1], data):.1f} %) + "
            f"{LEARNED_MARGIN:.0f} points; the row is left out of the verdicts.\n")


def mark_not_learned(cells: list[str], entry: dict, data: str, res: list) -> list[str]:
    """The row's accuracy cells (one per size of ``res``, then any others), the training size's marked when the row
    did not learn."""
    if entry["train_res"] in res and not_learned(entry, data):
        at = res.index(entry["train_res"])
        cells = [*cells[:at], f"{cells[at]} {NOT_LEARNED}", *cells[at + 1:]]
    return cells


PLATEAU_TEXT = (f"`last two epochs`: validation top-1 at the training size after the run's last two epochs (mean over "
                f"the seeds), whether the budget reached a plateau; {RISING}: it rose by more than "
                f"{PLATEAU_MARGIN:.0f} point over the last epoch.\n")


def last_two_cell(entry: dict) -> str:
    """The validation top-1 after the last two epochs, mean over the seeds (``84.1 → 85.0``), marked when it still
    rose by more than :data:`PLATEAU_MARGIN` points; ``n/a`` for runs of one epoch."""
    if not entry.get("last_two"):
        return "n/a"
    before, last = (mean_std([pair[i] for pair in entry["last_two"]])[0] for i in (0, 1))
    return f"{before:.1f} → {last:.1f}" + (f" {RISING}" if rising(entry) else "")


def markdown_table(table: dict, family: str, data: str, res: list[int]) -> str:
    rows = entries_of(table, family, data)
    if not rows:
        return "_no finished runs_\n"
    train_res = rows[0][1]["train_res"]
    head = ["encoding"] + [f"{key_text(r)}px{' (train)' if r == train_res else ''}" for r in res]
    head += [f"retention {key_text(r)}px" for r in res if r != train_res]
    head += ["last two epochs", "params", "train img/s", "seeds", "made by"]
    labels = machine_labels(table)
    body = [[label(pe, adaptation), *mark_not_learned(accuracy_cells(v, res, train_res), v, data, res),
             last_two_cell(v), f"{v['params'] / 1e3:.1f}k", f"{mean_std(v['img_s'])[0]:.0f}", str(len(v["seeds"])),
             made_by_cell(v, labels)] for (_, _, pe, adaptation), v in rows]
    notes = [learned_note(rows, data), PLATEAU_TEXT]
    return report_table(head, body) + "\n" + "".join(f"\n{note}" for note in notes if note)


def choice_text(values: list[str]) -> str:
    """The knob values the seeds chose at one size, most chosen first: ``x4 3/3``, ``x4 2/3, x2 1/3``."""
    counts = Counter(values)
    return ", ".join(f"{v} {n}/{len(values)}" for v, n in counts.most_common())


def tune_table(table: dict, family: str, data: str, res: list) -> str:
    """LookHere's protocol side by side: per row, untuned (the run's own settings, labelled as the row) then tuned
    (``[tuned]``: each size's cell with the knob values its seeds chose there), top-1 mean ± std over seeds."""
    rows = entries_of(table, family, data, tuned=True)
    if not rows:
        return "_no tuned rows (the sweeps were made without --tune)_\n"
    train_res = rows[0][1]["train_res"]
    head = ["row", "knob"] + [f"{key_text(r)}px{' (train)' if r == train_res else ''}" for r in res]
    head += ["seeds", "made by"]
    labels = machine_labels(table)
    order = list(dict.fromkeys(k[2] for k, _ in rows))  # the rows as trained; per protocol, untuned then tuned
    body = []
    for (_, _, pe, adaptation), v in sorted(rows, key=lambda kv: (order.index(kv[0][2]), kv[0][3].partition("/")[2],
                                                                  tune_of(kv[0][3]) == "tuned")):
        tuned, knob = tune_of(adaptation) == "tuned", v.get("knob", "")
        cells = [spread_text(v["acc"].get(r, [])) for r in res]
        if tuned:
            cells = [f"{c} ({choice_text(v['choice'][r])})" if knob and v.get("choice", {}).get(r) else c
                     for c, r in zip(cells, res)]
        body.append([tune_label(pe, adaptation), (f"{knob} (tuned)" if tuned else f"{knob} (trained)") if knob
                     else "none", *mark_not_learned(cells, v, data, res), str(len(v["seeds"])),
                     made_by_cell(v, labels)])
    note = learned_note(rows, data)
    return report_table(head, body) + "\n" + (f"\n{note}" if note else "")


def plot(table: dict, family: str, data: str, res: list, path: Path, tuned: bool = False) -> bool:
    """The figure of one family and data set: a curve per encoding (or row) and adaptation (``tuned``: LookHere's
    untuned and tuned rows), top-1 and retention, at most 8 curves a panel."""
    rows = entries_of(table, family, data, tuned)
    name = tune_label if tuned else label
    curves = [Curve(name(pe, adaptation), {r: v["acc"][r] for r in res if v["acc"].get(r)},
                    {r: v["ret"][r] for r in res if v["ret"].get(r)}, group=pe,
                    style=("pi" if tune_of(adaptation) == "tuned" else "none") if tuned else adaptation)
              for (_, _, pe, adaptation), v in rows]
    what = "untuned (solid) and tuned (dashed)" if tuned else "mean ± std over seeds"
    return accuracy_plot(curves, path, train_sizes=[rows[0][1]["train_res"]] if rows else [],
                         title=f"{data} ({family}): {what}")


def tune_part(table: dict, family: str, data: str, res: list, png: Path, heading: str) -> list[str]:
    """The lines of LookHere's protocol for one family and data set: ``heading`` (e.g. ``### shapes-position``) with
    the protocol's name, plot, side-by-side table, verdict."""
    lines = [f"{heading}: LookHere's protocol (untuned and tuned)", ""]
    if plot(table, family, data, res, png, tuned=True):
        lines += [f"![{data} tuned]({png.name})", ""]
    return lines + [tune_table(table, family, data, res), "Verdict (generated):", "",
                    tune_verdict(table, family, data, res)]


TUNE_TEXT = ("LookHere's protocol (`--tune`, Fuller et al. 2024): each row untuned (labelled as the row: the run's "
             "own settings, RoPE with the scaling it trained with, not the swept `--scaling` values) and tuned "
             "(`[tuned]`: the encoding's declared knob, e.g. axial RoPE's `theta`, RoPE-Mixed's `scaling`, ALiBi's "
             "`slope_scale`, the learned table's `interpolation`, chosen per test size on held-out training images "
             "that no run trained on, never on the validation set). A tuned cell says which value its seeds chose "
             "(`x4 3/3`: 3 of 3 seeds chose 4x the trained value).")


PICK_TEXT = ("Generated: at each test size, the learned row (any swept adaptation, or tuned) of the best mean top-1, "
             "and the rows within its seed spread, which a user can pick as well.")


def write_csv(path: Path, table: dict) -> None:
    """Every cell of the report as CSV: one line per (family, data, row, adaptation, size) with the mean and std
    over seeds, the per-seed values, the knob and the values the seeds chose (tuned rows), and whether the row
    learned."""
    buffer = io.StringIO(newline="")
    w = csv.writer(buffer, lineterminator="\n")
    w.writerow(["family", "data", "row", "adaptation", "size", "train_size", "acc_mean", "acc_std", "acc_seeds",
                "retention_mean", "seeds", "knob", "knob_chosen", "learned"])
    for (family, data, pe, adaptation), v in table.items():
        for r, values in v["acc"].items():
            mean, std = mean_std(values)
            ret = mean_std(v["ret"].get(r, []))[0]
            w.writerow([family, data, pe, adaptation, key_text(r), key_text(v["train_res"]), f"{mean:.4f}",
                        f"{std:.4f}", " ".join(f"{a:g}" for a in values), "" if math.isnan(ret) else f"{ret:.5f}",
                        len(v["seeds"]), v.get("knob", ""), " ".join(v.get("choice", {}).get(r, [])),
                        int(not not_learned(v, data))])
    write_text(path, buffer.getvalue())


def video_table(table: dict, data: str, cols: list) -> str:
    """Top-1 mean ± std per encoding (and adaptation) at every (frames, res) cell of a video benchmark."""
    rows = [(k, v) for k, v in table.items() if k[1] == data]
    if not rows:
        return "_no finished runs_\n"
    train = rows[0][1]["train_res"]
    head = ["encoding"] + [f"{f}f {r}px{' (train)' if (f, r) == train else ''}" for f, r in cols]
    head += ["params", "train clips/s", "seeds", "made by"]
    labels = machine_labels(table)
    body = [[label(pe, adaptation), *[spread_text(v["acc"].get(c, [])) for c in cols],
             f"{v['params'] / 1e3:.1f}k", f"{mean_std(v['img_s'])[0]:.0f}", str(len(v["seeds"])),
             made_by_cell(v, labels)] for (_, _, pe, adaptation), v in rows]
    return report_table(head, body) + "\n"


def has_tune(args, table: dict) -> bool:
    """The report has LookHere's part: asked for (``--tune``), or its rows are in the sweeps (``--report-only``)."""
    return getattr(args, "tune", False) or any(tune_of(k[3]) for k in table)


def write_video_part(path: Path, args, table, runs, command: str, wall: float, configs: dict, cols, *,
                     part: str = VIDEO_PART) -> None:
    """The video benchmark's own marked part ``part`` of the doc (replaced, or appended); the rest is left as it is.
    A part other than the default names itself in its heading, so that two video parts of one doc have two."""
    cfg_path = configs["vit"]
    named = "" if part == VIDEO_PART else f" (`{part}`)"
    lines = [f"<!-- BEGIN {part} -->", "## Video: positional encodings under frame-count and resolution "
             f"change{named}", "",
             "Generated by `visionpe benchmark` with a video recipe (numbers are measured, not edited). Tubelet "
             "video ViTs (`visionpe.create_video_model`) are trained on clips of one frame count and size and tested "
             "at others: the built-in task renders the same clip duration at every frame count (more frames = a "
             "higher frame rate) and size. Cells are top-1 % (mean ± std over seeds) on the validation split. RoPE "
             "rows show each adaptation on the same weights (`none` extrapolates integer positions, `pi` interpolates "
             "to the training token grid, per axis, time included); `learned` tables are resampled to the new "
             "(T, H, W) grid. `train clips/s` is per process (1 thread, "
             f"{args.jobs} processes side by side).", "",
             *provenance_lines(args, table, runs, command, wall),
             f"Recipe `{shown(cfg_path)}`"
             + (f" with `{shlex.join(args.extra)}`" if args.extra else "") + ":", "",
             "```yaml", cfg_path.read_text().strip(), "```", ""]
    if args.note:
        lines += [args.note.strip(), ""]
    for data in args.data:
        lines += [f"### {data}", "", video_table(table, data, cols), "Verdict (generated):", "",
                  video_verdict(table, data, cols, 100.0 / info(data)["num_classes"])]
    write_part(path, part, "\n".join(lines).rstrip("\n") + f"\n<!-- END {part} -->\n")


def recipe_lines(args, spec: dict) -> list[str]:
    """The recipes of a rows part, each once with the data sets it trains (a rows file's ``recipes``, else
    ``--config``) and its YAML."""
    used = {}
    for data in args.data:
        used.setdefault(recipe_of(spec, data, args.config.resolve()), []).append(data)
    lines = []
    for cfg_path, sets in used.items():
        lines += [f"Recipe `{shown(cfg_path)}` ({', '.join(sets)})"
                  + (f" with `{shlex.join(args.extra)}`" if args.extra else "") + ":", "",
                  "```yaml", cfg_path.read_text().strip(), "```", ""]
    return lines


def write_rows_part(path: Path, args, spec: dict, table: dict, runs, command: str, wall: float) -> None:
    """The rows benchmark's marked part of ``path`` (``<!-- BEGIN part -->``); the rest is left as it is."""
    name = spec["part"]
    lines = [f"<!-- BEGIN {name} -->", f"## {spec['title']}", "",
             "Generated by `visionpe benchmark --rows` (numbers are measured, not edited). Every row is trained "
             "with the recipe below and its own `visionpe train` arguments; rows marked *timm* are timm's own "
             "models (`--pe timm_unpatched`: the model exactly as timm builds it, its position encoding included, run at new "
             "sizes the way timm does it). Cells are top-1 % (mean ± std over seeds) on the validation split; "
             "`HxW` columns are non-square test sizes (height x width). A gap is *beyond* the seed spread when "
             "|mean_a - mean_b| > std_a + std_b.", "", *provenance_lines(args, table, runs, command, wall),
             *recipe_lines(args, spec), "Rows:", "",
             "| row | visionpe train arguments | swept adaptations | evaluation protocols | data sets |",
             "|---|---|---|---|---|"]
    own = "the run's own"
    lines += [f"| {r['label']}{' *(timm)*' if r['timm'] else ''} | `{shlex.join(r['train'])}` | "
              f"{', '.join(r['scaling'])} | {', '.join(r['protocol']) or own} | {', '.join(r['data']) or 'all'} |"
              for r in spec["rows"]]
    lines += ["", "A row label `[crop]` or `[native]` (or `[pi/crop]`) is that protocol of evaluation; unmarked rows "
              "are evaluated with the run's own protocol (`resize` unless the row says otherwise).", ""]
    if has_tune(args, table):
        lines += [TUNE_TEXT, ""]
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
        if has_tune(args, table):
            lines += tune_part(table, "rows", data, args.res, png.with_name(f"{png.stem}_tuned.png"),
                               f"#### {data}")
        lines += [f"#### {data}: the row to pick at each size", "", PICK_TEXT, "",
                  pick_verdict(table, "rows", data, args.res)]
    write_part(path, name, "\n".join(lines).rstrip("\n") + f"\n<!-- END {name} -->\n")


def write_report(path: Path, args, table, runs, command: str, wall: float, configs: dict) -> None:
    lines = ["# Benchmark: positional encodings under resolution change", "",
             "Generated by `visionpe benchmark` (numbers are measured, not edited). Every encoding is trained with",
             "the identical recipe; only `--pe` changes. Each model is trained at one resolution and tested at",
             "several: built-in tasks are re-rendered natively (same scene, more pixels), Fashion-MNIST is resized",
             "with antialiasing. Cells are top-1 % (mean ± std over seeds) on the validation split; retention is",
             "acc(res) / acc(train res) per seed, then averaged. RoPE rows show each resolution adaptation",
             "(`none` = extrapolate integer positions, `pi` = position interpolation to the training grid, `ntk`,",
             "`yarn`), evaluated on the same trained weights. `train img/s` is per process (1 thread, "
             f"{args.jobs} processes side by side on a shared machine), so treat it as a rough cost ratio.", "",
             "## Command", "", *provenance_lines(args, table, runs, command, wall)]
    for family, cfg_path in configs.items():
        lines += [f"## Recipe ({family}): `{shown(cfg_path)}`",
                  "", "```yaml", cfg_path.read_text().strip(), "```", ""]
    if has_tune(args, table):
        lines += [TUNE_TEXT, ""]
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
            if has_tune(args, table):
                lines += tune_part(table, family, data, args.res, png.with_name(f"{png.stem}_tuned.png"),
                                   f"### {data} — {family}")
    write_document(path, "\n".join(lines))  # parts other commands wrote into the doc are kept
