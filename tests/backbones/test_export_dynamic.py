"""Export at any resolution: every family (tokens, rotary, bias) in every backbone goes through ``torch.export`` with a
dynamic height and width (and batch, and frame count for clips; Swin's batch is static), and the exported program equals eager within 1e-5 at
sizes it was not traced at (one non-square) and at the traced size; the same program through the dynamo ONNX exporter
runs in onnxruntime equally close. Export runs under ``torch.no_grad()``, as a deployment does."""
import importlib.util

import pytest
import torch

import visionpe as vpe
from visionpe.backbones.adapter import named_constructor
from conftest import requires, requires_that

try:  # imported with the module, so visionpe's Hugging Face adapters are registered before any test (each test
    import transformers  # starts from the registries as they were then: tests/conftest.py)
except ImportError:
    transformers = None

pytestmark = requires("torch", "2.6", "torch.export with dynamic sizes as multiples of the patch (Dim * patch)")
HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))  # else torch.export only
ONNX = requires_that(HAS_ONNX, "the export extra (onnx, onnxscript, onnxruntime): pip install 'visionpe[export]'")
TOL = 1e-5
TINY_VIT = dict(img_size=32, patch_size=8, num_classes=5, depth=1)


def timm_vit(pe):
    return vpe.create_model("vit_tiny_patch16_224", pe=pe, **TINY_VIT)


def timm_deit(pe):
    return vpe.create_model("deit_tiny_distilled_patch16_224", pe=pe, **TINY_VIT)


def timm_eva(pe):
    return vpe.create_model("vit_small_patch16_rope_224", pe=pe, embed_dim=64, num_heads=2, **TINY_VIT)


def timm_beit(pe):
    """timm's head scaled at 1, not 0.001, so the logits (~0.2) are well above the tolerance; timm starts BEiT's
    relative tables at zero: random ones of a few units instead, so a wrong resize shows (BEiT's ratio fixed at 1.01
    moves the logits by 3e-5 and 8e-5 at two of the unseen sizes)."""
    model = vpe.create_model("beit_base_patch16_224", pe=pe, embed_dim=32, num_heads=2, head_init_scale=1.0,
                             **TINY_VIT)
    with torch.no_grad():
        for name, table in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                table.normal_(std=3.0)
    return model


def timm_relpos(pe):
    return vpe.create_model("vit_relpos_medium_patch16_cls_224", pe=pe, embed_dim=32, num_heads=2, **TINY_VIT)


def timm_swin(pe):
    return vpe.create_model("swin_tiny_patch4_window7_224", pe=pe, img_size=32, patch_size=4, window_size=2,
                            embed_dim=16, depths=(1, 1), num_heads=(1, 2), num_classes=5)


def torchvision_vit(pe):
    build = named_constructor("tv_vit_b_16")[1]
    return vpe.apply(build(num_classes=5, img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2), pe)


def hf_vit(pe):
    if transformers is None:
        pytest.skip("needs transformers (the hf extra)")
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8, num_labels=5)
    return vpe.apply(transformers.ViTForImageClassification(config), pe)


def hf_swin(pe):
    if transformers is None:
        pytest.skip("needs transformers (the hf extra)")
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                     window_size=2, num_labels=5)
    return vpe.apply(transformers.SwinForImageClassification(config), pe)


def tubelet_vit(pe):
    return vpe.create_video_model("vit_tiny_patch16_224", pe=pe, num_frames=4, tubelet_size=(2, 8, 8), img_size=32,
                                  num_classes=5, depth=1)


# backbone -> (builder, patch multiple of the height and width, an encoding of each family)
BACKBONES = {
    "timm_vit": (timm_vit, 8, ("learned", "rope_mixed", "alibi")),
    "timm_deit_distilled": (timm_deit, 8, ("sincos", "rope_axial", "rel_bias")),
    "timm_eva": (timm_eva, 8, ("learned", "native", "fire")),
    "timm_beit": (timm_beit, 8, ("learned", "rope_mixed", "native")),  # native: rel_bias, BEiT's geometric resize
    "timm_relpos": (timm_relpos, 8, ("learned", "rope_axial", "native")),  # native: cpb(mode="cr")
    "timm_swin": (timm_swin, 16, ("rope_mixed", "swin_bias", "cpb")),
    "torchvision_vit": (torchvision_vit, 8, ("learned", "rope_mixed", "alibi")),
    "hf_vit": (hf_vit, 8, ("learned", "rope_axial", "alibi")),
    "hf_swin": (hf_swin, 16, ("rope_mixed", "swin_bias", "cpb")),
    "tubelet_vit": (tubelet_vit, 8, ("learned", "rope_axial", "alibi")),
}
WINDOWED = ("timm_swin", "hf_swin")  # exported with a static batch (see example_and_dims)
CASES = [(backbone, pe) for backbone, (_, _, pes) in BACKBONES.items() for pe in pes]
# the frontier encodings on the timm ViT (torch.export; ONNX below where it has the ops)
FRONTIER = ("peg", "string", "comrope", "liere", "spiral_rope", "harope", "vit5_rope", "bucket_bias", "lookhere",
            "pape", "pape_ri", "v2pe", "circle_rope", "hope", "dype", "spherical_rope", "geope", "fourier",
            "mhrope", "decomposed_rel_pos")


def example_and_dims(backbone: str, patch: int):
    """The traced example, its dynamic shapes (batch, frames, height, width) and sizes it was not traced at (the
    traced one last); a grid keeps >= 2 patches per axis (torch.export specialises a size of 1)."""
    from torch.export import Dim  # imported here: torch 2.1 (our floor) has no torch.export.Dim, and the module skips there
    if backbone == "tubelet_vit":
        dims = {0: Dim("batch", max=64), 2: 2 * Dim("frames", max=16), 3: patch * Dim("height", max=32),
                4: patch * Dim("width", max=32)}
        return torch.randn(2, 3, 4, 32, 32), dims, [(3, 3, 6, 16, 24), (1, 3, 8, 40, 40), (2, 3, 4, 24, 48),
                                                     (2, 3, 4, 32, 32)]
    if backbone in WINDOWED:  # one image a call: torch.export would guard batch x windows != 1 (a one-window stage)
        dims = {2: patch * Dim("height", max=32), 3: patch * Dim("width", max=32)}
        return torch.randn(1, 3, 32, 32), dims, [(1, 3, 2 * patch, 3 * patch), (1, 3, 5 * patch, 5 * patch),
                                                 (1, 3, 3 * patch, 6 * patch), (1, 3, 32, 32)]
    dims = {0: Dim("batch", max=64), 2: patch * Dim("height", max=32), 3: patch * Dim("width", max=32)}
    return torch.randn(2, 3, 32, 32), dims, [(3, 3, 2 * patch, 3 * patch), (1, 3, 5 * patch, 5 * patch),
                                             (2, 3, 3 * patch, 6 * patch), (2, 3, 32, 32)]


def logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def exported(backbone: str, pe: str):
    make = BACKBONES[backbone][0]
    return (make(pe).eval(), *exported_inputs(backbone))


def exported_inputs(backbone: str):
    """The traced example, the dynamic shapes by input name and the sizes to compare at (:func:`example_and_dims`)."""
    x, dims, sizes = example_and_dims(backbone, BACKBONES[backbone][1])
    name = "pixel_values" if backbone.startswith("hf_") else "x"
    return x, {name: dims}, sizes


def check_export(model, x, dynamic_shapes, sizes, tmp_path, onnx: bool) -> None:
    """torch.export's program at every size equals eager within :data:`TOL`; with ``onnx``, the program comes from the
    dynamo ONNX exporter (its torch.export step) and the saved ONNX file runs in onnxruntime equally close."""
    with torch.no_grad():
        if onnx:
            onnx_program = torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False)
            program = onnx_program.exported_program.module()
            onnx_program.save(str(tmp_path / "model.onnx"))
        else:
            program = torch.export.export(model, (x,), dynamic_shapes=dynamic_shapes).module()
        session = None
        if onnx:
            import onnxruntime
            session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
        for size in sizes:
            y = torch.randn(size)
            expected = logits(model(y))
            torch.testing.assert_close(logits(program(y)), expected, rtol=TOL, atol=TOL, msg=f"torch.export {size}")
            if session is not None:
                got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: y.numpy()})[0])
                torch.testing.assert_close(got, expected, rtol=TOL, atol=TOL, msg=f"onnxruntime {size}")


@pytest.mark.parametrize("backbone,pe", CASES)
def test_export_with_dynamic_sizes_equals_eager_at_unseen_sizes(backbone, pe, tmp_path):
    """torch.export and (with the export extra) ONNX in onnxruntime."""
    check_export(*exported(backbone, pe), tmp_path, onnx=HAS_ONNX)


@pytest.mark.parametrize("pe,scaling", [("rope_axial", "ntk"), ("rope_axial", "yarn"), ("dype", "yarn")])
def test_scaled_rope_exports_with_dynamic_sizes(pe, scaling, tmp_path):
    """RoPE scaled against the traced grid (``ref_shape`` 4x4): the unseen sizes shrink both axes (no scaling),
    extend both, and extend one (non-square); YaRN's attention factor is computed in the graph from the size (DyPE's
    Dy-YaRN mid-way through sampling too)."""
    options = dict(scaling=scaling, ref_shape=(4, 4), **({"timestep": 0.5} if pe == "dype" else {}))
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=options, **TINY_VIT)
    check_export(model.eval(), *exported_inputs("timm_vit"), tmp_path, onnx=HAS_ONNX)


@pytest.mark.parametrize("pe", FRONTIER)
def test_frontier_encodings_export_with_dynamic_sizes(pe, tmp_path):
    """The frontier encodings on the timm ViT, STRING's Cayley basis included (by Newton-Schulz while exporting)."""
    check_export(*exported("timm_vit", pe), tmp_path, onnx=HAS_ONNX)


def test_cayley_by_iteration_equals_the_linear_solve_far_from_identity():
    """The exporter's Cayley transform (matrix products only) against ``torch.linalg.solve`` in float64, for skew
    matrices from near zero to entries of 1e3: equal to 1e-12 and orthogonal with det 1."""
    from visionpe.rotary.string_rope import CAYLEY_EXPORT_STEPS, cayley, cayley_by_iteration
    generator = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0, 1e3):
        upper = torch.randn(2, 8, 8, dtype=torch.float64, generator=generator) * scale
        skew = upper - upper.mT
        eye = torch.eye(8, dtype=torch.float64)
        solved = torch.linalg.solve(eye + skew, eye - skew)
        iterated = cayley_by_iteration(skew, steps=CAYLEY_EXPORT_STEPS)
        assert torch.allclose(iterated, solved, rtol=0, atol=1e-12), scale
        assert torch.allclose(iterated @ iterated.mT, eye.expand_as(iterated), rtol=0, atol=1e-12)
        assert torch.allclose(torch.linalg.det(iterated), torch.ones(2, dtype=torch.float64))
        assert torch.equal(cayley(skew), solved)  # eager keeps the solve


@pytest.mark.parametrize("backbone", WINDOWED)
def test_windowed_models_export_with_a_free_batch_at_a_fixed_size(backbone, tmp_path):
    """Swin's other deployment shape: the batch free (1 included) at the traced size. With both free, timm's window
    reversal infers the batch as ``windows // (H x W / window area)``, which torch.export guards ``!= 1``; timm's own
    Swin exports neither free size (its grid is fixed at construction)."""
    from torch.export import Dim
    make, _, pes = BACKBONES[backbone]
    model = make(pes[1]).eval()
    name = "pixel_values" if backbone.startswith("hf_") else "x"
    check_export(model, torch.randn(2, 3, 32, 32), {name: {0: Dim("batch", max=64)}},
                 [(1, 3, 32, 32), (5, 3, 32, 32), (2, 3, 32, 32)], tmp_path, onnx=False)
