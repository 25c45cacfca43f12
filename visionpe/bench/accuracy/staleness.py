"""Whether a benchmark's finished run is the one asked for now (an edited recipe or row retrains it) and whether its
sweep was made from its present results with the present arguments (else it is redone)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ...cli import UserError
from ...train import restore, rundir, settings
from ...weights import write_text

SWEEP_SOURCE = "made_by.json"  # in run/sweep/: the results file and the arguments the sweep was made from


def stale_settings(run: Path, train: list[str]) -> list[str]:
    """What of the run in ``run`` differs from what ``visionpe train TRAIN`` would train now (an edited recipe,
    another row), as ``setting (old -> new)``; settings that do not change what is trained
    (``settings.SAFE_ON_RESUME``) are not differences. Empty when the run is the one asked for."""
    asked = {**settings.parse_args(train, prog="benchmark (a run's visionpe train arguments)"), "output": str(run)}
    try:
        old = restore.load_run(run)
    except UserError as err:
        return [f"its config.yaml cannot be read ({err})"]
    return [f"{key} ({a!r} -> {b!r})" for key, a, b in settings.refused_changes(old, restore.new_config(asked))]


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
    """What :data:`SWEEP_SOURCE` holds: the sweep's arguments (``visionpe sweep RUN ARGS``: ARGS without the output
    folder, so a benchmark folder can move) and the sha256 of the results it swept."""
    arguments = sweep[2:]
    if "--out" in arguments:
        at = arguments.index("--out")
        arguments = arguments[:at] + arguments[at + 2:]
    return {"arguments": arguments, "results_sha256": hashlib.sha256((run / rundir.RESULTS).read_bytes()).hexdigest()}


def record_sweep(run: Path, sweep: list[str]) -> None:
    """After a successful sweep of ``run``: remember what it was made from (:func:`sweep_is_current`)."""
    write_text(run / "sweep" / SWEEP_SOURCE, json.dumps(sweep_record(run, sweep)))
