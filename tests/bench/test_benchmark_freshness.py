"""The accuracy benchmarks never report stale or silently shrunken results: a run trained with other settings than
asked for now (an edited recipe) is retrained, a sweep made from other results or arguments is redone, a report with
no current record refuses to touch the doc, row labels cannot escape their folder, and a relative --out works."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml
from trainutil import run_script

from visionpe.bench.accuracy import jobs, staleness
from visionpe.bench.accuracy.rows import read_rows
from visionpe.cli import UserError

RECIPE = {"data": "shapes-position", "img_size": 16, "patch_size": 4, "epochs": 1, "batch_size": 16,
          "train_samples": 32, "val_samples": 16, "warmup_epochs": 0,
          "model_kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2}}


def argv(folder, recipe, out="out", doc="B.md", *extra):
    return ["--config", str(recipe), "--data", "shapes-position", "--pe", "learned", "--seeds", "0", "--res", "16",
            "--jobs", "1", "--out", str(out), "--doc", str(folder / doc), *extra]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished benchmark of one run, made with a relative --out from its own folder."""
    folder = tmp_path_factory.mktemp("bench")
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        assert run_script("benchmark", argv(folder, recipe)) == 0
    finally:
        os.chdir(cwd)
    return folder


def copy(finished, tmp_path):
    shutil.copytree(finished, tmp_path / "b")
    return tmp_path / "b"


def the_run(folder):
    return folder / "out" / "vit" / "shapes-position" / "learned" / "s0"


def test_a_relative_out_is_the_callers_folder(finished):
    assert (the_run(finished) / "results.json").is_file() and (the_run(finished) / "sweep" / "sweep.csv").is_file()
    assert "| learned |" in (finished / "B.md").read_text()


def test_report_only_without_records_leaves_the_doc(finished, tmp_path, capsys):
    folder = copy(finished, tmp_path)
    before = (folder / "B.md").read_bytes()
    for records in (folder / "empty", folder / "nowhere"):
        (folder / "empty").mkdir(exist_ok=True)
        with pytest.raises(SystemExit) as exit_info:
            run_script("benchmark", argv(folder, folder / "recipe.yaml", "out", "B.md", "--report-only", "--records",
                                         str(records)))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and "no current records in --records" in err, err
        assert (folder / "B.md").read_bytes() == before


def test_an_edited_recipe_retrains_the_run(finished, tmp_path):
    folder = copy(finished, tmp_path)
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "epochs": 2}))
    run = the_run(folder)
    assert run_script("benchmark", argv(folder, recipe, folder / "out")) == 0
    assert json.loads((run / "results.json").read_text())["epochs"] == 2  # the new recipe's numbers
    log = next((folder / "out" / "logs").glob("*learned*s0.log")).read_text()
    assert "trained with other settings than asked for now: epochs (1 -> 2); retraining" in log
    assert "`epochs: 2`" in (folder / "B.md").read_text() or "epochs: 2" in (folder / "B.md").read_text()
    # unchanged now: a third invocation trains and sweeps nothing
    size = len(log)
    assert run_script("benchmark", argv(folder, recipe, folder / "out")) == 0
    assert "$ python" not in next((folder / "out" / "logs").glob("*learned*s0.log")).read_text()[size:]


def test_a_sweep_is_redone_when_its_results_or_arguments_changed(finished, tmp_path):
    folder = copy(finished, tmp_path)
    run = the_run(folder)
    sweep = jobs.sweep_command(run, [16], ["none", "pi", "ntk", "yarn"])
    assert staleness.sweep_is_current(run, sweep)
    assert not staleness.sweep_is_current(run, jobs.sweep_command(run, [16, 24], ["none"]))
    results = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps({**results, "final_train_loss": 0.0}))  # as a retrained run would
    assert not staleness.sweep_is_current(run, sweep)
    assert jobs.plan_run(run, ["--pe", "learned"], sweep, tmp_path / "log")[-1] == sweep


@pytest.mark.parametrize("label, slug", [("../up", "up"), ("a b+c", "a-b-c"), (".hidden", "hidden")])
def test_row_labels_stay_inside_their_folder(tmp_path, label, slug):
    rows = tmp_path / "rows.yaml"
    rows.write_text(yaml.safe_dump({"part": "s", "title": "t", "rows": [{"label": label, "args": "--pe learned"}]}))
    assert read_rows(rows)["rows"][0]["slug"] == slug


@pytest.mark.parametrize("label", ["..", ".", "/"])
def test_a_row_label_without_a_name_is_refused(tmp_path, label):
    rows = tmp_path / "rows.yaml"
    rows.write_text(yaml.safe_dump({"part": "s", "title": "t", "rows": [{"label": label, "args": "--pe learned"}]}))
    with pytest.raises(UserError, match="no letters or digits"):
        read_rows(rows)


def test_convert_benchmark_report_only_without_runs_leaves_the_doc(tmp_path, capsys):
    doc = tmp_path / "B.md"
    doc.write_text("# kept\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    with pytest.raises(SystemExit) as exit_info:
        run_script("convert_benchmark", ["--config", recipe, "--data", "shapes-position", "--seeds", "0",
                                         "--pretrain-epochs", "1", "--finetune-epochs", "1", "--res", "16",
                                         "--out", tmp_path / "empty", "--doc", doc, "--report-only"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "no current records in --records" in err and doc.read_text() == "# kept\n"


def test_a_folders_classes_read_when_a_run_starts_are_no_difference_until_both_are_known():
    """A finished image-folder run saved its classes and their count; the settings asked for now have neither yet
    (``None``, read from the data when a run starts), which is no reason to retrain; two known, different ones are."""
    from visionpe.train import settings
    asked = settings.resolve(settings.parse_args(["--data", "imagefolder", "--data-dir", "/folder"]))
    finished = {**asked, "num_classes": 8, "classes": ["a", "b"]}
    assert staleness.changed_settings(finished, {**asked, "num_classes": None, "classes": None}) == []
    assert staleness.changed_settings(finished, {**asked, "num_classes": 9, "classes": ["a", "c"]}) == [
        "num_classes (8 -> 9)", "classes (['a', 'b'] -> ['a', 'c'])"]
