"""Results as data: every run of ``visionpe benchmark`` writes a small record (settings and their hash, machine and
versions, per-epoch metrics, the sweep's table, wall time); ``--report-only`` rebuilds the report from records alone
on a fresh folder; an edited rows file makes a record stale, named and left out; a current record is not run again;
records of two machines are both named in the report."""
from __future__ import annotations

import json
import shutil

import pytest
from trainutil import run_script

from visionpe.bench.accuracy import jobs, records, staleness
from visionpe.bench.accuracy.jobs import sweep_command, train_command
from visionpe.bench.accuracy.records import FORMAT, read_record
from visionpe.bench.machine import environment
from visionpe.cli import UserError
from visionpe.cli.recipes import recipe_path

TINY = ["--epochs", "2", "--train-samples", "32", "--val-samples", "16", "--batch-size", "16", "--embed-dim", "16",
        "--depth", "1", "--num-heads", "2", "--img-size", "16", "--patch-size", "4"]
ROWS = "part: rec\ntitle: Records\nrows:\n  - {label: learned, args: --pe learned}\n" \
       "  - {label: rope, args: --pe rope_axial, scaling: [none, pi]}\n"
RECORDS = ("data", "doc", "rec", "shapes-position")  # the default records folder of DOC.md's section


def argv(folder, *extra):
    return ["--rows", str(folder / "rows.yaml"), "--data", "shapes-position", "--seeds", "0", "--res", "16", "24",
            "--tune", "--holdout", "8", "--jobs", "2", "--out", str(folder / "out"), "--doc", str(folder / "DOC.md"),
            *extra, "--", *TINY]


def record_of(folder, row):
    return folder.joinpath(*RECORDS, row, "s0.json")


def section(folder) -> str:
    text = (folder / "DOC.md").read_text()
    return text[text.index("<!-- BEGIN rec -->"):text.index("<!-- END rec -->")]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny rows benchmark (two rows, one seed, LookHere's protocol) run once; its folder."""
    folder = tmp_path_factory.mktemp("records")
    (folder / "rows.yaml").write_text(ROWS)
    assert run_script("benchmark", argv(folder)) == 0
    return folder


def fresh(made, tmp_path):
    """A folder with the rows file and the records only: no runs, no doc."""
    folder = tmp_path / "fresh"
    folder.mkdir()
    shutil.copy(made / "rows.yaml", folder)
    shutil.copytree(made / "data", folder / "data")
    return folder


def test_every_run_writes_a_small_record_of_what_made_its_numbers(made):
    for row, pe in (("learned", "learned"), ("rope", "rope_axial")):
        path = record_of(made, row)
        record = read_record(path)
        assert record["format"] == FORMAT and path.stat().st_size < 16_000  # a few KB, never weights
        assert (record["part"], record["data"], record["row"], record["seed"]) == ("rec", "shapes-position", row, 0)
        assert record["settings"]["pe"] == pe and record["settings"]["epochs"] == 2
        assert "output" not in record["settings"] and len(record["settings_sha256"]) == 64
        assert record["sweep"][:3] == ["--res", "16", "24"] and "--tune" in record["sweep"]
        assert [e["epoch"] for e in record["epochs"]] == [1, 2] and "val_acc" in record["epochs"][0]
        assert {r["adaptation"] for r in record["table"]} >= {"untuned", "tuned"}  # the final table, tuned too
        assert {r["res"] for r in record["table"]} == {"16", "24"} and "run" not in record["table"][0]
        train = record["made_by"]["train"]
        assert train["torch"] and train["timm"] and train["python"] and train["platform"] and train["cpu"]
        assert train["device"] == "cpu" and train["visionpe"]
        assert record["wall_s"]["train"] > 0 and record["wall_s"]["sweep"] > 0
    assert "| M1 |" in section(made) and "| made by |" in section(made)


def test_report_only_rebuilds_the_same_section_from_records_alone(made, tmp_path):
    folder = fresh(made, tmp_path)
    assert run_script("benchmark", argv(folder, "--report-only")) == 0
    assert not (folder / "out" / "shapes-position").exists()  # nothing was run
    rebuilt = section(folder)
    assert rebuilt == section(made)  # the command and wall time of the invocation that made the records
    assert "| learned |" in rebuilt and "| rope [pi] |" in rebuilt and "| rope [tuned] |" in rebuilt


def test_an_edited_row_makes_its_record_stale_named_and_left_out(made, tmp_path, capsys):
    folder = fresh(made, tmp_path)
    (folder / "rows.yaml").write_text(ROWS.replace("--pe rope_axial", "--pe rope_axial --drop-path 0.1"))
    assert run_script("benchmark", argv(folder, "--report-only")) == 0
    err = capsys.readouterr().err
    assert f"stale record {record_of(folder, 'rope')} (left out): drop_path (0.0 -> 0.1)" in err, err
    text = section(folder)
    assert "**1 of them have a stale record**" in text and "drop_path (0.0 -> 0.1)" in text
    assert "`data/doc/rec/shapes-position/rope/s0.json`" in text
    numbers = [line for line in text.splitlines() if line.startswith("| ") and "±" in line]
    assert any(line.startswith("| learned |") for line in numbers)
    assert not any(line.startswith("| rope") for line in numbers)  # never mixed in


def test_a_current_record_is_not_run_again_and_a_stale_one_is_redone(made, tmp_path, capsys):
    folder = fresh(made, tmp_path)
    kept = record_of(folder, "learned").read_bytes()
    (folder / "rows.yaml").write_text(ROWS.replace("--pe rope_axial", "--pe rope_axial --drop-path 0.1"))
    assert run_script("benchmark", argv(folder)) == 0
    assert "1 of 2 runs have a current record" in capsys.readouterr().out
    assert sorted(p.name for p in (folder / "out" / "logs").iterdir()) == ["shapes-position__rope__s0.log"]
    assert record_of(folder, "learned").read_bytes() == kept  # not run, not rewritten
    assert read_record(record_of(folder, "rope"))["settings"]["drop_path"] == 0.1  # retrained, current now
    assert "stale record" not in section(folder) and "| rope [pi] |" in section(folder)


def test_a_row_two_parts_share_takes_its_record_from_the_other_part_on_a_machine_without_its_runs(made, tmp_path,
                                                                                                      capsys):
    folder = fresh(made, tmp_path)  # records only: the runs were made elsewhere
    (folder / "rows.yaml").write_text(ROWS.replace("part: rec", "part: rec2")
                                      .replace("--pe rope_axial", "--pe rope_axial --drop-path 0.1"))
    assert run_script("benchmark", argv(folder)) == 0
    assert "1 current record taken from the report's part rec (" in capsys.readouterr().out
    assert sorted(p.name for p in (folder / "out" / "logs").iterdir()) == ["shapes-position__rope__s0.log"]
    second = folder.joinpath("data", "doc", "rec2", "shapes-position")
    assert (second / "learned" / "s0.json").read_bytes() == record_of(folder, "learned").read_bytes()
    assert read_record(second / "rope" / "s0.json")["settings"]["drop_path"] == 0.1  # a changed row: trained anew
    first = lambda text: next(line for line in text.splitlines() if line.startswith("| learned |"))
    assert first((folder / "DOC.md").read_text()) == first(section(made))  # the same numbers in the second part


def test_records_of_two_machines_are_both_named(made, tmp_path):
    folder = fresh(made, tmp_path)
    path = record_of(folder, "rope")
    record = json.loads(path.read_text())
    gpu = {**record["made_by"]["train"], "gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "cpu_count": 16,
           "visionpe": "git 0123456789ab"}
    record["made_by"] = {"train": gpu, "sweep": gpu}
    records.write_record(path, record)
    assert run_script("benchmark", argv(folder, "--report-only")) == 0
    text = section(folder)
    machines = [line for line in text.splitlines() if line.startswith("| M")]
    assert len(machines) == 2, machines
    assert any("NVIDIA H100 80GB HBM3" in m and "git 0123456789ab" in m and "(CUDA" in m for m in machines)
    assert any("cores" in m and "NVIDIA" not in m for m in machines)
    label = {"learned": None, "rope": None}
    for line in text.splitlines():
        for row in label:
            if line.startswith(f"| {row} |"):
                label[row] = line.rstrip(" |").rsplit("| ", 1)[1]
    assert label["learned"] != label["rope"] and set(label.values()) == {"M1", "M2"}, label


def test_the_hash_ignores_where_a_run_ran_and_names_what_changed(made, tmp_path):
    """A record made on a CPU is current for the same run asked for on a GPU (device, threads and the sweep's
    device do not change what is trained); another setting or another sweep makes it stale, with the change named."""
    record = read_record(record_of(made, "learned"))
    run, recipe = tmp_path / "run", recipe_path("bench_vit_tiny").resolve()  # the rows' recipe: --config's default
    args = ["--pe", "learned", *TINY]
    sweep = sweep_command(run, [16, 24], ["none"], tune=["--tune", "--holdout", "8"])
    train = lambda *extra: train_command(recipe, "shapes-position", 0, run, [*args, *extra])
    assert staleness.stale_record(record, train(), sweep, run) == []
    assert staleness.stale_record(record, train("--threads", "4", "--workers", "2"),
                                  sweep_command(run, [16, 24], ["none"], tune=["--tune", "--holdout", "8"],
                                                device="cuda"), run) == []
    cfg, arguments = staleness.asked_settings(train(), run), staleness.sweep_arguments(sweep)
    assert staleness.settings_sha256(cfg.replace(device="cuda"), arguments) == record["settings_sha256"]
    lr = record["settings"]["lr"]
    assert staleness.stale_record(record, train("--lr", str(lr * 2)), sweep, run) == [f"lr ({lr!r} -> {lr * 2!r})"]
    assert staleness.stale_record(record, train(), sweep_command(run, [16], ["none"]), run) == [
        "sweep arguments ('--res 16 24 --scaling none --tune --holdout 8' -> '--res 16 --scaling none')"]


def test_a_record_made_before_a_setting_was_added_stays_current(made, tmp_path):
    """A setting added after a record was made (absent from its settings, so its hash differs) is read at the
    setting's default: the record stays current, so a new setting does not make every committed record stale; a
    setting the record holds with another value still makes it stale."""
    record = read_record(record_of(made, "learned"))
    run, recipe = tmp_path / "run", recipe_path("bench_vit_tiny").resolve()
    sweep = sweep_command(run, [16, 24], ["none"], tune=["--tune", "--holdout", "8"])
    train = lambda *extra: train_command(recipe, "shapes-position", 0, run, ["--pe", "learned", *TINY, *extra])
    older = {**record, "settings": {k: v for k, v in record["settings"].items() if k != "grayscale_prob"},
             "settings_sha256": "0" * 64}
    assert staleness.stale_record(older, train(), sweep, run) == []
    assert staleness.stale_record(older, train("--grayscale-prob", "0.5"), sweep, run) == [
        "grayscale_prob (0.0 -> 0.5)"]


def test_a_sitting_killed_after_a_run_trained_still_names_its_training_machine(tmp_path, monkeypatch):
    """The machine of a step is noted before the step starts: a sitting killed after a run's training wrote its
    results but before the step returned (the next sitting only sweeps it) records who trained it, its wall time
    unknown (None), never ``?``; a resumed training adds its seconds to the attempts' before it."""
    run = tmp_path / "out" / "shapes-position" / "learned" / "s0"
    train = ["train", *train_command(recipe_path("bench_vit_tiny"), "shapes-position", 0, run, []), "--overwrite"]

    def killed_after_training(*args, **kwargs):
        raise KeyboardInterrupt  # the sitting's process stopped while (or just after) the training process ran

    monkeypatch.setattr(jobs.subprocess, "run", killed_after_training)
    with pytest.raises(KeyboardInterrupt):
        jobs.run_logged([train], tmp_path / "log")
    noted = records.read_noted(run)["train"]
    assert noted["machine"] == environment() and noted["device"] == "cpu" and noted["seconds"] is None

    records.note_machine(run, "train", "cpu", 3.0)
    records.note_machine(run, "train", "cpu", resumed=True)
    assert records.read_noted(run)["train"]["seconds"] is None  # running again: unknown until it returns
    records.note_machine(run, "train", "cpu", 2.0, resumed=True)
    assert records.read_noted(run)["train"]["seconds"] == 5.0
    records.note_machine(run, "train", "cpu", 4.0)  # trained anew (--overwrite): its own time only
    assert records.read_noted(run)["train"]["seconds"] == 4.0


def test_a_damaged_record_is_an_error_never_taken_for_absent(tmp_path):
    path = tmp_path / "s0.json"
    assert read_record(path) is None
    path.write_text("{not json")
    with pytest.raises(UserError, match="cannot be read"):
        read_record(path)
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(UserError, match="is not a"):
        read_record(path)


def test_the_made_by_cell_names_each_seeds_machines():
    """One machine for every seed is named once; trained on one and swept on another is ``M1/M2``; seeds made by
    different machines are named per seed; a run made before records (no machine noted) is ``?``, and said so."""
    from types import SimpleNamespace

    from visionpe.bench.accuracy import parts
    a, b = json.dumps({"device": "cpu a"}), json.dumps({"device": "gpu b"})
    table = {("rows", "d", "same", "default"): {"made_by": {0: (a, a), 1: (a, a)}},
             ("rows", "d", "swept", "default"): {"made_by": {0: (a, b)}},
             ("rows", "d", "mixed", "default"): {"made_by": {0: (a, a), 1: (b, b)}},
             ("rows", "d", "old", "default"): {"made_by": {0: (None, None)}}}
    labels = parts.machine_labels(table)
    assert labels == {a: "M1", b: "M2"}
    cells = {k[2]: parts.made_by_cell(v, labels) for k, v in table.items()}
    assert cells == {"same": "M1", "swept": "M1/M2", "mixed": "s0 M1, s1 M2", "old": "?"}
    args = SimpleNamespace(report_only=False, unfinished=[], stale=[], records=None)
    text = "\n".join(parts.provenance_lines(args, {k: {**v, "wall_s": {}} for k, v in table.items()
                                                       if k[2] == "old"}, [1], "visionpe benchmark ...", 60.0))
    assert "`?`: a step whose machine no record names" in text and "| machine |" not in text


def test_a_committed_report_that_drifts_from_its_records_is_named_and_rebuilt(made, tmp_path, capsys):
    """python -m visionpe.bench.rebuild: the doc's part is its records' rebuild byte for byte (the command of the
    invocation that ran last, with --report-only, on a copy of the records); an edited number is named, and
    ``--write`` rebuilds the doc in place from the records."""
    from visionpe.bench import rebuild
    folder = fresh(made, tmp_path)
    shutil.copy(made / "DOC.md", folder / "DOC.md")
    # the records made by a command whose --doc is made's DOC.md: its name, beside the records' data/ folder
    (invocation,) = rebuild.invocations(folder)
    assert invocation == folder.joinpath(*RECORDS[:3], rebuild.INVOCATION) and rebuild.doc_of(invocation) == \
        folder / "DOC.md"
    (tmp_path / "check").mkdir()
    committed, rebuilt = rebuild.check(invocation, tmp_path / "check")
    assert committed == rebuilt and committed.startswith("<!-- BEGIN rec -->") and "| rope [tuned] |" in rebuilt
    assert rebuild.main([str(folder)]) == 0
    doc = (folder / "DOC.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| learned |"))
    edited = row.replace("| learned | ", "| learned | 99.9 ± 0.0 x", 1)
    (folder / "DOC.md").write_text(doc.replace(row, edited))
    assert rebuild.main([str(folder)]) == 1
    assert f"{invocation.parent}: its report is not what its records rebuild" in capsys.readouterr().err
    assert rebuild.main([str(folder), "--write"]) == 0 and (folder / "DOC.md").read_text() == doc
    assert rebuild.main([str(folder)]) == 0


def test_the_rebuild_command_places_the_doc_records_and_runs_anew():
    from pathlib import Path

    from visionpe.bench import rebuild
    command = ("visionpe benchmark --rows r.yaml --out runs/x --doc=docs/reports/B.md --records d --seeds 0 1 "
               "--report-only -- --epochs 3 --out-of-place")
    name, argv = rebuild.report_only_argv(command, Path("D.md"), Path("R"), Path("O"))
    assert name == "benchmark"
    assert argv == ["--rows", "r.yaml", "--seeds", "0", "1", "--report-only", "--doc", "D.md", "--records", "R",
                    "--out", "O", "--", "--epochs", "3", "--out-of-place"]
    name, argv = rebuild.report_only_argv("visionpe small-folder-benchmark --seeds 0 --collect-only --out r",
                                          Path("D.md"), Path("R"), Path("O"))
    assert name == "small-folder-benchmark" and argv == ["--seeds", "0", "--report-only", "--doc", "D.md",
                                                         "--records", "R", "--out", "O"]
    with pytest.raises(UserError, match="not one of visionpe benchmark, small-folder-benchmark"):
        rebuild.report_only_argv("visionpe train --epochs 1", Path("D.md"), Path("R"), Path("O"))


VIDEO_TINY = ["--num-frames", "4", "--train-samples", "16", "--val-samples", "8", "--batch-size", "8", "--epochs",
              "1", "--img-size", "16", "--patch-size", "4", "--embed-dim", "24", "--depth", "1", "--num-heads", "2"]


def video_argv(folder, *extra, train=()):
    return ["--config", "bench_video_tiny", "--data", "moving-shapes", "--pe", "rope_axial", "--scaling", "none",
            "pi", "--seeds", "0", "--frames", "4", "8", "--res", "16", "--jobs", "1", "--out",
            str(folder / "out" / (extra[1] if extra else "default")), "--doc", str(folder / "DOC.md"), *extra,
            "--", *VIDEO_TINY, *train]


def test_two_video_parts_of_one_doc_each_rebuild_from_their_own_records(tmp_path):
    """--part: a second video benchmark (here RoPE at another base) is its own marked part of the same doc, with its
    own heading and records folder, and each part is rebuilt alone from its records."""
    from visionpe.bench import rebuild
    assert run_script("benchmark", video_argv(tmp_path)) == 0
    assert run_script("benchmark", video_argv(tmp_path, "--part", "video_theta",
                                              train=["--pe-kwargs", "theta=10000"])) == 0
    text = (tmp_path / "DOC.md").read_text()
    for part, heading in (("video_benchmark", "change\n"), ("video_theta", "change (`video_theta`)\n")):
        assert text.count(f"<!-- BEGIN {part} -->\n## Video: positional encodings under frame-count and resolution "
                          + heading) == 1
    made = {p.parent.name: p for p in rebuild.invocations(tmp_path)}
    assert set(made) == {"video_benchmark", "video_theta"}
    for name, pe_kwargs in (("video_benchmark", {}), ("video_theta", {"theta": 10000})):
        (record,) = made[name].parent.rglob("s0.json")
        assert read_record(record)["part"] == name and read_record(record)["settings"]["pe_kwargs"] == pe_kwargs
    for name, invocation in made.items():
        check = tmp_path / f"check_{name}"
        check.mkdir()
        committed, rebuilt = rebuild.check(invocation, check)
        assert committed == rebuilt and committed.startswith(f"<!-- BEGIN {name} -->") and "| rope_axial [pi] |" \
            in rebuilt


@pytest.mark.parametrize("extra, message", [
    (["--part", "a b"], "--part: part name must be letters, digits, '_', '.', '-', got 'a b'"),
    (["--part", "benchmark"], "--part benchmark is the image report's own records folder"),
])
def test_a_bad_video_part_name_is_refused_in_one_line(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        run_script("benchmark", video_argv(tmp_path, *extra))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_part_is_refused_for_an_image_benchmark(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_script("benchmark", ["--data", "shapes-position", "--pe", "learned", "--seeds", "0", "--out",
                                 str(tmp_path / "out"), "--part", "mine", "--", *TINY])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--part mine names a video benchmark's part" in err
