"""``--resume DIR --epochs N`` extends a run (issue 30 item 4), as timm's ``--resume`` with a new ``--epochs`` does:
the schedule is the one of the new length, read at the run's step; the history records the extension; a kill at
any write of the extension leaves a run that the same command finishes as if it had never been killed."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml
from test_rundir import MINI, KillAt, Killed, epochs_of, same_weights
from trainutil import train_main

from visionpe.train import rundir

EXTEND = ["--epochs", "4", "--no-progress"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-epoch run, the same run extended to 4 epochs, and a fresh 4-epoch run."""
    root = tmp_path_factory.mktemp("extend")
    train_main(MINI + ["--output", str(root / "short")])
    shutil.copytree(root / "short", root / "extended")
    train_main(["--resume", str(root / "extended"), *EXTEND])
    train_main(MINI + ["--epochs", "4", "--output", str(root / "long")])
    return root


def of_kind(out, kind):
    return [r for r in epochs_of(out) if r["kind"] == kind]


def test_resume_with_more_epochs_continues_on_the_schedule_of_the_new_length(finished):
    short, extended, long = (of_kind(finished / name, "epoch") for name in ("short", "extended", "long"))
    assert [r["epoch"] for r in extended] == [1, 2, 3, 4]
    assert extended[:2] == short  # the epochs trained before are kept as they were
    # epochs 3 and 4 follow the 4-epoch schedule (a fresh 4-epoch run's learning rates at the same steps), so the
    # learning rate rises again from the end of the 2-epoch schedule
    assert [r["lr"] for r in extended[2:]] == pytest.approx([r["lr"] for r in long[2:]], rel=1e-9)
    assert extended[2]["lr"] > short[-1]["lr"] and short[-1]["lr"] != long[1]["lr"]  # the schedules differ
    assert not same_weights(finished / "extended" / "last.safetensors", finished / "long" / "last.safetensors")
    history = epochs_of(finished / "extended")
    at = [i for i, r in enumerate(history) if r["kind"] == "extend"]
    assert len(at) == 1 and history[at[0]] == {"kind": "extend", "after_epoch": 2, "from_epochs": 2, "epochs": 4}
    assert history[at[0] - 1]["epoch"] == 2 and history[at[0] + 1]["epoch"] == 3
    assert yaml.safe_load((finished / "extended" / "config.yaml").read_text())["epochs"] == 4
    assert json.loads((finished / "extended" / "results.json").read_text())["epochs"] == 4
    assert len((finished / "extended" / "summary.csv").read_text().splitlines()) == 1 + 4


def test_the_extension_says_what_changes(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished / "short", out)
    train_main(["--resume", str(out), *EXTEND, "--stop-after", "1"])
    lines = capsys.readouterr().out.splitlines()
    line = next(x for x in lines if x.startswith("resume: 2 -> 4 epochs"))
    assert "from epoch 3 on the warmup + cosine schedule of 4 epochs" in line and "results.json" in line, line
    assert not (out / "results.json").exists()  # no longer finished: results.json is redone at the end


def test_a_kill_at_any_write_of_an_extension_leaves_a_run_the_same_command_finishes(finished, tmp_path, monkeypatch):
    reference = finished / "extended"
    with monkeypatch.context() as m:  # how many instants the extension has
        counter = KillAt(m)
        shutil.copytree(finished / "short", tmp_path / "count")
        train_main(["--resume", str(tmp_path / "count"), *EXTEND])
    assert counter.count >= 10
    for k in range(counter.count):
        out = tmp_path / f"k{k}"
        shutil.copytree(finished / "short", out)
        with monkeypatch.context() as m:
            KillAt(m, k)
            with pytest.raises(Killed):
                train_main(["--resume", str(out), *EXTEND])
        assert not rundir.temp_files(out)
        train_main(["--resume", str(out), *EXTEND])  # the same command again
        for name in ("last.safetensors", "best.safetensors"):
            assert same_weights(out / name, reference / name), (k, name)
        assert epochs_of(out) == epochs_of(reference), k  # the extension recorded once, every epoch once
        assert json.loads((out / "results.json").read_text())["epochs"] == 4, k
