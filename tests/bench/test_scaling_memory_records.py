"""Results as data for ``visionpe scaling-memory``: ``--out`` writes a record (command, settings and their hash,
machine and versions, each (model, mode)'s ranks, wall time) and the table is made from it, so ``--report-only``
prints the same table on any machine; a record made on a GPU names the GPU. torchrun is replaced by a stand-in
that prints what rank 0 prints (the measurement itself is tests/train/test_parallel.py's)."""
from __future__ import annotations

import json
import subprocess

import pytest

from visionpe.bench import scaling_memory
from visionpe.cli import UserError

GIB = 2 ** 30
RUN = subprocess.run


def torchrun(cmd, **kwargs):
    """What ``torchrun ... scaling-memory --worker MODEL MODE`` prints: rank 0's line of every rank's bytes (any
    other command, e.g. git's for the machine's visionpe version, runs)."""
    if "--worker" not in cmd:
        return RUN(cmd, **kwargs)
    model, mode = cmd[cmd.index("--worker") + 1:cmd.index("--worker") + 3]
    share = 0.5 if mode == "fsdp" else 1.0
    rank = {"parameters": share * GIB, "gradients": share * GIB, "optimizer": 2 * share * GIB, "peak_rss": 5.0 * GIB,
            "rss_before": 0.5 * GIB}
    line = json.dumps({"model": model, "mode": mode, "ranks": [rank, rank]})
    return subprocess.CompletedProcess(cmd, 0, stdout=f"noise\n{line}\n", stderr="")


def test_the_table_is_made_from_the_record_and_rebuilt_from_it_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(scaling_memory.subprocess, "run", torchrun)
    out = tmp_path / "memory.json"
    argv = ["--models", "vit_x", "--modes", "ddp", "fsdp", "--batch-size", "2", "--out", str(out)]
    assert scaling_memory.main(argv) == 0
    printed = capsys.readouterr().out
    record = scaling_memory.read_record(out)
    assert record["settings"] == {"models": ["vit_x"], "modes": ["ddp", "fsdp"], "processes": 2, "batch_size": 2,
                                  "img_size": 224, "pe": "learned", "device": "cpu"}
    assert len(record["settings_sha256"]) == 64 and record["made_by"]["torch"] and record["wall_s"] >= 0
    assert record["command"] == "visionpe scaling-memory " + " ".join(argv)
    assert "| vit_x | fsdp | 0.50 GiB | 0.50 GiB | 1.00 GiB | 2.00 GiB | 5.00 GiB | 0.50 GiB |" in printed
    assert f"cores; {record['made_by']['platform']}; python" in printed and "CUDA" not in printed
    gpu = tmp_path / "gpu.json"  # the same measurement, as a record made on a GPU would say it
    made = {**record["made_by"], "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "cuda": "13.0"}
    gpu.write_text(json.dumps({**record, "made_by": made}))
    assert scaling_memory.main(["--report-only", str(out), str(gpu)]) == 0
    cpu_table, gpu_table = capsys.readouterr().out.split("\n\n| model")
    assert cpu_table == printed.rstrip("\n")  # rebuilt byte for byte, measuring nothing
    assert "measured on NVIDIA H100 80GB HBM3; " in gpu_table and f"torch {made['torch']} (CUDA 13.0)" in gpu_table


def test_a_file_that_is_not_a_record_is_an_error_naming_it(tmp_path):
    path = tmp_path / "old.json"
    path.write_text("[]")  # what --out wrote before records: the bare results
    with pytest.raises(UserError, match=f"{path} is not a {scaling_memory.FORMAT} record"):
        scaling_memory.read_record(path)
