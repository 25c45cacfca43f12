"""Helpers for the tests of the command lines: run train_vit.py or a `visionpe` command in this process, exactly as
`python train_vit.py ARGV` (runpy executes the checkout's thin wrapper as __main__) or `visionpe NAME ARGV` would run
it, or build a command's parser without running it."""
from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "train_vit.py"

TINY = ["--data", "shapes-position", "--train-samples", "64", "--val-samples", "32", "--batch-size", "16",
        "--epochs", "2", "--img-size", "16", "--patch-size", "4", "--embed-dim", "16", "--depth", "1",
        "--num-heads", "2", "--warmup-epochs", "0.5", "--lr", "3e-3", "--no-progress", "--threads", "1"]


def train_main(argv):
    """``python train_vit.py *argv`` in this process; returns what its ``main`` returned. A user mistake raises
    ``SystemExit(2)`` after printing one line on stderr, as the script does."""
    with mock.patch.object(sys, "argv", [str(TRAIN), *map(str, argv)]):
        return runpy.run_path(str(TRAIN), run_name="__main__")["result"]


COMMAND_OF = {"resolution_sweep": "sweep"}  # a test's name of a command that is not its own with "_" for "-"


def run_script(name: str, argv):
    """``visionpe NAME *argv`` in this process (``name`` with ``_`` for ``-``, or ``resolution_sweep`` for
    ``sweep``); returns what the command's function returned. A user mistake raises ``SystemExit(2)`` after printing
    one line on stderr."""
    from visionpe.cli.commands import main
    return main([COMMAND_OF.get(name, name.replace("_", "-")), *map(str, argv)])


RUN = subprocess.run


def in_process(cmd, stdout=None, stderr=None, **kwargs):
    """``python -m visionpe ARGS`` (a benchmark run's train or sweep) in this process, its output to ``stdout``: the
    run's own process saved (seconds of imports); any other command runs. A benchmark's test patches it in for
    ``subprocess.run`` of :mod:`visionpe.bench.accuracy.jobs`."""
    if cmd[1:3] != ["-m", "visionpe"]:
        return RUN(cmd, stdout=stdout, stderr=stderr, **kwargs)
    from visionpe.cli.commands import main
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stdout):
        try:
            main(cmd[3:])  # returned: exit status 0, as the console script's
            code = 0
        except SystemExit as exit_:
            code = exit_.code
    return subprocess.CompletedProcess(cmd, code)


def parser_of(command: str):
    """The argument parser of ``visionpe COMMAND`` (its module's ``build_parser``; training's lives in settings)."""
    if command == "train":
        from visionpe.train import settings
        return settings.build_parser()
    from visionpe.cli.commands import COMMANDS
    module, _, _ = COMMANDS[command].target.partition(":")
    return importlib.import_module(module).build_parser()


def write_jpeg_folder(root: Path) -> Path:
    """A tiny JPEG ImageFolder under ``root``: 3 classes (a dominant colour each), 4 train and 2 val JPEGs per class,
    each of its own size and aspect ratio (from 3:1 wide to 1:3 tall)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    sizes = [(40, 120), (96, 32), (50, 50), (37, 61), (75, 44), (28, 90)]
    for c in range(3):
        for split, picks in (("train", sizes[:4]), ("val", sizes[4:])):
            (root / split / f"c{c}").mkdir(parents=True, exist_ok=True)
            for i, (h, w) in enumerate(picks):
                h, w = h + 3 * c, w + 5 * c  # no two images of one size
                pixels = rng.integers(0, 90, (h, w, 3), dtype=np.uint8)
                pixels[..., c] += 150
                Image.fromarray(pixels).save(root / split / f"c{c}" / f"{i}.jpg", quality=90)
    return root


def children_of(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (read from Linux's /proc; none elsewhere)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def kill_torchrun(proc) -> None:
    """SIGKILL a torchrun launcher started with ``start_new_session=True`` (``proc``: its ``subprocess.Popen``) and
    its workers (each in a session of its own: not in the launcher's group), and wait until no worker runs."""
    workers = children_of(proc.pid)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):  # ended and reaped already
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    while any(alive(pid) for pid in workers):
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def run_torchrun(command: list[str], *, env: dict, timeout: float) -> str:
    """Run a torchrun ``command`` to its end; its stdout. A non-zero exit fails the test with the end of its stderr;
    past ``timeout`` seconds its workers get SIGABRT (faulthandler prints their stacks, with PYTHONFAULTHANDLER=1 in
    ``env``), then it is killed and the test fails with them."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in children_of(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        time.sleep(2)  # the stacks written
        kill_torchrun(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(command[3:])} did not finish within {timeout} s:\n{stderr[-6000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    return stdout
