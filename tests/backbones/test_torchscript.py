"""TorchScript: ``torch.jit.script`` of a visionpe model of timm's token transformers (ViT, DeiT, Eva, BEiT, the RelPos
ViT) compiles its TorchScript form (``ScriptedGridForward``: the same parameters, every encoding's table computed in
the graph from the input's patch grid), which survives ``torch.jit.save``/``torch.jit.load`` and equals the eager
model at the training size and at sizes it was never run at; what has no TorchScript form is one
``NotImplementedError`` naming it and the routes that serve it (docs/deploy.md)."""
import io
import warnings

import pytest
import torch

import visionpe as vpe
from visionpe._compat import SCRIPTED_ENCODINGS
from visionpe.coords import COORDS, NORMALIZE_COORDS, axis_positions, patch_positions
from visionpe.registry import ENCODINGS

TINY = dict(img_size=32, patch_size=8, num_classes=5, depth=2, embed_dim=32, num_heads=2)
SIZES = [(32, 32), (48, 24)]  # the training size, then one the model never saw (non-square)
CASES = [  # every encoding with a TorchScript form, and the prefix layouts of timm's ViT family
    ("vit_tiny_patch16_224", "native"),  # learned: timm's pos_embed, a class-token row
    ("deit_tiny_distilled_patch16_224", "sincos+rope_axial"),  # class and distillation tokens, two heads
    ("vit_small_patch14_reg4_dinov2", "rope_mixed+alibi"),  # register tokens, no_embed_class, layer scale
    ("deit3_small_patch16_224", "learned+rel_bias"),
    ("eva02_tiny_patch14_224", "native"),  # Eva: learned + rope_axial (pi), separate q/k/v projections, SwiGLU
    ("vit_small_patch16_rope_224", "native"),  # Eva: rope_mixed taking over timm's frequencies, q/v biases
    ("beit_base_patch16_224", "learned+rope_mixed+alibi"),  # BEiT: Eva's attention, layer-scale vectors
    ("vit_relpos_small_patch16_224", "sincos+rope_axial+rel_bias"),
    ("vit_small_patch16_dinov3", "native"),  # Eva: rope_axial on normalised coordinates, rotate-half pairs
    ("deit_tiny_distilled_patch16_224", "string"),  # Cayley-STRING: RoPE after a learned basis
    ("deit3_small_patch16_224", "learned+comrope"),  # block rotations from commuting angle matrices, [-1, 1]
    ("eva02_tiny_patch14_224", "liere"),  # a dense generator's exponential per position
    ("vit_small_patch16_dinov3", "harope"),  # RoPE after learned maps M and M^-T per head, register tokens
    ("vit_small_patch16_rope_224", "spiral_rope"),  # fixed frequencies turned to four directions
]
VARIANTS = [  # other forms of the encodings (index coordinates: resolution scaling "pi" in a model)
    ("rope_axial", {"coords": "pixel", "normalize_coords": "min"}),
    ("string", {"variant": "circulant"}),
    ("comrope", {"variant": "ap", "coords": "index"}),
    ("liere", {"block_size": 4, "coords": "pixel", "normalize_coords": "min"}),
]
assert {pe for _, pes in CASES for pe in pes.split("+")} == {"native", *SCRIPTED_ENCODINGS}
ONE_BLOCK = {"string", "comrope", "liere", "harope", "spiral_rope"}  # a form per block: the other cases check two
VIT_ENCODINGS = [pe for pe in vpe.available() if 2 in ENCODINGS[pe].ndims and pe != "swin_bias"]  # (Swin's windows)
ROUTES = r".*torch.export.export or to ONNX.*torch.fx"


def script(model: torch.nn.Module) -> torch.jit.ScriptModule:
    """``model`` scripted, saved and loaded back: a module that holds no Python code of visionpe's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch 2.14: torch.jit.script is deprecated
        buffer = io.BytesIO()
        torch.jit.save(torch.jit.script(model), buffer)
        buffer.seek(0)
        return torch.jit.load(buffer)


def perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Every encoding parameter moved off its initial value (STRING's basis and HARoPE's maps start as the identity,
    which a form that left them out would match)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, vpe.Encoding):
                for parameter in module.parameters(recurse=False):
                    parameter.add_(0.1 * torch.randn_like(parameter))
    return model


@pytest.mark.parametrize("name, pe, pe_kwargs", [(name, pe, {}) for name, pe in CASES] +
                         [("vit_tiny_patch16_224", pe, kwargs) for pe, kwargs in VARIANTS])
def test_scripted_model_equals_eager_at_any_size(name, pe, pe_kwargs):
    torch.manual_seed(0)
    depth = 1 if set(pe.split("+")) & ONE_BLOCK else 2
    model = perturb(vpe.create_model(name, pe=pe, pe_kwargs=pe_kwargs, **{**TINY, "depth": depth}).eval())
    loaded = script(model)
    with torch.no_grad():
        for size in SIZES:
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(loaded.forward_features(x), model.forward_features(x), rtol=0, atol=1e-5,
                                       msg=f"{name} {pe} at {size}")
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-5, msg=f"{name} {pe} at {size}")


@pytest.mark.parametrize("coords", COORDS)
def test_scripted_positions_are_the_coordinate_systems(coords):
    """The TorchScript function the scripted encodings read their coordinates with gives what the coordinate system
    gives the eager encodings, for every normalisation, on grids of one, two and three axes."""
    positions = torch.jit.script(patch_positions)
    for normalize_coords in NORMALIZE_COORDS:
        for shape in [(5,), (3, 7), (1, 4, 2)]:
            got = positions(list(shape), coords, normalize_coords, torch.float64, torch.device("cpu"))
            expected = axis_positions(shape, coords=coords, normalize_coords=normalize_coords, dtype=torch.float64)
            assert len(got) == len(shape)
            for axis, (a, b) in enumerate(zip(got, expected)):
                torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{coords} {normalize_coords} {shape} {axis}")


def test_scripted_clip_model_equals_eager_at_any_length():
    """A clip model (3D tubelets): the scripted forward reads the (T, H, W) grid, every table follows it."""
    torch.manual_seed(0)
    model = vpe.create_video_model("vit_tiny_patch16_224", pe="learned+rope_axial+alibi", num_frames=4, img_size=16,
                                   tubelet_size=(2, 8, 8), num_classes=5, depth=2, embed_dim=48, num_heads=2).eval()
    loaded = script(model)
    with torch.no_grad():
        for size in [(4, 16, 16), (6, 24, 16)]:
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-5, msg=f"clip of {size}")


@pytest.mark.parametrize("pe", ["string", "comrope", "liere", "harope"])
def test_a_scripted_learned_rotation_reads_its_parameters_as_they_are_now(pe):
    """The TorchScript form holds the encoding's own parameters: a change after scripting (training) is what the
    scripted model computes with."""
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, **{**TINY, "depth": 1}).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
    perturb(model)
    x = torch.randn(1, 3, 40, 32)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=1e-5)


def test_scripted_model_shares_the_parameters_and_leaves_the_eager_model_as_it_was():
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+rel_bias", **TINY).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
    assert type(model.blocks[0].attn).__name__ == "Attention"  # the eager model keeps its own blocks
    x = torch.randn(1, 3, 40, 32)
    with torch.no_grad():
        model.blocks[1].attn.bias.relative_position_bias_table.add_(1.0)  # a trained weight, changed in place
        model.blocks[0].attn.rotary.freqs.mul_(2.0)
        torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=1e-5)
        assert model(x[..., :32, :], grid_offset=(1, 2)).shape == (1, 5)  # eager-only arguments still work


def test_every_encoding_scripts_equal_to_eager_or_refuses_by_name():
    """Over the registry (every encoding a ViT takes): the ones that script are SCRIPTED_ENCODINGS, each equal to the
    eager model at two sizes; every other one refuses, naming its class (a subclass of a scripted class too: HARoPE,
    Spiral RoPE, V2PE, ... place or rotate otherwise)."""
    scripted = set()
    for pe in VIT_ENCODINGS:
        torch.manual_seed(0)
        model = vpe.create_model("vit_tiny_patch16_224", pe=pe, **{**TINY, "depth": 1}).eval()
        name = type(getattr(model.blocks[0].attn, ENCODINGS[pe].family, None) or model.pe_tokens).__name__
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                compiled = torch.jit.script(model)
        except NotImplementedError as error:
            assert str(error).startswith(f"torch.jit.script does not support VisionTransformerPE with {name} "), pe
            continue
        scripted.add(pe)
        with torch.no_grad():
            for size in SIZES:
                x = torch.randn(2, 3, *size)
                torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-5, msg=f"{pe} at {size}")
    assert scripted == set(SCRIPTED_ENCODINGS)


@pytest.mark.parametrize("pe, what", [
    ("lookhere", r"VisionTransformerPE with LookHere \(blocks\.0\.attn\.bias\): it has no TorchScript form"),
    ("geope", r"VisionTransformerPE with GeoPE \(blocks\.0\.attn\.rotary\): it has no TorchScript form"),
    ("peg", r"VisionTransformerPE with PEG after block 1: "),
])
def test_an_encoding_without_a_torchscript_form_is_named(pe, what):
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, **TINY).eval()
    with pytest.raises(NotImplementedError, match=rf"^torch.jit.script does not support {what}{ROUTES}"):
        torch.jit.script(model)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


@pytest.mark.parametrize("name, pe, pe_kwargs, setting", [
    ("vit_tiny_patch16_224", "sincos", {"coords": "normalized"}, r"VisionTransformerPE with SinCos with "
                                                                 r"coords='normalized' \(pe_tokens\)"),
    ("vit_tiny_patch16_224", "learned", {"fit": "tile"}, r"VisionTransformerPE with Learned with fit='tile'"),
    ("vit_tiny_patch16_224", "rope_mixed", {"scaling": "yarn"}, r"VisionTransformerPE with MixedRoPE with "
                                                                r"scaling='yarn' \(blocks\.0\.attn\.rotary\)"),
    ("vit_tiny_patch16_224", "alibi", {"jitter_coords": 1.2}, r"VisionTransformerPE with ALiBi with jitter_coords=1.2"),
    ("vit_tiny_patch16_224", "rope_axial", {"coords": "pixel", "shift_coords": 0.5}, r"VisionTransformerPE with "
                                                    r"AxialRoPE with coords='pixel', shift_coords=0.5 \(blocks"),
    ("vit_tiny_patch16_224", "liere", {"shift_coords": 0.5}, r"VisionTransformerPE with LieRE with "
                                                             r"coords='normalized', shift_coords=0.5 \(blocks"),
    ("vit_tiny_patch16_224", "harope", {"scaling": "ntk"}, r"VisionTransformerPE with HARoPE with scaling='ntk'"),
    ("beit_base_patch16_224", "native", {}, r"BeitPE with RelBias with interpolation='geometric'"),  # BEiT's own
])
def test_a_setting_without_a_torchscript_form_is_named(name, pe, pe_kwargs, setting):
    model = vpe.create_model(name, pe=pe, pe_kwargs=pe_kwargs, **TINY).eval()
    with pytest.raises(NotImplementedError, match=rf"^torch.jit.script does not support {setting}"):
        torch.jit.script(model)


def test_a_model_class_without_a_torchscript_form_is_named():
    model = vpe.create_model("swin_tiny_patch4_window7_224", pe="cpb", img_size=32, patch_size=4, window_size=2,
                             embed_dim=16, depths=(2, 2), num_heads=(1, 2), num_classes=5).eval()
    with pytest.raises(NotImplementedError, match=rf"^torch.jit.script does not support SwinTransformerPE: this "
                                                  rf"model class has no TorchScript form{ROUTES}"):
        torch.jit.script(model)


def test_an_encoding_alone_does_not_script():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), vpe.build("alibi", num_heads=2))
    with pytest.raises(NotImplementedError, match=r"^torch.jit.script does not support ALiBi: an encoding scripts "
                                                  r"inside a visionpe model, not alone"):
        torch.jit.script(model)
