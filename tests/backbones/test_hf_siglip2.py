"""transformers' SigLIP 2 vision tower (NaFlex) with visionpe encodings: transformers' own model is the oracle (tiny
configs built here; nothing is downloaded)."""
import copy
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")
siglip2 = pytest.importorskip("transformers.models.siglip2", reason="transformers >= 4.49 has SigLIP 2")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("the SigLIP 2 adapter takes transformers 5's tower (a PreTrainedModel)", allow_module_level=True)

import visionpe as vpe  # noqa: E402
from visionpe.backbones.hf_siglip2 import TOWER, Siglip2VisionTowerPE  # noqa: E402
from visionpe.grid import Grid, MixedLayout  # noqa: E402
from conftest import perturbed, saved_and_loaded  # noqa: E402

PATCH = 4
CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=PATCH,
              num_patches=16)  # a 4x4 table
WIDTH = 3 * PATCH * PATCH
MIXED = [(3, 5), (6, 2), (8, 6), (4, 4)]  # non-square, larger than the table, the table's own


def _config(**overrides):
    return siglip2.Siglip2VisionConfig(**{**CONFIG, **overrides})


def _tower(**overrides):
    torch.manual_seed(0)
    return perturbed(siglip2.Siglip2VisionModel(_config(**overrides))).eval()


def tower_of(model):
    """The tower: ``Siglip2VisionModel`` itself, or its ``vision_model`` (transformers 5's first releases)."""
    return model if isinstance(model, TOWER) else model.vision_model


def _classifier():
    torch.manual_seed(0)
    config = siglip2.Siglip2Config(vision_config=_config().to_dict(), num_labels=3)
    return perturbed(siglip2.Siglip2ForImageClassification(config)).eval()


def naflex(shapes, length=None, seed=1):
    """A NaFlex batch of images with patch grids ``shapes``: pixels ``(B, L, C p p)`` (padding random, as garbage),
    the mask ``(B, L)``, ``spatial_shapes (B, 2)``."""
    length = length or max(h * w for h, w in shapes)
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(len(shapes), length, WIDTH, generator=generator)
    mask = torch.zeros(len(shapes), length, dtype=torch.long)
    for i, (h, w) in enumerate(shapes):
        mask[i, :h * w] = 1
    return pixels, mask, torch.tensor(shapes)


def _compare(ours, theirs, mask, tol=1e-5):
    real = mask.bool()
    assert (ours.last_hidden_state - theirs.last_hidden_state)[real].abs().max() < tol
    assert (ours.pooler_output - theirs.pooler_output).abs().max() < tol


@pytest.mark.parametrize("shapes", [[(4, 4)], [(3, 5)], [(2, 7)], [(8, 6)], [(6, 10)], MIXED],
                         ids=["table", "non-square", "wide", "larger", "larger-non-square", "mixed"])
def test_native_gives_transformers_outputs(shapes):
    """``pe="native"`` is SigLIP 2's table resized per image (bilinear, antialias): transformers' last hidden state
    (at the real patches) and pooled output, one image at a grid or images of different grids in one padded batch."""
    ref = _tower()
    model = vpe.apply(copy.deepcopy(ref), "native")
    assert type(tower_of(model)) is Siglip2VisionTowerPE and tower_of(model).embeddings.position_embedding is None
    table = vpe.encodings_of(model)["tokens"][0]
    assert table.grid_shape == (4, 4) and table.interpolation == "bilinear" and table.antialias
    pixels, mask, spatial = naflex(shapes, length=max(h * w for h, w in shapes) + 3)  # padded beyond the longest too
    with torch.no_grad():
        _compare(model(pixels, mask, spatial), ref(pixel_values=pixels, pixel_attention_mask=mask,
                                                  spatial_shapes=spatial), mask)


def test_padding_is_never_attended():
    """Whatever the padded slots hold, the real patches' outputs and the pooled output do not change (with the mask,
    and without it: the spatial shapes say where each image ends)."""
    model = vpe.apply(_tower(), "rope_mixed+learned")
    pixels, mask, spatial = naflex(MIXED)
    other = torch.where(mask.bool()[..., None], pixels, 100 * torch.randn_like(pixels))
    with torch.no_grad():
        out = model(pixels, mask, spatial)
        for inputs in ((other, mask, spatial), (other, None, spatial)):
            _compare(model(*inputs), out, mask, tol=1e-6)


def test_classifier_wrapper_gives_transformers_logits():
    """``Siglip2ForImageClassification`` (its tower in ``vision_model``) is patched as a task model: its mean pooling
    and classifier run unchanged around the patched tower."""
    ref = _classifier()
    model = vpe.apply(copy.deepcopy(ref), "native")
    assert isinstance(model.vision_model, Siglip2VisionTowerPE) and model.pe == "learned"
    pixels, mask, spatial = naflex(MIXED)
    with torch.no_grad():
        ours = model(pixels, mask, spatial).logits
        theirs = ref(pixel_values=pixels, pixel_attention_mask=mask, spatial_shapes=spatial).logits
    assert (ours - theirs).abs().max() < 1e-5


IMAGE_ENCODINGS = [pe for pe in vpe.available() if 2 in vpe.registry.ENCODINGS[pe].ndims and pe != "swin_bias"]


@pytest.mark.parametrize("pe", [*IMAGE_ENCODINGS, "rope_mixed+learned", "learned+alibi", "peg+lookhere"])
def test_any_encoding_runs_each_image_on_its_own_grid(pe):
    """Every registered image encoding (and combinations) swaps in with every other weight kept, and in a mixed NaFlex
    batch each image gets what it gets alone (its own grid, padding masked)."""
    ref = _tower()
    model = vpe.apply(copy.deepcopy(ref), pe)
    state = model.state_dict()
    kept = {k: v for k, v in ref.state_dict().items() if not k.endswith("embeddings.position_embedding.weight")}
    assert all(torch.equal(state[k], v) for k, v in kept.items())
    pixels, mask, spatial = naflex(MIXED)
    with torch.no_grad():
        out = model(pixels, mask, spatial)
        for i, (h, w) in enumerate(MIXED):
            n = h * w
            alone = model(pixels[i:i + 1, :n], mask[i:i + 1, :n], spatial[i:i + 1])
            assert (out.last_hidden_state[i, :n] - alone.last_hidden_state[0]).abs().max() < 1e-5, (pe, h, w)
            assert (out.pooler_output[i] - alone.pooler_output[0]).abs().max() < 1e-5, (pe, h, w)


def test_swin_bias_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="swin_bias needs window attention"):
        vpe.apply(_tower(), "swin_bias")


def test_naflex_inputs_are_checked():
    model = tower_of(vpe.apply(_tower(), "native"))
    pixels, mask, spatial = naflex([(3, 5)])
    with pytest.raises(ValueError, match="spatial_shapes must be an integer"):
        model(pixels, mask)
    with pytest.raises(ValueError, match=r"h \* w <= max_num_patches=15"):
        model(pixels, mask, torch.tensor([[4, 4]]))
    with pytest.raises(ValueError, match="pixel_values must be floating patchified pixels"):
        model(pixels[..., :-1], mask, spatial)
    with pytest.raises(ValueError, match="pixel_attention_mask must be"):
        model(pixels, mask[:, :-1], spatial)
    # issue 43: a bool spatial_shapes is named; a mask marking more patches than spatial_shapes is refused
    with pytest.raises(ValueError, match=r"spatial_shapes must be an integer .* got torch.bool of shape \(1, 2\)"):
        model(pixels, mask, spatial.bool())
    pixels, mask, spatial = naflex([(3, 5), (2, 2)])
    mask[1, :6] = 1
    with pytest.raises(ValueError, match=r"pixel_attention_mask marks 6 tokens of image 1 .* spatial_shapes \(2, 2\) "
                                         r"= 4"):
        model(pixels, mask, spatial)
    mask[1, 3:] = 0  # fewer marked than the grid holds: the caller's own masking, accepted
    assert torch.isfinite(model(pixels, mask, spatial).last_hidden_state).all()


def test_mixed_layout_length_is_at_least_the_longest_sample():
    assert MixedLayout((Grid((2, 3)), Grid((1, 2))), length=9).num_tokens == 9
    with pytest.raises(ValueError, match="length=5 must be an integer of at least the longest sample's 6 tokens"):
        MixedLayout((Grid((2, 3)), Grid((1, 2))), length=5)


@pytest.mark.parametrize("build", [_tower, _classifier], ids=["tower", "classifier"])
def test_save_pretrained_round_trip(tmp_path, build):
    model = vpe.apply(build(), "rope_mixed+learned")
    loaded = saved_and_loaded(model, type(build()), tmp_path)
    pixels, mask, spatial = naflex(MIXED)
    with torch.no_grad():
        ours, theirs = loaded(pixels, mask, spatial), model(pixels, mask, spatial)
    key = "logits" if "logits" in ours else "last_hidden_state"
    assert torch.equal(ours[key], theirs[key])
