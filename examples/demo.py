#!/usr/bin/env python
"""The main job, short (`make demo`, a few minutes on 2 CPU cores, no download):

1. train a tiny ViT on the built-in `shapes-relation` task at 32 px, once with a learned absolute table
   (`learned`) and once with mixed RoPE (`rope_mixed`), one after the other, each output line labelled;
2. test both at 24, 32, 48 and 64 px on the same scenes re-rendered natively, RoPE with and without
   position interpolation (`--scaling none pi`);
3. print the resolution table and write the plot to runs/demo/sweep.png (CSV next to it).

The same by hand:
    python train_vit.py --config configs/shapes_tiny.yaml --data shapes-relation --pe rope_mixed \
        --output runs/demo/rope_mixed
    python scripts/resolution_sweep.py runs/demo/* --res 24 32 48 64 --scaling none pi --out runs/demo
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from visionpe.cli.report import text_table
from visionpe.train import sweep

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "demo"
ENCODINGS = ["learned", "rope_mixed"]
RECIPE = ["--config", str(ROOT / "configs" / "shapes_tiny.yaml"), "--data", "shapes-relation", "--epochs", "4",
          "--train-samples", "6000", "--val-samples", "500", "--eval-res", "--no-progress", "--overwrite"]


def train(pe: str) -> None:
    """``train_vit.py`` with ``--pe pe`` in its own process, every line it prints labelled ``[pe]``."""
    cmd = [sys.executable, str(ROOT / "train_vit.py"), *RECIPE, "--pe", pe, "--output", str(OUT / pe)]
    print(f"[{pe}] $ python " + " ".join(cmd[1:]).replace(str(ROOT) + "/", ""), flush=True)
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "MPLBACKEND": "Agg"}) as proc:
        for line in proc.stdout:
            if line.strip():
                print(f"[{pe}] {line.rstrip()}", flush=True)
    if proc.returncode:
        sys.exit(f"demo: training {pe} failed (exit status {proc.returncode}, its output above)")


def main() -> None:
    t0 = time.time()
    for pe in ENCODINGS:
        train(pe)
    rows = sweep.sweep_runs([OUT / pe for pe in ENCODINGS], [24, 32, 48, 64], scalings=("none", "pi"), out=OUT,
                            log=lambda *_: None)
    res = sorted({r["res"] for r in rows})
    cells = {}
    for r in rows:
        name = r["pe"] if r["adaptation"] == "default" else f"{r['pe']} [{r['adaptation']}]"
        cells.setdefault(name, {})[r["res"]] = f"{r['acc']:.1f} ({r['retention']:.2f})"
    print("\nshapes-relation, tiny ViT trained at 32 px: top-1 % (retention = acc / acc at 32 px)")
    header = ["encoding", *(f"{x}px" for x in res)]
    print(text_table([[name, *(v[x] for x in res)] for name, v in cells.items()], header))
    print(f"\nplot: {OUT / 'sweep.png'}   csv: {OUT / 'sweep.csv'}   ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
