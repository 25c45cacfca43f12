#!/usr/bin/env python
"""The main job, short (`make demo`, a few minutes on 2 CPU cores, no download):

1. train a tiny ViT on the built-in `shapes-relation` task at 32 px, once with a learned absolute table
   (`learned`) and once with mixed RoPE (`rope_mixed`), side by side (one process and one core each);
2. test both at 24, 32, 48 and 64 px on the same scenes re-rendered natively, RoPE with and without
   position interpolation (`--scaling none pi`);
3. print the resolution table and write the plot to runs/demo/sweep.png (CSV next to it).

The same by hand:
    python train_vit.py --config configs/shapes_tiny.yaml --data shapes-relation --pe rope_mixed --output runs/demo/rope_mixed
    python scripts/resolution_sweep.py runs/demo/* --res 24 32 48 64 --scaling none pi --out runs/demo
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("MPLBACKEND", "Agg")

OUT = ROOT / "runs" / "demo"
ENCODINGS = ["learned", "rope_mixed"]
RECIPE = ["--config", str(ROOT / "configs" / "shapes_tiny.yaml"), "--data", "shapes-relation", "--epochs", "4",
          "--train-samples", "6000", "--val-samples", "500", "--eval-res", "--threads", "1", "--no-progress",
          "--overwrite"]


def main() -> None:
    t0 = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for pe in ENCODINGS:
        cmd = [sys.executable, str(ROOT / "train_vit.py"), *RECIPE, "--pe", pe, "--output", str(OUT / pe)]
        print("$", " ".join(cmd[1:]).replace(str(ROOT) + "/", ""), flush=True)
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env))
    if any(p.wait() for p in procs):
        sys.exit("demo: a training run failed (see its output above)")

    import resolution_sweep
    rows = resolution_sweep.main([str(OUT / pe) for pe in ENCODINGS] +
                                 ["--res", "24", "32", "48", "64", "--scaling", "none", "pi", "--out", str(OUT)])
    res = sorted({r["res"] for r in rows})
    lines = {}
    for r in rows:
        name = r["pe"] if r["adaptation"] == "default" else f"{r['pe']} [{r['adaptation']}]"
        lines.setdefault(name, {})[r["res"]] = (r["acc"], r["retention"])
    print(f"\nshapes-relation, tiny ViT trained at 32 px: top-1 % (retention = acc / acc at 32 px)")
    print(f"{'encoding':24s}" + "".join(f"{f'{x}px':>16s}" for x in res))
    for name, v in lines.items():
        print(f"{name:24s}" + "".join(f"{v[x][0]:8.1f} ({v[x][1]:4.2f})" for x in res))
    print(f"\nplot: {OUT / 'sweep.png'}   csv: {OUT / 'sweep.csv'}   ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
