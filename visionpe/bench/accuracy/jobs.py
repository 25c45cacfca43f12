"""A benchmark run's processes: train it (``python -m visionpe train ...``) unless it is finished with the settings
asked for now, then sweep it (``python -m visionpe sweep ...``) unless its sweep is current; each command in its own
process of this Python (the installed package, wherever the benchmark runs from), one thread each, its output
appended to the run's log; the machine and wall time of each step noted in the run's folder (:mod:`.records`)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ...train import rundir
from ...train.metrics import key_text
from ..machine import resolved_device
from .records import note_machine
from .staleness import asked_settings, record_sweep, stale_settings, sweep_is_current


def job(cfg_path: Path, data: str, seed: int, run: Path, train_args: list[str], res, scalings, log_dir: Path,
        frames=(), protocols=(), tune=()) -> dict:
    """Train and sweep one run of the accuracy benchmark (``visionpe train --config CFG --data D --seed S
    TRAIN_ARGS ...``, its sweep under ``protocols``, default the run's own, with ``tune``: LookHere's protocol, see
    :func:`sweep_command`) as far as it is not up to date. Returns {'run', 'ok', 'seconds', 'log'}."""
    log = log_dir / f"{run.parent.parent.name}__{run.parent.name}__{run.name}.log"
    train = train_command(cfg_path, data, seed, run, train_args)
    t0 = time.time()
    sweep = sweep_command(run, res, scalings, frames, protocols, tune, run_device(train, run))
    return {"run": run, "ok": run_logged(plan_run(run, train, sweep, log), log), "seconds": time.time() - t0,
            "log": log}


def train_command(cfg_path: Path, data: str, seed: int, run: Path, train_args: list[str]) -> list[str]:
    """The ``visionpe train`` arguments of one benchmark run (one thread, no progress bar, no extra evaluation)."""
    return ["--config", str(cfg_path), "--data", data, "--seed", str(seed), "--output", str(run), "--threads", "1",
            "--no-progress", "--eval-res", *train_args]


def run_device(train: list[str], run: Path) -> str:
    """Where a run trains and is swept (``visionpe train TRAIN``): ``cuda`` when it asks for it (``--device cuda``,
    or ``auto`` with a CUDA device here), else ``cpu``."""
    return resolved_device(asked_settings(train, run)["device"])


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


def sweep_command(run: Path, res, scalings, frames=(), protocols=(), tune=(), device: str = "cpu") -> list[str]:
    """``visionpe sweep`` of a run's last weights, writing ``run/sweep/`` (``scalings``: RoPE's adaptations, none
    for the run's own; ``frames``: a video run's test frame counts; ``protocols``: evaluation protocols, default the run's own; ``tune``: the sweep's arguments of LookHere's
    protocol, ``["--tune"]`` or ``["--tune", "--holdout", N]``, none without it; ``device``: ``cpu`` or ``cuda``)."""
    return ["sweep", str(run), "--res", *map(key_text, res), *(["--scaling", *scalings] if scalings else []),
            *(["--frames", *map(str, frames)] if frames else []),
            *(["--eval-protocol", *protocols] if protocols else []), *tune,
            *(["--device", device] if device != "cpu" else []), "--out", str(run / "sweep")]


def run_logged(commands: list[list[str]], log: Path) -> bool:
    """Run each ``visionpe`` command (``[name, *args]``) as ``python -m visionpe name args`` with this Python, one
    thread each, appending its output to ``log``; stop at the first failure. True when all succeeded. A sweep that
    succeeds records what it was made from; every step notes this machine when it starts and its wall time when it
    succeeded (:func:`.records.note_machine`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    with open(log, "a") as f:
        for cmd in commands:
            f.write(f"$ visionpe {shlex.join(cmd)}\n")
            f.flush()
            run, device, resumed = step_of(cmd)
            note_machine(run, cmd[0], device, resumed=resumed)  # first: a kill after the step's work names it
            t0 = time.time()
            if subprocess.run([sys.executable, "-m", "visionpe", *cmd], stdout=f, stderr=subprocess.STDOUT,
                              env=env).returncode:
                return False
            if cmd[0] == "sweep":
                record_sweep(run, cmd)
            note_machine(run, cmd[0], device, time.time() - t0, resumed=resumed)
    return True


def step_of(cmd: list[str]) -> tuple[Path, str, bool]:
    """A ``visionpe train`` or ``sweep`` command's run folder, the device it runs on (``cpu`` or ``cuda``) and whether
    it continues an interrupted training (``--resume``)."""
    if cmd[0] == "sweep":
        return Path(cmd[1]), cmd[cmd.index("--device") + 1] if "--device" in cmd else "cpu", False
    run = Path(cmd[cmd.index("--output") + 1])
    return run, run_device(cmd[1:], run), "--resume" in cmd
