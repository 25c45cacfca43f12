"""tests/train/test_parallel.py's checks on CUDA with nccl and the bf16 mixed-precision policy (scripts/gpu_check.sh
runs them): FSDP2 equals DDP in float32, the policy gives bf16 block weights and float32 encoding parameters and
gradients, and a run resumed from its DCP checkpoint continues as the uninterrupted one; the same for the training
command (`visionpe train --parallel fsdp --amp bf16`). Two processes on a machine with two GPUs or more, one on a
single GPU (nccl takes one rank per device)."""
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


TRAIN = ["--data", "shapes-position", "--train-samples", "64", "--val-samples", "32", "--batch-size", "16",
         "--epochs", "2", "--img-size", "16", "--patch-size", "4", "--embed-dim", "16", "--depth", "1",
         "--num-heads", "2", "--warmup-epochs", "0.5", "--lr", "3e-3", "--no-progress", "--pe", "rope_mixed",
         "--model-ema", "--parallel", "fsdp"]


def train(*args: str, device: str, processes: int) -> list[dict]:
    """``visionpe train`` under torchrun; the epoch records it wrote."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(processes), str(ROOT / "train_vit.py"), *args, "--device", device],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    out = Path(args[args.index("--output") + 1] if "--output" in args else args[args.index("--resume") + 1])
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]


def check_stopped_and_resumed(out: Path, *, amp: str, device: str, processes: int) -> None:
    """The run, and the same run stopped after its first epoch and resumed from its DCP checkpoint, end alike (near:
    CUDA kernels need not be deterministic)."""
    where = dict(device=device, processes=processes)
    full = train(*TRAIN, "--amp", amp, "--output", str(out / "full"), **where)
    train(*TRAIN, "--amp", amp, "--stop-after", "1", "--output", str(out / "cut"), **where)
    cut = train("--resume", str(out / "cut"), "--no-progress", **where)
    assert (out / "cut" / "checkpoint" / "latest").read_text().strip() == "epoch-2"
    assert len(full) == len(cut) == 2 and all(r["val_loss"] == r["val_loss"] for r in full)  # not NaN
    assert cut[1]["train_loss"] == pytest.approx(full[1]["train_loss"], rel=1e-2)


def test_the_training_command_under_fsdp_with_the_bf16_policy_resumes(tmp_path):
    """``visionpe train --parallel fsdp --amp bf16`` (bf16 parameters in the blocks, float32 encodings and logits)."""
    check_stopped_and_resumed(tmp_path, amp="bf16", device="cuda", processes=min(2, torch.cuda.device_count()))
