"""Helpers for the tests of the command lines: run train_vit.py or a script in this process, exactly as
`python train_vit.py ARGV` or `python scripts/NAME.py ARGV` would run it (nothing imports them; runpy executes the
file as __main__: the checkout's thin wrapper over the `visionpe` command, so the package's command runs through it),
or build a command's parser without running it."""
from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path
from unittest import mock

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


def script_path(name: str) -> Path:
    return ROOT / "scripts" / f"{name}.py"


def run_script(name: str, argv):
    """``python scripts/NAME.py *argv`` in this process; returns what its ``main`` returned (the script keeps it in
    ``result``). A user mistake raises ``SystemExit(2)`` after printing one line on stderr."""
    path = script_path(name)
    with mock.patch.object(sys, "argv", [str(path), *map(str, argv)]):
        return runpy.run_path(str(path), run_name="__main__")["result"]


def parser_of(command: str):
    """The argument parser of ``visionpe COMMAND`` (its module's ``build_parser``; training's lives in settings)."""
    if command == "train":
        from visionpe.train import settings
        return settings.build_parser()
    from visionpe.cli.commands import COMMANDS
    module, _, _ = COMMANDS[command].target.partition(":")
    return importlib.import_module(module).build_parser()
