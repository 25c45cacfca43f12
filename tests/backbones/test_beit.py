"""timm's BEiT (``beit_*``, ``beitv2_*``) with visionpe encodings: timm's own models at random weights are the
oracle; at another size, timm's BEiT built there from the same weights through its checkpoint filter (the geometric
resize of the relative tables and the resample of ``pos_embed`` that its ``set_input_size`` also applies; the floor's
timm has no ``set_input_size``)."""
import copy

import pytest
import timm
import torch
from conftest import assert_swapped_encoding_works, max_logit_diff

import visionpe as vpe
from visionpe.backbones import BeitPE, PositionalModel
from visionpe.backbones.beit import GridBeitBlock
from visionpe.backbones.eva import EvaAttentionPE

KW = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)
SIZES = ((32, 32), (48, 48), (48, 40), (64, 56), (16, 24), (24, 16))  # the training grid 4x4, larger, smaller
VARIANTS = [  # (timm name, extra keywords): per-block tables (BEiT, BEiT v2), plus pos_embed, pos_embed alone
    ("beit_base_patch16_224", {}),
    ("beitv2_base_patch16_224", {}),
    ("beit_base_patch16_224", dict(use_abs_pos_emb=True)),
    ("beit_base_patch16_224", dict(use_abs_pos_emb=True, use_rel_pos_bias=False)),
]


def _timm_beit(name, **extra):
    """A tiny timm BEiT on a 4x4 grid, its weights perturbed (its relative tables strongly), in eval mode."""
    torch.manual_seed(0)
    beit = timm.create_model(name, **KW, **extra).eval()
    with torch.no_grad():
        for key, p in beit.named_parameters():
            p.add_(torch.randn_like(p) * (1.0 if "relative_position" in key else 0.1))
    return beit


def _timm_at(beit, size, name, **extra):
    """timm's BEiT built at ``size`` with ``beit``'s weights, through its checkpoint filter (``beit`` itself at its own
    size)."""
    if tuple(size) == (32, 32):
        return beit
    other = timm.create_model(name, **dict(KW, img_size=size), **extra).eval()
    other.load_state_dict(timm.models.beit.checkpoint_filter_fn(beit.state_dict(), other))
    return other


@pytest.mark.parametrize("name,extra", VARIANTS)
def test_native_encoding_is_timms_beit_at_every_size(name, extra):
    """``apply(beit, pe="native")``: each block's relative table becomes a ``rel_bias`` (BEiT's class-token entries,
    resized to each grid with BEiT's geometric resize), ``pos_embed`` a ``learned`` table; timm's logits at the
    training size and at larger and smaller ones (timm's BEiT built there: its tables and ``pos_embed`` resized);
    patched in place, every weight kept."""
    beit = _timm_beit(name, **extra)
    before = copy.deepcopy(beit)
    ours = vpe.apply(beit, pe="native")
    assert ours is beit and isinstance(ours, (BeitPE, PositionalModel)) and ours.pos_embed is None
    assert all(isinstance(b, GridBeitBlock) and isinstance(b.attn, EvaAttentionPE) for b in ours.blocks)
    expected = "+".join(n for n, on in (("rel_bias", extra.get("use_rel_pos_bias", True)),
                                        ("learned", extra.get("use_abs_pos_emb", False))) if on)
    assert ours.pe == expected and vpe.backbones.adapter_for(ours).native_pe(ours) == (expected, {})
    for size in SIZES:
        assert max_logit_diff(ours, _timm_at(before, size, name, **extra), size) < 1e-6, size
    if "rel_bias" in expected:
        assert all((b.attn.bias.interpolation, b.attn.bias.grow) == ("geometric", "fit") for b in ours.blocks)


def test_registry_name_loads_timms_state_dict_and_is_timms_model():
    """``timm.create_model("vpe_beit_...")`` has the native encoding by default; timm's BEiT state dict loads into it
    with every key used (each block's table into its ``rel_bias``), and it computes timm's logits."""
    beit = _timm_beit("beitv2_base_patch16_224")
    assert "vpe_beitv2_base_patch16_224" in timm.list_models("vpe_beit*")
    ours = timm.create_model("vpe_beitv2_base_patch16_224", **KW).eval()
    report = vpe.load_timm_checkpoint(ours, beit.state_dict(), strict=True)
    assert "blocks.1.attn.relative_position_bias_table -> blocks.1.attn.bias.relative_position_bias_table" \
        in report.converted
    assert ours.pretrained_cfg["fixed_input_size"] is False
    for size in ((32, 32), (48, 40), (16, 24)):
        assert max_logit_diff(ours, _timm_at(beit, size, "beitv2_base_patch16_224"), size) < 1e-6, size


POSITIONAL = ("pos_embed", "rel_pos_bias", "relative_position")


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed+learned", "alibi", "cpb", "sincos+lookhere", "fire",
                                "rel_bias"])
def test_any_other_encoding_keeps_every_non_positional_weight(pe):
    """Another encoding replaces BEiT's: every non-positional weight kept (same values under the same names), the
    model runs at any size and trains its encoding; window biases are refused with the reason."""
    beit = _timm_beit("beit_base_patch16_224", use_abs_pos_emb=True)
    source = {k: v.clone() for k, v in beit.state_dict().items() if not any(p in k for p in POSITIONAL)}
    ours = vpe.apply(beit, pe).train()
    assert_swapped_encoding_works(ours, source, ((32, 32), (48, 40), (16, 24)))


def test_a_shared_table_is_refused_as_native_and_replaced_by_another():
    """BEiT pre-training's table shared by all blocks (``use_shared_rel_pos_bias``): no native equivalent (a clear
    error, remembered after another encoding replaced it); ``vpe.create_model`` takes BEiT names with any pe."""
    shared = timm.create_model("beit_base_patch16_224", use_rel_pos_bias=False, use_shared_rel_pos_bias=True, **KW)
    with pytest.raises(ValueError, match="use_shared_rel_pos_bias"):
        vpe.apply(copy.deepcopy(shared), pe="native")
    patched = vpe.apply(shared, "rel_bias")
    assert patched.rel_pos_bias is None and patched(torch.randn(1, 3, 48, 40)).shape == (1, 3)
    with pytest.raises(ValueError, match="use_shared_rel_pos_bias"):
        vpe.apply(patched, pe="native")
    model = vpe.create_model("beit_base_patch16_224", pe="rope_mixed", **KW)
    assert model.pe == "rope_mixed" and model(torch.randn(1, 3, 24, 40)).shape == (1, 3)


def test_forward_intermediates_and_masked_forward():
    """The ViT adapter's forward: timm's intermediates at another size, MAE's masked encoder."""
    ours = vpe.apply(_timm_beit("beit_base_patch16_224"), pe="native")
    final, inter = ours.forward_intermediates(torch.randn(2, 3, 48, 40), indices=2)
    assert final.shape == (2, 1 + 30, 32) and [t.shape for t in inter] == [(2, 32, 6, 5)] * 2
    tokens, keep = ours.forward_masked(torch.randn(2, 3, 32, 32), mask_ratio=0.5)
    assert tokens.shape == (2, 1 + 8, 32) and keep.shape == (2, 8)
