"""timm's ``NaFlexVit`` with visionpe encodings: timm's own models at random weights are the oracle (timm's NaFlexVit
runs image batches at any size itself)."""
import copy

import pytest
import timm
import torch
from conftest import max_logit_diff

import visionpe as vpe
from visionpe.backbones.naflex import NaFlexVitPE

from visionpe._compat import ADAPTER_MIN_TIMM, timm_release

pytestmark = pytest.mark.skipif(timm_release() < ADAPTER_MIN_TIMM["NaFlexVit"], reason="the NaFlexVit adapter needs timm >= "
                                "1.0.31 (what it reads of timm's model arrived there)")

KW = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)
SIZES = ((32, 32), (48, 40), (16, 24))  # the training grid 4x4, larger, smaller
GAP = "naflexvit_base_patch16_gap"
VARIANTS = [  # (timm name, extra keywords, native pe)
    (GAP, {}, "learned"),  # a joint table, bicubic with antialiasing
    ("naflexvit_base_patch16_siglip", {}, "learned"),  # bilinear, SigLIP's tower
    ("naflexvit_base_patch16_parfac_gap", dict(pos_embed_ar_preserving=False), "learned"),  # factorized per axis
    # pos_embed_ar_preserving (the par/parfac/RADIO names): resampled to a square of the longer side, cropped
    ("naflexvit_base_patch16_parfac_gap", {}, "learned"),  # factorized
    ("naflexvit_base_patch16_par_gap", {}, "learned"),  # joint, bicubic
    ("naflexvit_base_patch16_par_gap", dict(pos_embed_interp_mode="bilinear", pos_embed_antialias=False,
                                            pos_embed_align_corners=True), "learned"),
    (GAP, dict(embed_proj_type="linear", class_token=True, reg_tokens=2, global_pool="token"), "learned"),
    (GAP, dict(rope_type="axial", pos_embed="none"), "rope_axial"),  # Eva blocks
    (GAP, dict(rope_type="axial", rope_ref_feat_shape=(6, 6)), "rope_axial+learned"),
    (GAP, dict(rope_type="mixed", rope_temperature=10.0), "rope_mixed+learned"),
]


def _timm_naflex(name=GAP, **extra):
    """A tiny timm NaFlexVit, its weights perturbed, in eval mode."""
    torch.manual_seed(0)
    model = timm.create_model(name, **KW, **extra).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("name,extra,native", VARIANTS)
def test_native_encoding_is_timms_at_every_size(name, extra, native):
    """``apply(naflexvit, pe="native")``: timm's table (joint or factorized, resampled as timm resamples it) and RoPE
    (axial, with ``ref_feat_shape``, mixed with each block's frequencies) give timm's logits at the training grid and
    at a larger and a smaller one; patched in place."""
    naflex = _timm_naflex(name, **extra)
    before = copy.deepcopy(naflex)
    ours = vpe.apply(naflex, pe="native")
    assert ours is naflex and isinstance(ours, NaFlexVitPE) and ours.pe == native and ours.rope is None
    for size in SIZES:
        assert max_logit_diff(ours, before, size) < 1e-6, size
    assert max_logit_diff(vpe.apply(ours, pe="none"), before, SIZES[1]) > 1e-3  # the position was in use


def test_square_resample_is_learned_square_crop_and_replaced():
    """``pos_embed_ar_preserving`` is ``learned(fit="square_crop")`` (the sizes above: timm's logits); another encoding
    replaces it, every other weight kept."""
    naflex = _timm_naflex("naflexvit_base_patch16_parfac_gap")
    assert vpe.apply(copy.deepcopy(naflex), pe="native").pe_tokens.fit == "square_crop"
    kept = {k: v.clone() for k, v in naflex.state_dict().items() if "pos_embed" not in k}
    ours = vpe.apply(naflex, pe="rope_mixed+learned")
    state = ours.state_dict()
    assert ours.pe_tokens.fit == "resample" and all(torch.equal(state[k], v) for k, v in kept.items())
    with torch.no_grad():
        assert ours(torch.randn(1, 3, 40, 24)).shape == (1, 3)


def test_naflex_inputs_are_refused_and_mixed_sizes_run_in_one_batch():
    """timm's NaFlex dict input is refused with what to use: ``forward_batch`` runs images of other sizes each on its
    own grid, as each would run alone."""
    ours = vpe.apply(_timm_naflex(), pe="rope_axial+learned")
    with pytest.raises(ValueError, match="forward_batch"):
        ours({"patches": torch.randn(1, 4, 192), "patch_coord": torch.zeros(1, 4, 2, dtype=torch.long)})
    images = [torch.randn(3, 32, 24), torch.randn(3, 16, 40)]
    with torch.no_grad():
        batch = ours.forward_batch(images)
        alone = torch.cat([ours(image[None]) for image in images])
    assert (batch - alone).abs().max() < 1e-5


FITS = (vpe.backbones.adapter_for(_timm_naflex()).encodings()  # () below the adapter's timm: the module skips
        if timm_release() >= ADAPTER_MIN_TIMM["NaFlexVit"] else ())


@pytest.mark.parametrize("pe", FITS)
def test_every_fitting_encoding_swaps_in(pe):
    """Every registered 2D encoding but ``swin_bias`` fits (a ViT); every other weight is kept."""
    naflex = _timm_naflex(rope_type="axial", class_token=True, global_pool="token")  # Eva blocks, a prefix token
    kept = {k: v.clone() for k, v in naflex.state_dict().items() if k != "embeds.pos_embed"}
    ours = vpe.apply(naflex, pe=pe)
    state = ours.state_dict()
    assert all(torch.equal(state[k], v) for k, v in kept.items())
    with torch.no_grad():
        assert torch.isfinite(ours(torch.randn(1, 3, *SIZES[1]))).all()


def test_unfitting_encoding_is_refused_with_the_allowed_ones():
    assert "swin_bias" not in FITS and {"learned", "rope_axial", "rel_bias", "alibi"} <= set(FITS)
    with pytest.raises(ValueError, match="swin_bias needs window attention.*rel_bias"):
        vpe.apply(_timm_naflex(), pe="swin_bias")


@pytest.mark.parametrize("extra", [{}, dict(pos_embed="factorized"), dict(rope_type="mixed", rope_temperature=10.0)])
def test_registry_name_loads_timms_state_dict(extra):
    """``vpe_naflexvit_*`` is in timm's registry; a timm NaFlexVit state dict loads into it (its table, joint or
    factorized, and a mixed RoPE's per-block frequencies converted) and gives timm's logits."""
    naflex = _timm_naflex(**extra)
    assert "vpe_naflexvit_base_patch16_gap" in timm.list_models("vpe_naflexvit*")
    ours = timm.create_model("vpe_naflexvit_base_patch16_gap", **KW, **extra).eval()
    report = vpe.load_timm_checkpoint(ours, naflex.state_dict(), strict=True)
    assert report.converted
    assert max_logit_diff(ours, naflex, (24, 40)) < 1e-6
