"""train_vit.py on video data end to end: a tubelet ViT, the frames x resolution table (printed, results.json,
metrics.jsonl), exact resume, the resolution sweep with --frames, and one-line errors for bad combinations."""
import csv
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainutil import run_script, train_main
from visionpe.cli.recipes import recipe_path
from visionpe.train import models, restore


VIDEO = ["--data", "moving-shapes", "--num-frames", "4", "--train-samples", "32", "--val-samples", "16",
         "--batch-size", "8", "--epochs", "2", "--img-size", "16", "--patch-size", "4", "--embed-dim", "24",
         "--depth", "1", "--num-heads", "2", "--warmup-epochs", "0.5", "--lr", "3e-3", "--no-progress",
         "--threads", "1"]


def records(path, kind):
    return [r for r in map(json.loads, Path(path).read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def video_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("video") / "run"
    summary = train_main(VIDEO + ["--pe", "rope_axial", "--eval-frames", "2", "8", "--eval-res", "8", "24",
                                  "--output", str(out)])
    return out, summary


def test_video_run_writes_the_frames_by_resolution_table(video_run, capsys):
    out, summary = video_run
    assert summary["num_frames"] == 4 and summary["tubelet_size"] == [1, 4, 4]
    cells = {f"{f}x{r}" for f in (2, 4, 8) for r in (8, 16, 24)}
    results = json.loads((out / "results.json").read_text())
    for which in ("last", "best"):
        assert set(results["results"][which]) == cells
        assert results["results"][which]["4x16"]["retention"] == pytest.approx(1.0)
        rows = [r for r in records(out / "metrics.jsonl", "eval_res") if r["model"] == which]
        assert {(r["frames"], r["res"]) for r in rows} == {(f, r) for f in (2, 4, 8) for r in (8, 16, 24)}
    assert len(records(out / "metrics.jsonl", "epoch")) == 2
    model, cfg = restore.load_model(out)
    assert cfg["num_frames"] == 4 and models.run_grid(cfg) == (4, 4, 4)
    assert model(torch.randn(1, 3, 4, 16, 16)).shape == (1, 8)


def test_video_table_is_printed(tmp_path, capsys):
    train_main(VIDEO + ["--pe", "learned", "--epochs", "1", "--eval-frames", "8", "--eval-res", "8",
                        "--output", str(tmp_path / "r")])
    text = capsys.readouterr().out
    assert "trained at 4 frames at 16px" in text and "tubelet 1x4x4" in text
    for row in ("last 4 frames top-1 %", "last 8 frames top-1 %", "best 8 frames retention"):
        assert row in text
    assert "8px" in text and "16px" in text
    epochs = [line for line in text.splitlines() if line.startswith("epoch ")]
    assert epochs and all(line.endswith(" clips/s") for line in epochs), epochs  # the throughput counts clips
    assert "evaluating the last weights at 4x8 4x16 8x8 8x16 (frames x px) ..." in text


def test_video_resume_is_exact(tmp_path):
    extra = ["--pe", "learned", "--tubelet-size", "2", "4", "4"]
    train_main(VIDEO + extra + ["--output", str(tmp_path / "a")])
    assert train_main(VIDEO + extra + ["--stop-after", "1", "--output", str(tmp_path / "b")]) == {"stopped": 1}
    train_main(["--resume", str(tmp_path / "b"), "--no-progress"])
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("img_per_s", "epoch_time_s")} for r in rs]
    for kind in ("epoch", "eval_res"):
        assert strip(records(tmp_path / "a" / "metrics.jsonl", kind)) == \
            strip(records(tmp_path / "b" / "metrics.jsonl", kind))
    wa, wb = load_file(tmp_path / "a" / "last.safetensors"), load_file(tmp_path / "b" / "last.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sweep_on_a_video_run(video_run, tmp_path):
    out, _ = video_run
    rows = run_script("resolution_sweep", [str(out), "--frames", "2", "4", "8", "--res", "16", "24", "--scaling", "none", "pi",
                                  "--out", str(tmp_path / "sweep")])
    cells = {(a, f, r) for a in ("none", "pi") for f in (2, 4, 8) for r in (16, 24)}
    assert {(r["adaptation"], r["frames"], r["res"]) for r in rows} == cells
    with open(tmp_path / "sweep" / "sweep.csv") as f:
        saved = list(csv.DictReader(f))
    assert len(saved) == len(cells) and all(r["train_frames"] == "4" for r in saved)
    trained = {r["adaptation"]: r["acc"] for r in rows if (r["frames"], r["res"]) == (4, 16)}
    assert trained["none"] == trained["pi"]  # at the training grid every adaptation is the identity
    # the same weights, evaluated by train_vit.py at the end of training
    results = json.loads((out / "results.json").read_text())["results"]["last"]
    [cell] = [r for r in rows if r["adaptation"] == "none" and (r["frames"], r["res"]) == (8, 24)]
    assert cell["acc"] == pytest.approx(results["8x24"]["acc"], abs=1e-3)


@pytest.mark.parametrize("args, words", [
    (["--data", "moving-shapes"], ["moving-shapes", "video data set", "--num-frames"]),
    (["--data", "shapes-position", "--num-frames", "4"], ["--num-frames", "shapes-position", "image data set"]),
    (VIDEO + ["--tubelet-size", "3", "4", "4"], ["num_frames 4", "multiple", "3 frames"]),
    (VIDEO + ["--tubelet-size", "2", "4", "4", "--eval-frames", "3"], ["eval_frames 3", "2 frames"]),
    (VIDEO + ["--tubelet-size", "2", "8", "8"], ["tubelet_size 2 8 8", "patch_size 4"]),
    (VIDEO + ["--model", "swin_tiny_patch4_window7_224"], ["swin_tiny_patch4_window7_224", "ViT"]),
])
def test_bad_video_combinations_exit_2_with_one_line(args, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_main(args + ["--output", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("visionpe train: error: "), err
    assert all(w in err for w in words), err


def test_video_swin_run(tmp_path):
    """torchvision's Video Swin (swin3d_t at a tiny size) trains, evaluates the table and reloads."""
    args = VIDEO[:VIDEO.index("--embed-dim")] + VIDEO[VIDEO.index("--num-heads") + 2:]
    summary = train_main(args + ["--model", "swin3d_t", "--model-kwargs", "embed_dim=16", "depths=[1,1]",
                                 "num_heads=[2,4]", "window_size=[2,2,2]", "--pe", "rope_mixed", "--epochs", "1",
                                 "--eval-frames", "8", "--output", str(tmp_path / "swin")])
    assert set(summary["results"]["last"]) == {"4x16", "8x16"}
    model, cfg = restore.load_model(tmp_path / "swin")
    assert type(model).__name__ == "SwinTransformer3dPE" and cfg["model_kwargs"]["drop_path_rate"] == 0.0
    # --drop-path (default 0) is torchvision's stochastic depth, not its own default of 0.1
    depths = [m.p for m in model.modules() if type(m).__name__ == "StochasticDepth"]
    assert depths and all(p == 0.0 for p in depths)
    assert model(torch.randn(1, 3, 8, 16, 16)).shape == (1, 8)


def test_sweep_frames_refused_for_an_image_run(tmp_path, capsys):
    train_main(["--data", "shapes-position", "--train-samples", "16", "--val-samples", "8", "--batch-size", "8",
                "--epochs", "1", "--img-size", "16", "--embed-dim", "16", "--depth", "1", "--num-heads", "2",
                "--no-progress", "--output", str(tmp_path / "img")])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_script("resolution_sweep", [str(tmp_path / "img"), "--frames", "4", "--res", "16", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--frames is for video runs" in err, err


def test_benchmark_writes_its_video_part_and_keeps_the_rest(tmp_path):
    import argparse
    from visionpe.bench.accuracy import parts as bench
    cols = [(f, r) for f in (4, 8) for r in (16, 24)]
    entry = lambda accs: {"acc": {c: list(a) for c, a in zip(cols, accs)}, "ret": {}, "params": 1000, "img_s": [5.0],
                          "train_res": (8, 16), "seeds": {0, 1}}
    table = {("vit", "moving-shapes", "none", "default"): entry([(12, 13)] * 4),
             ("vit", "moving-shapes", "rope_axial", "none"): entry([(40, 42), (30, 34), (90, 92), (60, 64)]),
             ("vit", "moving-shapes", "rope_axial", "pi"): entry([(70, 72), (65, 69), (90, 92), (80, 84)])}
    doc = tmp_path / "B.md"
    doc.write_text("# Image benchmark\n\nkept text\n\n<!-- BEGIN convert_benchmark -->\nconverted\n"
                   "<!-- END convert_benchmark -->\n")
    args = argparse.Namespace(jobs=2, report_only=False, extra=[], note="", data=["moving-shapes"])
    cfg = recipe_path("bench_video_tiny")
    for _ in range(2):  # the second write replaces the section
        bench.write_video_part(doc, args, table, [1, 2], "visionpe benchmark ...", 60.0, {"vit": cfg},
                                  cols)
    text = doc.read_text()
    assert text.startswith("# Image benchmark\n\nkept text\n") and "converted" in text
    assert text.count("<!-- BEGIN video_benchmark -->") == 1 and text.rstrip().endswith("<!-- END video_benchmark -->")
    assert "| rope_axial [pi] | 71.0 ± 1.4 |" in text and "8f 16px (train)" in text
    assert "`rope_axial` pi − none" in text and "+30.0 points (beyond the seed spread)" in text
    assert "Chance is 12.5 %" in text and "`none` did not" in text
