"""timm's ``Xcit`` with visionpe tokens encodings: timm's own models at random weights are the oracle."""
import copy

import pytest
import timm
import torch
from conftest import max_logit_diff

import visionpe as vpe
from visionpe.backbones.xcit import XcitPE
from visionpe.tokens import Fourier

from visionpe._compat import ADAPTER_MIN_TIMM, timm_release

pytestmark = pytest.mark.skipif(timm_release() < ADAPTER_MIN_TIMM["Xcit"], reason="the Xcit adapter needs timm >= "
                                "1.0.31 (what it reads of timm's model arrived there)")

KW = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3, cls_attn_layers=1)
NAME = "xcit_nano_12_p8_224"


def _timm_xcit(**extra):
    """A tiny timm XCiT, its weights perturbed, in eval mode."""
    torch.manual_seed(0)
    model = timm.create_model(NAME, **KW, **extra).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def test_without_position_it_is_timms_model_at_every_size():
    """``use_pos_embed=False``: native is ``none``, and the patched forward (patch embedding, XCA blocks, class
    attention, norm) and ``forward_intermediates`` are timm's."""
    xcit = _timm_xcit(use_pos_embed=False)
    ours = vpe.apply(copy.deepcopy(xcit), pe="native")
    assert isinstance(ours, XcitPE) and ours.pe == "none"
    for size in ((32, 32), (48, 40)):
        assert max_logit_diff(ours, xcit, size) < 1e-6, size
    x = torch.randn(1, 3, 40, 32)
    with torch.no_grad():
        for fmt in ("NCHW", "NLC"):
            theirs, ours_ = xcit.forward_intermediates(x, output_fmt=fmt), ours.forward_intermediates(x, output_fmt=fmt)
            assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip([theirs[0], *theirs[1]], [ours_[0], *ours_[1]]))


def test_native_is_timms_fourier_encoding_at_every_size():
    """XCiT's Fourier encoding is ``fourier`` with timm's projection taken over: the model and its
    ``forward_intermediates`` are timm's at the training size and others, square or not."""
    xcit = _timm_xcit()
    ours = vpe.apply(copy.deepcopy(xcit), pe="native")
    assert ours.pe == "fourier" and isinstance(ours.pe_tokens, Fourier) and ours.pos_embed is None
    for size in ((32, 32), (48, 40), (16, 56)):
        assert max_logit_diff(ours, xcit, size) < 1e-6, size
    x = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        theirs, ours_ = xcit.forward_intermediates(x), ours.forward_intermediates(x)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip([theirs[0], *theirs[1]], [ours_[0], *ours_[1]]))
    assert max_logit_diff(vpe.apply(copy.deepcopy(ours), pe="none"), xcit, (32, 32)) > 1e-3  # the encoding is used
    assert vpe.backbones.adapter_for(ours).native_pe(ours) == ("fourier", dict(hidden_dim=32, temperature=10000.0))


def test_timm_checkpoint_loads_into_fourier():
    """``load_timm_checkpoint``: timm's ``pos_embed.token_projection`` (and the official ``pos_embeder.``) goes into
    ``fourier``'s projection, so a model built with a fresh one is timm's after loading."""
    xcit = _timm_xcit()
    for prefix in ("pos_embed.", "pos_embeder."):
        state = {k.replace("pos_embed.", prefix): v for k, v in xcit.state_dict().items()}
        ours = vpe.apply(_timm_xcit(use_pos_embed=False), pe="fourier")
        report = vpe.load_timm_checkpoint(ours, state, strict=True)
        assert f"{prefix}token_projection.weight -> pe_tokens.projection.weight" in report.converted
        assert max_logit_diff(ours, xcit, (40, 48)) < 1e-6


@pytest.mark.parametrize("pe", ["learned", "sincos", "peg", "fourier"])
def test_every_tokens_encoding_replaces_the_fourier_one(pe):
    """Each tokens encoding replaces XCiT's on the patch grid (PEG after its block), every other weight kept (a
    ``fourier`` here of another ``hidden_dim`` than timm's)."""
    xcit = _timm_xcit()
    kept = {k: v.clone() for k, v in xcit.state_dict().items() if not k.startswith("pos_embed")}
    ours = vpe.apply(xcit, pe=pe, **({"hidden_dim": 16} if pe == "fourier" else {}))
    assert ours.pos_embed is None and vpe.encodings_of(ours)["tokens"] == [ours.pe_tokens]
    state = ours.state_dict()
    assert all(torch.equal(state[k], v) for k, v in kept.items())
    x = torch.randn(1, 3, 48, 40)
    with torch.no_grad():
        assert max_logit_diff(ours, vpe.apply(copy.deepcopy(ours), pe="none"), (48, 40)) > 1e-4  # the encoding is used
        assert torch.isfinite(ours(x)).all()


@pytest.mark.parametrize("pe", ["rope_axial", "alibi"])
def test_rotary_and_bias_encodings_are_refused_with_the_allowed_ones(pe):
    assert vpe.backbones.adapter_for(_timm_xcit()).encodings() == ["sincos", "learned", "peg", "fourier"]
    with pytest.raises(ValueError, match=r"Xcit takes tokens encodings \(sincos, learned, peg, fourier\)"):
        vpe.apply(_timm_xcit(), pe=pe)


def test_registry_name():
    assert "vpe_" + NAME in timm.list_models("vpe_xcit*")
    assert timm.create_model("vpe_" + NAME, **KW).pe == "fourier"
    model = timm.create_model("vpe_" + NAME, pe="sincos", **KW)
    assert model.pe == "sincos" and model(torch.randn(1, 3, 40, 48)).shape == (1, 3)
    features = timm.create_model("vpe_" + NAME, pe="learned", features_only=True, out_indices=(0, 1), **KW)
    assert [tuple(f.shape) for f in features(torch.randn(1, 3, 32, 40))] == [(1, 32, 4, 5)] * 2  # timm's getter
