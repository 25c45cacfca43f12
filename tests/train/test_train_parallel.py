"""`visionpe train --parallel fsdp` end to end on tiny runs under torchrun (2 processes, gloo on the CPU): the same
training as one process to float rounding, distributed checkpoints in RUN/checkpoint/ that a SIGKILLed run resumes
from bit for bit on 2 processes (within an epoch too) and resharded on 1, results written once (rank 0). The
settings it refuses: tests/cli/test_cli_errors.py."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import requires
from safetensors.torch import load_file

from trainutil import ROOT, TINY, kill_torchrun, run_torchrun, train_main

TIMEOUT = 420  # seconds for one torchrun launch on a loaded 2-core machine (about 35 s when idle)
ARGS = TINY + ["--pe", "rope_mixed", "--model-ema", "--grad-accum-steps", "2"]  # learned frequencies, EMA, no_sync
pytestmark = requires("torch", "2.6", "torch.distributed.fsdp.fully_shard and DCP's state_dict API")


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            str(ROOT / "train_vit.py"), *args]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}


def run2(*args: str) -> str:
    """A 2-process run to its end; its stdout."""
    return run_torchrun(torchrun(*args), env=env(), timeout=TIMEOUT)


def run2_killed(args: list[str], *, line: str | None = None, commit: str | None = None) -> str:
    """A 2-process run SIGKILLed (launcher and workers) once a line of its output starts with ``line``, or once its
    ``--output``'s checkpoint/latest names a commit starting with ``commit``; returns the commit left."""
    out = Path(args[args.index("--output") + 1] if "--output" in args else args[args.index("--resume") + 1])
    latest = out / "checkpoint" / "latest"
    proc = subprocess.Popen(torchrun(*args), stdout=subprocess.PIPE if line else subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True, env=env(), cwd=ROOT, start_new_session=True)
    start, hit = time.monotonic(), False
    try:
        while not hit and proc.poll() is None and time.monotonic() - start < TIMEOUT:
            if line:
                hit = proc.stdout.readline().startswith(line)
            else:
                hit = latest.is_file() and latest.read_text().startswith(commit)
                time.sleep(0.005)
    finally:
        kill_torchrun(proc)
    assert hit, f"{out}: killed at {latest.read_text().strip() if latest.is_file() else 'no commit'}"
    return latest.read_text().strip()


def records(out: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("img_per_s", "epoch_time_s")} for r in rows]


def max_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One process without FSDP; the same run on 2 FSDP processes; that run SIGKILLed after its first epoch's commit,
    then resumed on 1 process (a copy) and on 2, which are killed again after a commit within the second epoch and
    resumed; a one-process run's first epoch (state.pt) resumed under FSDP."""
    base = tmp_path_factory.mktemp("fsdp-runs")
    dirs = {name: base / name for name in ("one", "fsdp", "killed", "resharded", "ddp_to_fsdp")}
    train_main(ARGS + ["--output", dirs["one"]])
    train_main(ARGS + ["--stop-after", "1", "--output", dirs["ddp_to_fsdp"]])
    train_main(["--resume", dirs["ddp_to_fsdp"], "--no-progress", "--parallel", "fsdp"])
    dirs["stdout"] = run2(*ARGS, "--parallel", "fsdp", "--output", str(dirs["fsdp"]))
    killed = str(dirs["killed"])
    dirs["committed"] = run2_killed([*ARGS, "--parallel", "fsdp", "--output", killed], line="epoch   1/2")
    dirs["finished when killed"] = (dirs["killed"] / "results.json").exists()  # none of its workers outlived the kill
    shutil.copytree(dirs["killed"], dirs["resharded"])
    # resumed with commits after every optimizer step, killed again after one of them, resumed again
    dirs["within"] = run2_killed(["--resume", killed, "--no-progress", "--checkpoint-every-steps", "1"],
                                 commit="epoch-1-step-")
    run2("--resume", killed, "--no-progress")
    train_main(["--resume", dirs["resharded"], "--no-progress"])  # 1 process: a group of one, FSDP as saved
    return dirs


def test_fsdp_on_two_processes_trains_as_one_process(runs):
    """Same global batches, gradients reduce-scattered instead of summed in one process: losses and weights agree
    to float rounding (measured about 1e-7 on the weights), far below how far training moved them."""
    assert "2 process(es)" in runs["stdout"]
    one, fsdp = records(runs["one"], "epoch"), records(runs["fsdp"], "epoch")
    assert len(one) == len(fsdp) == 2  # rank 0 alone writes the records
    for a, b in zip(one, fsdp):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
        assert b["ema_val_loss"] == pytest.approx(a["ema_val_loss"], rel=1e-5)
    assert one[0]["train_loss"] != one[1]["train_loss"]
    for name in ("last.safetensors", "ema.safetensors"):
        assert max_diff(runs["one"] / name, runs["fsdp"] / name) < 1e-5, name


def test_the_run_directory_of_a_sharded_run(runs):
    out = runs["fsdp"]
    assert (out / "results.json").is_file() and not (out / "state.pt").exists()
    assert (out / "checkpoint" / "latest").read_text().strip() == "epoch-2"
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["epoch-2", "latest"]  # older commits removed
    assert len(records(out, "eval_res")) == len(records(runs["one"], "eval_res"))  # evaluated once, reported once


def test_a_killed_run_resumes_bit_for_bit_and_on_one_process(runs):
    assert runs["committed"] == "epoch-1"  # killed after the first epoch's commit, before the second's
    assert runs["within"].startswith("epoch-1-step-")  # and after a commit within the second
    assert not runs["finished when killed"]
    fsdp, killed, resharded = runs["fsdp"], runs["killed"], runs["resharded"]
    for kind in ("epoch", "eval_res"):
        assert untimed(records(killed, kind)) == untimed(records(fsdp, kind))
    for name in ("last.safetensors", "ema.safetensors"):
        assert max_diff(killed / name, fsdp / name) == 0.0, name
    # resharded 2 -> 1: the first epoch carried over exactly, the next one to float rounding
    first, second = records(resharded, "epoch")
    assert untimed([first]) == untimed(records(fsdp, "epoch")[:1])
    assert second["train_loss"] == pytest.approx(records(fsdp, "epoch")[1]["train_loss"], rel=1e-5)
    assert max_diff(resharded / "last.safetensors", fsdp / "last.safetensors") < 1e-5


def test_a_state_pt_commit_resumes_under_fsdp(runs):
    """The whole weights and optimizer moments of state.pt loaded into the shards; the run then commits distributed
    checkpoints only (one commit point)."""
    out = runs["ddp_to_fsdp"]
    assert not (out / "state.pt").exists() and (out / "checkpoint" / "latest").is_file()
    assert untimed(records(out, "epoch")[:1]) == untimed(records(runs["one"], "epoch")[:1])
    assert max_diff(out / "last.safetensors", runs["one"] / "last.safetensors") < 1e-6


def test_checkpointed_blocks_and_channels_last_batches_train_as_without(runs, tmp_path):
    """One FSDP process (a group of one): activation checkpointing per block recomputes the same gradients;
    channels-last applies to the batches (FSDP2 shards contiguous parameters only)."""
    out = tmp_path / "checkpointed"
    train_main(ARGS + ["--parallel", "fsdp", "--grad-checkpointing", "--channels-last", "--output", out])
    assert max_diff(out / "last.safetensors", runs["one"] / "last.safetensors") < 1e-6
    assert max_diff(out / "ema.safetensors", runs["one"] / "ema.safetensors") < 1e-6


def test_a_meta_device_build_trains_with_its_ema(runs, tmp_path):
    """--meta-init: built on the meta device, sharded, then materialised and initialised (fresh draws, not the
    device build's numbers); the EMA copy starts from the same weights."""
    out = tmp_path / "meta"
    train_main(ARGS + ["--parallel", "fsdp", "--meta-init", "--epochs", "1", "--output", out])
    last, ema = load_file(out / "last.safetensors"), load_file(out / "ema.safetensors")
    assert last.keys() == ema.keys() == load_file(runs["one"] / "last.safetensors").keys()
    assert all(bool(torch.isfinite(t).all()) for t in last.values())
    assert max_diff(out / "last.safetensors", runs["one"] / "last.safetensors") > 1e-3
    assert all(math.isfinite(r["val_loss"]) and math.isfinite(r["ema_val_loss"]) for r in records(out, "epoch"))
