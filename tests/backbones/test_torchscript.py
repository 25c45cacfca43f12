"""TorchScript: ``torch.jit.script`` of a visionpe model of timm's token transformers (ViT, DeiT, Eva, BEiT, the RelPos
ViT) or of timm's Swin and Swin-V2 compiles its TorchScript form (``ScriptedGridForward``, ``ScriptedSwin``: the same
parameters, every encoding's table computed in the graph from the input's patch grid or window), which survives
``torch.jit.save``/``torch.jit.load`` and equals the eager model at the training size and at sizes it was never run
at; what has no TorchScript form is one ``NotImplementedError`` naming it and the routes that serve it
(docs/deploy.md)."""
import io
import warnings

import pytest
import timm
import torch
from conftest import perturbed, requires_that
from torchvision.models.vision_transformer import VisionTransformer

import visionpe as vpe
from visionpe._compat import ADAPTER_MIN_TIMM, SCRIPTED_ENCODINGS, timm_release
from visionpe.coords import COORDS, NORMALIZE_COORDS, axis_positions, patch_positions
from visionpe.registry import ENCODINGS

TINY = dict(img_size=32, patch_size=8, num_classes=5, depth=2, embed_dim=32, num_heads=2)
SIZES = [(32, 32), (48, 24)]  # the training size, then one the model never saw (non-square)
SWIN = dict(img_size=32, patch_size=4, window_size=4, embed_dim=24, depths=(2, 2), num_heads=(2, 4), num_classes=5)
SWIN_SIZES = [(32, 32), (56, 20)]  # 8x8 patches (a shifted first stage), then 14x5: windows padded, masks of that size
CASES = [  # every encoding with a TorchScript form, and the prefix layouts of timm's ViT family
    ("vit_tiny_patch16_224", "native"),  # learned: timm's pos_embed, a class-token row
    ("deit_tiny_distilled_patch16_224", "sincos+rope_axial"),  # class and distillation tokens, two heads
    ("vit_small_patch14_reg4_dinov2", "rope_mixed+alibi"),  # register tokens, no_embed_class, layer scale
    ("deit3_small_patch16_224", "learned+rel_bias"),
    ("eva02_tiny_patch14_224", "native"),  # Eva: learned + rope_axial (pi), separate q/k/v projections, SwiGLU
    ("vit_small_patch16_rope_224", "native"),  # Eva: rope_mixed taking over timm's frequencies, q/v biases
    ("beit_base_patch16_224", "learned+rope_mixed+alibi"),  # BEiT: Eva's attention, layer-scale vectors
    ("beit_base_patch16_224", "native"),  # rel_bias resized geometrically to each grid (grow="fit")
    ("vit_relpos_small_patch16_224", "sincos+rope_axial+rel_bias"),
    ("swin_tiny_patch4_window7_224", "rope_mixed+swin_bias"),  # Swin (SWIN, SWIN_SIZES): shifted, padded windows
    ("swinv2_tiny_window8_256", "rope_axial+alibi"),  # Swin-V2: cosine attention, q/v biases, post-norm
    ("swinv2_tiny_window8_256", "native"),  # cpb on each window (Swin-V2's log-spaced offsets)
    ("vit_relpos_small_patch16_224", "native"),  # cpb(mode="cr") taking over timm's RelPosMlp
    ("vit_small_patch14_reg4_dinov2", "cpb"),  # Swin-V2's mode, prefix rows zero
    ("deit3_small_patch16_224", "bucket_bias"),
    ("vit_small_patch16_rope_224", "fire"),  # Eva's attention
    ("vit_tiny_patch16_224", "peg+lookhere"),  # PEG after the first block; -inf outside each head's field of view
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


def assert_scripted_equals_eager(model: torch.nn.Module, sizes, what: str) -> None:
    """``model`` scripted, saved and loaded equals the eager one (features and output, within 1e-5) on a batch of
    two images at each of ``sizes``."""
    loaded = script(model)
    with torch.no_grad():
        for size in sizes:
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(loaded.forward_features(x), model.forward_features(x), rtol=0, atol=1e-5,
                                       msg=f"{what} at {size}")
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-5, msg=f"{what} at {size}")


def perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Every encoding's parameters moved off their initial values (STRING's basis and HARoPE's maps start as the
    identity, which a form that left them out would match)."""
    for module in model.modules():
        if isinstance(module, vpe.Encoding):
            perturbed(module, std=0.1)
    return model


@pytest.mark.parametrize("name, pe, pe_kwargs", [  # a model of a newer timm than the floor's is skipped there
    pytest.param(name, pe, {}, marks=requires_that(timm.is_model(name), f"timm's {name} (a newer timm)"))
    for name, pe in CASES] + [("vit_tiny_patch16_224", pe, kwargs) for pe, kwargs in VARIANTS])
def test_scripted_model_equals_eager_at_any_size(name, pe, pe_kwargs):
    torch.manual_seed(0)
    kwargs, sizes = (SWIN, SWIN_SIZES) if name.startswith("swin") else (TINY, SIZES)
    if set(pe.split("+")) & ONE_BLOCK:
        kwargs = {**kwargs, "depth": 1}
    model = perturb(vpe.create_model(name, pe=pe, pe_kwargs=pe_kwargs, **kwargs).eval())
    assert_scripted_equals_eager(model, sizes, f"{name} {pe}")


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


TV = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5)
TV_CASES = ["sincos+rope_axial+rel_bias", "learned+rope_mixed+alibi", "cpb", "bucket_bias", "fire", "lookhere",
            "string", "comrope", "liere", "harope", "spiral_rope"]
# with native: every scripted encoding but Swin's windows' table and PEG after the first block (refused below)
assert {pe for pes in TV_CASES for pe in pes.split("+")} == set(SCRIPTED_ENCODINGS) - {"swin_bias", "peg"}


def torchvision_vit(**kw) -> VisionTransformer:
    """A tiny torchvision ViT with non-trivial weights (eval: its dropouts on, dropping nothing)."""
    torch.manual_seed(0)
    return perturbed(VisionTransformer(**{**TV, "dropout": 0.1, "attention_dropout": 0.1, **kw})).eval()


@pytest.mark.parametrize("pe", TV_CASES)
def test_scripted_torchvision_vit_equals_eager_at_any_size(pe):
    """torchvision's ViT through vpe.apply: the scripted, saved and loaded model equals the eager one at the training
    size and at a non-square size torchvision's own model refuses (native: in the next test)."""
    model = vpe.apply(torchvision_vit(), pe=pe)
    assert_scripted_equals_eager(model, SIZES, pe)


def test_scripted_torchvision_vit_native_equals_torchvision_scripted():
    """The control: torchvision's own ViT scripts (its test suite checks it) and runs its one size; visionpe's
    scripted twin with its own table (native) gives torchvision's scripted logits there and, saved and loaded, equals
    the eager twin at a size torchvision refuses."""
    reference = torchvision_vit(representation_size=24)
    model = vpe.apply(torchvision_vit(representation_size=24), pe="native")
    ours, theirs = script(model), script(reference)
    x, other = torch.randn(2, 3, *SIZES[0]), torch.randn(2, 3, *SIZES[1])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-5)
        torch.testing.assert_close(ours(other), model(other), rtol=0, atol=1e-5)
        with pytest.raises(torch.jit.Error, match="Wrong image height"):
            theirs(other)


@pytest.mark.parametrize("pe, what", [
    ("pape", r"TorchvisionViTPE with PaPE \(encoder\.layers\.encoder_layer_0\.self_attention\.bias\): it has no "
             r"TorchScript form"),
    ("peg", r"TorchvisionViTPE with PEG after block 1: "),
])
def test_torchvision_vit_encoding_without_a_torchscript_form_is_named(pe, what):
    model = vpe.apply(torchvision_vit(), pe=pe)
    with pytest.raises(NotImplementedError, match=rf"^torch.jit.script does not support {what}.*{ROUTES}"):
        torch.jit.script(model)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


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
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+rel_bias", attn_drop_rate=0.1, **TINY).eval()
    with warnings.catch_warnings():  # (eval: the scripted attention drops nothing either)
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
    assert type(model.blocks[0].attn).__name__ == "Attention"  # the eager model keeps its own blocks
    x = torch.randn(1, 3, 40, 32)
    with torch.no_grad():
        model.blocks[1].attn.bias.relative_position_bias_table.add_(1.0)  # a trained weight, changed in place
        model.blocks[0].attn.rotary.freqs.mul_(2.0)
        torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=1e-5)
        assert model(x[..., :32, :], grid_offset=(1, 2)).shape == (1, 5)  # eager-only arguments still work


def test_scripted_mlp_and_convolution_forms_share_the_encodings_parameters():
    """The TorchScript forms of PEG (its convolution) and FIRE (its MLP, c, threshold multiplier) hold the
    encodings' parameters themselves: a weight changed in place after scripting changes the scripted model too."""
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="peg+fire", **TINY).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
    x = torch.randn(1, 3, 40, 32)
    with torch.no_grad():
        before = scripted(x)
        fire = model.blocks[1].attn.bias
        fire.c.mul_(3.0)
        fire.threshold_multiplier.mul_(0.5)
        fire.mlp[2].weight.add_(0.5)
        model.pe_tokens.proj.weight.add_(0.5)
        assert (scripted(x) - before).abs().max() > 1e-2
        torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=1e-5)


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
    assert scripted == set(SCRIPTED_ENCODINGS) - {"swin_bias"}


@pytest.mark.parametrize("pe, what", [
    ("pape", r"VisionTransformerPE with PaPE \(blocks\.0\.attn\.bias\): it has no TorchScript form"),
    ("geope", r"VisionTransformerPE with GeoPE \(blocks\.0\.attn\.rotary\): it has no TorchScript form"),
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
    ("vit_tiny_patch16_224", "cpb", {"coords": "normalized"}, r"VisionTransformerPE with ContinuousPositionBias with "
                                                              r"coords='normalized' \(blocks\.0\.attn\.bias\)"),
    ("vit_tiny_patch16_224", "rope_axial", {"coords": "pixel", "shift_coords": 0.5}, r"VisionTransformerPE with "
                                                    r"AxialRoPE with coords='pixel', shift_coords=0.5 \(blocks"),
    ("vit_tiny_patch16_224", "liere", {"shift_coords": 0.5}, r"VisionTransformerPE with LieRE with "
                                                             r"coords='normalized', shift_coords=0.5 \(blocks"),
    ("vit_tiny_patch16_224", "harope", {"scaling": "ntk"}, r"VisionTransformerPE with HARoPE with scaling='ntk'"),
])
def test_a_setting_without_a_torchscript_form_is_named(name, pe, pe_kwargs, setting):
    model = vpe.create_model(name, pe=pe, pe_kwargs=pe_kwargs, **TINY).eval()
    with pytest.raises(NotImplementedError, match=rf"^torch.jit.script does not support {setting}"):
        torch.jit.script(model)


def test_a_swin_setting_without_a_torchscript_form_is_named_with_its_window_attention():
    model = vpe.create_model("swin_tiny_patch4_window7_224", pe="rope_mixed", pe_kwargs={"scaling": "yarn"},
                             **SWIN).eval()
    where = r"\(layers\.0\.blocks\.0\.attn\.rotary\)"
    with pytest.raises(NotImplementedError, match=rf"^torch.jit.script does not support SwinTransformerPE with "
                                                  rf"MixedRoPE with scaling='yarn' {where}: "):
        torch.jit.script(model)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


def test_a_swin_bias_scripts_for_its_window_and_refuses_a_larger_grid_as_eager():
    """Swin's fixed window (``grow="error"``): a grid no larger than the window reads the table as the eager bias
    does (prefix rows zero); a larger one raises inside the graph, as the eager bias raises."""
    torch.manual_seed(0)
    pe = vpe.build("swin_bias", num_heads=2, window_size=(3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(pe.scriptable())
    for shape, prefix in [((3, 3), 0), ((2, 3), 1)]:
        torch.testing.assert_close(scripted(list(shape), prefix), pe(vpe.Grid(shape, prefix=prefix)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="larger than window_size"):
        pe(vpe.Grid((4, 3)))
    with pytest.raises(torch.jit.Error, match="larger than the bias's window_size"):
        scripted([4, 3], 0)


@pytest.mark.skipif(timm_release() < ADAPTER_MIN_TIMM["Xcit"], reason="the Xcit adapter needs a newer timm")
def test_a_model_class_without_a_torchscript_form_is_named():
    model = vpe.create_model("xcit_nano_12_p16_224", pe="sincos", img_size=32, depth=2, embed_dim=32, num_heads=2,
                             num_classes=5).eval()
    with pytest.raises(NotImplementedError, match=rf"^torch.jit.script does not support XcitPE: this "
                                                  rf"model class has no TorchScript form{ROUTES}"):
        torch.jit.script(model)


def test_an_encoding_alone_does_not_script():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), vpe.build("alibi", num_heads=2))
    with pytest.raises(NotImplementedError, match=r"^torch.jit.script does not support ALiBi: an encoding scripts "
                                                  r"inside a visionpe model, not alone"):
        torch.jit.script(model)
