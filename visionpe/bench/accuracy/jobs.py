"""A benchmark run's processes: train it (``python -m visionpe train ...``) unless it is finished with the settings
asked for now, then sweep it (``python -m visionpe sweep ...``) unless its sweep is current; each command in its own
process of this Python (the installed package, wherever the benchmark runs from), one thread each, its output
appended to the run's log."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ...train import rundir
from ...train.metrics import key_text
from .staleness import record_sweep, stale_settings, sweep_is_current


def job(cfg_path: Path, data: str, seed: int, run: Path, train_args: list[str], res, scalings, log_dir: Path,
        frames=(), protocols=(), tune=()) -> dict:
    """Train and sweep one run of the accuracy benchmark (``visionpe train --config CFG --data D --seed S
    TRAIN_ARGS ...``, its sweep under ``protocols``, default the run's own, with ``tune``: LookHere's protocol, see
    :func:`sweep_command`) as far as it is not up to date. Returns {'run', 'ok', 'seconds', 'log'}."""
    log = log_dir / f"{run.parent.parent.name}__{run.parent.name}__{run.name}.log"
    train = ["--config", str(cfg_path), "--data", data, "--seed", str(seed), "--output", str(run), "--threads", "1",
             "--no-progress", "--eval-res", *train_args]
    t0 = time.time()
    sweep = sweep_command(run, res, scalings, frames, protocols, tune)
    return {"run": run, "ok": run_logged(plan_run(run, train, sweep, log), log), "seconds": time.time() - t0,
            "log": log}


def plan_run(run: Path, train: list[str], sweep: list[str], log: Path) -> list[list[str]]:
    """The ``visionpe`` commands that bring ``run`` up to date: train (fresh, ``--resume`` of an interrupted run with
    the same settings, or ``--overwrite`` when the recipe or the row changed since it was trained, as the log says)
    unless it is finished with the settings asked for, then sweep unless :func:`sweep_is_current`."""
    commands = []
    changed = stale_settings(run, train) if (run / rundir.CONFIG).is_file() else []
    if changed:
        with open(log, "a") as f:
            f.write(f"# {run}: trained with other settings than asked for now: {'; '.join(changed)}; retraining\n")
    if changed or not (run / rundir.RESULTS).is_file():
        resume = (run / rundir.CONFIG).is_file() and not changed  # continued from its last saved epoch
        commands.append(["train", *train, "--resume" if resume else "--overwrite"])
    if commands or not sweep_is_current(run, sweep):
        commands.append(sweep)
    return commands


def sweep_command(run: Path, res, scalings, frames=(), protocols=(), tune=()) -> list[str]:
    """``visionpe sweep`` of a run's last weights, writing ``run/sweep/`` (``frames``: a video run's test frame
    counts; ``protocols``: evaluation protocols, default the run's own; ``tune``: the sweep's arguments of LookHere's
    protocol, ``["--tune"]`` or ``["--tune", "--holdout", N]``, none without it)."""
    return ["sweep", str(run), "--res", *map(key_text, res), "--scaling", *scalings,
            *(["--frames", *map(str, frames)] if frames else []),
            *(["--eval-protocol", *protocols] if protocols else []), *tune, "--out", str(run / "sweep")]


def run_logged(commands: list[list[str]], log: Path) -> bool:
    """Run each ``visionpe`` command (``[name, *args]``) as ``python -m visionpe name args`` with this Python, one
    thread each, appending its output to ``log``; stop at the first failure. True when all succeeded. A sweep that
    succeeds records what it was made from."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    with open(log, "a") as f:
        for cmd in commands:
            f.write(f"$ visionpe {shlex.join(cmd)}\n")
            f.flush()
            if subprocess.run([sys.executable, "-m", "visionpe", *cmd], stdout=f, stderr=subprocess.STDOUT,
                              env=env).returncode:
                return False
            if cmd[0] == "sweep":
                record_sweep(Path(cmd[1]), cmd)
    return True
