"""What a run reports (visionpe.train.metrics): one epoch record behind the console line, metrics.jsonl, summary.csv
and the loggers of --log, read back with each logger's own reader (TensorBoard's EventAccumulator, W&B's local run
file through W&B's own protobuf records) and held equal to metrics.jsonl, also after kills at every write of a run
that commits within its epochs."""
from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import pytest
from test_rundir import WITHIN, killed_and_finished
from trainutil import TINY, train_main

from visionpe.train import evaluation, loop, metrics, sampling


@pytest.fixture(autouse=True)
def needs_tensorboard(request):
    """The tests of --log tensorboard read the event files with TensorBoard's own reader."""
    if "tensorboard" in request.function.__name__:
        pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'visionpe[tensorboard]')")


def epoch_rows(out) -> list[dict]:
    return [r for r in map(json.loads, (Path(out) / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]


def summary_rows(out) -> list[dict]:
    with open(Path(out) / "summary.csv") as f:
        return list(csv.DictReader(f))


def assert_summary_is_metrics(out):
    """summary.csv holds exactly metrics.jsonl's epochs: the same columns and values, one row each, in order."""
    expected = epoch_rows(out)
    got = summary_rows(out)
    assert [int(r["epoch"]) for r in got] == [r["epoch"] for r in expected]
    for row, want in zip(got, expected):
        assert list(row) == [k for k in want if k != "kind"]
        assert all(float(row[k]) == float(v) for k, v in want.items() if k != "kind"), (row, want)


def tensorboard_scalars(out) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(Path(out) / metrics.TENSORBOARD))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_tensorboard_is_metrics(out):
    """Every number of every epoch row is a scalar at step = epoch, each epoch once, equal in float32."""
    expected = epoch_rows(out)
    scalars = tensorboard_scalars(out)
    assert set(scalars) == {k for k in expected[0] if k not in ("kind", "epoch")}
    for tag, points in scalars.items():
        assert [s for s, _ in points] == [r["epoch"] for r in expected], tag  # no epoch twice, none missing
        for (_, value), row in zip(points, expected):
            assert math.isclose(value, row[tag], rel_tol=1e-6, abs_tol=1e-12), (tag, value, row[tag])


def test_evaluate_returns_a_named_record():
    from visionpe.train import settings
    run = settings.TrainSettings(data="shapes-position", train_samples=8, val_samples=12, seed=0, img_size=16)
    val = sampling.dataset(run, "val", 16)
    import torch
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, val.num_classes))
    got = evaluation.evaluate(model, val, batch_size=5, device=torch.device("cpu"), autocast=loop.autocast_for(
        torch.device("cpu"), None))
    assert isinstance(got, metrics.Evaluation) and got.count == 12
    with torch.no_grad():
        x = torch.stack([val[i][0] for i in range(12)])
        y = torch.tensor([int(val[i][1]) for i in range(12)])
        logits = model(x)
    assert got.acc == 100.0 * int((logits.argmax(-1) == y).sum()) / 12
    assert math.isclose(got.loss, torch.nn.functional.cross_entropy(logits, y).item(), rel_tol=1e-5)


def test_retention_is_undefined_when_the_training_size_accuracy_is_0(tmp_path):
    """acc(res) / acc(train res) with acc(train res) = 0 is 0/0: None in results.json, an empty sweep.csv cell, n/a
    in the console's table and the benchmark's cells, and left out of a cell's mean over seeds (not averaged as 0)."""
    from visionpe.bench.accuracy.parts import accuracy_cells
    from visionpe.train import settings
    measured = {16: metrics.Evaluation(acc=0.0, loss=1.1, count=8), 24: metrics.Evaluation(acc=25.0, loss=1.0, count=8)}
    table = metrics.retention_table(measured, 16)
    assert table[16]["retention"] is None and table[24]["retention"] is None
    table = metrics.retention_table({**measured, 16: metrics.Evaluation(acc=50.0, loss=1.0, count=8)}, 16)
    assert table[24]["retention"] == 0.5 and table[16]["retention"] == 1.0
    run = settings.TrainSettings(img_size=16, eval_res=[24])
    text = metrics.resolution_table(run, {"last": metrics.retention_table(measured, 16)}, best_epoch=1)
    assert [line.split()[-2:] for line in text.splitlines() if "retention" in line] == [["n/a", "n/a"]]
    path = tmp_path / "sweep.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ["res", "retention"])
        writer.writeheader()
        writer.writerows([{"res": 24, "retention": None}, {"res": 24, "retention": 0.75}])
    with open(path) as f:
        cells = [metrics.read_retention(row["retention"]) for row in csv.DictReader(f)]
    assert cells == [None, 0.75]
    seeds = {"acc": {16: [0.0, 80.0], 24: [10.0, 60.0]}, "ret": {24: cells}}
    assert accuracy_cells(seeds, [16, 24], 16)[-1] == "0.750 ± n/a"  # the defined seed only (no spread), not 0.375
    assert accuracy_cells({**seeds, "ret": {24: [None, None]}}, [16, 24], 16)[-1] == "n/a"


def test_log_tensorboard_and_summary_csv_equal_metrics_jsonl(tmp_path, capsys):
    out = tmp_path / "run"
    train_main(TINY + ["--model-ema", "--log", "tensorboard", "--output", str(out)])
    assert list((out / metrics.TENSORBOARD).glob("events.out.tfevents.*"))
    assert_summary_is_metrics(out)
    assert_tensorboard_is_metrics(out)
    assert "ema_val_acc" in summary_rows(out)[0]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    expected = [metrics.EpochRecord(r["epoch"], r["train_loss"], metrics.Evaluation(r["val_acc"], r["val_loss"], 0),
                                    r["lr"], r["img_per_s"], r["epoch_time_s"],
                                    metrics.Evaluation(r["ema_val_acc"], r["ema_val_loss"], 0)).line(2, False)
                for r in epoch_rows(out)]
    assert [line.replace(" *", "") for line in lines] == expected  # the console line is the record's


def test_a_resumed_run_shows_each_epoch_once_in_tensorboard_and_overwrite_clears_it(tmp_path):
    out = tmp_path / "run"
    train_main(TINY + ["--epochs", "3", "--stop-after", "1", "--log", "tensorboard", "--output", str(out)])
    assert [s for s, _ in tensorboard_scalars(out)["val_acc"]] == [1]
    assert_summary_is_metrics(out)
    train_main(["--resume", str(out), "--no-progress"])
    assert_tensorboard_is_metrics(out)
    assert_summary_is_metrics(out)
    train_main(TINY + ["--epochs", "1", "--overwrite", "--output", str(out)])  # a new run without --log
    assert not list((out / metrics.TENSORBOARD).glob("events.out.tfevents.*"))


def test_kills_at_every_write_within_epochs_leave_summary_and_tensorboard_equal_to_metrics(tmp_path, monkeypatch):
    """The run of test_rundir's kill test (commits within each epoch) with --log tensorboard, killed at every write
    and resumed: summary.csv and TensorBoard's scalars hold metrics.jsonl's epochs, each once."""
    for _, out, _ in killed_and_finished(WITHIN + ["--log", "tensorboard"], tmp_path, monkeypatch):
        assert_summary_is_metrics(out)
        assert_tensorboard_is_metrics(out)


def wandb_records(path: Path) -> list:
    """The records of a local W&B run file (LevelDB-log framing: 32 KiB blocks, 7-byte record headers, full, first,
    middle and last fragments), each one of W&B's own protobuf ``Record`` messages, in the order written."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, pos, chunks, records = path.read_bytes(), 7, b"", []  # a 7-byte file header (":W&B", magic, version)
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            continue
        chunks = chunk if kind in (1, 2) else chunks + chunk
        if kind in (1, 4):  # a full record, or the last fragment of one
            records.append(pb.Record())
            records[-1].ParseFromString(chunks)
    return records


def wandb_history(out, timeout: float = 60.0) -> list[dict]:
    """The ``history`` records of every local W&B run under ``out/wandb``, in the order they were written. W&B's
    service writes a run's file on its own after ``finish()`` returns: each file is read once it holds its ``exit``
    record."""
    rows = []
    for path in sorted(Path(out).glob("wandb/*run-*/run-*.wandb")):
        deadline = time.monotonic() + timeout
        while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
            assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
            time.sleep(0.2)
        rows += [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
                 for r in wandb_records(path) if r.WhichOneof("record_type") == "history"]
    return rows


def test_log_wandb_offline_holds_every_epoch_once_across_resume(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'visionpe[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    train_main(TINY + ["--epochs", "3", "--stop-after", "2", "--log", "wandb", "--output", str(out)])
    run_id = json.loads((out / metrics.WANDB_STATE).read_text())["id"]
    train_main(["--resume", str(out), "--no-progress"])
    assert json.loads((out / metrics.WANDB_STATE).read_text()) == {"id": run_id, "epochs": 3}
    assert all(p.name == f"run-{run_id}.wandb" for p in out.glob("wandb/*run-*/run-*.wandb"))  # one W&B run
    logged = wandb_history(out)
    assert [r["_step"] for r in logged] == [1, 2, 3]  # the resumed process sent epoch 3 only
    for row, want in zip(logged, epoch_rows(out)):
        assert all(row[k] == v for k, v in want.items() if k != "kind"), (row, want)


def test_a_failed_start_names_the_missing_package_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """--log tensorboard without tensorboard: one line naming tensorboard (it read "needs torch"), and nothing
    written, so the same command runs once it is installed (issue 43: the folder with config.yaml refused the retry,
    and --resume repeated the error). A logger that fails after the folder is written removes what the start wrote."""
    import sys
    from visionpe.cli import UserError
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "tensorboard", None)  # not installed
        patch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
        with pytest.raises(SystemExit):
            train_main(TINY + ["--epochs", "1", "--log", "tensorboard", "--output", str(out)])
    err = capsys.readouterr().err
    assert err.startswith("visionpe train: error: --log tensorboard needs the package tensorboard, which cannot be "
                          "imported") and "pip install 'visionpe[tensorboard]'" in err, err
    assert not out.exists()

    class Refusing:
        module = "json"

        def __init__(self, *args):
            raise UserError("the logger's service is unreachable")

    monkeypatch.setitem(metrics.LOGGER_CLASSES, "tensorboard", Refusing)
    with pytest.raises(SystemExit):
        train_main(TINY + ["--epochs", "1", "--log", "tensorboard", "--output", str(out)])
    assert "unreachable" in capsys.readouterr().err and not out.exists()
    monkeypatch.undo()
    train_main(TINY + ["--epochs", "1", "--output", str(out)])  # the retry starts
    assert (out / "results.json").is_file()
