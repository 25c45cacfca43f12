"""A run read back: its settings (:func:`load_run`), its trained model (:func:`load_model`), the settings of
``--resume`` (:func:`resume_config`), and a new run started from another model's weights (``--init-from``:
:func:`new_config`, :func:`init_weights`). The files themselves belong to :mod:`visionpe.train.rundir`.

``--pretrained`` starts a new run from timm's pretrained weights (:func:`pretrained_weights`), reported as
``--init-from`` is.

A run records the user code it imported (``imports`` in ``config.yaml``); loading the run imports it again, so a
user's encoding, data set or backbone is known to ``--resume``, the sweep and visualization.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from .. import data as vdata
from ..weights import convert, io
from . import models, rundir
from .settings import (DEFAULTS, EXTEND_ON_RESUME, RUN_KEYS, SAFE_ON_RESUME, TrainSettings, changes, check, copied,
                       read_recipe, refused_changes, renamed, resolve)
from ..cli import UserError, import_user_code, user_errors
from .rundir import CONFIG, LAST

MODEL_KEYS = ("model", "pe", "img_size", "patch_size", "num_classes")  # needed to rebuild the model


def load_run(path, require: tuple[str, ...] = ()) -> TrainSettings:
    """The settings of the run in ``path``, complete and checked: ``config.yaml`` over the defaults.

    ``num_classes`` and ``in_chans`` are the run's own (never re-derived from the data set's name), so an
    ImageFolder run rebuilds with its class count. ``require``: keys the caller needs besides those that rebuild
    the model (e.g. ``("data",)`` to evaluate on the run's data)."""
    run = Path(path)
    raw = rundir.read_config(run)
    missing = [k for k in (*MODEL_KEYS, *require) if k not in raw]
    if missing:
        raise UserError(f"{run / CONFIG} lacks the setting(s) {', '.join(missing)}")
    unknown = sorted(set(raw) - set(DEFAULTS) - set(RUN_KEYS))
    if unknown:
        raise UserError(f"{run / CONFIG} has unknown setting(s) {', '.join(unknown)}")
    values = {**copied(DEFAULTS), **renamed(copied(raw))}  # written before a rename: the name now
    for key in ("model_kwargs", "pe_kwargs", "imports"):
        if values[key] is None:
            values[key] = copied(DEFAULTS[key])
    try:
        if not isinstance(values["imports"], list):
            raise UserError(f"imports must be a list of module names or .py files, got {values['imports']!r}")
        import_user_code(values["imports"])  # the run's own encodings, data sets and backbones, before any check
        settings = check(values, training=False)
    except UserError as err:
        raise UserError(f"{run / CONFIG}: {err}") from None
    num_classes = settings.num_classes
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise UserError(f"{run / CONFIG}: num_classes must be an integer >= 1, got {num_classes!r}")
    classes = settings.classes
    if classes is not None and (not isinstance(classes, list) or len(classes) != num_classes
                                or not all(isinstance(c, str) for c in classes)):
        raise UserError(f"{run / CONFIG}: classes must be a list of the {num_classes} class names that number the "
                        f"outputs, got {str(classes)[:200]}")
    in_chans = settings.in_chans
    if in_chans is None:
        in_chans = settings.model_kwargs.get("in_chans") or (vdata.info(settings.data)["in_chans"] if "data" in raw
                                                             else 3)
    return settings.replace(in_chans=in_chans, output=str(run))


def load_model(path, which: str = "best") -> tuple[torch.nn.Module, dict]:
    """Rebuild a trained model from a run directory (``which`` = ``"best"``, ``"last"`` or ``"ema"`` weights) or from
    a ``.safetensors`` file inside one; returns ``(model in eval mode, settings)``."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} not found (neither a run directory nor a weights file)")
    run, weights = (path, rundir.weights_file(path, which)) if path.is_dir() else (path.parent, path)
    settings = load_run(run)  # first: a folder that is not a run says so
    if not weights.is_file():
        raise UserError(f"weights file {str(weights)!r} not found")
    model = models.build_model(settings)
    rundir.load_state(model, rundir.read_weights(weights), weights)
    return model.eval(), settings


def resume_config(args: dict) -> tuple[TrainSettings, list[tuple]]:
    """Settings of ``--resume``: the run's own config.yaml, with the command line's changes where they are safe
    (``SAFE_ON_RESUME``). Returns ``(settings, [(setting, old, new)] applied)``; any other change is refused
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
        raise UserError(rundir.no_run_message(out))
    base = load_run(out)
    given = {k: v for k, v in args.items() if k not in ("resume", "debug")}
    given["output"] = str(out)
    settings = resolve(given, base=base)
    diff = changes(base, settings)
    refused = [d for d in refused_changes(base, settings) if d[0] not in EXTEND_ON_RESUME]
    if refused:
        raise UserError(f"--resume {out}: cannot change {'; '.join(f'{k} ({a!r} -> {b!r})' for k, a, b in refused)} "
                        f"of the run (only {', '.join(SAFE_ON_RESUME + EXTEND_ON_RESUME)} may "
                        "change); start a new run with another --output, or --overwrite this one")
    return settings, diff


INHERITED = ("model", "model_kwargs", "img_size", "patch_size", "data", "data_dir", "num_frames",
             "tubelet_size")  # taken from a source run


CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def new_config(args: dict) -> TrainSettings:
    """Settings of a new run: :func:`resolve`; with ``--init-from`` a run (directory, or a weights file in
    one), the source run's model and data settings (:data:`INHERITED`) take the place of the defaults, below the
    recipe and the command line, and ``init_from`` becomes the weights file itself."""
    init = args.get("init_from")
    if init is None and args.get("config"):
        init = read_recipe(args["config"]).get("init_from")
    if init is None:
        return resolve(args)
    if not isinstance(init, str) or not init:
        raise UserError(f"init_from must be a path, got {init!r}")
    weights, source = init_source(init)
    base = None
    if source is not None:
        kwargs = {k: v for k, v in source.model_kwargs.items() if k not in models.DERIVED_MODEL_KWARGS}
        base = TrainSettings(**{k: copied(source[k]) for k in INHERITED}).replace(model_kwargs=kwargs)
    settings = resolve({**args, "init_from": str(weights)}, base=base, origin=f"the source run {weights.parent}")
    if Path(settings.output).resolve() == weights.parent.resolve():
        raise UserError(f"--init-from {init}: the weights are in the new run's own --output {settings.output}; give "
                        "another --output")
    return settings


def init_source(path) -> tuple[Path, TrainSettings | None]:
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


def _source_run(run: Path) -> TrainSettings:
    try:
        return load_run(run)
    except UserError as err:
        raise UserError(f"--init-from {run}: {err}") from None


def init_weights(model: torch.nn.Module, settings: TrainSettings) -> dict:
    """Load ``settings.init_from`` into ``model`` (:func:`visionpe.load_timm_checkpoint`: non-positional weights by
    name and shape, positional ones converted where possible) and return the report as a history record
    ``{'kind': 'init', 'source', 'source_pe', 'source_epoch', 'head_reset', 'kept', 'converted', 'new', 'dropped',
    'assumed'}`` (``assumed``: the grid of a ``pos_embed`` that neither ``--init-grid`` nor a source run gave).

    A non-positional weight that is dropped or new (another embed_dim, depth, patch size or model), or a classifier
    head that does not fit unless ``settings.init_head_reset`` (which leaves the head new), is a :class:`UserError`
    naming the keys; the model may then be partly loaded."""
    path = Path(settings.init_from)
    source_settings = _source_run(path.parent) if (path.parent / CONFIG).is_file() else None
    with user_errors(f"--init-from {path}", (ValueError, OSError)):
        state = io.read_state_dict(path)
    report = _load_converted(model, state, settings, f"--init-from {path}", source_settings, head_reset=settings.init_head_reset,
                             source_grid=init_grid(settings, source_settings, model, state))
    epoch = io.weights_metadata(path).get("epoch") if path.suffix == ".safetensors" else None
    return {"kind": "init", "source": str(path), "source_pe": source_settings.pe if source_settings else None,
            "source_epoch": int(epoch) if epoch is not None else None, "head_reset": settings.init_head_reset,
            **report}


def pretrained_weights(model: torch.nn.Module, settings: TrainSettings, pretrained: tuple[torch.nn.Module, str]) -> dict:
    """``--pretrained``: timm's pretrained weights of the run's model (``pretrained``: ``(timm's model, the name of
    its source)`` as :func:`visionpe.train.models.pretrained_source` gives them) into ``model`` through
    :func:`visionpe.load_timm_checkpoint`, reported as :func:`init_weights` reports. Where timm gives a new
    classifier head (other classes, or a local file) ``model`` keeps its own new head."""
    source_model, source = pretrained
    head_reset = settings.num_classes != source_model.pretrained_cfg.get("num_classes")  # timm's rule for a new head
    state = source_model.state_dict()
    grid = getattr(getattr(source_model, "patch_embed", None), "grid_size", None)  # the grid of its pos_embed
    report = _load_converted(model, state, settings, f"--pretrained {settings.model}", None, head_reset=head_reset,
                             source_grid=None if grid is None else tuple(grid))
    return {"kind": "init", "source": source, "source_pe": "timm", "source_epoch": None, "head_reset": head_reset,
            **report}


def init_grid(settings: TrainSettings, source_settings: TrainSettings | None, model: torch.nn.Module,
              state: dict) -> tuple[int, int] | None:
    """The patch grid of the ``pos_embed`` in ``state`` that ``--init-from`` reads into ``model``'s learned table:
    ``--init-grid H W``, else the source run's image grid (its ``config.yaml``), else None (a checkpoint of no run:
    :func:`visionpe.load_timm_checkpoint` assumes one and says so). ``--init-grid`` where nothing reads it (no
    ``pos_embed`` in the source, no learned table in the new model) is a :class:`UserError`, never ignored."""
    reads = "pos_embed" in state and convert.pos_embed_reader(model) is not None
    if settings.init_grid:
        if not reads:
            why = (f"the new model's pe={settings.pe} has no learned table" if "pos_embed" in state else
                   f"{settings.init_from} holds no pos_embed (a visionpe table stores its grid, RoPE has none)")
            raise UserError(f"--init-grid {' '.join(map(str, settings.init_grid))} is the patch grid of a timm "
                            f"pos_embed read into a learned table, but {why}; leave out --init-grid")
        return tuple(int(v) for v in settings.init_grid)
    if reads and source_settings is not None and not source_settings.num_frames:
        return models.run_grid(source_settings)
    return None


def _load_converted(model: torch.nn.Module, state: dict, settings: TrainSettings, what: str,
                    source_settings: TrainSettings | None, head_reset: bool, source_grid=None) -> dict:
    """``state`` into ``model`` by :func:`visionpe.load_timm_checkpoint` (without its classifier head when
    ``head_reset``; ``source_grid``: the grid of its ``pos_embed`` when known): ``{'kept', 'converted', 'new',
    'dropped', 'assumed'}``, or a :class:`UserError` when a non-positional weight does not fit (see
    :func:`init_weights`) or the grid does not fit the ``pos_embed``."""
    head = [k for k in state if convert.is_classifier(k)] if head_reset else []
    state = {k: v for k, v in state.items() if k not in head}
    positional = _positional_names(model)
    is_positional = lambda key: convert.is_positional(key) or key.startswith(positional)
    target = model.state_dict()
    quiet = logging.getLogger("visionpe.weights")
    was_disabled, quiet.disabled = quiet.disabled, True  # the report is printed by the caller
    try:
        with user_errors(what):  # a source grid that does not fit the pos_embed
            try:
                report = convert.load_timm_checkpoint(model, state, source_grid=source_grid)
            except convert.NothingFits as err:  # nothing loaded: named below with the runs' sizes
                report = err.report
    finally:
        quiet.disabled = was_disabled
    order = {k: i for i, k in enumerate(target)}
    loose = sorted((k for k in dict.fromkeys(report.dropped + report.new) if not is_positional(k)
                    and not (head_reset and convert.is_classifier(k))),
                   key=lambda k: order.get(k, len(order)))  # in the model's order
    if loose:
        def describe(key):
            if key in state and key in target:
                return f"{key} {_shape(state[key])} in the source, {_shape(target[key])} here"
            return f"{key} only in the {'source' if key in state else 'new model'}"
        shown = ", ".join(describe(k) for k in loose[:6]) + (f", ... {len(loose) - 6} more" if len(loose) > 6 else "")
        if all(convert.is_classifier(k) for k in loose):
            raise UserError(f"{what}: the classifier head does not fit ({shown}); pass --init-head-reset "
                            "to train a new head")
        source = "" if source_settings is None else f"source {source_settings.model} [{_sizes(source_settings)}], "
        raise UserError(f"{what} does not fit the new model ({source}new {settings.model} "
                        f"[{_sizes(settings)}] pe={settings.pe}): {shown}; only positional weights (and the head, with "
                        "--init-head-reset) may differ; leave out the model settings to take the source run's")
    return {"kept": report.kept, "converted": report.converted, "new": report.new, "dropped": report.dropped,
            "assumed": [note.replace(convert.GRID_HINT, "--init-grid H W") for note in report.assumed]}


def _positional_names(model) -> tuple[str, ...]:
    """Name prefixes (``name.``) of the model's encoding modules."""
    from .. import encodings_of
    modules = {id(m) for family in encodings_of(model).values() for m in family}
    return tuple(f"{name}." for name, m in model.named_modules() if id(m) in modules and name)


def _shape(t) -> str:
    return "x".join(map(str, t.shape)) or "scalar"


def _sizes(settings: TrainSettings) -> str:
    kw = settings.model_kwargs or {}
    sizes = [f"{k}={kw[k]}" for k in ("embed_dim", "depth", "num_heads") if k in kw]
    sizes += [f"{k}={getattr(settings, k)}" for k in ("patch_size", "in_chans", "num_classes")]
    return " ".join(sizes)


def init_text(record: dict) -> str:
    """The report of :func:`init_weights`: one summary line, then one line per converted, new and dropped key
    (and per positional weight kept as it was), and what was assumed about the source."""
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
    lines += [f"  assumed   {k}" for k in record.get("assumed", ())]
    return "\n".join(lines)
