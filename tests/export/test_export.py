"""visionpe.export, the library behind ``visionpe export``: a model exported with a free batch, height and width (and
a video's frame count), read back from its bytes, equals the eager model at sizes the trace never saw, in
torch.export and in onnxruntime; a program specialised on its size is caught by the check; the file is written
atomically; missing tools and bad examples are clear errors."""
from __future__ import annotations

import os

import pytest
import torch
from conftest import requires_that

import visionpe as vpe
from visionpe import export

pytestmark = requires_that(export.torch_supports_export(),
                           "torch >= 2.6: torch.export's derived dims (Dim * patch) and the dynamo ONNX exporter")
onnx_tools = requires_that(not export.missing_onnx_packages(),
                           "the export extra: onnx, onnxscript, onnxruntime (pip install 'visionpe[export]')")
TINY = dict(img_size=16, patch_size=4, num_classes=5, embed_dim=24, depth=2, num_heads=2)


def tiny(pe: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return vpe.create_model("vit_tiny_patch16_224", pe=pe, **TINY).eval()


def tiny_video(pe: str = "rope_mixed") -> torch.nn.Module:
    torch.manual_seed(0)
    return vpe.create_video_model("vit_tiny_patch16_224", pe=pe, num_frames=2, tubelet_size=(1, 4, 4), img_size=16,
                                  num_classes=5, embed_dim=24, depth=1, num_heads=2).eval()


@pytest.mark.parametrize("pe", ["rope_mixed", "rope_axial", "sincos", "alibi", "rope_mixed+alibi"])
def test_a_dynamic_program_equals_eager_at_sizes_it_never_traced(pe):
    model = tiny(pe)
    x = export.example_input(model)
    assert x.shape == (2, 3, 16, 16)
    sizes = export.check_sizes(model)
    assert sizes == [(16, 16), (24, 24), (20, 32)]  # the traced size, 2 patches more, a non-square one
    program = export.export_program(model, x)
    loaded = export.runner(export.to_bytes(program), "pt2")  # what a .pt2 file holds, read back
    checks = export.check_export(model, loaded, sizes)
    assert [c.batch for c in checks] == [2, 1, 2]
    assert all(c.ok for c in checks), checks
    assert all(c.max_diff <= export.ATOL + export.RTOL * c.scale for c in checks)


@onnx_tools
@pytest.mark.parametrize("pe", ["rope_mixed", "alibi"])
def test_an_onnx_file_equals_eager_in_onnxruntime_at_new_sizes(pe, tmp_path):
    model = tiny(pe)
    x = export.example_input(model)
    path = tmp_path / "model.onnx"
    export.export_onnx(export.export_program(model, x), x, path=path)
    assert os.listdir(tmp_path) == ["model.onnx"]  # written atomically: no temporary left beside it
    run = export.runner(path, "onnx")
    assert [i.name for i in run.session.get_inputs()] == ["x"]
    checks = export.check_export(model, run, [(16, 16), (32, 32), (12, 40)])
    assert all(c.ok for c in checks), checks


@onnx_tools
def test_a_video_model_exports_with_a_free_frame_count():
    model = tiny_video()
    x = export.example_input(model)
    assert x.shape == (2, 3, 2, 16, 16)
    sizes = export.check_sizes(model)
    assert sizes == [(2, 16, 16), (4, 24, 24), (4, 20, 32)]
    onnx_program = export.export_onnx(model, x)
    checks = export.check_export(model, export.runner(export.to_bytes(onnx_program), "onnx"), sizes)
    assert all(c.ok for c in checks), checks


def test_a_static_program_is_checked_at_its_size_and_two_batches():
    model = tiny("rope_axial")
    x = export.example_input(model)
    sizes = export.check_sizes(model, dynamic=False)
    assert sizes == [(16, 16), (16, 16)]
    program = export.export_program(model, x, dynamic=False)
    checks = export.check_export(model, program.module(), sizes)
    assert [c.batch for c in checks] == [2, 1] and all(c.ok for c in checks)


class SizeSpecialised(torch.nn.Module):
    """A forward that reads its input's width as a Python int: torch.export specialises it to the traced width."""

    def __init__(self):
        super().__init__()
        self.patch_embed = torch.nn.Module()
        self.patch_embed.patch_size, self.patch_embed.img_size = (4, 4), (16, 16)
        self.patch_embed.proj = torch.nn.Conv2d(3, 8, 4, 4)

    def forward(self, x):
        y = self.patch_embed.proj(x)
        return y.flatten(2).mean(-1) * int(y.shape[-1])  # an int() of a traced size


def test_a_program_that_specialises_on_its_size_fails_the_check_at_new_sizes():
    model = SizeSpecialised().eval()
    program = export.export_program(model, export.example_input(model))
    checks = export.check_export(model, program.module(), export.check_sizes(model))
    assert checks[0].ok
    assert not checks[1].ok and "Guard failed" in checks[1].error


def test_a_model_that_cannot_be_traced_is_an_export_error():
    class ValueBranch(torch.nn.Module):
        patch_embed = SizeSpecialised().patch_embed

        def forward(self, x):
            return x * 2 if x.sum() > 0 else x  # a branch on a value: torch.export cannot trace it

    with pytest.raises(export.ExportError, match="torch.export could not trace ValueBranch"):
        export.export_program(ValueBranch(), torch.randn(2, 3, 16, 16))


def test_save_writes_atomically_and_reads_back(tmp_path):
    model = tiny("sincos")
    program = export.export_program(model, export.example_input(model))
    path = export.save(program, tmp_path / "m.pt2")
    assert os.listdir(tmp_path) == ["m.pt2"]
    x = torch.randn(1, 3, 28, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(path).module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_bad_examples_are_clear_errors():
    model = tiny("sincos")
    with pytest.raises(ValueError, match="batch 1"):
        export.export_program(model, torch.randn(1, 3, 16, 16))
    with pytest.raises(ValueError, match=r"\(1, 4\) patches"):
        export.export_program(model, torch.randn(2, 3, 4, 16))
    with pytest.raises(ValueError, match="multiple of the patch"):
        export.export_program(model, torch.randn(2, 3, 18, 16))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        export.export_program(model, torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="patch must be"):
        export.export_program(model, torch.randn(2, 3, 16, 16), patch=(0, 4))
    with pytest.raises(ValueError, match="format must be one of pt2, onnx"):
        export.runner(b"", "tflite")
    with pytest.raises(TypeError, match="ExportedProgram"):
        export.to_bytes(model)


def test_onnx_without_the_extra_names_it(monkeypatch):
    real = export.importlib.util.find_spec
    monkeypatch.setattr(export.importlib.util, "find_spec", lambda name: None if name == "onnxscript" else real(name))
    assert export.missing_onnx_packages() == ["onnxscript"]
    model = tiny("sincos")
    with pytest.raises(ModuleNotFoundError, match=r"needs onnxscript: pip install 'visionpe\[export\]'"):
        export.export_onnx(model, export.example_input(model))
