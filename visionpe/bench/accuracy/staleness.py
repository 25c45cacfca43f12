"""Whether a benchmark's finished run is the one asked for now (an edited recipe or row retrains it), whether its
sweep was made from its present results with the present arguments (else it is redone), and whether a run's record
(:mod:`.records`) holds the settings and sweep asked for now (its settings hash; else it is stale)."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

from ...cli import UserError
from ...train import models, restore, rundir, settings
from ...weights import write_text

READ_FROM_DATA = ("num_classes", "classes")  # settings a run reads from its data when it starts (None before)
SWEEP_SOURCE = "made_by.json"  # in run/sweep/: the results file and the arguments the sweep was made from


def stale_settings(run: Path, train: list[str]) -> list[str]:
    """What of the run in ``run`` differs from what ``visionpe train TRAIN`` would train now (an edited recipe,
    another row), as ``setting (old -> new)``; settings that do not change what is trained
    (``settings.SAFE_ON_RESUME``) are not differences. Empty when the run is the one asked for."""
    try:
        old = restore.load_run(run)
    except UserError as err:
        return [f"its config.yaml cannot be read ({err})"]
    return changed_settings(old, asked_settings(train, run))


def asked_settings(train: list[str], run: Path) -> dict:
    """The settings ``visionpe train TRAIN --output RUN`` resolves now (the recipe read as it is now). A run started
    from another run's weights (``--init-from SOURCE``) whose source holds no weights here yet (trained later in the
    same benchmark, or on another machine: its record only is here) is resolved as it will be once the source is
    trained with the same recipe: from ``SOURCE/last.safetensors``, the recipe's model and data settings."""
    args = {**settings.parse_args(train, prog="benchmark (a run's visionpe train arguments)"), "output": str(run)}
    source = Path(args["init_from"]) if args.get("init_from") is not None else None
    if source is not None and source.suffix not in restore.CHECKPOINT_SUFFIXES and \
            not (source / rundir.LAST).is_file():
        return settings.resolve({**args, "init_from": str(source / rundir.LAST)})
    return restore.new_config(args)


def changed_settings(old: dict, new: dict) -> list[str]:
    """The settings that differ from ``old`` to ``new`` and change what is trained, as ``setting (old -> new)``; an
    image folder's classes and their count (:data:`READ_FROM_DATA`) are read from the data when a run starts
    (``None`` before), so they differ only when both are known."""
    return [f"{key} ({a!r} -> {b!r})" for key, a, b in settings.refused_changes(old, new)
            if not (key in READ_FROM_DATA and None in (a, b))]


def defining_settings(cfg: dict) -> dict:
    """What of resolved settings ``cfg`` defines a run's numbers, in JSON form: its saved settings without the run's
    folder, without :data:`settings.SAFE_ON_RESUME` (threads, device, ...) and without the ``model_kwargs`` derived
    from the others, ``init_from`` relative to the run's folder (:func:`run_relative`); the part
    :func:`changed_settings` compares."""
    saved = settings.saved_form(run_relative(cfg))
    kept = {k: v for k, v in saved.items() if k != "output" and k not in settings.SAFE_ON_RESUME}
    kept["model_kwargs"] = {k: v for k, v in saved["model_kwargs"].items() if k not in models.DERIVED_MODEL_KWARGS}
    return json.loads(json.dumps(kept))


def run_relative(cfg):
    """Resolved settings ``cfg`` with ``init_from`` (the weights a run started from, an absolute path once resolved)
    relative to the run's own folder (``../../learned_e3/s0/last.safetensors``), so that a run started from another
    run of the same benchmark is the same run in a benchmark folder moved elsewhere (another machine's); unchanged
    without ``init_from`` or when it is relative already."""
    init = cfg["init_from"]
    if init is None or not Path(init).is_absolute() or not cfg["output"]:
        return cfg
    return cfg.replace(init_from=Path(os.path.relpath(init, Path(cfg["output"]).resolve())).as_posix())


def settings_sha256(cfg: dict, sweep_arguments: list[str]) -> str:
    """The hash of a run's record: sha256 of its :func:`defining_settings` and its sweep's arguments
    (:func:`sweep_arguments`), canonical JSON."""
    text = json.dumps({"train": defining_settings(cfg), "sweep": list(sweep_arguments)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def stale_record(record: dict, train: list[str], sweep: list[str], run: Path) -> list[str]:
    """What of a run's record (:mod:`.records`) differs from the run asked for now (``visionpe train TRAIN --output
    RUN``, then ``sweep``), as ``setting (old -> new)`` and ``sweep arguments (old -> new)``; empty when the record is
    current: its settings hash is the one asked for, or, where it is not, no setting and no sweep argument differs
    (a record made before a setting was added holds no value for it and is read at the setting's default, what its
    run trained with; so a new setting does not make every committed record stale)."""
    asked, arguments = asked_settings(train, run), sweep_arguments(sweep)
    old = {**settings.copied(settings.DEFAULTS), **record.get("settings", {})}
    asked = run_relative(read_from_data(asked, old))  # as the record holds it (:func:`.records.make_record`)
    if record.get("settings_sha256") == settings_sha256(asked, arguments):
        return []
    found = changed_settings(old, asked)
    if record.get("sweep") != arguments:
        found.append(f"sweep arguments ({shlex.join(record.get('sweep') or [])!r} -> {shlex.join(arguments)!r})")
    return found


def read_from_data(asked, made: dict):
    """The settings ``asked`` for now with those a run reads from its data when it starts (:data:`READ_FROM_DATA`:
    an image folder's classes and their count, None before) taken from the settings the run was ``made`` with, so
    that a record of an image-folder run can be current (a built-in data set's are known before: left as asked)."""
    known = {key: made[key] for key in READ_FROM_DATA if asked[key] is None and made.get(key) is not None}
    return asked.replace(**known) if known else asked


def sweep_is_current(run: Path, sweep: list[str]) -> bool:
    """``run/sweep/sweep.csv`` exists and was made by ``sweep`` from the run's present ``results.json``: the same
    arguments, ``--tune`` and ``--holdout`` included, so a sweep made with or without LookHere's protocol is redone
    when the other is asked for (the run itself is not retrained: :func:`stale_settings` reads its training
    arguments only)."""
    source = run / "sweep" / SWEEP_SOURCE
    if not (run / "sweep" / "sweep.csv").is_file() or not source.is_file() or not (run / rundir.RESULTS).is_file():
        return False
    try:
        made_by = json.loads(source.read_text())
    except ValueError:
        return False
    return made_by == sweep_record(run, sweep)


def sweep_record(run: Path, sweep: list[str]) -> dict:
    """What :data:`SWEEP_SOURCE` holds: the sweep's arguments (:func:`sweep_arguments`: a sweep made on another
    device or into another folder is the same sweep) and the sha256 of the results it swept."""
    return {"arguments": sweep_arguments(sweep),
            "results_sha256": hashlib.sha256((run / rundir.RESULTS).read_bytes()).hexdigest()}


def sweep_arguments(sweep: list[str]) -> list[str]:
    """The arguments of ``visionpe sweep RUN ARGS`` (``sweep``: ``["sweep", RUN, *ARGS]``) without the run, its
    output folder and its device, so that a benchmark folder can move (and a record made on a GPU stand beside one
    made on a CPU)."""
    arguments = sweep[2:]
    for flag in ("--out", "--device"):
        if flag in arguments:
            at = arguments.index(flag)
            arguments = arguments[:at] + arguments[at + 2:]
    return arguments


def record_sweep(run: Path, sweep: list[str]) -> None:
    """After a successful sweep of ``run``: remember what it was made from (:func:`sweep_is_current`)."""
    write_text(run / "sweep" / SWEEP_SOURCE, json.dumps(sweep_record(run, sweep)))
