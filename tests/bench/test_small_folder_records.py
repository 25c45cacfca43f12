"""Results as data for ``visionpe small-folder-benchmark``: its table is made from the runs' records alone
(``--report-only`` rebuilds it byte for byte from a copy of them), each row names the machine that made it, a record
made with another recipe is stale, named and left out, and a run whose record is current is not run again.

The records are written the way :func:`visionpe.bench.accuracy.records.make_record` lays them out, with the settings
hash the benchmark asks for (computed by :mod:`visionpe.bench.accuracy.staleness` from the runs' real ``visionpe
train`` arguments), and with the classes an image-folder run reads from its folder when it starts."""
from __future__ import annotations

import json
import shlex

import pytest
from trainutil import in_process, run_script

from visionpe.bench import rebuild
from visionpe.bench.accuracy import jobs, records, small_folder, staleness
from visionpe.cli.recipes import recipe_path
from visionpe.train import settings

PART = small_folder.PART
CPU = {"cpu": "Some CPU", "cpu_count": 2, "gpu": None, "platform": "Linux-x", "python": "3.11.7", "torch": "2.14.1",
       "cuda": None, "timm": "1.0.31", "torchvision": "0.29.1", "visionpe": "git aaaaaaaaaaaa", "device": "cpu"}
GPU = {**CPU, "gpu": "NVIDIA H100 80GB HBM3", "cuda": "13.0", "cpu_count": 16, "visionpe": "git bbbbbbbbbbbb",
       "device": "cuda"}
ACC = {"timm": 40.0, "resize+flip": 50.0, "small_folder": 52.0}  # top-1 at 32 px; one point lower at 48 px


def argv(folder, *extra, recipe="small_folder", folders=None):
    return ["--recipe", str(recipe), "--folders", str(folders or folder / "folders"), "--out", str(folder / "runs"),
            "--doc", str(folder / "doc.md"), "--seeds", "0", *extra]


def records_of(folder):
    """The default records folder of ``argv(folder)``: data/<doc's name>/<part> beside the doc."""
    return folder / "data" / "doc" / PART


def section(folder) -> str:
    text = (folder / "doc.md").read_text()
    return text[text.index(f"<!-- BEGIN {PART} -->"):]


def fabricate(folder, made_by: dict, recipe_file="small_folder") -> None:
    """A record for every run of ``argv(folder)`` (``made_by``: {folder kind: machine}), current for the recipe as
    it is: the settings hash of what the benchmark asks for, the 8 classes the run read from its folder."""
    assert run_script("small_folder_benchmark", argv(folder, "--report-only", recipe=recipe_file)) == {}  # the rows'
    out, recipe = (folder / "runs").resolve(), settings.read_yaml(recipe_path(str(recipe_file)), "recipe")
    sizes = [recipe["img_size"], 48]
    for kind in small_folder.FOLDERS:
        for row, acc in ACC.items():
            run = out / kind / f"{row}_s0"
            job = (run, out / "configs" / f"{row}.yaml", (folder / "folders" / kind).resolve(), 0)
            train, sweep = small_folder.commands(job, sizes)
            classes = [f"c{i}" for i in range(8)]  # another folder than a real run's: only its count matters
            cfg = staleness.asked_settings(train, run).replace(num_classes=8, classes=classes)
            arguments = staleness.sweep_arguments(sweep)
            saved = {k: v for k, v in settings.saved_form(cfg).items() if k != "output"}
            table = [{"train_res": "32", "adaptation": "default", "res": str(res), "acc": str(a),
                      "retention": str(a / acc), "frames": "", "train_frames": "", "protocol": "resize"}
                     for res, a in ((32, acc), (48, acc - 1))]
            record = {"format": records.FORMAT, "benchmark": "doc.md", "part": PART, "family": small_folder.FAMILY,
                      "data": kind, "row": row, "seed": 0, "run": f"{kind}/{row}_s0",
                      "settings": json.loads(json.dumps(saved)), "sweep": arguments,
                      "settings_sha256": staleness.settings_sha256(cfg, arguments),
                      "made_by": {"train": made_by[kind], "sweep": made_by[kind]}, "wall_s": {"train": 60.0,
                                                                                               "sweep": 30.0},
                      "num_classes": 8, "results": {"params": 200_000, "train_img_per_s": 500.0},
                      "epochs": [{"epoch": 1, "val_acc": acc - 2}, {"epoch": 2, "val_acc": acc}], "table": table}
            records.write_record(records.record_path(records_of(folder).resolve(), out, run), record)
    command = shlex.join(["visionpe", "small-folder-benchmark", *argv(folder, "--jobs", "1", recipe=recipe_file)])
    (records_of(folder) / small_folder.INVOCATION).write_text(json.dumps({"command": command, "wall_s": 540.0}))


def test_the_table_is_rebuilt_from_records_alone_each_row_naming_its_machine(tmp_path):
    fabricate(tmp_path, {"objects": CPU, "photos": GPU})
    assert len(run_script("small_folder_benchmark", argv(tmp_path, "--report-only"))) == 6
    text = section(tmp_path)
    assert "Not finished" not in text and "Stale records" not in text
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line.rstrip(" |").rsplit("| ", 1)[1]
            for line in text.splitlines() if line.startswith(("| objects |", "| photos |"))}
    assert rows == {**{("objects", row): "M1" for row in ACC}, **{("photos", row): "M2" for row in ACC}}
    machines = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| M")}
    assert "Some CPU, 2 cores" in machines["M1"] and "git aaaaaaaaaaaa" in machines["M1"]
    assert "NVIDIA H100 80GB HBM3" in machines["M2"] and "(CUDA 13.0)" in machines["M2"]
    assert "| objects | small_folder | 52.0 ± n/a | 51.0 ± n/a | 0.981 ± n/a | 0 | 15 | 1.5 | M1 |" in text
    assert "--seeds 0 --jobs 1`." in text and "--report-only" not in text  # the run's command, not the rebuild's
    # the rebuild check: the invocation's command with --report-only on a copy of the records, no runs, the doc copied
    (invocation,) = rebuild.invocations(tmp_path)
    (tmp_path / "check").mkdir()
    committed, rebuilt = rebuild.check(invocation, tmp_path / "check")
    assert rebuilt == committed and text.startswith(committed)


def test_a_record_of_another_recipe_is_stale_named_and_left_out(tmp_path, capsys):
    fabricate(tmp_path, {"objects": CPU, "photos": CPU})
    edited = tmp_path / "edited.yaml"
    edited.write_text(recipe_path("small_folder").read_text().replace("lr: 3.0e-3", "lr: 4.0e-3"))
    assert run_script("small_folder_benchmark", argv(tmp_path, "--report-only", recipe=edited)) == {}
    assert "stale record of objects/small_folder_s0 (left out): lr (0.003 -> 0.004)" in capsys.readouterr().err
    text = section(tmp_path)
    assert "Stale records, made with other settings than asked for now and left out (6)" in text
    assert "objects/timm_s0 (lr (0.003 -> 0.004))" in text and "Not finished, so not in the table (6 runs)" in text
    assert not any(line.startswith("| M") for line in text.splitlines())  # no machine made a number shown


def test_a_run_whose_record_is_current_is_not_run_again(tmp_path, monkeypatch, capsys):
    fabricate(tmp_path, {"objects": CPU, "photos": CPU})
    ran = []
    monkeypatch.setattr(small_folder, "job", lambda *a: ran.append(a) or True)
    monkeypatch.setattr(small_folder, "make_folders", lambda *a: ran.append(a))
    assert len(run_script("small_folder_benchmark", argv(tmp_path))) == 6
    assert ran == [] and "6 of 6 runs have a current record" in capsys.readouterr().out
    invocation = json.loads((records_of(tmp_path) / small_folder.INVOCATION).read_text())
    assert invocation["command"] in section(tmp_path) and "--report-only" not in invocation["command"]


TINY = """model: vit_tiny_patch16_224
model_kwargs: {embed_dim: 16, depth: 1, num_heads: 2}
img_size: 32
patch_size: 8
data: imagefolder
epochs: 1
batch_size: 8
warmup_epochs: 0
scale: [0.8, 1.0]
"""


def test_a_run_made_here_writes_its_record_beside_those_of_other_machines(tmp_path, capsys, monkeypatch):
    """One real run, trained and swept on a tiny generated folder (the five others' records made elsewhere,
    current): it writes its record, with the classes it read from the folder, and the record is current when the
    benchmark is asked for again, so nothing runs then."""
    monkeypatch.setattr(jobs.subprocess, "run", in_process)
    folders = tmp_path / "folders"
    run_script("make_image_folders", ["objects", "--out", folders / "objects", "--train-per-class", "2",
                                      "--val-per-class", "1", "--sides", "20", "40"])
    (folders / "photos" / "val").mkdir(parents=True)  # present, so nothing is generated
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY)
    fabricate(tmp_path, {"objects": GPU, "photos": GPU}, recipe)
    path = records_of(tmp_path) / "objects" / "small_folder_s0.json"
    path.unlink()
    assert len(run_script("small_folder_benchmark", argv(tmp_path, "--jobs", "1", recipe=recipe))) == 6
    assert "5 of 6 runs have a current record" in capsys.readouterr().out
    record = records.read_record(path)
    classes = sorted(p.name for p in (folders / "objects" / "train").iterdir())
    assert record["settings"]["classes"] == classes and record["num_classes"] == len(classes)
    assert record["made_by"]["train"]["device"] == "cpu" and record["wall_s"]["train"] > 0
    assert [e["epoch"] for e in record["epochs"]] == [1] and {r["res"] for r in record["table"]} == {"32", "48"}
    text = section(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| objects | small_folder |"))
    assert row.endswith("| M2 |") and "| M1 | NVIDIA H100 80GB HBM3" in text  # the GPU's records came first
    assert len(run_script("small_folder_benchmark", argv(tmp_path, "--jobs", "1", recipe=recipe))) == 6
    assert "6 of 6 runs have a current record" in capsys.readouterr().out


def test_collect_only_and_report_only_together_is_one_clear_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_script("small_folder_benchmark", argv(tmp_path, "--collect-only", "--report-only"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert "--collect-only reads the runs, --report-only the records alone: give one of them" in err
