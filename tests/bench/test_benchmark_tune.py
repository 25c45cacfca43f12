"""``visionpe benchmark --tune``: LookHere's protocol in the report (untuned and tuned rows side by side, the knob
values the seeds chose), adding or dropping it re-sweeps finished runs without retraining them; every report marks a
row that did not learn and leaves it out of the verdicts; plots keep at most 8 curves a panel."""
from __future__ import annotations

import argparse
import csv
import shutil

import pytest
import yaml
from trainutil import run_script

from visionpe.bench.accuracy import parts, verdicts
from visionpe.cli.recipes import recipe_path
from visionpe.cli.report import Curve, panels_of

RECIPE = {"data": "shapes-position", "img_size": 16, "patch_size": 4, "epochs": 1, "batch_size": 16,
          "train_samples": 32, "val_samples": 16, "warmup_epochs": 0,
          "model_kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2}}


def argv(folder, *extra):
    return ["--config", str(folder / "recipe.yaml"), "--data", "shapes-position", "--pe", "rope_axial", "--seeds", "0",
            "--res", "16", "24", "--scaling", "none", "pi", "--jobs", "1", "--out", str(folder / "out"),
            "--doc", str(folder / "B.md"), *extra]


def log_of(folder):
    return next((folder / "out" / "logs").glob("*rope_axial*s0.log")).read_text()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A benchmark of one run made without --tune (as a running benchmark is), then re-run with --tune; returns the
    folder, the log and the weights' mtime before the second invocation."""
    folder = tmp_path_factory.mktemp("tune")
    (folder / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    assert run_script("benchmark", argv(folder)) == 0
    weights = folder / "out" / "vit" / "shapes-position" / "rope_axial" / "s0" / "last.safetensors"
    before = {"log": log_of(folder), "mtime": weights.stat().st_mtime_ns, "doc": (folder / "B.md").read_text()}
    assert run_script("benchmark", argv(folder, "--tune", "--holdout", "8")) == 0
    return folder, before, weights


def test_tune_resweeps_a_finished_run_without_retraining_it(tuned):
    folder, before, weights = tuned
    assert "LookHere" not in before["doc"] and "[tuned]" not in before["doc"]
    new = log_of(folder)[len(before["log"]):]
    assert "$ visionpe train" not in new and weights.stat().st_mtime_ns == before["mtime"]
    assert "$ visionpe sweep" in new and "--tune --holdout 8 --out" in new
    with open(weights.parent / "sweep" / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["adaptation"] for r in rows} == {"none", "pi", "untuned", "tuned"}
    assert {r["knob"] for r in rows if r["adaptation"] == "tuned"} == {"theta"}


def test_the_report_shows_untuned_and_tuned_side_by_side(tuned):
    folder, before, _ = tuned
    text = (folder / "B.md").read_text()
    main = before["doc"][before["doc"].index("| encoding |"):]
    main = main[:main.index("\n\n")]
    assert main in text  # the table of the adaptations is as without --tune
    assert "### shapes-position — vit: LookHere's protocol (untuned and tuned)" in text
    assert "| rope_axial | theta (trained) | " in text and "| rope_axial [tuned] | theta (tuned) | " in text
    tuned_row = next(line for line in text.splitlines() if line.startswith("| rope_axial [tuned] |"))
    assert tuned_row.count(" 1/1)") == 2  # the chosen factor at each size: (x1 1/1), (x4 1/1), ...
    assert "`rope_axial [tuned]` (`theta`) − untuned: 24px" in text
    assert (folder / "b_vit_shapes-position_tuned.png").is_file()
    with open(folder / "out" / parts.TABLE_CSV) as f:
        cells = list(csv.DictReader(f))
    chosen = [c for c in cells if c["adaptation"] == "tuned"]
    assert {c["size"] for c in chosen} == {"16", "24"} and all(c["knob_chosen"].startswith("x") for c in chosen)
    assert {c["adaptation"] for c in cells} == {"none", "pi", "untuned", "tuned"}


def test_dropping_tune_resweeps_again_without_retraining(tuned, tmp_path):
    folder = tmp_path / "b"
    shutil.copytree(tuned[0], folder)
    weights = folder / "out" / "vit" / "shapes-position" / "rope_axial" / "s0" / "last.safetensors"
    mtime, size = weights.stat().st_mtime_ns, len(log_of(folder))
    assert run_script("benchmark", argv(folder)) == 0
    new = log_of(folder)[size:]
    assert "$ visionpe train" not in new and weights.stat().st_mtime_ns == mtime
    assert "$ visionpe sweep" in new and "--tune" not in new
    assert "[tuned]" not in (folder / "B.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--holdout", "8"], "--holdout 8 sets the held-out images of --tune; give --tune too"),
    (["--tune", "--holdout", "0"], "--holdout must be an integer >= 1"),
])
def test_bad_tune_options_are_refused_in_one_line(tmp_path, capsys, extra, message):
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    with pytest.raises(SystemExit) as exit_info:
        run_script("benchmark", argv(tmp_path, *extra))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_tune_on_a_whole_real_set_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({**RECIPE, "train_samples": None}))
    args = argv(tmp_path, "--tune")
    args[args.index("--data") + 1] = "fashion-mnist"
    with pytest.raises(SystemExit) as exit_info:
        run_script("benchmark", args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--train-samples below the set's size" in err, err
    assert not (tmp_path / "out" / "logs").exists()


def entry(acc: dict, num_classes=9, **extra) -> dict:
    return {"acc": acc, "ret": {}, "params": 1000, "img_s": [1.0], "train_res": 16, "seeds": {0, 1, 2},
            "num_classes": num_classes, **extra}


GOOD = {16: [90, 91, 92], 24: [60, 61, 62], 32: [40, 41, 42]}
CHANCE = {16: [12, 13, 14], 24: [11, 11, 11], 32: [11, 11, 11]}  # 9 classes: chance 11.1 %, floor 16.1 %


def test_a_row_that_did_not_learn_is_marked_and_left_out_of_the_ordering():
    table = {("vit", "d", "learned", "default"): entry({16: [90, 90, 90], 24: [30, 31, 32], 32: [20, 21, 22]}),
             ("vit", "d", "rope_axial", "none"): entry(CHANCE),
             ("vit", "d", "rope_mixed", "none"): entry(GOOD),
             ("vit", "d", "rope_axial", "pi"): entry(GOOD),
             ("vit", "d", "rope_mixed", "pi"): entry(GOOD)}
    text = parts.markdown_table(table, "vit", "d", [16, 24, 32])
    assert "| rope_axial [none] | 13.0 ± 1.0 *not learned* | 11.0 ± 0.0 |" in text
    assert text.count("*not learned*") == 2  # the row's mark and the note under the table
    assert "below chance (11.1 %) + 5 points" in text
    said = verdicts.verdict(table, "vit", "d", [16, 24, 32])
    assert "RoPE `pi`" in said and "RoPE `none`" not in said  # the none ordering would read rope_axial [none]
    assert "Left out as not learned" in said and "`rope_axial [none]`" in said
    assert not verdicts.not_learned(entry({16: [17, 17, 17]}), "d")  # above chance + 5 points
    assert verdicts.not_learned(entry({16: [29, 29]}, num_classes=4), "d")  # chance 25 %, floor 30 %
    learned_only = {k: v for k, v in table.items() if k[2] != "rope_axial" or k[3] != "none"}
    assert "not learned" not in parts.markdown_table(learned_only, "vit", "d", [16, 24, 32])


def test_one_seed_has_no_spread():
    """A cell over one seed reads ``n/a`` for its spread, never ``± 0.0``, which would claim one (issue 43); three
    equal seeds are a spread of 0.0."""
    one = {("vit", "d", "learned", "default"): entry({16: [90.0], 24: [9.6], 32: [40.0]}, seeds={0},
                                                     ret={24: [0.107], 32: [0.444]})}
    text = parts.markdown_table(one, "vit", "d", [16, 24, 32])
    assert "| 9.6 ± n/a |" in text and "0.107 ± n/a" in text and "± 0.0" not in text
    assert "`learned` 90.0 ± n/a %" in verdicts.pick_verdict(one, "vit", "d", [16, 24, 32])
    assert "11.0 ± 0.0" in parts.markdown_table({("vit", "d", "learned", "default"): entry(CHANCE)}, "vit", "d",
                                                   [16, 24, 32])
    # nor is a gap over one seed called beyond the spread (a spread of 0 made every gap "beyond")
    pair = {("rows", "d", "a", "default"): entry({16: [90.0], 24: [60.0]}, seeds={0}),
            ("rows", "d", "b", "default"): entry({16: [80.0], 24: [50.0]}, seeds={0})}
    said = verdicts.compare_verdict(pair, "d", [["a", "b"]], [16, 24])
    assert "16px +10.0 (one seed); 24px +10.0 (one seed). Beyond the seed spread at no size." in said, said
    rows = [{"label": "a", "timm": False}, {"label": "b", "timm": True}]
    assert "+10.0 points (one seed: no spread to compare with)" in verdicts.rows_verdict(pair, "d", rows, [16, 24])
    three = {k: entry({16: [v - 1, v, v + 1], 24: [v, v, v]}) for k, v in zip(pair, (90.0, 80.0))}
    assert "16px +10.0 (beyond); 24px +10.0 (beyond)" in verdicts.compare_verdict(three, "d", [["a", "b"]], [16, 24])


def test_rows_compare_and_tune_verdicts_leave_out_what_did_not_learn():
    rows = [{"label": "ours", "timm": False}, {"label": "weak", "timm": False}, {"label": "timm ref", "timm": True}]
    table = {("rows", "d", "ours", "default"): entry({16: [12, 12, 12], 24: [99, 99, 99], 32: [99, 99, 99]}),
             ("rows", "d", "weak", "default"): entry({16: [90, 90, 90], 24: [50, 50, 50], 32: [40, 40, 40]}),
             ("rows", "d", "timm ref", "default"): entry({16: [90, 90, 90], 24: [40, 40, 40], 32: [30, 30, 30]}),
             ("rows", "d", "ours", "untuned"): entry(CHANCE, knob="theta"),
             ("rows", "d", "ours", "tuned"): entry(CHANCE, knob="theta", choice={r: ["x1"] * 3 for r in CHANCE}),
             ("rows", "d", "weak", "untuned"): entry(GOOD, knob="theta"),
             ("rows", "d", "weak", "tuned"): entry({16: [90, 91, 92], 24: [70, 71, 72], 32: [40, 41, 42]},
                                                   knob="theta",
                                                   choice={16: ["x1"] * 3, 24: ["x4", "x4", "x2"], 32: ["x1"] * 3})}
    said = verdicts.rows_verdict(table, "d", rows, [16, 24, 32])
    assert "Best visionpe row (mean over the test sizes): `weak`" in said and "Left out as not learned" in said
    assert "`ours`" in said.splitlines()[-1]
    pairs = verdicts.compare_verdict(table, "d", [["ours", "weak"], ["weak", "timm ref"]], [16, 24, 32])
    assert "- `ours` − `weak`: left out, `ours` did not learn." in pairs and "`weak` − `timm ref`: 16px" in pairs
    tune = verdicts.tune_verdict(table, "rows", "d", [16, 24, 32])
    assert "- `weak [tuned]` (`theta`) − untuned: 24px +10.0 (beyond); 32px +0.0 (within). Ahead beyond the seed " \
           "spread at 24 px." in tune
    assert "`ours [tuned]`" in tune.splitlines()[-1] and "Left out as not learned" in tune
    side = parts.tune_table(table, "rows", "d", [16, 24, 32])
    lines = [line for line in side.splitlines() if line.startswith("| ")][1:]
    assert [line.split(" | ")[0] for line in lines] == ["| ours", "| ours [tuned]", "| weak", "| weak [tuned]"]
    assert "| 71.0 ± 1.0 (x4 2/3, x2 1/3) |" in side and "12.0 ± 0.0" not in side
    assert "13.0 ± 1.0 *not learned*" in side


def test_plots_keep_at_most_eight_curves_a_panel_and_a_group_together(tmp_path):
    groups = {"none": 1, "sincos": 1, "learned": 1, "rope_axial": 4, "rope_mixed": 4, "rope_mixed+learned": 4,
              "alibi": 1, "many": 11}
    curves = [Curve(f"{g} {i}", {16: [50.0], 24: [40.0]}, {24: [0.8]}, group=g) for g, n in groups.items()
              for i in range(n)]
    panels = panels_of(curves)
    assert all(len(p) <= 8 for p in panels) and [c for p in panels for c in p] == curves
    for g, n in groups.items():
        if n <= 8:
            assert sum(any(c.group == g for c in p) for p in panels) == 1, g
    table = {("vit", "d", c.label, "default"): entry({16: [50.0], 24: [40.0]}) for c in curves}
    assert parts.plot(table, "vit", "d", [16, 24], tmp_path / "p.png") and (tmp_path / "p.png").is_file()


def test_a_rows_part_with_tuned_rows_has_its_side_by_side_table(tmp_path):
    spec = {"part": "rows_tune", "title": "Rows", "compare": [], "recipes": {},
            "rows": [{"label": "weak", "train": ["--pe", "rope_axial"], "scaling": ["none"], "protocol": [],
                      "data": [], "timm": False}]}
    table = {("rows", "shapes-position", "weak", "default"): entry(GOOD),
             ("rows", "shapes-position", "weak", "untuned"): entry(GOOD, knob="theta"),
             ("rows", "shapes-position", "weak", "tuned"): entry(GOOD, knob="theta",
                                                                 choice={r: ["x2"] * 3 for r in GOOD})}
    args = argparse.Namespace(config=recipe_path("bench_vit_tiny"), extra=[], note="", jobs=1,
                              report_only=False, data=["shapes-position"], res=[16, 24, 32], tune=False)
    doc = tmp_path / "B.md"
    parts.write_rows_part(doc, args, spec, table, [1], "visionpe benchmark --rows ...", 1.0)
    text = doc.read_text()
    assert "#### shapes-position: LookHere's protocol (untuned and tuned)" in text
    assert "LookHere's protocol (`--tune`" in text  # what the side-by-side rows are, once
    assert "| weak [tuned] | theta (tuned) | 91.0 ± 1.0 (x2 3/3) | 61.0 ± 1.0 (x2 3/3) |" in text
    assert "| weak | 91.0 ± 1.0 |" in text and "| weak [untuned]" not in text  # the adaptations' table as before
    assert (tmp_path / "b_rows_tune_shapes-position_tuned.png").is_file()
