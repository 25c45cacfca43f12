"""The resolution sweep: trained runs evaluated at several resolutions, with each encoding's resolution adaptation
(``scripts/resolution_sweep.py`` is its command line).

    python scripts/resolution_sweep.py runs/A runs/B --res 24 32 48 64 --scaling none pi ntk yarn --out runs/sweep
    python scripts/resolution_sweep.py runs/A --res 32 32x48 48x32          # non-square sizes: HEIGHTxWIDTH
    python scripts/resolution_sweep.py runs/VIDEO --frames 4 8 16 --res 24 32 48 --scaling none pi   # video runs

For every run directory (as written by train_vit.py) the model is rebuilt from its config.yaml once per
adaptation and the weights loaded (strictly: adaptations change no parameter):

- RoPE (``rope_axial``, ``rope_mixed``, and combinations holding them): one model per ``--scaling``
  (``none`` extrapolates, ``pi``/``ntk``/``yarn`` scale relative to ``ref_shape`` = the training grid);
- ``learned`` (and combinations): one model per ``--interpolation`` (table resampling mode, default bicubic);
- every other encoding: as trained (``default``).

A video run (``num_frames`` in its config) is evaluated at every ``--frames`` x ``--res`` pair (its training
frame count and size always among them): the built-in tasks sample the same clip duration at every frame count
(more frames = a higher frame rate), and the adaptations act on time as on space (``ref_shape`` = the training
token grid ``(T/t, H/p, W/p)``). Rows then carry ``frames`` and ``train_frames``; retention is against the
training pair. ``--frames`` with an image run is an error.

An image run also takes non-square sizes ``HxW`` (height x width, e.g. ``32x48``; ``32x32`` is ``32``): the
synthetic scenes are rendered stretched to that aspect, real images resized to it. Their rows read ``res`` =
``32x48`` in the CSV and are left out of the plot (its x-axis is the side of a square). A video run takes square
sizes only.

The validation images are the run's own, shown at each size under an evaluation protocol (``--eval-protocol``,
default the run's own; several compare them on the same weights): ``resize`` (the whole image at the size; synthetic
tasks re-rendered natively, the same scene with more pixels), ``crop`` (timm's eval transform: shorter side to
size / ``--crop-pct``, centre crop; synthetic tasks rendered at that size and centre-cropped), ``native`` (each image
at its own aspect ratio within the patch budget of the size, visionpe.data.transforms). Writes ``OUT/sweep.csv``
(one row per run x protocol x adaptation x resolution, with top-1 and retention = acc(res) / acc(train res) under
the same protocol) and ``OUT/sweep.png`` (accuracy vs resolution, one line per run, adaptation and protocol), and
prints the table. Errors in the arguments exit with status 2 and one line.
"""
from __future__ import annotations

import csv
import inspect
import io as text_io
from pathlib import Path

import torch

from ..backbones import parse_pe
from ..registry import ENCODINGS
from ..weights import write_text
from . import cli, loop, models, restore, rundir, settings
from .cli import UserError

FIELDS = ["run", "data", "model", "pe", "seed", "train_res", "adaptation", "weights", "res", "acc", "loss",
          "retention", "frames", "train_frames", "protocol"]


def coordinates_of(cls, pe_kwargs: dict) -> str | None:
    """The ``coords`` an encoding class is built with: ``pe_kwargs``'s, else its constructor's default."""
    if "coords" in pe_kwargs:
        return pe_kwargs["coords"]
    parameter = inspect.signature(cls).parameters.get("coords")
    return None if parameter is None else parameter.default


def adaptations(pe: str, scalings, interpolations, pe_kwargs=None) -> list[tuple[str, dict]]:
    """``[(label, pe_kwargs overrides)]`` for one encoding built with ``pe_kwargs``: the rotary encoding's scalings
    (those of ``scalings`` it takes: its class's ``scalings``, e.g. RoPE's none/pi/ntk/yarn, the learned rotations'
    none/pi; none on normalised coordinates, which map every grid onto [-1, 1] already) x learned interpolations."""
    if pe == models.TIMM_NATIVE:  # timm's own model: it adapts to a new size its own way
        return [("default", {})]
    with cli.user_errors("pe"):
        names = parse_pe(pe)
    rotary = ENCODINGS.get(names.get("rotary"))
    swept = [s for s in scalings if s in getattr(rotary, "scalings", ())]
    if rotary is not None and coordinates_of(rotary, pe_kwargs or {}) == "normalized":
        swept = []
    learned = names.get("tokens") == "learned"
    out = [("", {})]
    if swept:
        out = [(f"{label}{'/' if label else ''}{s}", {**kw, "scaling": s}) for label, kw in out for s in swept]
    if learned and interpolations:
        out = [(f"{label}{'/' if label else ''}{m}", {**kw, "interpolation": m})
               for label, kw in out for m in interpolations]
    return [(label or "default", kw) for label, kw in out]


def check_sizes(run: Path, cfg: dict, sizes) -> None:
    """``--res`` fits the run: every side a positive multiple of its patch_size, at most
    :data:`~visionpe.train.settings.MAX_PATCHES` patches, ``HxW`` for image runs only; the rendered scenes and an
    evaluation batch within this machine's memory."""
    video = bool(cfg.get("num_frames"))
    for size in sizes:
        if video and not isinstance(size, int):
            raise UserError(f"--res {loop.key_text(size)}: non-square sizes (HxW) are for image runs; {run} is a "
                            f"video run ({cfg['data']}), give square sizes in pixels")
        sides = (size,) if isinstance(size, int) else size
        if any(s < cfg["patch_size"] or s % cfg["patch_size"] for s in sides):
            raise UserError(f"resolution {loop.key_text(size)} is not a positive multiple of {run}'s patch_size "
                            f"{cfg['patch_size']}" + ("" if isinstance(size, int) else " on each side"))
        settings.check_patches("--res", size, cfg["patch_size"])
    settings.check_memory({**cfg, "eval_res": list(sizes), "train_res": []})  # the rendered scenes, one eval batch


def check_frames(run: Path, cfg: dict, frames) -> None:
    """``--frames`` fits the run: only for a video run, each a positive multiple of its tubelet's frames."""
    if not frames:
        return
    if not cfg.get("num_frames"):
        raise UserError(f"--frames is for video runs; {run} is an image run ({cfg['data']})")
    t = models.tubelet(cfg)[0]
    bad = [f for f in frames if f < 1 or f % t]
    if bad:
        raise UserError(f"--frames {' '.join(map(str, bad))}: not a positive multiple of {run}'s tubelet frames {t}")


def check_protocols(run: Path, cfg: dict, protocols) -> None:
    """``--eval-protocol`` fits the run: video runs take ``resize`` only, ``native`` needs a model that takes mixed
    sizes."""
    for protocol in protocols or ():
        try:
            settings.check_evaluation({**cfg, "eval_protocol": protocol})
        except UserError as err:
            raise UserError(f"--eval-protocol {protocol} for {run}: {err}") from None


def res_cell(key, video: bool) -> int | str:
    """The ``res`` column of a row: the pixels of a square size (an int, as a video key's ``res``), ``"HxW"`` of a
    non-square one."""
    if video:
        return key[1]
    return key if isinstance(key, int) else loop.key_text(key)


def sweep_run(run: Path, resolutions, scalings=("none",), interpolations=(), weights="last", val_samples=None,
              device="cpu", batch_size=256, log=print, frames=(), protocols=None, crop_pct=None) -> list[dict]:
    """Rows of the sweep for one run directory (a video run: at every ``frames`` x ``resolutions`` pair), under each
    of ``protocols`` (default: the run's own) with ``crop_pct`` (default: the run's)."""
    run = Path(run)
    cfg = restore.load_run(run, require=("data",))
    check_frames(run, cfg, frames)
    cfg.update(workers=0, eval_batch_size=batch_size)
    if val_samples is not None:
        cfg["val_samples"] = val_samples
    if crop_pct is not None:
        cfg["crop_pct"] = crop_pct
    check_sizes(run, cfg, resolutions)
    protocols = list(protocols or [settings.eval_protocol(cfg)])
    check_protocols(run, cfg, protocols)
    rows = []
    for protocol in protocols:
        rows += _sweep_protocol(run, cfg, protocol, resolutions, scalings, interpolations, weights, device,
                                batch_size, log, frames)
    return rows


def _sweep_protocol(run: Path, cfg: dict, protocol: str, resolutions, scalings, interpolations, weights, device,
                    batch_size, log, frames) -> list[dict]:
    """The rows of one run under one protocol: every adaptation at every size."""
    path = rundir.weights_file(run, weights)
    state = rundir.read_weights(path)
    device = torch.device(device)
    eval_kw = dict(batch_size=batch_size, device=device,
                   autocast=loop.autocast_for(device, loop.amp_dtype("auto", device)))
    video = bool(cfg.get("num_frames"))
    keys, train_key = loop.eval_grid(cfg, resolutions, frames)
    sets = {k: loop.dataset(cfg, "val", k[1], k[0], protocol=protocol) if video else
            loop.dataset(cfg, "val", k, protocol=protocol) for k in keys}
    wanted = [k for k in keys if (k[1] if video else k) in resolutions]  # the training size only if asked for
    rows, known = [], {}
    for label, kw in adaptations(cfg["pe"], scalings, interpolations, cfg["pe_kwargs"]):
        model = models.build_model({**cfg, "pe_kwargs": {**cfg["pe_kwargs"], **kw}})
        restore.load_state(model, state, path)
        model.to(device)
        # at the training grid every adaptation is the identity (scale 1), so that size is evaluated once
        res = loop.evaluate_resolutions(model, sets, train_key, known=known, **eval_kw)
        known = {train_key: (res[train_key]["acc"], res[train_key]["loss"])}
        for k in wanted:
            m = res[k]
            rows.append({"run": str(run), "data": cfg["data"], "model": cfg["model"], "pe": cfg["pe"],
                         "seed": cfg["seed"], "train_res": cfg["img_size"], "adaptation": label, "weights": weights,
                         "res": res_cell(k, video), "acc": round(m["acc"], 4), "loss": m["loss"],
                         "retention": round(m["retention"], 5), "frames": k[0] if video else "",
                         "train_frames": cfg["num_frames"] if video else "", "protocol": protocol})
        log(f"{run.name:40s} {label:16s} {protocol:7s} " + "  ".join(
            f"{f'{k[0]}f ' if video else ''}{k[1] if video else loop.key_text(k)}px {res[k]['acc']:6.2f}"
            for k in wanted))
    return rows


def check_out(out: Path) -> None:
    """The output folder can be written: not an existing file (checked before the first run is evaluated)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file; give a folder for sweep.csv and sweep.png")
    for name in ("sweep.csv", "sweep.png"):
        if (out / name).is_dir():
            raise UserError(f"--out {str(out)!r}: {name} there is a directory")


def sweep_runs(runs, resolutions, scalings=("none",), interpolations=(), weights="last", val_samples=None,
               device="cpu", batch_size=256, frames=(), out: Path | None = None, log=print, protocols=None,
               crop_pct=None) -> list[dict]:
    """Rows of the sweep for every run (all of them checked before the first is evaluated); with ``out``, written
    to ``out/sweep.csv`` and plotted to ``out/sweep.png``."""
    if out is not None:
        check_out(out)
    for run in runs:
        cfg = restore.load_run(run, require=("data",))
        check_frames(run, cfg, frames)
        check_sizes(run, cfg, resolutions)
        check_protocols(run, cfg, protocols)
    rows = []
    for run in runs:
        rows += sweep_run(run, resolutions, scalings, interpolations, weights, val_samples, device, batch_size,
                          log=log, frames=frames, protocols=protocols, crop_pct=crop_pct)
    if out is not None:
        write_csv(rows, Path(out) / "sweep.csv")
        plot(rows, Path(out) / "sweep.png")
    return rows


def write_csv(rows, path: Path) -> None:
    """The rows as CSV (:data:`FIELDS`), written atomically."""
    buffer = text_io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buffer.getvalue())


def plot(rows, path: Path, title: str = "") -> None:
    """Accuracy vs resolution, one line per (run, adaptation); a dotted line marks the training size.

    The x-axis is the side of a square image: rows of non-square sizes (``res`` = ``HxW``) are left out of the plot
    (they stay in the CSV)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lines = {}
    for r in rows:
        if not isinstance(r["res"], int):
            continue  # a non-square size has no place on the axis
        label = r["adaptation"] if r.get("protocol") in (None, "", "resize") else f"{r['adaptation']}, {r['protocol']}"
        lines.setdefault((Path(r["run"]).name, label), []).append((r["res"], r["acc"]))
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
