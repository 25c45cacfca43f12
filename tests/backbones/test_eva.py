"""timm's Eva family (EVA, EVA-02, the rope-vit ports, timm's SBB RoPE ViTs, DINOv3, LingBot, Sapiens2) and timm's
distilled DeiT with visionpe encodings: timm's own models at random weights are the oracle."""
import copy
import inspect
import re

import pytest
import timm
import torch
from conftest import assert_swapped_encoding_works, perturbed, requires_that
from timm.layers import RotaryEmbeddingCat, apply_rot_embed_cat
from timm.models.eva import Eva

import visionpe as vpe
from visionpe.backbones import PositionalModel
from visionpe.backbones.eva import EvaAttentionPE

KW = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)
SIZES = ((32, 32), (48, 40), (16, 24))  # the training size, larger, smaller (and not square)
HAS_GQA = "num_kv_heads" in inspect.signature(Eva).parameters


def newer(name: str, why: str = ""):
    """An Eva variant of a newer timm than the floor's (skipped there, saying which)."""
    return pytest.param(name, marks=requires_that(timm.is_model(name), f"timm's {name} (a newer timm) {why}"))


# every RoPE type, pos_embed with and without prefix rows, q/v biases, fused and split projections, scaled MLP,
# post-norm blocks, registers, grouped key/value heads
VARIANTS = [
    "vit_small_patch16_rope_224",  # rope-vit axial: xy, theta 100, integer positions (extrapolated)
    "vit_small_patch16_rope_mixed_224",  # rope-vit mixed: learned frequencies per block
    "vit_small_patch16_rope_ape_224",  # + pos_embed without prefix rows (no_embed_class)
    "vit_small_patch16_rope_mixed_ape_224",
    "eva02_tiny_patch14_224",  # ij, theta 10000, ref_feat_shape 16x16 (scaling pi), pos_embed with a class row
    "eva02_base_patch14_224",  # split q/k/v projections, SwiGLU with a norm
    "vit_medium_patch16_rope_reg1_gap_256",  # timm SBB: a register, average pooling, ref_feat_shape 16x16
    "eva_giant_patch14_224",  # EVA: pos_embed only
    "eva02_enormous_patch14_clip_224",  # post-norm blocks
    newer("vit_small_patch16_dinov3"),  # DINOv3: normalised coordinates, half pairs, 4 registers
    newer("vit_small_patch16_lingbot"),
    newer("vit_base_patch16_sapiens2", "(grouped key/value heads, q/k RMS norm, train-time rescale)"),
]


def _perturb(model):
    return perturbed(model).eval()


def _timm_eva(name, **extra):
    kw = dict(KW, **extra)
    if "sapiens2" in name:
        kw["num_kv_heads"] = 1  # its per-block tuple is for its own depth; one key/value head for both query heads
    torch.manual_seed(0)
    return _perturb(timm.create_model(name, dynamic_img_size=True, **kw))


def _max_diff(ours, theirs, size):
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
    with torch.no_grad():
        return (ours(x) - theirs(x)).abs().max().item()


@pytest.mark.parametrize("name", VARIANTS)
def test_native_encoding_keeps_timms_logits_at_every_size(name):
    """``apply(eva, pe="native")``: timm's own position encoding, reproduced exactly (at the training size and at other
    sizes, with the scaling that variant has); the model is patched in place, every weight kept."""
    eva = _timm_eva(name)
    before = copy.deepcopy(eva)
    ours = vpe.apply(eva, pe="native")
    assert ours is eva and isinstance(ours, PositionalModel) and ours.rope is None
    assert all(isinstance(b.attn, EvaAttentionPE) for b in ours.blocks)
    for size in SIZES:
        assert _max_diff(ours, before, size) < 2e-5, (name, size)
    pe, kwargs = vpe.backbones.adapter_for(ours).native_pe(ours)
    assert pe == ours.pe
    if before.rope is not None:
        assert pe.split("+")[0] in ("rope_axial", "rope_mixed")
    if before.pos_embed is not None:
        assert pe.endswith("learned")


def test_the_sbb_gap_ports_interpolate_to_their_reference_grid():
    """timm's ``*_reg*_gap_256`` models carry ``ref_feat_shape=(16, 16)``: positions are scaled to a 16x16 grid at
    every size (PI), so the native encoding is ``rope_axial`` with ``scaling="pi", ref_shape=(16, 16)``, ij order,
    theta 10000: its rotation of q is timm's own RoPE module's (``apply_rot_embed_cat``) at every grid, and extrapolated
    integer positions (``scaling="none"``) are not."""
    eva = _timm_eva("vit_medium_patch16_rope_reg1_gap_256")
    assert vpe.backbones.adapter_for(eva).native_pe(eva) == (
        "rope_axial", dict(theta=10000.0, axis_order="ij", pairs="interleaved", scaling="pi", ref_shape=(16, 16)))
    rotary = vpe.encodings_of(vpe.apply(copy.deepcopy(eva), pe="native"))["rotary"][0]
    assert (rotary.scaling, rotary.ref_shape, rotary.axis_order, rotary.theta) == ("pi", (16, 16), "ij", 10000.0)
    extrapolated = vpe.encodings_of(vpe.apply(copy.deepcopy(eva), pe="native", scaling="none"))["rotary"][0]
    for shape in ((4, 4), (6, 5)):
        q = torch.randn(1, 8, shape[0] * shape[1], rotary.head_dim)
        expected = apply_rot_embed_cat(q, eva.rope.get_embed(shape=list(shape)))
        torch.testing.assert_close(rotary.rotate(q, vpe.Grid(shape)), expected, atol=2e-5, rtol=1e-5)
        assert (extrapolated.rotate(q, vpe.Grid(shape)) - expected).abs().max() > 0.1


@pytest.mark.parametrize("name", ["vit_small_patch16_rope_mixed_224", "eva02_tiny_patch14_224",
                                  "vit_small_patch16_rope_ape_224"])
def test_registry_name_is_timms_model_at_any_size(name):
    """``timm.create_model("vpe_<eva name>")`` has the native encoding by default; timm's state dict loads into it
    (a mixed RoPE's ``rope.freqs`` becomes each block's frequencies, ``pos_embed`` the learned table) with every key
    used, and it computes timm's logits at every size."""
    eva = _timm_eva(name)
    ours = timm.create_model(f"vpe_{name}", **KW).eval()
    report = vpe.load_timm_checkpoint(ours, eva.state_dict(), strict=True)
    if "mixed" in name:
        assert "rope.freqs[:, 1] -> blocks.1.attn.rotary.freqs" in report.converted
    if "pos_embed" in eva.state_dict():
        assert any(line.startswith("pos_embed -> pe_tokens.") for line in report.converted)
    assert ours.pretrained_cfg["fixed_input_size"] is False
    for size in SIZES:
        assert _max_diff(ours, eva, size) < 2e-5, (name, size)


POSITIONAL = ("pos_embed", "rope.")


@pytest.mark.parametrize("pe", ["rope_mixed", "learned", "alibi", "rope_axial+rel_bias", "sincos+lookhere",
                                "string", "fire"])
def test_any_other_encoding_keeps_every_non_positional_weight(pe):
    """Another encoding replaces timm's: every non-positional weight of the Eva is kept (same tensor values under the
    same names), the model runs at any size and trains its encoding."""
    eva = _timm_eva("eva02_tiny_patch14_224")
    source = {k: v.clone() for k, v in eva.state_dict().items() if not k.startswith(POSITIONAL)}
    ours = vpe.apply(eva, pe).train()
    assert not any(k.startswith(POSITIONAL) for k in ours.state_dict())
    assert_swapped_encoding_works(ours, source, SIZES)


def test_create_model_with_another_encoding_and_back():
    """``vpe.create_model`` takes Eva names; re-applying the native encoding to a patched model works from what the
    model recorded when it was patched (timm's RoPE module is gone by then)."""
    ours = vpe.create_model("eva02_tiny_patch14_224", pe="alibi", **KW)
    assert ours.pe == "alibi" and vpe.encodings_of(ours)["bias"]
    vpe.apply(ours, pe="native")
    rotary = vpe.encodings_of(ours)["rotary"][0]
    assert ours.pe == "rope_axial+learned" and (rotary.theta, rotary.ref_shape) == (10000.0, (16, 16))


PERCEPTION_ENCODER = [newer(f"vit_pe_core_{size}_patch16_384", "(Perception Encoder)") for size in ("tiny", "small")]


@pytest.mark.parametrize("name", PERCEPTION_ENCODER)
def test_perception_encoder_native_is_rope_with_its_grid_offset(name):
    """Perception Encoder's RoPE (patches counted from 1 beside the unrotated class token, ``rope_grid_offset=1``,
    then scaled to ``ref_feat_shape`` 24x24, xy order): ``rope_axial`` with ``grid_offset=1.0`` and ``scaling="pi"``,
    timm's logits at every size; the ``vpe_`` name loads timm's state dict and computes the same."""
    pe_model = _timm_eva(name)
    assert pe_model.rope.grid_offset == 1.0
    ours = vpe.apply(copy.deepcopy(pe_model), pe="native")
    assert vpe.backbones.adapter_for(ours).native_pe(ours) == ("rope_axial+learned", dict(
        theta=10000.0, axis_order="xy", pairs="interleaved", scaling="pi", ref_shape=(24, 24), grid_offset=1.0))
    assert vpe.encodings_of(ours)["rotary"][0].grid_offset == 1.0
    for size in SIZES:
        assert _max_diff(ours, pe_model, size) < 2e-6, size
    registered = timm.create_model(f"vpe_{name}", **KW).eval()
    vpe.load_timm_checkpoint(registered, pe_model.state_dict(), strict=True)
    for size in SIZES:
        assert _max_diff(registered, pe_model, size) < 2e-6, size
    rotary = vpe.encodings_of(ours)["rotary"][0]
    from_zero = vpe.encodings_of(vpe.apply(copy.deepcopy(pe_model), pe="native", grid_offset=0.0))["rotary"][0]
    for shape in ((4, 4), (6, 5)):  # timm's own RoPE module: q rotated from position 1 (times 24 / size)
        q = torch.randn(1, 2, shape[0] * shape[1], rotary.head_dim)
        expected = apply_rot_embed_cat(q, pe_model.rope.get_embed(shape=list(shape)))
        torch.testing.assert_close(rotary.rotate(q, vpe.Grid(shape)), expected, atol=2e-5, rtol=1e-5)
        assert (from_zero.rotate(q, vpe.Grid(shape)) - expected).abs().max() > 0.1
    gigantic = _timm_eva("vit_pe_core_gigantic_patch14_448")  # no class token, no offset
    assert gigantic.rope.grid_offset == 0 and "vpe_vit_pe_core_gigantic_patch14_448" in timm.list_models("vpe_*")
    ours = vpe.apply(copy.deepcopy(gigantic), pe="native")
    for size in SIZES:
        assert _max_diff(ours, gigantic, size) < 2e-5, size


MROPE = hasattr(timm.layers, "create_rope_embed") and "mrope" in inspect.getsource(timm.layers.create_rope_embed)


CAT_GRIDS = [  # timm's RotaryEmbeddingCat beyond the Eva defaults: pixel-frequency bands (in_pixels=True) on its pixel
    dict(in_pixels=True, max_res=224),  # grid (linspace(-1, 1, s)) or on integer positions, temperature bands on the
    dict(in_pixels=True, max_res=64, linear_bands=True, grid_indexing="xy"),  # pixel and the centred grids
    dict(in_pixels=True, max_res=224, grid_type="index", ref_feat_shape=(4, 4)),
    dict(in_pixels=False, temperature=100, grid_type="pixel"),
    dict(in_pixels=False, temperature=100, grid_type="centered", grid_indexing="xy"),
]
HAS_GRID_TYPE = "grid_type" in inspect.signature(RotaryEmbeddingCat).parameters


def _cat_closed_form(q, rope, shape):
    """timm's axial RoPE in float64 from its own stored bands (``rope.bands``): the grid of its ``grid_type``
    (``_build_grid``'s formulas), angles ``coordinate * band`` per axis, interleaved pairs."""
    shape = list(shape)[::-1] if rope.grid_indexing == "xy" else list(shape)
    if rope.grid_type == "pixel":
        axes = [torch.linspace(-1, 1, n, dtype=torch.float64) for n in shape]
    elif rope.grid_type == "centered":
        axes = [(torch.arange(n, dtype=torch.float64) + 0.5) / n * 2 - 1 for n in shape]
    else:
        axes = [torch.arange(n, dtype=torch.float64) + rope.grid_offset for n in shape]
    if rope.ref_feat_shape is not None:
        ref = list(rope.ref_feat_shape)[::-1] if rope.grid_indexing == "xy" else list(rope.ref_feat_shape)
        axes = [a / n * r for a, n, r in zip(axes, shape, ref)]
    coords = torch.stack(torch.meshgrid(axes, indexing=rope.grid_indexing), -1).reshape(-1, len(shape))
    angles = (coords[:, :, None] * rope.bands.double()).flatten(1).repeat_interleave(2, -1)
    return apply_rot_embed_cat(q.double(), torch.cat([angles.sin(), angles.cos()], -1)).float()


@requires_that(HAS_GRID_TYPE, "timm's RotaryEmbeddingCat with grid_type (a newer timm)")
@pytest.mark.parametrize("rope_kwargs", CAT_GRIDS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_pixel_frequency_and_other_grids_of_timm_rope_are_native(rope_kwargs):
    """An Eva whose ``RotaryEmbeddingCat`` has timm's pixel-frequency bands (``in_pixels=True``: ``max_res``,
    ``linear_bands``) or another coordinate grid (``grid_type`` ``"pixel"``: ``coords="pixel"``; ``"centered"``:
    ``coords="normalized"``; temperature bands there as periods ``2 pi temperature^(i/n)``): ``pe="native"`` rotates
    q as timm's formula in float64 (from its stored float32 bands) to float32 rounding, timm's float32 module to its
    own rounding of angles up to ``pi max_res / 2`` per unit, and gives timm's logits at every size."""
    eva = _timm_eva("vit_small_patch16_rope_224")
    eva.rope = RotaryEmbeddingCat(dim=KW["embed_dim"] // KW["num_heads"], **rope_kwargs)
    ours = vpe.apply(copy.deepcopy(eva), pe="native")
    rotary = vpe.encodings_of(ours)["rotary"][0]
    for shape in ((4, 4), (6, 5), (1, 3)):
        q = torch.randn(1, 2, shape[0] * shape[1], rotary.head_dim)
        mine = rotary.rotate(q, vpe.Grid(shape))
        torch.testing.assert_close(mine, _cat_closed_form(q, eva.rope, shape), atol=1e-6, rtol=0)
        torch.testing.assert_close(mine, apply_rot_embed_cat(q, eva.rope.get_embed(list(shape))), atol=5e-4, rtol=0)
    for size in SIZES:
        assert _max_diff(ours, eva, size) < 2e-5, size


@requires_that(HAS_GRID_TYPE, "timm's RotaryEmbeddingCat with grid_type (a newer timm)")
def test_what_timm_rope_visionpe_cannot_reproduce_is_refused_with_the_reason():
    """A ``ref_feat_shape`` on timm's [-1, 1] grids (it rescales them by ref / size) and a grid offset on the centred
    one: refused with the reason; another encoding still replaces them."""
    for rope_kwargs, words in ((dict(in_pixels=True, ref_feat_shape=(4, 4)), "'pixel' grid with ref_feat_shape"),
                               (dict(in_pixels=False, grid_type="centered", grid_offset=1.0), "grid_offset=1.0")):
        eva = _timm_eva("vit_small_patch16_rope_224")
        eva.rope = RotaryEmbeddingCat(dim=KW["embed_dim"] // KW["num_heads"], **rope_kwargs)
        with pytest.raises(ValueError, match=re.escape(words)):
            vpe.apply(copy.deepcopy(eva), pe="native")
        assert vpe.apply(eva, "rope_axial")(torch.randn(1, 3, 32, 48)).shape == (1, 3)


MROPE_CASES = [  # (embed_dim, heads, mrope_section): timm's default sections on a 16- and a 64-wide head (the
    (32, 2, None),  # first clamped by the head: 3/3/2 pairs), GenLIP's (12, 12, 12) on a 72-wide head
    (128, 2, None),
    (144, 2, (12, 12, 12)),
]


def _mrope_eva(embed_dim, num_heads, section, **extra):
    kw = dict(KW, embed_dim=embed_dim, num_heads=num_heads, rope_type="mrope", rope_grid_indexing="ij", **extra)
    if section is not None:
        kw["rope_mrope_section"] = section
    torch.manual_seed(0)
    return _perturb(timm.create_model("vit_small_patch16_rope_224", dynamic_img_size=True, **kw))


@requires_that(MROPE, "timm's M-RoPE (a newer timm)")
@pytest.mark.parametrize("embed_dim,num_heads,section", MROPE_CASES)
def test_timm_mrope_native_is_interleaved_mrope_with_time_inert(embed_dim, num_heads, section):
    """timm's ``rope_type="mrope"`` (``RotaryEmbeddingMRope``: one spectrum over the head, pairs dealt t, h, w, t, ...,
    time at 0 on an image, half pairs): ``rope_axial`` with ``spectrum="mrope_interleaved"``, ``inert_axes=1`` and
    the pair counts timm's clamped interleave gives; timm's logits at every size, and the same rotation of q as timm's
    own module."""
    eva = _mrope_eva(embed_dim, num_heads, section)
    ours = vpe.apply(copy.deepcopy(eva), pe="native")
    pe, kwargs = vpe.backbones.adapter_for(ours).native_pe(ours)
    head_pairs = embed_dim // num_heads // 2
    assert pe == "rope_axial" and kwargs["inert_axes"] == 1 and sum(kwargs["sections"]) == head_pairs
    for size in SIZES:
        assert _max_diff(ours, eva, size) < 2e-5, size
    rotary = vpe.encodings_of(ours)["rotary"][0]
    for shape in ((4, 4), (6, 5)):
        q = torch.randn(1, num_heads, shape[0] * shape[1], rotary.head_dim)
        expected = apply_rot_embed_cat(q, eva.rope.get_embed(list(shape)), half=True)
        torch.testing.assert_close(rotary.rotate(q, vpe.Grid(shape)), expected, atol=2e-5, rtol=1e-5)


@requires_that(MROPE and "rope_shift_coords" in inspect.signature(Eva).parameters,
               "timm's M-RoPE with RoPE coordinate augmentation (a newer timm)")
def test_timm_mrope_trains_as_timm_with_coordinate_augmentation():
    """In training mode timm's M-RoPE augments (h, w), time staying at 0: the same draws from the same RNG state give
    timm's logits."""
    eva = _mrope_eva(32, 2, None, rope_shift_coords=1.0, rope_jitter_coords=1.5, rope_rescale_coords=1.2)
    ours = vpe.apply(copy.deepcopy(eva), pe="native")
    eva.train(), ours.train()
    x = torch.randn(2, 3, 40, 32)
    torch.manual_seed(3)
    theirs = eva(x)
    torch.manual_seed(3)
    mine = ours(x)
    assert (mine - theirs).abs().max() < 2e-5
    torch.manual_seed(4)
    assert (ours(x) - theirs).abs().max() > 1e-4  # another draw


def test_an_eval_model_draws_no_coordinate_augmentation():
    """Encodings built by ``apply`` take the model's mode: an Eva in evaluation mode with timm's train-time RoPE
    augmentation gives timm's (unaugmented) logits, every call the same."""
    kw = dict(rope_shift_coords=1.0, rope_jitter_coords=1.5)
    if "rope_shift_coords" not in inspect.signature(Eva).parameters:
        pytest.skip("needs timm's Eva with RoPE coordinate augmentation (rope_shift_coords; not in timm 1.0.19)")
    eva = _timm_eva("vit_small_patch16_rope_224", **kw)
    ours = vpe.apply(copy.deepcopy(eva), pe="native")
    assert not any(m.training for m in ours.modules())  # the encodings and the new attentions too
    assert vpe.encodings_of(ours)["rotary"][0].coordinates.shift_coords == 1.0
    assert _max_diff(ours, eva, (32, 32)) < 2e-5


def test_training_mode_of_a_gqa_eva_is_timms():
    """Sapiens-style grouped key/value heads in training mode (dropout off): timm's logits and gradients."""
    if not HAS_GQA:
        pytest.skip("needs timm's Eva with num_kv_heads (a newer timm)")
    eva = _timm_eva("vit_small_patch16_rope_224", num_kv_heads=1, qkv_fused=False)
    ours = vpe.apply(copy.deepcopy(eva), pe="native")
    eva.train(), ours.train()
    x = torch.randn(2, 3, 40, 32)
    theirs, mine = eva(x), ours(x)
    assert (mine - theirs).abs().max() < 2e-5
    theirs.square().sum().backward()
    mine.square().sum().backward()
    grad = dict(ours.named_parameters())
    for key, p in eva.named_parameters():
        assert torch.allclose(grad[key].grad, p.grad, atol=1e-4), key


# -- timm's distilled DeiT, adapted as transformers' DeiTForImageClassificationWithTeacher ----------------------------
def test_distilled_deit_keeps_both_heads():
    """The class and distillation tokens are the prefix; the native encoding gives timm's logits at every size (the
    heads' average), and in distilled training each head's own logits."""
    torch.manual_seed(0)
    deit = _perturb(timm.create_model("deit_tiny_distilled_patch16_224", dynamic_img_size=True, **KW))
    ours = vpe.apply(copy.deepcopy(deit), pe="native")
    assert type(ours).__name__ == "VisionTransformerDistilledPE" and ours.pe == "learned"
    assert ours.pe_tokens.prefix.shape == (2, KW["embed_dim"])  # pos_embed's class and distillation rows
    for size in SIZES:
        assert _max_diff(ours, deit, size) < 2e-5, size
    for model in (deit, ours):
        model.set_distilled_training(True)
        model.train()
    x = torch.randn(2, 3, 32, 32)
    (cls_theirs, dist_theirs), (cls_ours, dist_ours) = deit(x), ours(x)
    assert (cls_ours - cls_theirs).abs().max() < 2e-5 and (dist_ours - dist_theirs).abs().max() < 2e-5
    registry = timm.create_model("vpe_deit_tiny_distilled_patch16_224", pe="rope_mixed", **KW)
    assert registry(torch.randn(1, 3, 24, 40)).shape == (1, 3)
