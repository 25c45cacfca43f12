"""A run folder from elsewhere, or one edited or damaged (issue 43): nothing in it runs code on any resume path (one
process, --parallel fsdp, torchrun on 2 processes, a state.pt run with a planted checkpoint/), and every edited or
damaged file is one line naming it, never a run that trains or reports from it. Each payload would create a marker
file if anything unpickled it as DCP or pickle.load would; the marker must never exist. The restricted DCP reader
itself: tests/train/test_parallel.py."""
from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import requires
from safetensors.torch import load_file, save_file
from trainutil import ROOT, TINY, train_main

from visionpe.train import parallel

FSDP = requires("torch", "2.6", "torch.distributed.fsdp.fully_shard and DCP's state_dict API")


class Touch:
    """Creates ``marker`` when unpickled with ``pickle.load`` or ``torch.load(weights_only=False)``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


class System(Touch):
    """The same through ``os.system``."""

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def refused(argv, capsys) -> str:
    """``visionpe train ARGV`` exits 2 with one line on stderr; that line."""
    with pytest.raises(SystemExit) as exit_info:
        train_main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("visionpe train: error: "), err
    return err


def copy_run(run: Path, tmp_path: Path, name: str = "run") -> Path:
    out = tmp_path / name
    shutil.copytree(run, out)
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """A state.pt run stopped after its first epoch of two."""
    out = tmp_path_factory.mktemp("plain") / "run"
    train_main(TINY + ["--output", out, "--stop-after", "1"])
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    train_main(TINY + ["--output", out, "--epochs", "1"])
    return out


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A --parallel fsdp run (one process: a group of one) stopped after its first epoch of two."""
    out = tmp_path_factory.mktemp("sharded") / "run"
    train_main(TINY + ["--output", out, "--stop-after", "1", "--parallel", "fsdp"])
    return out


def commit_of(run: Path) -> Path:
    return parallel.latest_checkpoint(run / "checkpoint")


def plant_value(folder: Path, fqn: str, value) -> None:
    """Point the DCP index of ``folder`` at a new data file holding ``torch.save(value)`` for the entry ``fqn``
    (written with pickle, as DCP writes it)."""
    import dataclasses
    blob = folder / "__9_0.distcp"
    with open(blob, "wb") as f:
        torch.save(value, f)
    metadata = parallel.read_metadata(folder)
    for index, info in metadata.storage_data.items():
        if index.fqn == fqn:
            metadata.storage_data[index] = dataclasses.replace(info, relative_path=blob.name, offset=0,
                                                               length=blob.stat().st_size)
    (folder / parallel.METADATA).write_bytes(pickle.dumps(metadata))


# -- nothing runs code ----------------------------------------------------------------------------------------------
@FSDP
@pytest.mark.parametrize("payload", [Touch, System])
def test_a_crafted_dcp_index_runs_nothing_on_a_one_process_fsdp_resume(sharded, tmp_path, capsys, payload):
    out = copy_run(sharded, tmp_path)
    marker = tmp_path / "ran"
    index = commit_of(out) / parallel.METADATA
    good = index.read_bytes()
    index.write_bytes(pickle.dumps(payload(marker)))
    err = refused(["--resume", out], capsys)
    assert not marker.exists()
    assert f"{index} names" in err and "refused unread" in err and "--overwrite" in err, err
    index.write_bytes(good)  # the genuine index: the restricted reader loads it, the run finishes
    train_main(["--resume", out])
    assert (out / "results.json").is_file() and not marker.exists()


@FSDP
@pytest.mark.parametrize("fqn", ["extra", "optimizer.param_groups.0.lr", "model.cls_token"])
def test_a_crafted_value_of_a_dcp_data_file_runs_nothing(sharded, tmp_path, capsys, fqn):
    """DCP reads the values that are no tensor (the optimizer's hyperparameters, the extra) with
    torch.load(weights_only=False); visionpe's planner with weights_only=True, as tensors are read."""
    out = copy_run(sharded, tmp_path)
    marker = tmp_path / "ran"
    plant_value(commit_of(out), fqn, Touch(marker))
    err = refused(["--resume", out], capsys)
    assert not marker.exists()
    assert str(commit_of(out)) in err and "refused unread" in err and "getattr" in err, err


@FSDP
def test_a_crafted_dcp_index_runs_nothing_under_torchrun(sharded, tmp_path):
    """2 processes resume a commit of 1 (an epoch's end: DCP reshards); every rank refuses before any collective."""
    out = copy_run(sharded, tmp_path)
    marker = tmp_path / "ran"
    index = commit_of(out) / parallel.METADATA
    index.write_bytes(pickle.dumps(Touch(marker)))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train_vit.py"), "--resume", str(out)],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT,
                          timeout=300)
    assert proc.returncode != 0 and not marker.exists()
    lines = [line for line in proc.stderr.splitlines() if line.startswith("visionpe train: error:")]
    assert lines and all(f"{index} names" in line for line in lines), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr.split("visionpe train: error:")[0], proc.stderr[-3000:]


def test_a_planted_checkpoint_in_a_state_pt_run_is_named_and_refused(plain, tmp_path, capsys):
    """A run that commits state.pt (parallel: ddp) with a newer checkpoint/ beside it: never preferred, never read."""
    out = copy_run(plain, tmp_path)
    marker = tmp_path / "ran"
    folder = out / "checkpoint" / "epoch-9"
    folder.mkdir(parents=True)
    (folder / parallel.METADATA).write_bytes(pickle.dumps(Touch(marker)))
    (out / "checkpoint" / parallel.LATEST).write_text("epoch-9\n")
    err = refused(["--resume", out], capsys)
    assert not marker.exists()
    assert f"{folder} (epoch 9) is no older than {out / 'state.pt'} (epoch 1)" in err, err
    assert "parallel: ddp, which commits state.pt" in err and "remove it" in err, err
    shutil.rmtree(out / "checkpoint")  # as the message says: the run's own commit resumes
    train_main(["--resume", out])
    assert (out / "results.json").is_file() and not marker.exists()


# -- edited or damaged files ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, shown", [
    ("epoch", -1, "epoch -1 (an integer >= 1"),
    ("epoch", 2, "epoch 2 with a history of the epochs [1]"),
    ("epoch", "1", "epoch '1'"),
    ("best_epoch", 5, "best_epoch 5 (an epoch from 1 to 1"),
    ("best_acc", float("nan"), "best_acc nan"),
    ("history", json.dumps([{"kind": "epoch", "epoch": 1}] * 2), "epoch 1 with a history of the epochs [1, 1]"),
    ("progress", {"step": 7, "sums": [[0.0, 0]]}, "progress step 7 within an epoch of 4 batches"),
])
def test_a_state_pt_out_of_range_is_named_and_refused(plain, tmp_path, capsys, field, value, shown):
    """state.pt with epoch -1 used to train "epoch 0" at a negative learning rate and list epoch 1 twice."""
    out = copy_run(plain, tmp_path)
    state = torch.load(out / "state.pt", weights_only=True)
    state[field] = value
    torch.save(state, out / "state.pt")
    before = (out / "metrics.jsonl").read_text()
    err = refused(["--resume", out], capsys)
    assert f"{out / 'state.pt'} is damaged or was edited: it holds {shown}" in err and "--overwrite" in err, err
    assert (out / "metrics.jsonl").read_text() == before


def test_an_edited_config_yaml_is_named_and_refused(plain, tmp_path, capsys):
    """config.yaml edited to lr: 0.5 used to resume on the saved schedule while the run kept saying 0.5."""
    out = copy_run(plain, tmp_path)
    config = yaml.safe_load((out / "config.yaml").read_text())
    lr, config["lr"], config["weight_decay"] = config["lr"], 0.5, 0.01
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    err = refused(["--resume", out], capsys)
    assert f"{out / 'config.yaml'} differs from the settings {out / 'state.pt'} was trained with" in err, err
    assert f"lr ({lr!r} in state.pt, 0.5 in config.yaml)" in err and "weight_decay (0.05 in state.pt" in err, err
    config["eval_res"] = [12, 20]  # what --resume may change anyway: not refused
    config["lr"], config["weight_decay"] = lr, 0.05
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    train_main(["--resume", out])
    assert set(json.loads((out / "results.json").read_text())["results"]["last"]) == {"12", "16", "20"}


@FSDP
def test_an_edited_config_yaml_of_a_sharded_run_is_named_and_refused(sharded, tmp_path, capsys):
    out = copy_run(sharded, tmp_path)
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["seed"] = 7
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    err = refused(["--resume", out], capsys)
    assert f"differs from the settings {commit_of(out)} was trained with: seed (0 in epoch-1, 7 in config.yaml)" \
        in err, err


def test_a_finished_run_with_non_finite_weights_reports_nothing(finished, tmp_path, capsys):
    """--resume of a finished run whose last.safetensors holds a NaN used to exit 0 and rewrite results.json from it
    (state.pt's weights good)."""
    out = copy_run(finished, tmp_path)
    weights = load_file(out / "last.safetensors")
    name = next(iter(weights))
    weights[name].view(-1)[0] = math.nan
    save_file(weights, out / "last.safetensors", {"epoch": "1"})
    results = (out / "results.json").read_text()
    err = refused(["--resume", out], capsys)
    assert f"weights file '{out / 'last.safetensors'}' holds 1 NaN or infinite value(s) in '{name}'" in err, err
    assert (out / "results.json").read_text() == results


@pytest.mark.parametrize("part", ["model", "optimizer"])
def test_non_finite_values_in_state_pt_are_named_as_the_checkpoints(plain, tmp_path, capsys, part):
    """A NaN in state.pt's weights or optimizer state used to train on and be blamed on the learning rate and the
    data; training never commits one, so it is a damaged or edited file, named with the tensor (issue 43)."""
    out = copy_run(plain, tmp_path)
    state = torch.load(out / "state.pt", weights_only=True)
    if part == "model":
        name = next(iter(state["model"]))
        state["model"][name].view(-1)[0] = math.nan
        shown = f"{out / 'state.pt'}'s model holds 1 NaN or infinite value(s) in '{name}'"
    else:
        param = next(iter(state["optimizer"]["state"]))
        state["optimizer"]["state"][param]["exp_avg_sq"].view(-1)[0] = math.inf
        shown = f"{out / 'state.pt'}'s optimizer state holds 1 NaN or infinite value(s) in '{param}.exp_avg_sq'"
    torch.save(state, out / "state.pt")
    err = refused(["--resume", out], capsys)
    assert shown in err and "damaged or was edited (not a learning rate or data problem)" in err, err
    assert "--lr" not in err


def plant_nan(folder: Path, fqn: str, index: int) -> None:
    """A NaN at flat ``index`` of the tensor ``fqn`` of the distributed checkpoint ``folder``, the rest zeros."""
    value = torch.zeros(parallel.read_metadata(folder).state_dict_metadata[fqn].size)
    value.view(-1)[index] = math.nan
    plant_value(folder, fqn, value)


@FSDP
@pytest.mark.parametrize("fqn, shown", [("model.cls_token", "model holds 1 NaN or infinite value(s) in 'cls_token'"),
                                        ("optimizer.state.cls_token.exp_avg_sq",
                                         "optimizer state holds 1 NaN or infinite value(s) in 'cls_token.exp_avg_sq'")])
def test_non_finite_values_in_a_distributed_checkpoint_are_named_as_the_checkpoints(sharded, tmp_path, capsys, fqn,
                                                                                   shown):
    """As in state.pt: a NaN in a --parallel fsdp commit's weights or optimizer state used to train on and be blamed on
    the learning rate and the data (issue 43)."""
    out = copy_run(sharded, tmp_path)
    plant_nan(commit_of(out), fqn, 0)
    err = refused(["--resume", out], capsys)
    assert f"{commit_of(out)}'s {shown}" in err and "damaged or was edited (not a learning rate" in err, err
    assert "--lr" not in err


@FSDP
def test_a_non_finite_value_in_another_processs_shard_is_refused_by_every_process(sharded, tmp_path):
    """2 processes resume a commit of 1; the NaN lands in rank 1's shard (the last row of fc1.weight), and rank 0
    names it too: every process counts its own shards and the counts are summed, so all refuse together."""
    out = copy_run(sharded, tmp_path)
    plant_nan(commit_of(out), "model.blocks.0.mlp.fc1.weight", -1)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train_vit.py"), "--resume", str(out)],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT,
                          timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("visionpe train: error:")]
    assert proc.returncode != 0 and lines, proc.stderr[-3000:]
    assert all(f"{commit_of(out)}'s model holds 1 NaN or infinite value(s) in 'blocks.0.mlp.fc1.weight' (64, 16)"
               in line for line in lines), lines
