"""A rows file's budgets per task (``recipes``: each data set its own recipe; ``data``: a row trained on some data
sets only), the report's plateau check (each row's top-1 after its last two epochs, a row still rising marked) and
its generated pick (the best learned row at each size, with the rows within its seed spread)."""
from __future__ import annotations

import pytest
import yaml
from trainutil import run_script

import visionpe as vpe
from visionpe.bench.accuracy import collect, parts, verdicts
from visionpe.bench.accuracy.rows import read_rows, runs_on
from visionpe.cli import UserError
from visionpe.cli.recipes import recipe_path
from visionpe.presets.preset import get_preset
from visionpe.train import restore

TINY = {"img_size": 16, "patch_size": 4, "batch_size": 16, "val_samples": 16, "warmup_epochs": 0,
        "model_kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2}}


def rows_file(tmp_path, text: str):
    path = tmp_path / "rows.yaml"
    path.write_text("part: budgets\ntitle: Budgets\n" + text)
    return path


def test_recipes_and_row_data_sets_are_read_and_resolved(tmp_path):
    (tmp_path / "long.yaml").write_text(yaml.safe_dump({**TINY, "epochs": 2}))
    spec = read_rows(rows_file(tmp_path, f"recipes:\n  shapes-relation: {tmp_path / 'long.yaml'}\n"
                                         "  fashion-mnist: bench_fashion_mnist\n"
                                         "rows:\n  - {label: a, args: --pe learned, data: [shapes-relation]}\n"
                                         "  - {label: b, args: --pe rope_mixed}\n"))
    assert spec["recipes"] == {"shapes-relation": (tmp_path / "long.yaml").resolve(),
                               "fashion-mnist": recipe_path("bench_fashion_mnist").resolve()}
    a, b = spec["rows"]
    assert (a["data"], b["data"]) == (["shapes-relation"], [])
    assert runs_on(a, "shapes-relation") and not runs_on(a, "shapes-position")
    assert runs_on(b, "shapes-position") and runs_on(b, "shapes-relation")


def test_a_rows_file_of_before_the_rename_is_read_its_section_as_part(tmp_path):
    """``section`` is the old name of a rows file's ``part`` (the marked part of the report): read as ``part``;
    both at once is a mistake."""
    path = tmp_path / "old.yaml"
    path.write_text("section: old\ntitle: t\nrows:\n  - {label: a, args: --pe learned}\n")
    assert read_rows(path)["part"] == "old"
    path.write_text("section: old\npart: new\ntitle: t\nrows:\n  - {label: a, args: --pe learned}\n")
    with pytest.raises(UserError, match="'section' is the old name of 'part'"):
        read_rows(path)


@pytest.mark.parametrize("text, words", [
    ("recipes:\n  shapes-nowhere: bench_vit_tiny\nrows:\n  - {label: a, args: --pe learned}\n",
     ["recipes must be a list of data sets", "shapes-position", "'shapes-nowhere'"]),
    ("recipes: [bench_vit_tiny]\nrows:\n  - {label: a, args: --pe learned}\n",
     ["recipes must map data sets to recipes"]),
    ("recipes:\n  shapes-position: no_such_recipe\nrows:\n  - {label: a, args: --pe learned}\n",
     ["recipe of shapes-position", "no_such_recipe", "bench_vit_tiny"]),
    ("recipes:\n  shapes-position: ./missing/recipe.yaml\nrows:\n  - {label: a, args: --pe learned}\n",
     ["recipes that do not exist", "shapes-position"]),
    ("rows:\n  - {label: a, args: --pe learned, data: [shapes-nowhere]}\n",
     ["row 'a': data must be a list of data sets", "shapes-relation"]),
    ("rows:\n  - {label: a, args: --pe learned, data: shapes-position}\n", ["row 'a': data must be a list"]),
    ("rows:\n  - {label: a, args: --pe learned, budget: 3}\n", ["optionally scaling, protocol, data"]),
])
def test_bad_recipes_or_row_data_sets_name_the_key_and_the_allowed_values(tmp_path, text, words):
    with pytest.raises(UserError) as err:
        read_rows(rows_file(tmp_path, text))
    assert all(w in str(err.value) for w in words), str(err.value)


def entry(acc: dict, last_two=(), seeds=3, classes=4) -> dict:
    return {"acc": acc, "ret": {}, "params": 1, "img_s": [1.0], "train_res": 32, "seeds": set(range(seeds)),
            "num_classes": classes, "last_two": list(last_two)}


@pytest.mark.parametrize("pairs, still_rising", [
    ([(80.0, 82.5), (81.0, 82.0), (79.0, 81.0)], True),    # +1.83 points on average: above the margin
    ([(85.0, 85.5), (84.0, 85.0), (86.0, 85.0)], False),   # +0.17
    ([(84.0, 85.0)], False),                                 # exactly the margin is a plateau
    ([], False),                                             # one epoch: nothing to compare
])
def test_a_row_still_rising_over_its_last_epoch_is_marked(pairs, still_rising):
    e = entry({32: [80.0]}, pairs)
    assert verdicts.rising(e) is still_rising
    cell = parts.last_two_cell(e)
    if not pairs:
        assert cell == "n/a"
        return
    before = sum(p[0] for p in pairs) / len(pairs)
    last = sum(p[1] for p in pairs) / len(pairs)
    assert cell.startswith(f"{before:.1f} → {last:.1f}")
    assert (parts.RISING in cell) is still_rising


def test_last_two_epochs_are_read_from_the_runs_metrics():
    lines = [{"kind": "epoch", "epoch": e, "train_loss": 1.0, "val_loss": 1.0, "val_acc": acc, "lr": 0.1,
              "img_per_s": 1.0, "epoch_time_s": 1.0} for e, acc in [(1, 40.0), (2, 70.5), (3, 72.25)]]
    assert collect.last_two_epochs(lines) == (70.5, 72.25)
    assert collect.last_two_epochs(lines[:1]) is None


def test_the_pick_names_the_best_learned_row_and_the_rows_within_its_spread():
    table = {("rows", "d", "best", "default"): entry({32: [90, 91, 92], 64: [80, 81, 82]}),
             ("rows", "d", "close", "pi"): entry({32: [89, 90, 91], 64: [78, 79, 80]}),
             ("rows", "d", "far", "default"): entry({32: [60, 60, 60], 64: [40, 41, 42]}),
             ("rows", "d", "far", "untuned"): entry({32: [60, 60, 60], 64: [40, 41, 42]}),
             ("rows", "d", "far", "tuned"): {**entry({32: [60, 60, 60], 64: [95, 96, 97]}), "knob": "theta"},
             ("rows", "d", "best", "tuned"): {**entry({32: [90, 91, 92], 64: [80, 81, 82]}), "knob": ""},
             ("rows", "d", "chance", "default"): entry({32: [25, 26, 24], 64: [99, 99, 99]})}
    text = verdicts.pick_verdict(table, "rows", "d", [32, 64])
    lines = text.splitlines()
    assert lines[0] == "- 32 px (1x) (training size): `best` 91.0 ± 1.0 %; within its seed spread: `close [pi]` 90.0."
    assert lines[1] == "- 64 px (2x): `far [tuned]` 96.0 ± 1.0 %; within its seed spread: none."
    assert "far [untuned]" not in text and "best [tuned]" not in text  # both repeat the run's own row
    assert "Left out as not learned" in lines[2] and "`chance`" in lines[2]  # 99 % at 2x does not count


def test_a_benchmark_trains_each_task_with_its_recipe_and_each_row_where_it_runs(tmp_path):
    (tmp_path / "short.yaml").write_text(yaml.safe_dump({**TINY, "epochs": 1, "train_samples": 32}))
    (tmp_path / "long.yaml").write_text(yaml.safe_dump({**TINY, "epochs": 2, "train_samples": 48}))
    rows = rows_file(tmp_path, f"recipes:\n  shapes-relation: {tmp_path / 'long.yaml'}\n"
                               "rows:\n  - {label: both, args: --pe rope_mixed}\n"
                               "  - {label: relation only, args: --pe learned, data: [shapes-relation]}\n")
    out, doc = tmp_path / "out", tmp_path / "B.md"
    argv = ["--rows", str(rows), "--config", str(tmp_path / "short.yaml"), "--data", "shapes-position",
            "shapes-relation", "--seeds", "0", "--res", "16", "32", "--jobs", "2", "--out", str(out), "--doc", str(doc)]
    assert run_script("benchmark", argv) == 0
    runs = sorted(p.parent.relative_to(out).as_posix() for p in out.glob("*/*/s0/results.json"))
    assert runs == ["shapes-position/both/s0", "shapes-relation/both/s0", "shapes-relation/relation-only/s0"]
    assert (restore.load_run(out / "shapes-position" / "both" / "s0")["epochs"],
            restore.load_run(out / "shapes-relation" / "both" / "s0")["epochs"]) == (1, 2)
    assert restore.load_run(out / "shapes-relation" / "relation-only" / "s0")["train_samples"] == 48
    text = doc.read_text()
    assert "Recipe `" in text and "(shapes-position)" in text and "(shapes-relation)" in text
    assert "| relation only | `--pe learned` | none | the run's own | shapes-relation |" in text
    assert "| both | `--pe rope_mixed` | none | the run's own | all |" in text
    relation = text[text.index("### shapes-relation"):]
    assert "last two epochs" in relation and " → " in relation  # two epochs: their top-1 shown
    pick = relation[relation.index("#### shapes-relation: the row to pick at each size"):]
    assert parts.PICK_TEXT in pick and ("- 32 px (2x)" in pick or "Left out as not learned" in pick)
    position = text[text.index("### shapes-position"):text.index("### shapes-relation")]
    assert "relation only" not in position and "| n/a |" in position  # one epoch: no plateau to show


def test_the_committed_comparison_gives_each_task_its_budget():
    """The comparison's rows file names a recipe for each of its three tasks, and every row runs on at least one."""
    spec = read_rows(recipe_path("bench_rows_comparison"))
    assert set(spec["recipes"]) == {"clutter-relation", "fashion-mnist", "clutter-count"}
    assert all(path.is_file() for path in spec["recipes"].values())
    assert all(set(r["data"]) <= set(spec["recipes"]) for r in spec["rows"])
    cfg = yaml.safe_load(spec["recipes"]["fashion-mnist"].read_text())
    assert (cfg["img_size"], cfg["train_samples"], cfg["no_aug"]) == (32, 20000, True)


def test_the_comparisons_second_part_shares_the_first_parts_budget_and_row():
    """The frontier part trains each task with the first part's recipe, and has the first part's RoPE-Mixed row
    with the same arguments and adaptations (its runs are the same in one --out), beside every frontier encoding in
    every form (both of STRING and of ComRoPE), on every task."""
    first = read_rows(recipe_path("bench_rows_comparison"))
    second = read_rows(recipe_path("bench_rows_comparison_frontier"))
    assert second["part"] != first["part"]
    assert second["recipes"] == first["recipes"]
    assert set(second["recipes"]) == {"clutter-relation", "fashion-mnist", "clutter-count"}
    shared = {r["label"]: r for r in first["rows"]}["rope_mixed"]
    row = {r["label"]: r for r in second["rows"]}["rope_mixed"]
    assert (row["slug"], row["train"], row["scaling"]) == (shared["slug"], shared["train"], shared["scaling"])
    frontier = {r["label"] for r in read_rows(recipe_path("bench_rows_frontier"))["rows"]}
    covered = {r["label"] for r in first["rows"] + second["rows"]}
    assert frontier <= covered
    assert all(not r["data"] for r in second["rows"])


def test_the_comparisons_presets_part_has_every_image_preset_beside_the_first_parts_shared_rows():
    """The presets part (issue 45) trains every image preset of ``vpe.presets()`` with the first parts' recipes, beside
    RoPE-Mixed and timm's two reference rows with the labels, arguments and adaptations they have in the first parts
    (the same runs, so their records are shared), on every task."""
    first, second = (read_rows(recipe_path(name))
                     for name in ("bench_rows_comparison", "bench_rows_comparison_frontier"))
    earlier = {r["label"]: r for r in first["rows"] + second["rows"]}
    third = read_rows(recipe_path("bench_rows_comparison_presets"))
    assert third["part"] not in {first["part"], second["part"]}
    assert third["recipes"] == first["recipes"] and all(not r["data"] for r in third["rows"])
    image = {name for name in vpe.presets() if all(kw["ndim"] == 2 for _, kw in get_preset(name).encodings.values())}
    rows = {r["label"]: r for r in third["rows"]}
    presets = {label for label in rows if label.startswith("preset ")}
    assert presets == {f"preset {name}" for name in image}
    shared = set(rows) - presets
    assert shared == {"rope_mixed", "timm Eva RoPE-axial ref_feat_shape", "timm ViT learned APE"}
    for label in shared:
        assert [rows[label][k] for k in ("slug", "train", "scaling")] == \
            [earlier[label][k] for k in ("slug", "train", "scaling")], label


def test_the_benchmarks_files_live_apart_from_the_user_recipes_and_are_found_by_name(tmp_path):
    """``configs/`` (package data) holds only user recipes; the benchmark's recipes and rows files are in
    ``visionpe/bench/configs/``, found by the same ``--config NAME`` and shown in a report by that name."""
    from visionpe.cli import recipes
    assert not list(recipes.folder().glob("bench_*.yaml")) and recipes.names() == recipes.names(recipes.folder())
    assert {p.stem for p in recipes.bench_folder().glob("*.yaml")} >= {"bench_vit_tiny", "bench_rows_resolution"}
    assert recipe_path("bench_vit_tiny") == recipes.bench_folder() / "bench_vit_tiny.yaml"
    assert recipe_path("shapes_tiny.yaml") == recipes.folder() / "shapes_tiny.yaml"
    own = tmp_path / "bench_vit_tiny.yaml"  # a file of the same name elsewhere is shown by its path
    own.write_text("epochs: 1\n")
    assert [recipes.shown(p) for p in (recipe_path("bench_vit_tiny"), recipe_path("shapes_tiny"), own)] == \
        ["bench_vit_tiny", "shapes_tiny", str(own)]
