"""Helpers for the training tests: run train_vit.py in this process, exactly as `python train_vit.py ARGV` would
run it (nothing imports train_vit.py; runpy executes it as __main__)."""
from __future__ import annotations

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
