"""The run directory: the one reader and writer of what ``train_vit.py`` leaves on disk.

    config.yaml         the resolved settings (model, pe, pe_kwargs, img_size, patch_size, num_classes, in_chans,
                        model_kwargs: everything visionpe.create_model(model, pe, pe_kwargs=..., **model_kwargs)
                        needs), written when the run starts
    state.pt            THE CHECKPOINT: model weights, optimizer, scheduler, epoch, best_acc, best_epoch, history
                        (torch.load(..., weights_only=True))
    last.safetensors    exported weights of the latest epoch   (metadata: epoch)
    best.safetensors    exported weights of the epoch with the best validation top-1 (metadata: epoch)
    metrics.jsonl       one JSON object per line: {"kind": "epoch", ...}, then {"kind": "eval_res", ...}
    results.json        the final resolution table; written last, so it exists only for a finished run

Everything that reads a run goes through here: training and resume (``train_vit.py``), the resolution sweep,
the benchmark and the visualization (:func:`load_run`, :func:`build_model`, :func:`load_model`), and a new run
that starts from another run's weights (``--init-from``: :func:`new_config`, :func:`init_weights`).

Checkpoint protocol (a kill at any instant leaves a run that ``--resume`` continues exactly):

1. Every file is written by :func:`visionpe.io.atomic_write`: a temporary file, fsync, ``os.replace``. A
   file is always either its old or its new version, never a mix; a kill leaves at most a stray temporary
   ``.<name>.<random>.tmp``, which the next start deletes (:func:`clean_temp`).
2. ``state.pt`` is the single commit point: it alone holds everything resume needs, the model weights included.
   An epoch is saved when its ``state.pt`` has replaced the previous one; before that instant the run is at the
   previous epoch, after it at the new one.
3. ``last.safetensors``, ``best.safetensors`` and ``metrics.jsonl`` are exports of ``state.pt``, written after
   it. On resume :func:`repair` compares them with ``state.pt`` (the ``epoch`` in the weights' metadata, the
   history) and rewrites any that lag behind: ``last`` from the state's weights; ``best`` likewise when the best
   epoch is the state's epoch (the only case in which ``best`` can lag, since the next epoch starts only after
   the exports are complete).
4. ``results.json`` is written after everything else. A run without ``state.pt`` has finished no epoch: resume
   starts it at epoch 1 from its ``config.yaml``.
5. ``--overwrite`` deletes the previous run's files (only the names above and their temporaries) before writing
   anything: ``results.json`` first, then ``config.yaml`` (the rest can then no longer be loaded, resumed or
   swept), ``state.pt`` and the exports. A kill part-way leaves some of the old files or only new ones, never
   both, and never the old results.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from ..weights import convert, io
from . import config
from .cli import UserError, one_line, user_errors

CONFIG, STATE, LAST, BEST, METRICS, RESULTS = ("config.yaml", "state.pt", "last.safetensors", "best.safetensors",
                                               "metrics.jsonl", "results.json")
# deletion order of --overwrite: the "finished" marker first, then the config (what is left can no longer be
# loaded, resumed or swept), the commit point, the exports
ARTIFACTS = (RESULTS, CONFIG, STATE, METRICS, BEST, LAST)
STATE_KEYS = ("epoch", "best_acc", "best_epoch", "history", "optimizer", "scheduler")
MODEL_KEYS = ("model", "pe", "img_size", "patch_size", "num_classes")  # needed to rebuild the model


# -----------------------------------------------------------------------------------------------------
# files
def write_text(path: Path, text: str) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    io.atomic_write(path, write)


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def temp_files(out: Path) -> list[Path]:
    """Temporaries of an interrupted :func:`~visionpe.io.atomic_write` of one of the run's files."""
    out = Path(out)
    if not out.is_dir():
        return []
    return sorted(p for p in out.glob(".*.tmp") if any(p.name.startswith(f".{name}.") for name in ARTIFACTS))


def clean_temp(out: Path) -> list[Path]:
    stray = temp_files(out)
    for path in stray:
        _unlink(path)
    return stray


def existing(out: Path) -> list[str]:
    """The run files present in ``out``."""
    return [name for name in ARTIFACTS if (Path(out) / name).exists()]


def clear(out: Path, keep: tuple[str, ...] = ()) -> None:
    """Delete the run's files (never anything else in ``out``): results first, then state, then the exports."""
    clean_temp(out)
    for name in ARTIFACTS:
        if name not in keep:
            _unlink(Path(out) / name)


def check_fresh(out: Path, overwrite: bool) -> None:
    """A new run may only start in a directory without a run, or with ``--overwrite``."""
    if Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"--output {str(out)!r} is not a directory")
    found = existing(out)
    if found and not overwrite:
        raise UserError(f"run directory {str(out)!r} already holds a run ({', '.join(found)}); pass --resume to "
                        "continue it or --overwrite to delete it and start again")


# -----------------------------------------------------------------------------------------------------
# config
def read_config(run) -> dict:
    """``run/config.yaml`` as written (a plain mapping), or a :class:`UserError`."""
    run = Path(run)
    path = run / CONFIG
    if not run.is_dir():
        raise UserError(f"run directory {str(run)!r} not found")
    if not path.is_file():
        raise UserError(f"{str(run)!r} is not a run directory: {CONFIG} not found")
    return config.read_yaml(path, what="run config")


def load_run(path, require: tuple[str, ...] = ()) -> dict:
    """The settings of the run in ``path``, complete and checked: ``config.yaml`` over the defaults.

    ``num_classes`` and ``in_chans`` are the run's own (never re-derived from the data set's name), so an
    ImageFolder run rebuilds with its class count. ``require``: keys the caller needs besides those that rebuild
    the model (e.g. ``("data",)`` to evaluate on the run's data)."""
    run = Path(path)
    raw = read_config(run)
    missing = [k for k in (*MODEL_KEYS, *require) if k not in raw]
    if missing:
        raise UserError(f"{run / CONFIG} lacks the setting(s) {', '.join(missing)}")
    unknown = sorted(set(raw) - set(config.DEFAULTS) - set(config.RUN_KEYS))
    if unknown:
        raise UserError(f"{run / CONFIG} has unknown setting(s) {', '.join(unknown)}")
    cfg = config._copy(config.DEFAULTS)
    cfg.update(config._copy(raw))
    for key in ("model_kwargs", "pe_kwargs"):
        if cfg[key] is None:
            cfg[key] = {}
    try:
        config.check(cfg, training=False)
    except UserError as err:
        raise UserError(f"{run / CONFIG}: {err}") from None
    num_classes = cfg["num_classes"]
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise UserError(f"{run / CONFIG}: num_classes must be an integer >= 1, got {num_classes!r}")
    if cfg.get("in_chans") is None:
        cfg["in_chans"] = cfg["model_kwargs"].get("in_chans") or (
            config.vdata.info(cfg["data"])["in_chans"] if "data" in raw else 3)
    cfg["output"] = str(run)
    return cfg


def write_config(out: Path, cfg: dict) -> None:
    write_text(Path(out) / CONFIG, yaml.safe_dump(config.saved_form(cfg), sort_keys=False))


def resume_config(args: dict) -> tuple[dict, list[tuple]]:
    """Settings of ``--resume``: the run's own config.yaml, with the command line's changes where they are safe
    (``config.SAFE_ON_RESUME``). Returns ``(cfg, [(setting, old, new)] applied)``; any other change is refused
    with one line naming it."""
    resume = args["resume"]
    if args.get("init_from") is not None:
        raise UserError("--init-from starts a new run from another model's weights and --resume continues this run "
                        "from its own; give one of them")
    out = Path(resume if isinstance(resume, str) else args.get("output") or "")
    if str(out) in ("", "."):
        raise UserError("--resume needs the run directory: --resume DIR (or --output DIR)")
    if isinstance(resume, str) and args.get("output") and Path(args["output"]) != out:
        raise UserError(f"--resume {resume} and --output {args['output']} name different directories; give one")
    if args.get("overwrite"):
        raise UserError("--resume continues a run and --overwrite deletes it; give one of them")
    if not (out / CONFIG).is_file():
        raise UserError(f"--resume: no run to continue in {str(out)!r} (no {CONFIG})")
    base = load_run(out)
    given = {k: v for k, v in args.items() if k not in ("resume", "debug")}
    given["output"] = str(out)
    cfg = config.resolve(given, base=base)
    diff = config.changes(base, cfg)
    refused = [d for d in diff if d[0] not in config.SAFE_ON_RESUME]
    if refused:
        raise UserError(f"--resume {out}: cannot change {'; '.join(f'{k} ({a!r} -> {b!r})' for k, a, b in refused)} "
                        f"of the run (only {', '.join(config.SAFE_ON_RESUME)} may change); start a new run with "
                        "another --output, or --overwrite this one")
    return cfg, diff


def new_config(args: dict) -> dict:
    """Settings of a new run: :func:`config.resolve`; with ``--init-from`` a run (directory, or a weights file in
    one), the source run's model and data settings (:data:`INHERITED`) take the place of the defaults, below the
    recipe and the command line, and ``init_from`` becomes the weights file itself."""
    init = args.get("init_from")
    if init is None and args.get("config"):
        init = config.read_yaml(args["config"]).get("init_from")
    if init is None:
        return config.resolve(args)
    if not isinstance(init, str) or not init:
        raise UserError(f"init_from must be a path, got {init!r}")
    weights, source = init_source(init)
    base = None
    if source is not None:
        base = config._copy(config.DEFAULTS)
        base.update({k: config._copy(source[k]) for k in INHERITED})
        base["model_kwargs"] = {k: v for k, v in base["model_kwargs"].items() if k not in DERIVED_MODEL_KWARGS}
    cfg = config.resolve({**args, "init_from": str(weights)}, base=base)
    if Path(cfg["output"]).resolve() == weights.parent.resolve():
        raise UserError(f"--init-from {init}: the weights are in the new run's own --output {cfg['output']}; give "
                        "another --output")
    return cfg


# -----------------------------------------------------------------------------------------------------
# --init-from: a new run that starts from another model's weights
INHERITED = ("model", "model_kwargs", "img_size", "patch_size", "data", "data_dir", "num_frames",
             "tubelet_size")  # taken from a source run
DERIVED_MODEL_KWARGS = ("img_size", "patch_size", "num_classes", "in_chans", "drop_path_rate")  # set from settings
CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def init_source(path) -> tuple[Path, dict | None]:
    """``(weights file, the source run's settings or None)`` of ``--init-from path``: a run directory (its
    last.safetensors), a weights file in one, or a checkpoint file of no run (timm or visionpe)."""
    path = Path(path)
    if path.is_dir():
        if not (path / CONFIG).is_file():
            raise UserError(f"--init-from {path}: not a run directory ({CONFIG} not found) and not a weights file")
        source = _source_run(path)
        if not (path / LAST).is_file():
            raise UserError(f"--init-from {path}: {LAST} not found (the run has finished no epoch)")
        return path / LAST, source
    if not path.exists():
        raise UserError(f"--init-from {path}: no such run directory or weights file")
    if path.suffix not in CHECKPOINT_SUFFIXES:
        raise UserError(f"--init-from {path}: expected a run directory or a {', '.join(CHECKPOINT_SUFFIXES)} file")
    return path, (_source_run(path.parent) if (path.parent / CONFIG).is_file() else None)


def _source_run(run: Path) -> dict:
    try:
        return load_run(run)
    except UserError as err:
        raise UserError(f"--init-from {run}: {err}") from None


def init_weights(model: torch.nn.Module, cfg: dict) -> dict:
    """Load ``cfg['init_from']`` into ``model`` (:func:`visionpe.load_timm_checkpoint`: non-positional weights by
    name and shape, positional ones converted where possible) and return the report as a history record
    ``{'kind': 'init', 'source', 'source_pe', 'source_epoch', 'kept', 'converted', 'new', 'dropped'}``.

    A non-positional weight that is dropped or new (another embed_dim, depth, patch size or model), or a classifier
    head that does not fit unless ``cfg['init_head_reset']`` (which leaves the head new), is a :class:`UserError`
    naming the keys; the model may then be partly loaded."""
    import logging
    path = Path(cfg["init_from"])
    source_cfg = _source_run(path.parent) if (path.parent / CONFIG).is_file() else None
    with user_errors(f"--init-from {path}", (ValueError, OSError)):
        state = io.read_state_dict(path)
    head = [k for k in state if convert.is_classifier(k)] if cfg["init_head_reset"] else []
    state = {k: v for k, v in state.items() if k not in head}
    positional = _positional_names(model)
    is_positional = lambda key: convert.is_positional(key) or key.startswith(positional)
    target = model.state_dict()
    quiet = logging.getLogger("visionpe.weights")
    was_disabled, quiet.disabled = quiet.disabled, True  # the report is printed by the caller
    try:
        report = convert.load_timm_checkpoint(model, state)
    finally:
        quiet.disabled = was_disabled
    order = {k: i for i, k in enumerate(target)}
    loose = sorted((k for k in dict.fromkeys(report.dropped + report.new) if not is_positional(k)
                    and not (cfg["init_head_reset"] and convert.is_classifier(k))),
                   key=lambda k: order.get(k, len(order)))  # in the model's order
    if loose:
        def describe(key):
            if key in state and key in target:
                return f"{key} {_shape(state[key])} in the source, {_shape(target[key])} here"
            return f"{key} only in the {'source' if key in state else 'new model'}"
        shown = ", ".join(describe(k) for k in loose[:6]) + (f", ... {len(loose) - 6} more" if len(loose) > 6 else "")
        if all(convert.is_classifier(k) for k in loose):
            raise UserError(f"--init-from {path}: the classifier head does not fit ({shown}); pass --init-head-reset "
                            "to train a new head")
        source = "" if source_cfg is None else f"source {source_cfg['model']} [{_sizes(source_cfg)}], "
        raise UserError(f"--init-from {path} does not fit the new model ({source}new {cfg['model']} "
                        f"[{_sizes(cfg)}] pe={cfg['pe']}): {shown}; only positional weights (and the head, with "
                        "--init-head-reset) may differ; leave out the model settings to take the source run's")
    epoch = io.weights_metadata(path).get("epoch") if path.suffix == ".safetensors" else None
    return {"kind": "init", "source": str(path), "source_pe": source_cfg["pe"] if source_cfg else None,
            "source_epoch": int(epoch) if epoch is not None else None, "head_reset": cfg["init_head_reset"],
            "kept": report.kept, "converted": report.converted, "new": report.new,
            "dropped": report.dropped}


def _positional_names(model) -> tuple[str, ...]:
    """Name prefixes (``name.``) of the model's encoding modules."""
    from .. import encodings_of
    modules = {id(m) for family in encodings_of(model).values() for m in family}
    return tuple(f"{name}." for name, m in model.named_modules() if id(m) in modules and name)


def _shape(t) -> str:
    return "x".join(map(str, t.shape)) or "scalar"


def _sizes(cfg: dict) -> str:
    kw = cfg.get("model_kwargs") or {}
    sizes = [f"{k}={kw[k]}" for k in ("embed_dim", "depth", "num_heads") if k in kw]
    sizes += [f"{k}={cfg.get(k)}" for k in ("patch_size", "in_chans", "num_classes")]
    return " ".join(sizes)


def init_text(record: dict) -> str:
    """The report of :func:`init_weights`: one summary line, then one line per converted, new and dropped key
    (and per positional weight kept as it was)."""
    source = record["source"] + "".join(
        [f" pe={record['source_pe']}" if record["source_pe"] else "",
         f" epoch {record['source_epoch']}" if record["source_epoch"] is not None else ""])
    counts = ", ".join(f"{len(record[k])} {k}" for k in ("kept", "converted", "new", "dropped"))
    lines = [f"init from {source}: {counts}" + (" (classifier head reset)" if record["head_reset"] else "")
             + "; a new run: fresh optimizer and schedule"]
    lines += [f"  kept      {k}" for k in record["kept"] if convert.is_positional(k)]
    lines += [f"  converted {k}" for k in record["converted"]]
    lines += [f"  new       {k}" for k in record["new"]]
    lines += [f"  dropped   {k}" for k in record["dropped"]]
    return "\n".join(lines)


# -----------------------------------------------------------------------------------------------------
# models
tubelet = config.tubelet  # a video run's tubelet: tubelet_size, else (1, patch, patch)


def run_grid(cfg: dict) -> tuple[int, ...]:
    """Patch grid of a trained model: ``img_size // patch_size`` per axis (either may be an int or a list);
    a video run (``num_frames`` set) adds ``num_frames // tubelet_size[0]`` in front."""
    img = cfg["img_size"]
    img = (img, img) if isinstance(img, int) else tuple(img)
    patch = cfg["patch_size"]
    patch = (patch,) * len(img) if isinstance(patch, int) else tuple(patch)
    if cfg.get("num_frames"):
        img, patch = (int(cfg["num_frames"]), *img), tubelet(cfg)
    if len(patch) != len(img):
        raise UserError(f"img_size={cfg['img_size']!r} and patch_size={cfg['patch_size']!r} differ in axes")
    return tuple(int(i) // int(p) for i, p in zip(img, patch))


def _create_video_model():
    import visionpe
    if hasattr(visionpe, "create_video_model"):
        return visionpe.create_video_model
    from ..video import create_video_model
    return create_video_model


def build_model(cfg: dict) -> torch.nn.Module:
    """The one place a model is made from settings (training, resume, sweep, benchmark, visualization).
    A video run (``num_frames`` set) is a tubelet ViT from ``create_video_model``, or torchvision's Video Swin
    (``swin3d_t/s/b``: ``SwinTransformer3d`` with the tubelet as its patch, then ``visionpe.apply``)."""
    import visionpe
    kwargs = config.model_kwargs(cfg)
    with user_errors(f"cannot build {cfg['model']} with pe={cfg['pe']}", (ValueError, TypeError, AssertionError)):
        if cfg["model"] in config.VIDEO_SWIN:  # torchvision's Video Swin, its patch the tubelet
            from torchvision.models.video.swin_transformer import SwinTransformer3d
            model = SwinTransformer3d(patch_size=list(tubelet(cfg)), **kwargs)
            return visionpe.apply(model, cfg["pe"], **cfg["pe_kwargs"])
        if cfg.get("num_frames"):
            kwargs.pop("patch_size", None)
            return _create_video_model()(cfg["model"], pe=cfg["pe"], num_frames=cfg["num_frames"],
                                         tubelet_size=tubelet(cfg), pe_kwargs=cfg["pe_kwargs"], **kwargs)
        if cfg["pe"] == config.TIMM_NATIVE:
            return timm_native(cfg["model"], kwargs)
        return visionpe.create_model(cfg["model"], pe=cfg["pe"], pe_kwargs=cfg["pe_kwargs"], **kwargs)


def timm_native(name: str, kwargs: dict) -> torch.nn.Module:
    """``pe=timm``: the model exactly as timm builds it, its own position encoding included, made to run at any
    input size the way timm does it (:func:`visionpe.backbones.api.any_size_kwargs`: learned tables resampled
    bicubic and RoPE recomputed per grid for ViT/Eva, ``strict_img_size=False`` for Swin)."""
    import timm

    from ..backbones.api import any_size_kwargs
    return timm.create_model(name, pretrained=False, **any_size_kwargs(name, kwargs))


def read_weights(path: Path, device="cpu") -> dict[str, torch.Tensor]:
    """A safetensors state dict, or a :class:`UserError` naming the file (missing, truncated, not safetensors)."""
    from safetensors.torch import load_file
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file {str(path)!r} not found")
    try:
        return load_file(str(path), device=str(device))
    except Exception as err:  # safetensors raises its own error type for a damaged file
        raise UserError(f"cannot read {path}: damaged or not a safetensors file ({one_line(err)[:200]})") from None


def load_state(model: torch.nn.Module, state: dict, source) -> None:
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise UserError(f"{source} does not fit the model rebuilt from {CONFIG}: {one_line(err)[:300]}") from None


def load_model(path, which: str = "best") -> tuple[torch.nn.Module, dict]:
    """Rebuild a trained model from a run directory (``which`` = ``"best"`` or ``"last"`` weights) or from a
    ``.safetensors`` file inside one; returns ``(model in eval mode, settings)``."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} not found (neither a run directory nor a weights file)")
    run, weights = (path, path / f"{which}.safetensors") if path.is_dir() else (path.parent, path)
    if not weights.is_file():
        raise UserError(f"weights file {str(weights)!r} not found")
    cfg = load_run(run)
    model = build_model(cfg)
    load_state(model, read_weights(weights), weights)
    return model.eval(), cfg


# -----------------------------------------------------------------------------------------------------
# checkpoint: state.pt is the commit point, the rest are exports (see the module docstring)
def weights_epoch(path: Path) -> int:
    """The ``epoch`` stored in a weights file's metadata; -1 if the file is missing or unreadable."""
    try:
        return int(io.weights_metadata(path).get("epoch", -1))
    except Exception:
        return -1


def metrics_text(history: list[dict]) -> str:
    return "".join(json.dumps(h) + "\n" for h in history)


def save_checkpoint(out: Path, model, optimizer, scheduler, *, epoch: int, best_acc: float, best_epoch: int,
                    history: list[dict]) -> None:
    """Commit epoch ``epoch`` (``state.pt``), then export last/best weights and metrics from it."""
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    state = {"format": 2, "epoch": epoch, "best_acc": best_acc, "best_epoch": best_epoch,
             "history": json.dumps(history), "model": weights, "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict()}
    io.atomic_write(Path(out) / STATE, lambda tmp: torch.save(state, tmp))
    export(out, state, history)


def export(out: Path, state: dict, history: list[dict], force: bool = True) -> list[str]:
    """Write the exports of ``state`` (all of them, or with ``force=False`` only those that lag behind it);
    returns the names written."""
    out, epoch, written = Path(out), state["epoch"], []
    if force or weights_epoch(out / LAST) != epoch:
        io.save_weights(state["model"], out / LAST, {"epoch": str(epoch)})
        written.append(LAST)
    best_epoch = state["best_epoch"]
    if best_epoch == epoch and (force or weights_epoch(out / BEST) != epoch):
        io.save_weights(state["model"], out / BEST, {"epoch": str(epoch)})
        written.append(BEST)
    elif best_epoch >= 1 and weights_epoch(out / BEST) != best_epoch:
        raise UserError(f"{out / BEST} is missing or not from the best epoch {best_epoch}, and {STATE} (epoch {epoch}) "
                        "cannot rebuild it; the run can only be restarted with --overwrite")
    text = metrics_text(history)
    if force or not (out / METRICS).is_file() or (out / METRICS).read_text() != text:
        write_text(out / METRICS, text)
        written.append(METRICS)
    return written


def load_checkpoint(out: Path) -> dict | None:
    """``state.pt`` of the run in ``out``, checked, with ``history`` decoded and the model weights in
    ``state['model']``; ``None`` when no epoch was saved yet. A damaged file is a :class:`UserError`."""
    out = Path(out)
    path = out / STATE
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserError(f"cannot read {path}: damaged or not a train_vit.py checkpoint "
                        f"({type(err).__name__}: {one_line(err)[:160]}); restart the run with --overwrite") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise UserError(f"{path} is not a train_vit.py checkpoint (lacks {', '.join(missing)})")
    try:
        state["history"] = json.loads(state["history"])
    except (TypeError, ValueError):
        raise UserError(f"{path} holds a damaged history") from None
    if "model" not in state:  # written by an older train_vit.py: the weights live in last.safetensors
        if weights_epoch(out / LAST) != state["epoch"]:
            raise UserError(f"{out / LAST} and {STATE} are from different epochs; cannot resume exactly")
        state["model"] = read_weights(out / LAST)
    return state


def repair(out: Path, state: dict | None) -> list[str]:
    """Bring the exports in line with ``state.pt`` before training continues (see the module docstring); with no
    state (no epoch saved), remove exports left by anything else. Returns what was done, for the log."""
    out = Path(out)
    notes = [f"removed the interrupted write {p.name}" for p in clean_temp(out)]
    if state is None:
        stale = [n for n in existing(out) if n != CONFIG]
        clear(out, keep=(CONFIG,))
        return notes + ([f"removed {', '.join(stale)} (no epoch was saved)"] if stale else [])
    written = export(out, state, state["history"], force=False)
    return notes + ([f"re-exported {', '.join(written)} from {STATE} (epoch {state['epoch']})"] if written else [])


def read_results(run: Path) -> dict:
    """``results.json`` of a finished run, or a :class:`UserError`."""
    path = Path(run) / RESULTS
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} not found: the run has not finished") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path}: {one_line(err)}") from None


def prepare(out: Path, cfg: dict, *, resume: bool, state: dict | None, changed=()) -> list[str]:
    """Ready the run directory for training (rank 0 only). A new run: delete the previous run's files (only with
    ``--overwrite`` can there be any), then write config.yaml. A resumed run: :func:`repair`, and record the
    settings changed on the command line (``changed``, from :func:`resume_config`) in config.yaml. Returns what was
    done, for the log."""
    if not resume:
        clear(out)
        write_config(out, cfg)
        return []
    notes = [f"resume: {note}" for note in repair(out, state)]
    notes += [f"resume: {key} changed from {old!r} to {new!r} (applied)" for key, old, new in changed]
    if any(key in config.saved_form(cfg) for key, _, _ in changed):
        write_config(out, cfg)
        notes.append(f"resume: {CONFIG} updated with the changed settings")
    return notes


def finish(out: Path, history: list[dict], summary: dict) -> None:
    """The last writes of a finished run: all metrics, then results.json (whose presence means "finished")."""
    write_text(Path(out) / METRICS, metrics_text(history))
    write_text(Path(out) / RESULTS, json.dumps(summary, indent=1))
