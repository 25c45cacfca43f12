#!/usr/bin/env python
"""The main job, short (`make demo`, a few minutes on 2 CPU cores, no download):

1. train a tiny ViT on the built-in `shapes-relation` task at 32 px, once with a learned absolute table
   (`learned`) and once with mixed RoPE (`rope_mixed`), one after the other, each output line labelled;
2. test both at 24, 32, 48 and 64 px on the same scenes re-rendered natively, RoPE with and without
   position interpolation (`--scaling none pi`);
3. print one table with its legend (and a caveat for a row that is under-trained), write the plot to
   runs/demo/sweep.png (CSV next to it), and end with the paths.

The same by hand:
    python train_vit.py --config configs/shapes_tiny.yaml --data shapes-relation --pe rope_mixed \
        --output runs/demo/rope_mixed
    visionpe sweep runs/demo/* --res 24 32 48 64 --scaling none pi --out runs/demo
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from visionpe.cli.report import text_table
from visionpe.train import metrics, rundir, sweep

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "demo"
ENCODINGS = ["learned", "rope_mixed"]
SIZES = [24, 32, 48, 64]
RECIPE = ["--config", str(ROOT / "configs" / "shapes_tiny.yaml"), "--data", "shapes-relation", "--epochs", "4",
          "--train-samples", "6000", "--val-samples", "500", "--eval-res", "--no-progress", "--overwrite"]
BEHIND = 5.0  # top-1 points at the training size below the best row that call for a caveat
LEGEND = [
    "top-1 % on the same validation scenes rendered at each size; (retention) = top-1 / top-1 at the training size",
    "[none]: RoPE as trained, its positions counted in patches at every size (extrapolation beyond the training grid)",
    "[pi]: position interpolation, the positions scaled so that every grid spans the training grid's range",
    "a row without [..]: the encoding's own adaptation (learned: its table resampled bicubic to each grid)",
    "*: in the training lines above, a new best validation top-1",
]


def train(pe: str, out: Path, recipe: list[str]) -> None:
    """``train_vit.py`` with ``--pe pe`` in its own process, every line it prints labelled ``[pe]``; its own
    resolution table (a single column here) is left out: the sweep's table below has every size."""
    cmd = [sys.executable, str(ROOT / "train_vit.py"), *recipe, "--pe", pe, "--output", str(out / pe)]
    print(f"[{pe}] $ python " + " ".join(cmd[1:]).replace(str(ROOT) + "/", ""), flush=True)
    in_table = False
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "MPLBACKEND": "Agg"}) as proc:
        for line in proc.stdout:
            in_table = (in_table or line.startswith("evaluating the ")) and not line.startswith("run ")
            if line.strip() and not in_table:
                print(f"[{pe}] {line.rstrip()}", flush=True)
    if proc.returncode:
        sys.exit(f"demo: training {pe} failed (exit status {proc.returncode}, its output above)")


def row_name(row: dict) -> str:
    return row["pe"] if row["adaptation"] == "default" else f"{row['pe']} [{row['adaptation']}]"


def caveats(rows: list[dict], runs: dict[str, Path]) -> list[str]:
    """A line for each encoding whose top-1 at the training size is more than :data:`BEHIND` points below the best
    one's: its retention compares a less trained model; says whether its validation top-1 still rose at the end."""
    at_train = {r["pe"]: r["acc"] for r in rows if r["res"] == r["train_res"] and r["adaptation"] in ("default", "none")}
    best = max(at_train, key=at_train.get)
    notes = []
    for pe, acc in at_train.items():
        if at_train[best] - acc <= BEHIND:
            continue
        history = metrics.epochs(metrics.read_history(runs[pe]))
        rising = len(history) > 1 and history[-1]["val_acc"] > max(h["val_acc"] for h in history[:-1])
        epochs = f"{len(history)} epoch{'s' if len(history) != 1 else ''}"
        notes.append(f"caveat: {pe} reaches {acc:.1f}% at its training size, {at_train[best] - acc:.1f} points below "
                     f"{best}, after {epochs}" + (" (its validation top-1 still rose in the last one)" if rising else "")
                     + ": it is likely under-trained, so its retention compares a weaker model (more --epochs)")
    return notes


def main(out: Path = OUT, recipe: list[str] = RECIPE) -> None:
    t0 = time.time()
    for pe in ENCODINGS:
        train(pe, out, recipe)
    runs = {pe: out / pe for pe in ENCODINGS}
    print(f"testing both at {' '.join(map(str, SIZES))} px ...", flush=True)
    rows = sweep.sweep_runs(list(runs.values()), SIZES, scalings=("none", "pi"), log=lambda *_: None)
    sweep.write_csv(rows, out / "sweep.csv")
    train_res = rows[0]["train_res"]
    title = f"shapes-relation, tiny ViT trained at {train_res} px: {' vs '.join(ENCODINGS)}"
    sweep.plot(rows, out / "sweep.png", title=title)
    res = sorted({r["res"] for r in rows})
    cells = {}
    for r in rows:
        cells.setdefault(row_name(r), {})[r["res"]] = f"{r['acc']:.1f} ({r['retention']:.2f})"
    print(f"\n{title}")
    header = ["encoding", *(f"{x}px{' (train)' if x == train_res else ''}" for x in res)]
    print(text_table([[name, *(v[x] for x in res)] for name, v in cells.items()], header))
    print("\n".join(["", *LEGEND, *caveats(rows, runs)]))
    print(f"\nruns: {'  '.join(str(p) for p in runs.values())}   (each: {rundir.RESULTS}, {rundir.METRICS}, weights)")
    print(f"plot: {out / 'sweep.png'}   csv: {out / 'sweep.csv'}   ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
