"""Results as data for ``visionpe convert-benchmark``: every run it finishes (the learned-APE source, its conversions,
the runs from scratch) writes a record (:mod:`visionpe.bench.accuracy.records`) and the ``invocation.json`` beside
them; ``--report-only`` rebuilds the part byte for byte from a copy of the records in an empty ``--out``; a run whose
record is current is not run again; a record made with other settings is stale, named and left out; a record that
cannot be read is one clear line; ``python -m visionpe.bench.rebuild`` checks and rebuilds the part.

One tiny benchmark (one seed, one target, one epoch each way: five runs, trained and swept in this process) is made
once for the module; every other test works on a copy of its records alone."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml
from trainutil import in_process, run_script

from visionpe.bench import rebuild
from visionpe.bench.accuracy import conversion, jobs, records
from visionpe.cli import UserError

RECIPE = {"data": "shapes-position", "img_size": 16, "patch_size": 4, "epochs": 1, "batch_size": 16,
          "train_samples": 16, "val_samples": 16, "warmup_epochs": 0,
          "model_kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2}}
RECORDS = ("data", "c", conversion.PART)  # the default records folder of C.md's part
RUNS = {"learned_e1": ("source", "learned"), "learned_e1_to_learned_e1": ("converted", "learned"),
        "learned_e1_to_rope_axial_e1": ("converted", "rope_axial"), "learned_e2": ("scratch", "learned"),
        "rope_axial_e2": ("scratch", "rope_axial")}


def argv(folder, *extra, out=None, scaling=("none", "pi"), recipe=None):
    """The command line of the benchmark of ``folder`` (the recipe, named in the part, ``recipe`` or folder's)."""
    return ["--config", str(recipe or folder / "recipe.yaml"), "--data", "shapes-position", "--seeds", "0",
            "--pretrain-epochs", "1", "--finetune-epochs", "1", "--to", "rope_axial", "--res", "16",
            "--scaling", *scaling, "--jobs", "1", "--out", str(out or folder / "out"), "--doc", str(folder / "C.md"),
            *extra]


def again(made, folder, tmp_path, *extra, **kwargs):
    """The command line of ``made``'s benchmark on the doc and records of ``folder``, its runs in an empty folder."""
    return argv(folder, *extra, out=tmp_path / "empty", recipe=made / "recipe.yaml", **kwargs)


def record_of(folder, name):
    return folder.joinpath(*RECORDS, "shapes-position", name, "s0.json")


def section(folder) -> str:
    text = (folder / "C.md").read_text()
    return text[text.index(conversion.BEGIN):text.index(conversion.END)]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The tiny benchmark, its runs trained and swept in this process; its folder."""
    folder = tmp_path_factory.mktemp("convert")
    (folder / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jobs.subprocess, "run", in_process)
        assert run_script("convert_benchmark", argv(folder)) == 0
    return folder


def fresh(made, tmp_path):
    """A folder with the doc and a copy of the records only: no runs (the recipe is made's, named in the part)."""
    folder = tmp_path / "fresh"
    folder.mkdir()
    shutil.copy(made / "C.md", folder)
    shutil.copytree(made / "data", folder / "data")
    return folder


def test_every_finished_run_writes_its_record_and_the_part_names_its_machine(made):
    for name, (kind, pe) in RUNS.items():
        record = records.read_record(record_of(made, name))
        assert (record["part"], record["family"], record["row"], record["seed"]) == (conversion.PART, kind, pe, 0)
        assert record["run"] == f"shapes-position/{name}/s0" and record["settings"]["pe"] == pe
        assert record["sweep"] == ["--res", "16", "--scaling", "none", "pi"]
        assert record["made_by"]["train"]["device"] == "cpu" and record["wall_s"]["train"] > 0
        if kind == "converted":  # its source named, and the weights it started from relative to its own folder
            assert record["source"] == "shapes-position/learned_e1/s0"
            assert record["settings"]["init_from"] == "../../learned_e1/s0/last.safetensors"
        else:
            assert "source" not in record and record["settings"]["init_from"] is None
    invocation = json.loads(made.joinpath(*RECORDS, conversion.INVOCATION).read_text())
    assert invocation["command"].startswith("visionpe convert-benchmark --config") and invocation["wall_s"] > 0
    text = section(made)
    assert invocation["command"] in text and "| made by |" in text and "| M1 | " in text
    rows = [line for line in text.splitlines() if line.startswith(("| learned", "| rope_axial"))]
    assert len(rows) == 7 and all(line.endswith("| 1 | M1 |") for line in rows), rows  # RoPE rows: none and pi


def test_report_only_rebuilds_the_same_part_from_the_records_alone(made, tmp_path):
    folder = fresh(made, tmp_path)
    (folder / "C.md").write_text("# other\n")
    assert run_script("convert_benchmark", again(made, folder, tmp_path, "--report-only")) == 0
    assert list((tmp_path / "empty").iterdir()) == []  # nothing was run
    assert section(folder) == section(made)


def test_a_current_record_is_not_run_again(made, tmp_path, monkeypatch, capsys):
    folder = fresh(made, tmp_path)
    ran = []
    monkeypatch.setattr(conversion, "job", lambda spec, *a: ran.append(spec) or {"ok": True})
    assert run_script("convert_benchmark", again(made, folder, tmp_path)) == 0
    assert ran == [] and "5 of 5 runs have a current record" in capsys.readouterr().out
    assert record_of(folder, "learned_e1").read_bytes() == record_of(made, "learned_e1").read_bytes()


def test_a_conversion_without_a_current_record_trains_its_source_again_for_its_weights(made, tmp_path, monkeypatch,
                                                                                        capsys):
    folder = fresh(made, tmp_path)
    record_of(folder, "learned_e1_to_rope_axial_e1").unlink()
    ran = []
    monkeypatch.setattr(conversion, "job", lambda spec, *a: ran.append(spec["run"].parent.name) or
                        {"run": spec["run"], "ok": False, "ran": False, "seconds": 0.0, "log": "x.log"})
    assert run_script("convert_benchmark", again(made, folder, tmp_path)) == 0
    assert ran == ["learned_e1", "learned_e1_to_rope_axial_e1"]
    assert "4 of 5 runs have a current record" in capsys.readouterr().out
    text = section(folder)  # the failed run is named, the others reported from their records
    assert "**1 planned run(s) have no current record" in text and "learned_e1_to_rope_axial_e1/s0" in text


def test_a_record_made_with_other_settings_is_stale_named_and_left_out(made, tmp_path, capsys):
    folder = fresh(made, tmp_path)
    path = record_of(folder, "rope_axial_e2")
    record = json.loads(path.read_text())
    lr = record["settings"]["lr"]
    records.write_record(path, {**record, "settings": {**record["settings"], "lr": lr * 2},
                                "settings_sha256": "0" * 64})
    assert run_script("convert_benchmark", again(made, folder, tmp_path, "--report-only")) == 0
    assert f"stale record {path} (left out): lr ({lr * 2!r} -> {lr!r})" in capsys.readouterr().err
    text = section(folder)
    assert "**1 of them have a stale record**" in text and f"lr ({lr * 2!r} -> {lr!r})" in text
    assert not any(line.startswith("| rope_axial, 2 ep from scratch") for line in text.splitlines())  # never mixed
    assert any(line.startswith("| learned 1 ep → rope_axial +1 ep [pi]") for line in text.splitlines())


def test_a_changed_setting_makes_every_record_stale_and_the_doc_is_left(made, tmp_path, capsys):
    folder = fresh(made, tmp_path)
    before = (folder / "C.md").read_text()
    with pytest.raises(SystemExit) as exit_:
        run_script("convert_benchmark", again(made, folder, tmp_path, "--report-only", scaling=["none"]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("stale record") == 5
    assert "sweep arguments ('--res 16 --scaling none pi' -> '--res 16 --scaling none')" in err
    assert "no current records in --records" in err and "5 stale" in err and (folder / "C.md").read_text() == before


def test_an_unreadable_record_is_one_clear_line(made, tmp_path, capsys):
    folder = fresh(made, tmp_path)
    record_of(folder, "learned_e2").write_text("{not json")
    with pytest.raises(SystemExit) as exit_:
        run_script("convert_benchmark", again(made, folder, tmp_path, "--report-only"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert f"record {record_of(folder, 'learned_e2')} cannot be read" in err and "remove it to redo its run" in err


def test_the_rebuild_check_rebuilds_a_convert_part_from_its_records(made, tmp_path, capsys):
    folder = fresh(made, tmp_path)
    (invocation,) = rebuild.invocations(folder)
    assert rebuild.doc_of(invocation) == folder / "C.md"
    assert rebuild.main([str(folder)]) == 0
    doc = (folder / "C.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| learned, 2 ep from scratch |"))
    (folder / "C.md").write_text(doc.replace(row, row.replace("| learned, 2 ep from scratch | ", "| x | 99.9 ", 1)))
    assert rebuild.main([str(folder)]) == 1
    assert f"{invocation.parent}: its report is not what its records rebuild" in capsys.readouterr().err
    assert rebuild.main([str(folder), "--write"]) == 0 and (folder / "C.md").read_text() == doc
    name, rest = rebuild.report_only_argv("visionpe convert-benchmark --seeds 0 --out r --doc d/C.md",
                                          folder / "D.md", folder / "R", folder / "O")
    assert name == "convert-benchmark" and rest == ["--seeds", "0", "--report-only", "--doc", str(folder / "D.md"),
                                                    "--records", str(folder / "R"), "--out", str(folder / "O")]


def test_a_source_not_here_is_resolved_from_its_folder_name():
    """A conversion's settings asked for while its source has no weights here (made elsewhere: its record only) are
    those it will have once the source is trained: the relative ``init_from`` of a record, whatever the folder."""
    from pathlib import Path

    from visionpe.bench.accuracy import staleness
    run = Path("/nowhere/out/d/learned_e1_to_rope_axial_e1/s0")
    cfg = staleness.asked_settings(["--pe", "rope_axial", "--init-from", "/nowhere/out/d/learned_e1/s0",
                                    "--output", str(run)], run)
    assert cfg["init_from"] == "/nowhere/out/d/learned_e1/s0/last.safetensors"
    assert staleness.run_relative(cfg)["init_from"] == "../../learned_e1/s0/last.safetensors"
    with pytest.raises(UserError, match="no such run directory or weights file"):
        staleness.asked_settings(["--init-from", "/nowhere/w.pth", "--output", str(run)], run)
