"""visionpe visualize --kind explore: the page of a fresh encoding, and of every encoding of a run that a tiny
train_vit.py run wrote; user mistakes exit with status 2 and one line."""
from __future__ import annotations

import pytest

import visionpe
from visionpe import viz
from visionpe.train import models, restore

from explorerutil import check_layer, page_data
from trainutil import TINY, run_script, train_main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("explore") / "run"
    train_main(TINY + ["--pe", "rope_mixed+learned", "--epochs", "1", "--output", str(out)])
    return out


def test_a_fresh_encoding(tmp_path, capsys):
    out = tmp_path / "page.html"
    assert run_script("visualize", ["--pe", "rope_axial", "--grid", "4", "4", "--kind", "explore", "--head-dim", "16",
                     "--num-heads", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    data = page_data(out.read_text(encoding="utf-8"))
    pe = viz.fresh_encoding("rope_axial", (4, 4), num_heads=2, head_dim=16)  # what the CLI builds
    assert data["title"] == "rope_axial" and len(data["layers"]) == 1
    check_layer(data["layers"][0], pe, (4, 4), (8, 8))
    video = tmp_path / "video.html"
    assert run_script("visualize", ["--pe", "alibi", "--grid", "2", "3", "3", "--new-grid", "2", "4", "4", "--kind", "explore",
                     "--num-heads", "2", "--out", str(video)]) == 0
    views = page_data(video.read_text(encoding="utf-8"))["layers"][0]["views"]
    assert [v["shape"] for v in views] == [[2, 3, 3], [2, 4, 4]]
    # a fresh RoPE is built as a model builds it (position interpolation to its grid); --scaling adds a view
    extra = tmp_path / "none.html"
    assert run_script("visualize", ["--pe", "rope_mixed", "--grid", "3", "3", "--kind", "explore", "--scaling", "none",
                                    "--head-dim", "16", "--num-heads", "2", "--out", str(extra)]) == 0
    labels = [v["label"] for v in page_data(extra.read_text(encoding="utf-8"))["layers"][0]["views"]]
    assert labels[0] == "native grid 3x3" and "scaling=pi" in labels[1] and "extrapolated" in labels[2], labels


def test_a_run_directory(run_dir, tmp_path):
    out = tmp_path / "run.html"
    assert run_script("visualize", ["--run", str(run_dir), "--kind", "explore", "--out", str(out)]) == 0
    data = page_data(out.read_text(encoding="utf-8"))
    assert data["title"] == f"rope_mixed+learned ({run_dir.name})"
    model, cfg = restore.load_model(run_dir)
    found = visionpe.encodings_of(model)
    assert [layer["label"] for layer in data["layers"]] == ["learned", "rope_mixed, layer 0"]
    grid = models.run_grid(cfg)
    for layer, pe in zip(data["layers"], [found["tokens"][0], found["rotary"][0]]):
        check_layer(layer, pe, grid, viz.larger_shape(grid))  # the trained weights, not a fresh model's
    last = tmp_path / "last.html"
    assert run_script("visualize", ["--checkpoint", str(run_dir / "last.safetensors"), "--kind", "explore", "--new-grid", "6", "6",
                     "--out", str(last)]) == 0
    assert page_data(last.read_text(encoding="utf-8"))["layers"][1]["views"][1]["grid"] == [6, 6]


@pytest.mark.parametrize("argv, message", [
    (["--kind", "explore"], "--pe is required"),
    (["--kind", "explorer", "--pe", "sincos"], "explore"),
    (["--kind", "explore", "--pe", "rope_axial", "--grid", "50", "50"], "max_patches"),
    (["--kind", "explore", "--pe", "sincos", "--grid", "4", "4", "--scaling", "pi"], "rotary encodings only"),
])
def test_mistakes_exit_2_with_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        run_script("visualize", argv + ["--out", str(tmp_path / "x.html")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "x.html").exists()


def test_grid_with_a_run_is_a_mistake(run_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_script("visualize", ["--run", str(run_dir), "--kind", "explore", "--grid", "8", "8", "--out", str(tmp_path / "x.html")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--new-grid" in err
