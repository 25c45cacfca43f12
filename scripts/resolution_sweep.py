#!/usr/bin/env python
"""Evaluate trained runs at several resolutions, with each encoding's resolution adaptation.

    python scripts/resolution_sweep.py runs/A runs/B --res 24 32 48 64 --scaling none pi ntk yarn --out runs/sweep

For every run directory (as written by train_vit.py) the model is rebuilt from its config.yaml once per
adaptation and the weights loaded (strictly: adaptations change no parameter):

- RoPE (``rope_axial``, ``rope_mixed``, and combinations holding them): one model per ``--scaling``
  (``none`` extrapolates, ``pi``/``ntk``/``yarn`` scale relative to ``ref_shape`` = the training grid);
- ``learned`` (and combinations): one model per ``--interpolation`` (table resampling mode, default bicubic);
- every other encoding: as trained (``default``).

The validation images are the run's own (synthetic tasks re-rendered natively at each size, real images
resized with antialiasing). Writes ``OUT/sweep.csv`` (one row per run x adaptation x resolution, with
top-1 and retention = acc(res) / acc(train res)) and ``OUT/sweep.png`` (accuracy vs resolution, one line per
run and adaptation), and prints the table. Errors in the arguments exit with status 2 and one line.
"""
from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_vit  # noqa: E402
from visionpe.backbones import parse_pe  # noqa: E402
from visionpe.rotary.scaling import SCALINGS  # noqa: E402

INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "area")
FIELDS = ["run", "data", "model", "pe", "seed", "train_res", "adaptation", "weights", "res", "acc", "loss",
          "retention"]


def adaptations(pe: str, scalings, interpolations) -> list[tuple[str, dict]]:
    """``[(label, pe_kwargs overrides)]`` for one encoding: RoPE scalings x learned interpolations."""
    names = parse_pe(pe)
    rope = names.get("rotary") in ("rope_axial", "rope_mixed")
    learned = names.get("tokens") == "learned"
    out = [("", {})]
    if rope:
        out = [(f"{label}{'/' if label else ''}{s}", {**kw, "scaling": s}) for label, kw in out for s in scalings]
    if learned and interpolations:
        out = [(f"{label}{'/' if label else ''}{m}", {**kw, "interpolation": m})
               for label, kw in out for m in interpolations]
    return [(label or "default", kw) for label, kw in out]


def load_run(run: Path) -> dict:
    path = run / "config.yaml"
    if not path.is_file():
        raise train_vit.UserError(f"{str(run)!r} is not a run directory (no config.yaml)")
    with open(path) as f:
        cfg = yaml.safe_load(f)
    cfg = train_vit.resolve({"output": str(run)}, base=cfg)
    cfg.update(threads=0, workers=0)
    return cfg


def sweep_run(run: Path, resolutions, scalings=("none",), interpolations=(), weights="last", val_samples=None,
              device="cpu", batch_size=256, log=print) -> list[dict]:
    """Rows of the sweep for one run directory."""
    cfg = load_run(run)
    if val_samples is not None:
        cfg["val_samples"] = val_samples
    cfg["eval_batch_size"] = batch_size
    wpath = run / f"{weights}.safetensors"
    if not wpath.is_file():
        raise train_vit.UserError(f"{str(wpath)!r} does not exist (train the run first)")
    state = load_file(wpath)
    device = torch.device(device)
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    sets = {r: train_vit.build_data(cfg, "val", r) for r in sorted(set(resolutions) | {cfg["img_size"]})}
    rows, at_train = [], None
    for label, kw in adaptations(cfg["pe"], scalings, interpolations):
        model = train_vit.build_model({**cfg, "pe_kwargs": {**cfg["pe_kwargs"], **kw}})
        model.load_state_dict(state)
        model.to(device)
        # at the training grid every adaptation is the identity (scale 1), so that size is evaluated once
        accs = {r: (at_train if r == cfg["img_size"] and at_train is not None else
                    train_vit.evaluate(model, ds, cfg, device, autocast, 0, 1)) for r, ds in sets.items()}
        at_train = accs[cfg["img_size"]]
        base = accs[cfg["img_size"]][0]
        for r in sorted(resolutions):
            acc, loss = accs[r]
            rows.append({"run": str(run), "data": cfg["data"], "model": cfg["model"], "pe": cfg["pe"],
                         "seed": cfg["seed"], "train_res": cfg["img_size"], "adaptation": label, "weights": weights,
                         "res": r, "acc": round(acc, 4), "loss": round(loss, 8),
                         "retention": round(acc / base, 5) if base > 0 else 0.0})
        log(f"{run.name:40s} {label:16s} " + "  ".join(f"{r}px {accs[r][0]:6.2f}" for r in sorted(resolutions)))
    return rows


def write_csv(rows, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def plot(rows, path: Path, title: str = "") -> None:
    """Accuracy vs resolution, one line per (run, adaptation); a dotted line marks the training size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lines = {}
    for r in rows:
        lines.setdefault((Path(r["run"]).name, r["adaptation"]), []).append((r["res"], r["acc"]))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for (run, label), pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label=run if label == "default" else f"{run} [{label}]")
    for res in {r["train_res"] for r in rows}:
        ax.axvline(res, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("test resolution (px)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(title or "accuracy vs test resolution")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    p = train_vit.OneLineParser(prog="resolution_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories written by train_vit.py")
    p.add_argument("--res", nargs="+", type=int, required=True, help="test resolutions (px)")
    p.add_argument("--scaling", nargs="+", default=["none"], help=f"RoPE adaptations: {' '.join(SCALINGS)}")
    p.add_argument("--interpolation", nargs="*", default=[],
                   help=f"learned-table resampling modes to compare: {' '.join(INTERPOLATIONS)}")
    p.add_argument("--weights", default="last", choices=["last", "best"])
    p.add_argument("--val-samples", type=int, default=None, help="validation images (default: the run's)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=Path("runs/sweep"), help="folder for sweep.csv and sweep.png")
    args = p.parse_args(argv)
    for s in args.scaling:
        if s not in SCALINGS:
            raise train_vit.UserError(f"unknown scaling {s!r}; choose from {', '.join(SCALINGS)}")
    for m in args.interpolation:
        if m not in INTERPOLATIONS:
            raise train_vit.UserError(f"unknown interpolation {m!r}; choose from {', '.join(INTERPOLATIONS)}")
    rows = []
    for run in args.runs:
        cfg = load_run(run)
        for r in args.res:
            if r < cfg["patch_size"] or r % cfg["patch_size"]:
                raise train_vit.UserError(f"resolution {r} is not a multiple of {run}'s patch_size {cfg['patch_size']}")
        rows += sweep_run(run, args.res, args.scaling, args.interpolation, args.weights, args.val_samples,
                          args.device, args.batch_size)
    write_csv(rows, args.out / "sweep.csv")
    plot(rows, args.out / "sweep.png")
    print(f"wrote {args.out / 'sweep.csv'} and {args.out / 'sweep.png'}")
    return rows


def cli(argv=None) -> None:
    try:
        main(argv)
    except train_vit.UserError as err:
        print(f"resolution_sweep: error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
