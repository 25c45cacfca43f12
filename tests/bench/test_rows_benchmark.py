"""timm's own models as reference rows (``--pe timm_unpatched``) and ``visionpe benchmark --rows``: the rows file, the
models it builds, the verdict against timm, and a tiny benchmark end to end."""
from __future__ import annotations

import csv
import inspect

import pytest
import timm
import torch
from conftest import requires_that
from trainutil import TINY, run_script, train_main

from visionpe.bench.accuracy.rows import read_rows
from visionpe.bench.accuracy.verdicts import rows_verdict
from visionpe.cli import recipes
from visionpe.cli.recipes import recipe_path
from visionpe.train import models, restore, settings

ROWS_FILE = recipe_path("bench_rows_resolution")
RECIPE = recipe_path("bench_vit_tiny")


def row_config(row: dict, data="shapes-position") -> settings.TrainSettings:
    cfg = settings.resolve({**settings.parse_args(row["train"]), "config": str(RECIPE), "data": data})
    return cfg.replace(num_classes=9, in_chans=3)


EVA_ROPE_TYPE = requires_that("rope_type" in inspect.signature(timm.models.eva.Eva).parameters,
                              "a timm whose Eva takes rope_type (the rows file's DINOv3 reference rows)")
ROWS_FILES = [pytest.param(path, id=path.stem, marks=[EVA_ROPE_TYPE] if "rope_type" in path.read_text() else [])
              for path in sorted(recipes.bench_folder().glob("bench_rows_*.yaml"))]


@pytest.mark.parametrize("rows_file", ROWS_FILES)
def test_committed_rows_files_build_every_model_at_every_test_size(rows_file):
    """Every row of every committed rows file resolves with the benchmark recipe, and its model runs at the test
    sizes (below, at, above training and non-square); timm rows are timm's classes, without layer scale."""
    spec = read_rows(rows_file)
    assert len({r["slug"] for r in spec["rows"]}) == len(spec["rows"])
    assert {r["label"] for r in spec["rows"] if r["timm"]} == {r["label"] for r in spec["rows"]
                                                               if "--pe timm_unpatched" in " ".join(r["train"])}
    x = {size: torch.randn(2, 3, *size) for size in [(24, 24), (32, 32), (64, 64), (32, 48)]}
    for row in spec["rows"]:
        model = models.build_model(row_config(row)).eval()
        if row["timm"]:
            assert type(model).__module__.startswith("timm.models.")
            gammas = [v for k, v in model.state_dict().items() if "gamma" in k]  # Eva's layer scale, at 1.0
            assert all(torch.equal(g, torch.ones_like(g)) for g in gammas)
        else:
            assert type(model).__module__.startswith("visionpe.")
        with torch.no_grad():
            outs = {size: model(t) for size, t in x.items()}
        assert all(o.shape == (2, 9) and torch.isfinite(o).all() for o in outs.values()), row["label"]


def test_timm_rows_use_the_body_of_the_visionpe_rows():
    """Same sizes on both sides: timm's learned ViT has exactly the parameters of visionpe's learned ViT, and timm's
    Eva RoPE row has those of visionpe's rope_axial ViT (RoPE adds no parameter) plus Eva's layer scale (2 x dim per
    block), the one difference the rows file states."""
    rows = {r["label"]: r for r in read_rows(ROWS_FILE)["rows"]}
    count = lambda label: sum(p.numel() for p in models.build_model(row_config(rows[label])).parameters())
    assert count("timm ViT learned APE") == count("learned")
    assert count("timm Eva RoPE-axial ref_feat_shape") == count("rope_axial index") + 2 * 64 * 4


def test_timm_unpatched_rope_follows_ref_feat_shape():
    """pe=timm_unpatched keeps timm's own resolution behaviour: Eva with ref_feat_shape interpolates positions (a 2x input
    gets RoPE angles at half steps), so the model built with and without it differ only off the reference grid."""
    base = dict(model="vit_small_patch16_rope_224", pe="timm_unpatched", model_kwargs={"embed_dim": 32, "depth": 1,
                "num_heads": 2, "init_values": 1.0})
    cfgs = [settings.resolve({**base, "model_kwargs": {**base["model_kwargs"], **extra}})
            for extra in ({}, {"ref_feat_shape": 8})]
    built = []
    for cfg in cfgs:
        torch.manual_seed(0)
        built.append(models.build_model(cfg.replace(num_classes=3, in_chans=3)).eval())
    x32, x64 = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        same, other = [m(x32) for m in built], [m(x64) for m in built]
    torch.testing.assert_close(same[0], same[1])
    assert not torch.allclose(other[0], other[1])


def test_timm_run_trains_resumes_and_sweeps(tmp_path):
    """A --pe timm_unpatched run trains, is rebuilt from its config.yaml and sweeps with its own adaptation only."""
    out = tmp_path / "run"
    kwargs = ["--model-kwargs", "embed_dim=16", "depth=1", "num_heads=2", "init_values=null", "ref_feat_shape=4"]
    train_main(TINY + ["--pe", "timm_unpatched", "--model", "vit_small_patch16_rope_224", *kwargs, "--output", str(out)])
    model, cfg = restore.load_model(out)
    assert cfg["pe"] == "timm_unpatched" and isinstance(model, timm.models.eva.Eva)
    rows = run_script("resolution_sweep", [str(out), "--res", "8", "16", "24", "8x16", "--scaling", "none", "pi", "--out",
                       str(tmp_path / "sweep")])
    assert {r["adaptation"] for r in rows} == {"default"}
    with open(tmp_path / "sweep" / "sweep.csv") as f:
        assert sorted(r["res"] for r in csv.DictReader(f)) == ["16", "24", "8", "8x16"]


def entry(acc: dict) -> dict:
    return {"acc": acc, "ret": {}, "params": 1, "img_s": [1.0], "train_res": 32, "seeds": {0, 1, 2}}


@pytest.mark.parametrize("ours, word", [
    ({24: [90, 91, 92], 32: [95, 95, 95], 48: [93, 94, 95]}, "beats it beyond the seed spread at every test size"),
    ({24: [80, 81, 82], 32: [95, 95, 95], 48: [60, 61, 62]}, "ahead beyond the seed spread at 0 of 2 test sizes, "
                                                              "behind beyond it at 2"),
    ({24: [90, 91, 92], 32: [95, 95, 95], 48: [73, 75, 77]}, "ahead beyond the seed spread at 1 of 2 test sizes, "
                                                              "within it elsewhere"),
])
def test_rows_verdict_compares_best_against_timm_best_with_the_spread(ours, word):
    rows = [{"label": "ours", "timm": False}, {"label": "weak", "timm": False}, {"label": "timm ref", "timm": True}]
    table = {("rows", "d", "ours", "default"): entry(ours),
             ("rows", "d", "weak", "default"): entry({24: [10, 10, 10], 32: [90, 90, 90], 48: [10, 10, 10]}),
             ("rows", "d", "timm ref", "default"): entry({24: [84, 85, 86], 32: [95, 95, 95], 48: [72, 73, 74]})}
    text = rows_verdict(table, "d", rows, [24, 32, 48])
    assert "best visionpe row" in text.lower() and "`ours`" in text and "`timm ref`" in text
    assert word in text, text
    assert "`weak`" not in text  # the best row of each side speaks for it


def test_rows_benchmark_end_to_end_writes_its_section_and_keeps_the_doc(tmp_path):
    rows = tmp_path / "rows.yaml"
    rows.write_text("part: rows_test\ntitle: Rows test\nrows:\n  - {label: learned, args: --pe learned}\n"
                    "  - {label: rope, args: --pe rope_mixed, scaling: [none, pi]}\n"
                    "  - {label: timm learned, args: --pe timm_unpatched --model vit_tiny_patch16_224}\n")
    doc = tmp_path / "DOC.md"
    doc.write_text("# Kept\n\nkept text\n")
    tiny = ["--epochs", "1", "--train-samples", "32", "--val-samples", "16", "--batch-size", "16", "--embed-dim",
            "16", "--depth", "1", "--num-heads", "2", "--img-size", "16", "--patch-size", "4"]
    argv = ["--rows", str(rows), "--data", "shapes-position", "--seeds", "0", "--res", "8", "16", "8x16",
            "--jobs", "2", "--out", str(tmp_path / "out"), "--doc", str(doc), "--", *tiny]
    assert run_script("benchmark", argv) == 0
    text = doc.read_text()
    assert text.startswith("# Kept\n\nkept text\n") and text.count("<!-- BEGIN rows_test -->") == 1
    for cell in ("| learned |", "| rope [none] |", "| rope [pi] |", "| timm learned |", "8x16px", "Verdict"):
        assert cell in text, cell
    assert "timm learned *(timm)*" in text
    assert (tmp_path / "out" / "shapes-position" / "timm-learned" / "s0" / "sweep" / "sweep.csv").is_file()
    # rebuilt from the records (made with the same arguments: else they are stale), the section replaced in place
    run_script("benchmark", argv[:-len(tiny) - 1] + ["--report-only", "--", *tiny])
    assert doc.read_text().count("<!-- BEGIN rows_test -->") == 1


def section_of(text: str, name: str) -> str:
    return text[text.index(f"<!-- BEGIN {name} -->"):text.index(f"<!-- END {name} -->")]


def test_rows_parts_sharing_a_folder_each_keep_their_own_command_and_wall_time(tmp_path):
    """Two rows files run into one --out share a row's runs (the second trains nothing), and --report-only of the
    first rebuilds it with its own command and wall time, not those of the invocation that ran last."""
    tiny = ["--epochs", "1", "--train-samples", "32", "--val-samples", "16", "--batch-size", "16", "--embed-dim",
            "16", "--depth", "1", "--num-heads", "2", "--img-size", "16", "--patch-size", "4"]
    doc, out = tmp_path / "DOC.md", tmp_path / "out"
    rows = {}
    for name, extra in (("first", "  - {label: sincos, args: --pe sincos}\n"), ("second", "")):
        rows[name] = tmp_path / f"rows_{name}.yaml"
        rows[name].write_text(f"part: {name}\ntitle: {name}\nrows:\n  - {{label: rope, args: --pe rope_mixed}}\n"
                              + extra)
    argv = lambda name: ["--rows", str(rows[name]), "--data", "shapes-position", "--seeds", "0", "--res", "16",
                         "--jobs", "1", "--out", str(out), "--doc", str(doc)]
    assert run_script("benchmark", argv("first") + ["--", *tiny]) == 0
    first = section_of(doc.read_text(), "first")
    weights = out / "shapes-position" / "rope" / "s0" / "last.safetensors"
    trained = weights.stat().st_mtime_ns
    assert run_script("benchmark", argv("second") + ["--", *tiny]) == 0
    assert weights.stat().st_mtime_ns == trained  # the shared row's run is reused
    second = section_of(doc.read_text(), "second")
    assert "rows_second.yaml" in second and "rows_first.yaml" not in second
    assert run_script("benchmark", argv("first") + ["--report-only", "--", *tiny]) == 0  # the first command again
    rebuilt = section_of(doc.read_text(), "first")
    assert "rows_first.yaml" in rebuilt and "rows_second.yaml" not in rebuilt
    assert rebuilt == first
