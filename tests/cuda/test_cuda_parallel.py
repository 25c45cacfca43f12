"""tests/train/test_parallel.py's checks on CUDA with nccl and the bf16 mixed-precision policy (scripts/gpu_check.sh
runs them): FSDP2 equals DDP in float32, the policy gives bf16 block weights and float32 encoding parameters and
gradients, and a run resumed from its DCP checkpoint continues as the uninterrupted one. Two processes on a machine
with two GPUs or more, one on a single GPU (nccl takes one rank per device)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import requires

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "train" / "parallel_worker.py"
pytestmark = [pytest.mark.cuda, requires("torch", "2.6", "torch.distributed.fsdp.fully_shard")]


def run(*args: str) -> None:
    processes = min(2, torch.cuda.device_count())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(processes), str(WORKER), *args, "--backend", "nccl"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]


def test_fsdp_equals_ddp_and_the_bf16_policy_keeps_encodings_float32(tmp_path):
    run("equal", str(tmp_path), "--bf16")
    report = json.loads((tmp_path / "equal.json").read_text())
    assert report.pop("bf16") == {"block": "torch.bfloat16", "rotary": "torch.float32", "tokens": "torch.float32",
                                  "grad": "torch.float32"}
    for pe, got in report.items():
        assert got["keys_equal"] and got["sharded"] and got["moved"] > 1e-2, pe
        assert got["max_diff"] < 1e-4 and got["ema_max_diff"] < 1e-4, (pe, got)


def test_a_resumed_bf16_run_continues_as_the_uninterrupted_one(tmp_path):
    run("train", str(tmp_path / "full"), "--steps", "3", "--bf16")
    run("train", str(tmp_path / "cut"), "--steps", "2", "--bf16")
    run("train", str(tmp_path / "cut"), "--steps", "3", "--bf16", "--resume", str(tmp_path / "cut" / "checkpoint"))
    full, cut = (json.loads((tmp_path / d / "losses.json").read_text()) for d in ("full", "cut"))
    assert len(cut) == 3 and cut[:2] == pytest.approx(full[:2], rel=1e-3)
    assert cut[2] == pytest.approx(full[2], rel=1e-3)  # CUDA kernels need not be deterministic: near, not bitwise
