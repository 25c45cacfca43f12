"""``visionpe export`` end to end on tiny trained runs (an image run, a video run): both formats, dynamic and static,
the file read back and equal to the rebuilt run's model at new sizes; an export that differs from eager or does not
trace exits with status 1 and one line, and writes nothing. Its argument mistakes are rows of test_cli_errors.py."""
from __future__ import annotations

import os

import pytest
import torch
from conftest import requires_that
from trainutil import TINY, run_script, train_main

from visionpe import export
from visionpe.train import restore

pytestmark = requires_that(export.torch_supports_export(),
                           "torch >= 2.6: torch.export's derived dims (Dim * patch) and the dynamo ONNX exporter")
onnx_tools = requires_that(not export.missing_onnx_packages(),
                           "the export extra: onnx, onnxscript, onnxruntime (pip install 'visionpe[export]')")
QUICK = [*TINY, "--epochs", "1", "--train-samples", "32", "--val-samples", "16"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    train_main([*QUICK, "--pe", "rope_mixed", "--output", root / "image"])
    train_main([*QUICK, "--data", "moving-shapes", "--num-frames", "2", "--embed-dim", "24", "--pe", "rope_mixed",
                "--output", root / "video"])
    return root


def reloaded(path, fmt: str, model, size, batch: int = 1):
    """The written file run at ``size`` against the run's model rebuilt by restore.load_model: max |diff|."""
    x = torch.randn(batch, 3, *size)
    with torch.no_grad():
        return (export.runner(path, fmt)(x) - model(x)).abs().max().item()


FORMATS = [pytest.param("pt2"), pytest.param("onnx", marks=onnx_tools)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_dynamic_export_of_a_run_serves_new_sizes(fmt, runs, tmp_path, capsys):
    out = tmp_path / f"model.{fmt}"
    result = run_script("export", [runs / "image", "--format", fmt, "--dynamic", "--out", out])
    printed = capsys.readouterr().out
    assert result["out"] == out and os.listdir(tmp_path) == [out.name]  # atomic: no temporary left
    assert [c.size for c in result["checks"]] == [(16, 16), (24, 24), (20, 32)] and all(c.ok for c in result["checks"])
    assert "| 20x32 | 2 |" in printed and "tolerance 1e-05 + 1e-05 x max |eager|" in printed
    assert f"wrote {out}" in printed
    model, _ = restore.load_model(runs / "image", "best")
    assert reloaded(out, fmt, model, (28, 12), batch=3) < 1e-5  # a size and batch no check used


@pytest.mark.parametrize("fmt", FORMATS)
def test_static_export_takes_the_training_size(fmt, runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = run_script("export", [runs / "image", "--format", fmt, "--weights", "last"])
    assert result["out"] == tmp_path.joinpath(f"image.{fmt}").relative_to(tmp_path)  # <run name>.<format>
    assert [(c.size, c.batch) for c in result["checks"]] == [((16, 16), 2), ((16, 16), 1)]
    assert "static 16x16, dynamic batch" in capsys.readouterr().out
    model, _ = restore.load_model(runs / "image", "last")
    assert reloaded(tmp_path / f"image.{fmt}", fmt, model, (16, 16), batch=4) < 1e-5
    with pytest.raises(Exception):  # another size is refused: the export is static
        reloaded(tmp_path / f"image.{fmt}", fmt, model, (24, 24))


@onnx_tools
def test_a_video_run_exports_with_a_free_frame_count(runs, tmp_path):
    out = tmp_path / "video.onnx"
    result = run_script("export", [runs / "video", "--format", "onnx", "--dynamic", "--out", out,
                                   "--sizes", "24x32", "6x16x20"])
    assert [c.size for c in result["checks"]] == [(2, 16, 16), (2, 24, 32), (6, 16, 20)]
    assert all(c.ok for c in result["checks"])
    model, _ = restore.load_model(runs / "video", "best")
    assert reloaded(out, "onnx", model, (3, 8, 28)) < 1e-5


def test_a_check_beyond_the_tolerance_exits_1_in_one_line_and_writes_nothing(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(export, "ATOL", -1.0)  # no difference passes
    with pytest.raises(SystemExit) as exit_info:
        run_script("export", [runs / "image", "--format", "pt2", "--dynamic", "--out", tmp_path / "m.pt2"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1, err
    assert err.startswith("visionpe export: error: the exported model differs from eager at 16x16 by")
    assert f"nothing written to {tmp_path / 'm.pt2'}" in err and os.listdir(tmp_path) == []


def test_a_model_that_does_not_trace_exits_1_in_one_line(runs, tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise RuntimeError("Could not guard on data-dependent expression u0 > 0")
    monkeypatch.setattr(torch.export, "export", refuse)
    with pytest.raises(SystemExit) as exit_info:
        run_script("export", [runs / "image", "--format", "pt2", "--dynamic", "--out", tmp_path / "m.pt2"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1, err
    assert "torch.export could not trace" in err and "data-dependent expression" in err
    assert os.listdir(tmp_path) == []


@onnx_tools
def test_an_onnx_export_of_a_program_that_refuses_new_sizes_stops_before_onnx(runs, tmp_path, monkeypatch, capsys):
    """The ONNX file keeps no guards, so the program is checked at the new sizes first: a refusal is one line and
    exit status 1, before the (slow) ONNX conversion."""
    def refusing(model, exported, sizes, **kwargs):
        return [export.Check(tuple(s), 1, error="AssertionError: Guard failed: x.size()[2] == 16") for s in sizes]
    monkeypatch.setattr(export, "check_export", refusing)
    monkeypatch.setattr(export, "export_onnx", lambda *a, **k: pytest.fail("converted a refused program"))
    with pytest.raises(SystemExit) as exit_info:
        run_script("export", [runs / "image", "--format", "onnx", "--dynamic", "--out", tmp_path / "m.onnx"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1, err
    assert "the exported program refuses 16x16: AssertionError: Guard failed" in err
    assert "specialises on its size: export without --dynamic" in err and os.listdir(tmp_path) == []
