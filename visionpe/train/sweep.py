"""Evaluate trained runs at several resolutions, with each encoding's resolution adaptation.

    visionpe sweep runs/A runs/B --res 24 32 48 64 --scaling none pi ntk yarn --out runs/sweep
    visionpe sweep runs/A runs/B --res 32 64 128 --tune     # LookHere's protocol: untuned and tuned side by side
    visionpe sweep runs/A --res 32 32x48 48x32          # non-square sizes: HEIGHTxWIDTH
    visionpe sweep runs/VIDEO --frames 4 8 16 --res 24 32 48 --scaling none pi   # video runs
    visionpe sweep runs/A --res 24 32 48 --eval-protocol resize crop native   # protocols

For every run directory (as written by ``visionpe train``) the model is rebuilt from its config.yaml once per
adaptation and the weights loaded (strictly: adaptations change no parameter):

- RoPE (``rope_axial``, ``rope_mixed``, and combinations holding them): one model per ``--scaling``
  (``none`` extrapolates, ``pi``/``ntk``/``yarn`` scale relative to ``ref_shape`` = the training grid); without
  ``--scaling``, the run's own (the ``scaling`` its model was built with), so that the sweep measures what the run
  measured; the ``adaptation`` column names the scaling of every row;
- ``learned`` (and combinations): one model per ``--interpolation`` (table resampling mode, default bicubic);
- every other encoding: as trained (``default``).

A video run (``num_frames`` in its config) is evaluated at every ``--frames`` x ``--res`` pair (its training
frame count and size always among them): the built-in tasks sample the same clip duration at every frame count
(more frames = a higher frame rate), and the adaptations act on time as on space (``ref_shape`` = the training
token grid ``(T/t, H/p, W/p)``). Rows then carry ``frames`` and ``train_frames``; retention is against the
training pair. ``--frames`` with an image run is an error.

An image run also takes non-square sizes ``HxW`` (height x width, e.g. ``32x48``; ``32x32`` is ``32``): the
synthetic scenes are rendered stretched to that aspect, real images resized to it. Their rows read ``res`` =
``32x48`` in the CSV and are left out of the plot (its x-axis is the side of a square), which names them, as the
sweep's output does. A video run takes square sizes only.

The validation images are the run's own, shown at each size under an evaluation protocol (``--eval-protocol``,
default the run's own; several compare them on the same weights): ``resize`` (the whole image at the size; synthetic
tasks re-rendered natively, the same scene with more pixels), ``crop`` (timm's eval transform: shorter side to
size / ``--crop-pct``, centre crop; synthetic tasks rendered at that size and centre-cropped), ``native`` (each image
at its own aspect ratio within the patch budget of the size, visionpe.data.transforms). Writes ``OUT/sweep.csv``
(one row per run x protocol x adaptation x resolution, with top-1 and retention = acc(res) / acc(train res) under
the same protocol) and ``OUT/sweep.png`` (accuracy vs resolution, one line per run, adaptation and protocol), and
prints the table. Errors in the arguments exit with status 2 and one line.

``--tune`` (image runs) adds LookHere's protocol (:mod:`visionpe.train.tuning`): rows ``untuned`` (the run's own
settings) and ``tuned`` (the encoding's declared knob chosen per test size on ``--holdout`` held-out training
images, never on the validation set), with ``knob``, ``knob_value`` and ``holdout_acc`` (its held-out top-1).
"""
from __future__ import annotations

import csv
import inspect
import io as text_io
from pathlib import Path

import torch

from .. import cli
from ..backbones import encodings_of, parse_pe
from ..cli import UserError
from ..cli.report import Curve, accuracy_plot, off_axis
from ..coords import NORMALIZED_COORDS
from ..data import PROTOCOLS
from ..registry import ENCODINGS
from ..resample import INTERPOLATIONS
from ..rotary.scaling import SCALINGS
from ..weights import write_text
from . import evaluation, loop, metrics, models, restore, rundir, sampling, tuning
from .settings import TrainSettings, check_evaluation, check_memory, check_patches, eval_protocol
from .metrics import key_text

FIELDS = ["run", "data", "model", "pe", "seed", "train_res", "adaptation", "weights", "res", "acc", "loss",
          "retention", "frames", "train_frames", "protocol", "knob", "knob_value", "holdout_acc"]


def coordinates_of(cls, pe_kwargs: dict) -> str | None:
    """The ``coords`` an encoding class is built with: ``pe_kwargs``'s, else its constructor's default."""
    if "coords" in pe_kwargs:
        return pe_kwargs["coords"]
    parameter = inspect.signature(cls).parameters.get("coords")
    return None if parameter is None else parameter.default


def own_scalings(settings: TrainSettings) -> list[str]:
    """The resolution scaling a run's model was built with (``[]`` without a rotary encoding that has one): the
    model's own, which ``for_model`` may choose (RoPE on integer positions: ``pi`` unless ``pe_kwargs`` say
    otherwise), read from the rebuilt model rather than guessed from the settings."""
    if settings.pe == models.TIMM_UNPATCHED:
        return []
    rotary = encodings_of(models.build_model(settings))["rotary"]
    scaling = getattr(rotary[0], "scaling", None) if rotary else None
    return [scaling] if scaling is not None else []


def adaptations(pe: str, scalings, interpolations, pe_kwargs=None) -> list[tuple[str, dict]]:
    """``[(label, pe_kwargs overrides)]`` for one encoding built with ``pe_kwargs``: the rotary encoding's scalings
    (those of ``scalings`` it takes: its class's ``scalings``, e.g. RoPE's none/pi/ntk/yarn, the learned rotations'
    none/pi; none on normalised coordinates, which map every grid onto [-1, 1] already) x learned interpolations."""
    if pe == models.TIMM_UNPATCHED:  # timm's own model: it adapts to a new size its own way
        return [("default", {})]
    with cli.user_errors("pe"):
        names = parse_pe(pe)
    rotary = ENCODINGS.get(names.get("rotary"))
    swept = [s for s in scalings if s in getattr(rotary, "scalings", ())]
    if rotary is not None and coordinates_of(rotary, pe_kwargs or {}) in NORMALIZED_COORDS:
        swept = []
    learned = names.get("tokens") == "learned"
    out = [("", {})]
    if swept:
        out = [(f"{label}{'/' if label else ''}{s}", {**kw, "scaling": s}) for label, kw in out for s in swept]
    if learned and interpolations:
        out = [(f"{label}{'/' if label else ''}{m}", {**kw, "interpolation": m})
               for label, kw in out for m in interpolations]
    return [(label or "default", kw) for label, kw in out]


def check_sizes(run: Path, settings: TrainSettings, sizes) -> None:
    """``--res`` fits the run: every side a positive multiple of its patch_size, at most
    :data:`~visionpe.train.settings.MAX_PATCHES` patches, ``HxW`` for image runs only; the rendered scenes and an
    evaluation batch within this machine's memory."""
    video = bool(settings.num_frames)
    for size in sizes:
        if video and not isinstance(size, int):
            raise UserError(f"--res {key_text(size)}: non-square sizes (HxW) are for image runs; {run} is a "
                            f"video run ({settings.data}), give square sizes in pixels")
        sides = (size,) if isinstance(size, int) else size
        if any(s < settings.patch_size or s % settings.patch_size for s in sides):
            raise UserError(f"resolution {key_text(size)} is not a positive multiple of {run}'s patch_size "
                            f"{settings.patch_size}" + ("" if isinstance(size, int) else " on each side"))
        check_patches("--res", size, settings.patch_size)
    check_memory(settings.replace(eval_res=list(sizes), train_res=[]))  # the rendered scenes, one eval batch


def check_frames(run: Path, settings: TrainSettings, frames) -> None:
    """``--frames`` fits the run: only for a video run, each a positive multiple of its tubelet's frames."""
    if not frames:
        return
    if not settings.num_frames:
        raise UserError(f"--frames is for video runs; {run} is an image run ({settings.data})")
    t = models.tubelet(settings)[0]
    bad = [f for f in frames if f < 1 or f % t]
    if bad:
        raise UserError(f"--frames {' '.join(map(str, bad))}: not a positive multiple of {run}'s tubelet frames {t}")


def check_protocols(run: Path, settings: TrainSettings, protocols) -> None:
    """``--eval-protocol`` fits the run: video runs take ``resize`` only, ``native`` needs a model that takes mixed
    sizes."""
    for protocol in protocols or ():
        try:
            check_evaluation(settings.replace(eval_protocol=protocol))
        except UserError as err:
            raise UserError(f"--eval-protocol {protocol} for {run}: {err}") from None


def res_cell(key, video: bool) -> int | str:
    """The ``res`` column of a row: the pixels of a square size (an int, as a video key's ``res``), ``"HxW"`` of a
    non-square one."""
    if video:
        return key[1]
    return key if isinstance(key, int) else key_text(key)


def sweep_run(run: Path, resolutions, scalings=None, interpolations=(), weights="last", val_samples=None,
              device="cpu", batch_size=256, log=print, frames=(), protocols=None, crop_pct=None, tune=False,
              holdout=None) -> list[dict]:
    """Rows of the sweep for one run directory (a video run: at every ``frames`` x ``resolutions`` pair), under each
    of ``protocols`` (default: the run's own) with ``crop_pct`` (default: the run's); ``tune``: with the untuned and
    tuned rows of LookHere's protocol on ``holdout`` held-out training images (:mod:`.tuning`); ``scalings=None``:
    the run's own (:func:`own_scalings`)."""
    run = Path(run)
    settings = restore.load_run(run, require=("data",))
    check_frames(run, settings, frames)
    settings = settings.replace(workers=0, eval_batch_size=batch_size,
                                val_samples=settings.val_samples if val_samples is None else val_samples,
                                crop_pct=settings.crop_pct if crop_pct is None else crop_pct)
    check_sizes(run, settings, resolutions)
    protocols = list(protocols or [eval_protocol(settings)])
    check_protocols(run, settings, protocols)
    if tune:
        tuning.check_run(run, settings, holdout, resolutions)
    if scalings is None:
        scalings = own_scalings(settings)
    rows = []
    for protocol in protocols:
        rows += _sweep_protocol(run, settings, protocol, resolutions, scalings, interpolations, weights, device,
                                batch_size, log, frames, tune, holdout)
    return rows


def _sweep_protocol(run: Path, settings: TrainSettings, protocol: str, resolutions, scalings, interpolations,
                    weights, device, batch_size, log, frames, tune=False, holdout=None) -> list[dict]:
    """The rows of one run under one protocol: every adaptation at every size."""
    path = rundir.weights_file(run, weights)
    state = rundir.read_weights(path)
    device = torch.device(device)
    eval_kw = dict(batch_size=batch_size, device=device,
                   autocast=loop.autocast_for(device, loop.amp_dtype("auto", device)))
    video = bool(settings.num_frames)
    keys, train_key = sampling.eval_grid(settings, resolutions, frames)
    sets = {k: sampling.dataset(settings, "val", k[1], k[0], protocol=protocol) if video else
            sampling.dataset(settings, "val", k, protocol=protocol) for k in keys}
    wanted = [k for k in keys if (k[1] if video else k) in resolutions]  # the training size only if asked for
    rows, known = [], {}

    def base_row(k):
        return {"run": str(run), "data": settings.data, "model": settings.model, "pe": settings.pe, "seed": settings.seed,
                "train_res": settings.img_size, "weights": weights, "res": res_cell(k, video),
                "frames": k[0] if video else "", "train_frames": settings.num_frames if video else "",
                "protocol": protocol}

    own = own_scalings(settings)

    def built(kw: dict):
        model = models.build_model(settings.replace(pe_kwargs={**settings.pe_kwargs, **kw}))
        rundir.load_state(model, state, path)
        return model.to(device)

    for label, kw in adaptations(settings.pe, scalings, interpolations, settings.pe_kwargs):
        model = built(kw)
        # the model as trained at the training size: measured once, and every adaptation's retention is against it.
        # An adaptation other than the run's own scaling is measured there too: it is the identity at the training
        # grid only when its reference grid is that grid (a preset's fixed ref_shape, e.g. SAM 3's 24x24, is not)
        as_trained = kw.get("scaling") in (None, *own)
        measured = evaluation.evaluate_resolutions(model, sets, known=known if as_trained else {}, **eval_kw)
        if as_trained:
            known = {train_key: measured[train_key]}
        elif not known:
            known = evaluation.evaluate_resolutions(built({}), {train_key: sets[train_key]}, **eval_kw)
        res = metrics.retention_table(measured, train_key, trained=known[train_key])
        if not as_trained and measured[train_key].loss != known[train_key].loss:  # an identity gives the same bits
            log(f"{run.name}: {label} is not the model as trained at the training size "
                f"({res[train_key]['acc']:.2f} % against {known[train_key].acc:.2f} %, loss "
                f"{measured[train_key].loss:.4f} against {known[train_key].loss:.4f}); its retention is against the "
                "model as trained")
        for k in wanted:
            m = res[k]
            rows.append({**base_row(k), "adaptation": label, "acc": round(m["acc"], 4), "loss": m["loss"],
                         "retention": None if m["retention"] is None else round(m["retention"], 5)})
        log(f"{run.name:40s} {label:16s} {protocol:7s} " + "  ".join(
            f"{f'{k[0]}f ' if video else ''}{k[1] if video else key_text(k)}px {res[k]['acc']:6.2f}"
            for k in wanted))
    if tune:
        rows += tuning.tune_rows(run, settings, protocol, state, path, keys, wanted, train_key, sets, eval_kw, holdout,
                                 base_row, log)
    return rows


def check_out(out: Path) -> None:
    """The output folder can be written: not an existing file (checked before the first run is evaluated)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file; give a folder for sweep.csv and sweep.png")
    for name in ("sweep.csv", "sweep.png"):
        if (out / name).is_dir():
            raise UserError(f"--out {str(out)!r}: {name} there is a directory")


def sweep_runs(runs, resolutions, scalings=None, interpolations=(), weights="last", val_samples=None,
               device="cpu", batch_size=256, frames=(), out: Path | None = None, log=print, protocols=None,
               crop_pct=None, tune=False, holdout=None) -> list[dict]:
    """Rows of the sweep for every run (all of them checked before the first is evaluated); with ``out``, written
    to ``out/sweep.csv`` and plotted to ``out/sweep.png``."""
    if out is not None:
        check_out(out)
    for run in runs:
        settings = restore.load_run(run, require=("data",))
        check_frames(run, settings, frames)
        check_sizes(run, settings, resolutions)
        check_protocols(run, settings, protocols)
        if tune:
            tuning.check_run(run, settings, holdout, resolutions)
    rows = []
    for run in runs:
        rows += sweep_run(run, resolutions, scalings, interpolations, weights, val_samples, device, batch_size,
                          log=log, frames=frames, protocols=protocols, crop_pct=crop_pct, tune=tune,
                          holdout=holdout)
    if out is not None:
        write_csv(rows, Path(out) / "sweep.csv")
        plot(rows, Path(out) / "sweep.png", log=log)
    return rows


def write_csv(rows, path: Path) -> None:
    """The rows as CSV (:data:`FIELDS`), written atomically."""
    buffer = text_io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buffer.getvalue())


def plot(rows, path: Path, title: str = "", log=print) -> None:
    """Accuracy vs resolution (:func:`visionpe.cli.report.accuracy_plot`), one line per (run, adaptation, protocol);
    a dotted line marks each training size. Rows of non-square sizes (``res`` = ``HxW``) stay in the CSV only: the
    figure names them under its panels, and ``log`` says so."""
    curves = {}
    for r in rows:
        label = r["adaptation"] if r.get("protocol") in (None, "", "resize") else f"{r['adaptation']}, {r['protocol']}"
        run = Path(r["run"]).name
        curve = curves.setdefault((run, label), Curve(run if label == "default" else f"{run} [{label}]", {}, {},
                                                       group=run, style=r["adaptation"]))
        curve.acc[r["res"]] = [r["acc"]]
        if "retention" in r:
            curve.retention[r["res"]] = [r["retention"]]
    accuracy_plot(list(curves.values()), path, train_sizes={r["train_res"] for r in rows},
                  title=title or "accuracy vs test resolution")
    left_out = off_axis(list(curves.values()))
    if left_out:
        log(f"{path.name} draws square sizes only: {', '.join(left_out)} are in sweep.csv and the table above")


def build_parser() -> cli.Parser:
    head, examples = __doc__.split("\n\n")[:2]
    p = cli.Parser(prog="visionpe sweep", description=head,
                   epilog=examples + "\n\nWhat each adaptation and protocol is, how video and non-square sizes are "
                   "swept, and what OUT/sweep.csv and OUT/sweep.png hold: python -m pydoc visionpe.train.sweep. Errors in the "
                   "arguments exit with status 2 and one line.")
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories written by visionpe train")
    ev = p.add_argument_group("evaluation")
    ev.add_argument("--res", nargs="+", type=loop.parse_size, required=True, metavar="PX|HxW",
                    help="test resolutions in pixels: PX (square) or HxW (height x width, image runs only), each side "
                         "a positive multiple of the runs' patch_size, at most 65536 patches per image (required)")
    ev.add_argument("--frames", nargs="+", type=int, default=[], metavar="T",
                    help="video runs: test frame counts, crossed with --res; each a positive multiple of the runs' "
                         "tubelet frames (default: the training frame count only)")
    ev.add_argument("--scaling", nargs="+", default=None, choices=SCALINGS, metavar="NAME",
                    help=f"RoPE adaptations to compare: {', '.join(SCALINGS)} (default: each run's own, the scaling "
                         "its model was built with; the table's adaptation column names it)")
    ev.add_argument("--interpolation", nargs="*", default=[], choices=INTERPOLATIONS, metavar="MODE",
                    help=f"learned-table resampling modes to compare: {', '.join(INTERPOLATIONS)} "
                         "(default: the run's own)")
    ev.add_argument("--eval-protocol", nargs="+", default=None, choices=PROTOCOLS, metavar="NAME",
                    help=f"how each validation image is shown at a test size, of {', '.join(PROTOCOLS)}: resize (the "
                         "whole image), crop (timm's eval transform: shorter side to size / crop_pct, centre crop), "
                         "native (its own aspect ratio within the patch budget of the size); several compare them on "
                         "the same weights (default: each run's own)")
    ev.add_argument("--crop-pct", type=float, default=None, metavar="PCT",
                    help="the crop protocol's crop fraction, in (0, 1] (default: each run's crop_pct)")
    ev.add_argument("--weights", default="last", choices=["last", "best", "ema"],
                    help="which weights of each run: last, best or ema (the EMA weights of a --model-ema run) "
                         "(default: last)")
    ev.add_argument("--val-samples", type=int, default=None, metavar="N",
                    help="validation images, an integer >= 1 (default: the run's)")
    ev.add_argument("--batch-size", type=int, default=256, metavar="N",
                    help="evaluation batch size, an integer >= 1 (default: 256)")
    ev.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu or cuda (default: cpu)")
    tuning.add_arguments(
        ev, tune="LookHere's protocol (image runs): also report each run untuned and with its encoding's declared knob "
        "(RoPE theta or scaling, ALiBi/LookHere slopes, FIRE's threshold, the learned table's interpolation) chosen "
        "per test size on held-out training images, never on the validation set (python -m pydoc "
        "visionpe.train.tuning)",
        holdout="with --tune: held-out training images (the N after the run's train_samples), an integer >= 1 "
        "(default: 1%% of the training images, at least 100)")
    out = p.add_argument_group("output and misc")
    cli.add_import(p, out)
    out.add_argument("--out", type=Path, default=Path("runs/sweep"), metavar="DIR",
                     help="folder for sweep.csv and sweep.png (default: runs/sweep)")
    p.add_debug(out)
    return p


def main(argv) -> list[dict]:
    """``visionpe sweep ARGV``: returns the rows; a user mistake is a :class:`UserError`."""
    args = build_parser().parse_args(argv)
    if args.val_samples is not None and args.val_samples < 1:
        raise UserError(f"--val-samples must be an integer >= 1, got {args.val_samples}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be an integer >= 1, got {args.batch_size}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is available")
    if args.crop_pct is not None and not 0 < args.crop_pct <= 1:
        raise UserError(f"--crop-pct must be in (0, 1], got {args.crop_pct}")
    if args.holdout is not None and not args.tune:
        raise UserError(f"--holdout {args.holdout} sets the held-out images of --tune; give --tune too")
    if args.holdout is not None and args.holdout < 1:
        raise UserError(f"--holdout must be an integer >= 1, got {args.holdout}")
    if any(f < 1 for f in args.frames):
        raise UserError(f"--frames takes positive frame counts, got {' '.join(map(str, args.frames))}")
    cli.import_user_code(args.imports)
    rows = sweep_runs(args.runs, args.res, args.scaling, args.interpolation, args.weights, args.val_samples,
                      args.device, args.batch_size, frames=args.frames, out=args.out,
                      protocols=args.eval_protocol, crop_pct=args.crop_pct, tune=args.tune, holdout=args.holdout)
    print(f"wrote {args.out / 'sweep.csv'} and {args.out / 'sweep.png'}")
    return rows
