"""timm's ``VisionTransformerSAM`` (ViTDet / SAM's image encoder) with visionpe encodings: timm's own models at random
weights are the oracle (at another size, timm's model built there from the same weights where timm's RoPE is fixed
to its build size)."""
import copy

import pytest
import timm
import torch
from conftest import assert_swapped_encoding_works, max_logit_diff

import visionpe as vpe
from visionpe.backbones.sam import SamAttentionPE, VisionTransformerSAMPE

# a 4x4 patch grid, windows of 3x3 (padded) in block 0, block 1 global
KW = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3, window_size=3,
          global_attn_indexes=(1,), neck_chans=8)
SIZES = ((16, 16), (24, 20), (12, 16))  # the training grid, larger, smaller


def _timm_sam(img_size=16, **extra):
    """A tiny timm SAM ViT, its weights perturbed, in eval mode."""
    torch.manual_seed(0)
    model = timm.create_model("samvit_base_patch16", **dict(KW, img_size=img_size), **extra).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _timm_at(model, size, **extra):
    """timm's SAM ViT (without ``pos_embed``) built at ``size`` with ``model``'s weights: its RoPE is built for its own
    grid (timm's runs at that size only)."""
    other = timm.create_model("samvit_base_patch16", **dict(KW, img_size=size), **extra).eval()
    other.load_state_dict(model.state_dict())
    return other


def test_native_absolute_table_is_timms_at_every_size():
    """``use_abs_pos``: ``pos_embed (1, H, W, D)`` becomes a ``learned`` table, resampled as timm resamples it at other
    sizes; patched in place, every attention a :class:`SamAttentionPE` on its window or on the whole map."""
    sam = _timm_sam(use_rel_pos=False)
    before = copy.deepcopy(sam)
    ours = vpe.apply(sam, pe="native")
    assert ours is sam and isinstance(ours, VisionTransformerSAMPE) and ours.pos_embed is None and ours.pe == "learned"
    assert all(isinstance(b.attn, SamAttentionPE) for b in ours.blocks)
    for size in SIZES:
        assert max_logit_diff(ours, before, size) < 1e-6, size


@pytest.mark.parametrize("ref_feat_shape", [None, ((6, 6), (2, 2))])
def test_native_rope_is_timms_at_every_size(ref_feat_shape):
    """``use_rope``: timm's two ``RotaryEmbeddingCat`` (global blocks, windows) become ``rope_axial`` with its
    temperature; with ``ref_feat_shape`` each block's kind keeps its own reference grid (``scaling="pi"``)."""
    extra = dict(use_rel_pos=False, use_abs_pos=False, use_rope=True, ref_feat_shape=ref_feat_shape)
    sam = _timm_sam(**extra)
    ours = vpe.apply(copy.deepcopy(sam), pe="native")
    assert ours.pe == "rope_axial"
    assert ours.blocks[1].attn.rotary.scaling == ("none" if ref_feat_shape is None else "pi")
    for size in SIZES:
        assert max_logit_diff(ours, _timm_at(sam, size, **extra), size) < 1e-6, size


def test_native_absolute_table_and_rope_together():
    sam = _timm_sam(use_rel_pos=False, use_rope=True)
    ours = vpe.apply(copy.deepcopy(sam), pe="native")
    assert ours.pe == "rope_axial+learned"
    assert max_logit_diff(ours, sam, (16, 16)) < 1e-6


def max_feature_diff(ours, theirs, size) -> float:
    """Largest difference of the neck's maps ``(B, C, H, W)`` at ``size`` between ``ours`` and timm's ``theirs``."""
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
    with torch.no_grad():
        return (ours.forward_features(x) - theirs.eval().forward_features(x)).abs().max().item()


def test_native_decomposed_relative_positions_are_timms_at_every_size():
    """Every registered ``samvit_*`` has ViTDet's decomposed relative positions: ``pe="native"`` gives each block a
    ``decomposed_rel_pos`` holding timm's ``rel_pos_h`` and ``rel_pos_w`` as they are (the windowed block's for its
    3x3 window, the global block's for the 4x4 grid), and the model is timm's at its size and at two others, where
    timm resamples the global block's tables linearly (the windows keep theirs)."""
    sam = _timm_sam()
    assert sam.blocks[0].attn.rel_pos_h.shape == (5, 8) and sam.blocks[1].attn.rel_pos_h.shape == (7, 8)
    timm_state = {k: v.clone() for k, v in sam.state_dict().items() if k != "pos_embed"}
    ours = vpe.apply(copy.deepcopy(sam), pe="native")
    assert ours.pe == "decomposed_rel_pos+learned"
    state = ours.state_dict()
    for key, value in timm_state.items():  # every weight kept: the tables moved into each attention's bias
        assert torch.equal(state[key.replace("attn.rel_pos", "attn.bias.rel_pos")], value), key
    assert [b.attn.bias.grid_shape for b in ours.blocks] == [(3, 3), (4, 4)]
    for size in SIZES:
        assert max_feature_diff(ours, sam, size) < 1e-5, size
        assert max_logit_diff(ours, sam, size) < 1e-5, size


def test_decomposed_relative_positions_are_replaced_by_any_fitting_encoding():
    sam = _timm_sam()
    kept = {k: v.clone() for k, v in sam.state_dict().items() if "rel_pos" not in k and k != "pos_embed"}
    ours = vpe.apply(sam, pe="rope_axial+learned")
    assert not any("rel_pos" in k for k in ours.state_dict())
    assert_swapped_encoding_works(ours, kept, SIZES)


def test_registry_name_is_native_and_loads_timms_decomposed_tables():
    """``vpe_samvit_*`` builds ViTDet's own encoding; a timm SAM state dict loads into it strictly (each
    ``attn.rel_pos_*`` into the attention's bias) and gives timm's logits at another size."""
    sam = _timm_sam()
    ours = timm.create_model("vpe_samvit_base_patch16", **KW).eval()
    assert ours.pe == "decomposed_rel_pos+learned"
    report = vpe.load_timm_checkpoint(ours, sam, strict=True)
    assert "blocks.1.attn.rel_pos_w -> blocks.1.attn.bias.rel_pos_w" in report.converted
    assert max_logit_diff(ours, sam, (24, 12)) < 1e-5


FITS = vpe.backbones.adapter_for(_timm_sam()).encodings()


@pytest.mark.parametrize("pe", FITS)
def test_every_fitting_encoding_swaps_in(pe):
    """Every registered 2D encoding but ``swin_bias`` fits: tokens on the patch grid, rotary and bias in each window
    and each global block; the model runs at other sizes and every other weight is kept."""
    sam = _timm_sam(use_rel_pos=False)
    kept = {k: v.clone() for k, v in sam.state_dict().items() if k != "pos_embed"}
    ours = vpe.apply(sam, pe=pe)
    state = ours.state_dict()
    assert all(torch.equal(state[k], v) for k, v in kept.items())
    with torch.no_grad():
        assert torch.isfinite(ours(torch.randn(1, 3, *SIZES[1]))).all()


def test_unfitting_encoding_is_refused_with_the_allowed_ones():
    assert "swin_bias" not in FITS and {"learned", "rope_axial", "rel_bias"} <= set(FITS)
    with pytest.raises(ValueError, match="swin_bias needs window attention.*VisionTransformerSAM.*rel_bias"):
        vpe.apply(_timm_sam(), pe="swin_bias")


def test_registry_name_loads_timms_state_dict_and_features():
    """``vpe_samvit_*`` is in timm's registry; a timm SAM state dict loads into it (``pos_embed`` into the learned
    table) and gives timm's logits; ``features_only`` gives timm's getter of block maps."""
    sam = _timm_sam(use_rel_pos=False)
    assert {"vpe_samvit_base_patch16", "vpe_samvit_base_patch16_224"} <= set(timm.list_models("vpe_samvit*"))
    ours = timm.create_model("vpe_samvit_base_patch16", use_rel_pos=False, **KW).eval()
    report = vpe.load_timm_checkpoint(ours, sam, strict=True)
    assert "pos_embed (1, 4, 4, 16) -> (1, 16, 16)" in report.converted
    assert max_logit_diff(ours, sam, (24, 12)) < 1e-6
    features = timm.create_model("vpe_samvit_base_patch16", pe="rope_mixed", features_only=True, out_indices=(0, 1),
                                 **KW)
    assert [tuple(f.shape) for f in features(torch.randn(1, 3, 24, 16))] == [(1, 16, 6, 4)] * 2
