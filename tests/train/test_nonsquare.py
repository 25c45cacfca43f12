"""Non-square (height x width) evaluation sizes for image runs: data at (H, W), key order and text, --res HxW in
the resolution sweep (parse, validate, CSV, log), and the errors for bad sizes."""
import argparse
import csv
import math

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import SQUARE_TASKS, render_task_scene
from trainutil import TINY, run_script, train_main
from visionpe import data
from visionpe.train import evaluation, loop, metrics, sampling, settings, sweep
from visionpe.cli import UserError



# -- data ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", SQUARE_TASKS)
def test_render_square_pair_is_the_integer_and_pairs_have_shape_h_w(task):
    for i in range(6):
        assert np.array_equal(render_task_scene(task, i, 32), render_task_scene(task, i, (32, 32)))
        assert np.array_equal(render_task_scene(task, i, 24), render_task_scene(task, i, [24, 24]))
        assert render_task_scene(task, i, (24, 48)).shape == (24, 48, 3)
        assert render_task_scene(task, i, (48, 24)).shape == (48, 24, 3)


def test_render_stretches_the_scene_per_axis():
    """A (24, 48) rendering is the 48 px scene squeezed vertically: area-averaging the rows of the 48 px image
    pairwise gives the same picture up to supersampling error (a shape whose height were not scaled with the
    image's, e.g. ry = rx * 0.75, is off by about 10 grey levels on average)."""
    for i in range(5):
        sc = data.scene("shapes-position", 0, i, "val")
        wide = data.render(sc, (24, 48)).astype(float)
        square = data.render(sc, 48).astype(float)
        assert np.abs(wide - (square[0::2] + square[1::2]) / 2).mean() < 2.0


@pytest.mark.parametrize("task", SQUARE_TASKS)
def test_synthetic_dataset_at_height_by_width(task):
    ds = data.build_dataset(task, "val", (24, 48), seed=0, num_samples=4)
    x, y = ds[0]
    assert x.shape == (3, 24, 48) and ds.images.shape == (4, 3, 24, 48) and ds.img_size == (24, 48)
    square = data.build_dataset(task, "val", 24, seed=0, num_samples=4)
    assert torch.equal(ds.labels, square.labels)  # the same scenes, stretched
    pair = data.build_dataset(task, "val", (24, 24), seed=0, num_samples=4)
    assert torch.equal(pair.images, square.images) and pair.img_size == 24


def test_resize_real_images_to_height_by_width():
    """fashion-mnist-like uint8 images (N, 1, 28, 28), no download: resized to (H, W), augmented per axis."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8, generator=gen)
    out = data.resize(images, (24, 48))
    assert out.shape == (6, 1, 24, 48) and out.dtype == torch.uint8
    assert torch.equal(data.resize(images, (28, 28)), images) and torch.equal(data.resize(images, 16),
                                                                              data.resize(images, (16, 16)))
    ds = data.ImageTensorDataset(out, torch.arange(6), 10, (0.286,), (0.353,), augment=True, flip=True, seed=1)
    assert ds.img_size == (24, 48)
    shifted = 0
    for epoch in range(3):
        ds.set_epoch(epoch)
        for i in range(6):
            x, _ = ds[i]
            assert x.shape == (1, 24, 48)
            shifted += not torch.equal(x, (out[i].float() / 255 - ds.mean) / ds.std)
    assert shifted > 0  # the train augmentation does move the images


def test_imagefolder_at_height_by_width(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / "val" / cls).mkdir(parents=True)
        image = np.full((20, 30, 3), 100 if cls == "a" else 200, np.uint8)
        Image.fromarray(image).save(tmp_path / "val" / cls / "0.png")
    ds = data.build_dataset("imagefolder", "val", (16, 32), data_dir=tmp_path)
    assert ds[0][0].shape == (3, 16, 32) and ds.num_classes == 2


@pytest.mark.parametrize("size", [(24,), (24, 48, 3), (24, 2), (24.0, 48), "32", (True, 8), 3, None, {"h": 24}])
def test_bad_image_sizes_raise(size):
    with pytest.raises(ValueError, match="img_size") as err:
        data.build_dataset("shapes-position", "val", size, num_samples=2)
    assert "(height, width)" in str(err.value)


def test_video_data_takes_square_sizes_only():
    with pytest.raises(ValueError, match="img_size.*video"):
        data.build_dataset("moving-shapes", "val", (16, 24), num_samples=2, num_frames=2)
    assert data.build_dataset("moving-shapes", "val", 16, num_samples=2, num_frames=2)[0][0].shape == (3, 2, 16, 16)


# -- loop: key order and text ----------------------------------------------------------------------------------------
def test_eval_grid_orders_mixed_sizes_by_height_then_width():
    keys, train = sampling.eval_grid(settings.TrainSettings(img_size=16), [(8, 16), 24, 8, (16, 8), (24, 8)])
    assert keys == [8, (8, 16), (16, 8), 16, (24, 8), 24] and train == 16
    keys, train = sampling.eval_grid(settings.TrainSettings(img_size=16, num_frames=4), [8], [2])
    assert keys == [(2, 8), (2, 16), (4, 8), (4, 16)] and train == (4, 16)


def test_size_and_key_text():
    assert metrics.key_text(32) == "32" and metrics.key_text((32, 48)) == "32x48"
    assert metrics.key_text(32) == "32" and metrics.key_text((8, 32)) == "8x32"


# -- resolution_sweep: parse_size ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, size", [("32", 32), ("32x48", (32, 48)), ("48X32", (48, 32)), ("32x32", 32),
                                        (" 8x16 ", (8, 16))])
def test_parse_size(text, size):
    assert loop.parse_size(text) == size


@pytest.mark.parametrize("text", ["x", "32x", "x32", "1x2x3", "abc", "3.5", "-4", "32*48", "", "٣٢"])
def test_parse_size_refuses_malformed_text(text):
    with pytest.raises(argparse.ArgumentTypeError, match="PX or HxW"):
        loop.parse_size(text)


@pytest.mark.parametrize("text", ["0", "0x8", "8x0"])
def test_parse_size_refuses_zero(text):
    with pytest.raises(argparse.ArgumentTypeError, match="positive"):
        loop.parse_size(text)


def test_check_sizes():
    image = settings.TrainSettings(data="shapes-position", patch_size=4)  # a run's settings
    sweep.check_sizes("r", image, [8, (8, 16), (16, 8)])
    with pytest.raises(UserError, match=r"resolution 8x18 .*patch_size 4"):
        sweep.check_sizes("r", image, [(8, 18)])
    with pytest.raises(UserError, match=r"resolution 0x8 "):
        sweep.check_sizes("r", image, [(0, 8)])
    video = settings.TrainSettings(data="moving-shapes", patch_size=4, num_frames=4, img_size=16)
    sweep.check_sizes("r", video, [8, 16])
    with pytest.raises(UserError, match=r"--res 8x16: .*image runs.*video run"):
        sweep.check_sizes("r", video, [(8, 16)])


# -- resolution_sweep end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("nonsquare") / "rope"
    train_main(TINY + ["--pe", "rope_mixed", "--epochs", "1", "--output", str(out)])
    return out


def test_sweep_evaluates_a_non_square_size(tiny_run, tmp_path, monkeypatch, capsys):
    seen = []
    evaluate = evaluation.evaluate

    def spy(model, dataset, **kw):  # the images each adaptation's model is evaluated on
        seen.append(tuple(dataset[0][0].shape))
        return evaluate(model, dataset, **kw)

    monkeypatch.setattr(evaluation, "evaluate", spy)
    rows = run_script("resolution_sweep", [str(tiny_run), "--res", "8", "16", "8x16", "--scaling", "none", "pi",
                                  "--out", str(tmp_path)])
    # every size for each adaptation: the training size too for none, which is not the run's own scaling (pi) and
    # so need not be the identity there (a reference grid that is not the training grid)
    assert sorted(seen) == sorted([(3, 16, 16), (3, 8, 8), (3, 8, 16)] * 2)
    with open(tmp_path / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) == 6
    for adaptation in ("none", "pi"):
        got = {r["res"]: r for r in table if r["adaptation"] == adaptation}
        assert list(got) == ["8", "8x16", "16"]  # ordered by (height, width)
        assert math.isfinite(float(got["8x16"]["acc"])) and 0 <= float(got["8x16"]["acc"]) <= 100
        assert float(got["16"]["retention"]) == 1.0 and got["8x16"]["train_res"] == "16"
    assert [r["res"] for r in rows if r["adaptation"] == "none"] == [8, "8x16", 16]
    assert "8x16px" in capsys.readouterr().out
    assert (tmp_path / "sweep.png").stat().st_size > 1000  # the plot leaves the 8x16 rows out


def test_plot_leaves_non_square_rows_out_and_says_which(tmp_path, monkeypatch):
    """The plot's x-axis is the side of a square: 8x16 is not drawn, and both the figure and the sweep's output name
    it (issue 43: it was dropped without a word)."""
    import matplotlib.axes
    import matplotlib.figure
    plotted, notes, real, real_text = [], [], matplotlib.axes.Axes.plot, matplotlib.figure.Figure.text

    def spy(ax, x, y, **kw):  # the x values of every line drawn
        plotted.append(list(x))
        return real(ax, x, y, **kw)

    def text(fig, x, y, s, *args, **kw):  # the figure's own notes
        notes.append(s)
        return real_text(fig, x, y, s, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    monkeypatch.setattr(matplotlib.figure.Figure, "text", text)
    rows = [{"run": "r", "adaptation": "default", "res": res, "acc": 50.0, "train_res": 16}
            for res in (8, "8x16", "16x8", 16)]
    said = []
    sweep.plot(rows, tmp_path / "p.png", log=said.append)
    assert plotted == [[8, 16]]
    assert notes == ["not drawn (non-square, no place on the axis; in the table): 16x8, 8x16"]
    assert said == ["p.png draws square sizes only: 16x8, 8x16 are in sweep.csv and the table above"]
    sweep.plot([r for r in rows if isinstance(r["res"], int)], tmp_path / "q.png", log=said.append)
    assert len(said) == 1 and len(notes) == 1


@pytest.mark.parametrize("res, words", [("8x17", ["resolution 8x17", "patch_size 4"]),
                                        ("8xx", ["--res", "'8xx'", "PX or HxW"]),
                                        ("0x8", ["--res", "positive"])])
def test_sweep_cli_bad_size_exits_2_with_one_line(tiny_run, tmp_path, capsys, res, words):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_script("resolution_sweep", [str(tiny_run), "--res", "8", res, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("visionpe sweep: error: "), err
    assert all(w in err for w in words), err
    assert not (tmp_path / "sweep.csv").exists()
