"""timm's ``VisionTransformerRelPos`` (``vit_relpos_*``) with visionpe encodings: timm's own models at random weights
are the oracle; at another size, timm's model built there with the same weights (its MLP on the new offsets, its
table resized by timm's ``resize_rel_pos_bias_table``, as its ``set_input_size`` does; the floor's timm has none)."""
import copy

import pytest
import timm
import torch
from conftest import assert_swapped_encoding_works, max_logit_diff

import visionpe as vpe
from visionpe.attention import Attention
from visionpe.backbones import PositionalModel
from visionpe.backbones.vit_relpos import GRID_BLOCKS

KW = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)
SIZES = ((32, 32), (48, 48), (48, 40), (16, 24))  # the training grid 4x4, larger, smaller
VARIANTS = [  # RelPosMlp(mode="cr") without and with a class token, post-norm blocks, class token + average pooling;
    ("vit_relpos_small_patch16_224", {}),  # RelPosBias without and with a class token
    ("vit_relpos_medium_patch16_cls_224", {}),
    ("vit_relpos_small_patch16_rpn_224", {}),
    ("vit_relpos_base_patch16_clsgap_224", {}),
    ("vit_relpos_small_patch16_224", dict(rel_pos_type="bias")),
    ("vit_relpos_medium_patch16_cls_224", dict(rel_pos_type="bias")),
]


def _timm_relpos(name, **extra):
    """A tiny timm model on a 4x4 grid, its weights perturbed (its relative position modules strongly), in eval."""
    torch.manual_seed(0)
    model = timm.create_model(name, **KW, **extra).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (1.0 if "rel_pos" in key else 0.1))
    return model


def _timm_at(model, size, name, **extra):
    """timm's model built at ``size`` with ``model``'s weights, a ``RelPosBias`` table resized by timm's
    ``resize_rel_pos_bias_table`` (``model`` itself at its own size)."""
    if tuple(size) == (32, 32):
        return model
    other = timm.create_model(name, **dict(KW, img_size=size), **extra).eval()
    state = model.state_dict()
    for key, target in other.state_dict().items():
        if key.endswith("relative_position_bias_table") and target.shape != state[key].shape:
            # the source grid is square: the floor's timm reads its size from the table
            state[key] = timm.layers.resize_rel_pos_bias_table(
                state[key], new_window_size=other.patch_embed.grid_size, new_bias_shape=tuple(target.shape))
    other.load_state_dict(state)
    return other


@pytest.mark.parametrize("name,extra", VARIANTS)
def test_native_encoding_is_timms_model_at_every_size(name, extra):
    """``apply(model, pe="native")``: each block's ``RelPosMlp(mode="cr")`` becomes ``cpb(mode="cr")`` with its MLP,
    a ``RelPosBias`` a ``rel_bias`` with its table (resized geometrically to each grid); timm's logits at the
    training size and at larger and smaller ones (timm's model built there); patched in place, weights kept."""
    model = _timm_relpos(name, **extra)
    before = copy.deepcopy(model)
    ours = vpe.apply(model, pe="native")
    assert ours is model and isinstance(ours, PositionalModel) and ours.shared_rel_pos is None
    assert all(type(b) in GRID_BLOCKS.values() and isinstance(b.attn, Attention) for b in ours.blocks)
    if extra:
        expected = ("rel_bias", {"grow": "fit"})
    else:
        expected = ("cpb", {"mode": "cr", "hidden_dim": before.blocks[0].attn.rel_pos.mlp.fc1.out_features})
    assert vpe.backbones.adapter_for(ours).native_pe(ours) == expected
    for size in SIZES:
        assert max_logit_diff(ours, _timm_at(before, size, name, **extra), size) < 1e-6, size


@pytest.mark.parametrize("extra", [{}, dict(rel_pos_type="bias")])
def test_registry_name_loads_timms_state_dict_and_is_timms_model(extra):
    """``timm.create_model("vpe_vit_relpos_...")`` has the native encoding; timm's state dict loads into it with every
    key used (``rel_pos.mlp.fc1/fc2`` -> ``bias.cpb_mlp.0/2``; a table without class-token rows gets BEiT's three,
    unused without a class token), and it computes timm's logits."""
    name = "vit_relpos_small_patch16_224"
    model = _timm_relpos(name, **extra)
    ours = timm.create_model(f"vpe_{name}", **KW, **extra).eval()
    report = vpe.load_timm_checkpoint(ours, model.state_dict(), strict=True)
    expected = ("blocks.1.attn.rel_pos.relative_position_bias_table -> blocks.1.attn.relative_position_bias_table"
                if extra else "blocks.1.attn.rel_pos.mlp.fc2.bias -> blocks.1.attn.cpb_mlp.2.bias")
    assert expected in report.converted
    for size in ((32, 32), (48, 40)):
        assert max_logit_diff(ours, _timm_at(model, size, name, **extra), size) < 1e-6, size


POSITIONAL = ("rel_pos",)


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed+learned", "alibi", "sincos+lookhere", "rel_bias"])
def test_any_other_encoding_keeps_every_non_positional_weight(pe):
    model = _timm_relpos("vit_relpos_medium_patch16_cls_224")
    source = {k: v.clone() for k, v in model.state_dict().items() if not any(p in k for p in POSITIONAL)}
    ours = vpe.apply(model, pe)
    assert_swapped_encoding_works(ours, source, ((32, 32), (48, 40), (16, 24)))


def test_what_has_no_native_equivalent_is_refused_with_the_reason():
    """``RelPosMlp(mode="swin")`` (timm renormalises by each new grid) and a module shared by all blocks
    (``vit_srelpos_*``, left out of the ``vpe_`` registry): refused as native, the reason remembered; another
    encoding replaces them."""
    swin = timm.create_model("vit_relpos_small_patch16_224", rel_pos_type="mlp_swin", **KW)
    with pytest.raises(ValueError, match="mode='swin'"):
        vpe.apply(copy.deepcopy(swin), pe="native")
    patched = vpe.apply(swin, "cpb")  # visionpe's own Swin-V2 CPB, fresh
    assert patched(torch.randn(1, 3, 48, 40)).shape == (1, 3)
    with pytest.raises(ValueError, match="mode='swin'"):
        vpe.apply(patched, pe="native")
    shared = timm.create_model("vit_srelpos_small_patch16_224", **KW)
    with pytest.raises(ValueError, match="shared_rel_pos=True"):
        vpe.apply(copy.deepcopy(shared), pe="native")
    assert "vpe_vit_srelpos_small_patch16_224" not in timm.list_models("vpe_*")
    assert vpe.apply(shared, "alibi").shared_rel_pos is None
