"""timm's feature extraction on visionpe models (``features_only=True``, ``out_indices``, ``feature_info``,
``forward_intermediates``): timm's own ``features_only`` models of the same weights are the oracle."""
import copy

import pytest
import timm
import torch
from safetensors.torch import save_file

import visionpe as vpe

from conftest import perturbed

VIT_KW = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=3)
SWIN_KW = dict(img_size=32, patch_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2), window_size=4,
               num_classes=3)
CASES = {"vit_small_patch16_224": VIT_KW, "deit_tiny_distilled_patch16_224": VIT_KW,
         "eva02_tiny_patch14_224": VIT_KW, "vit_small_patch16_rope_mixed_224": VIT_KW,
         "swin_tiny_patch4_window7_224": SWIN_KW, "swinv2_tiny_window8_256": SWIN_KW}
SIZES = ((32, 32), (64, 32), (48, 64))  # each a multiple of Swin's largest window step (4 px patches, 2 stages)


def is_swin(name: str) -> bool:
    return name.startswith("swin")


def _checkpoint(name, tmp_path):
    """A plain timm model with random non-trivial weights, saved as a timm hub file is (a state dict)."""
    torch.manual_seed(0)
    model = timm.create_model(name, **CASES[name])
    perturbed(model)
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return path


def _features(name, path, size=None, prefix="", **kwargs):
    """timm's (``prefix=""``) or visionpe's (``"vpe_"``) features_only model of ``name`` holding the weights of
    ``path``; timm's own ViT and Eva at any size through ``dynamic_img_size``, its Swin built at ``size``."""
    kw = dict(CASES[name], **kwargs)
    if not prefix:
        kw.update(dict(img_size=size) if is_swin(name) else dict(dynamic_img_size=True))
    return timm.create_model(prefix + name, features_only=True, pretrained=True,
                             pretrained_cfg_overlay=dict(file=str(path), custom_load=False), **kw).eval()


@pytest.mark.parametrize("out_indices", [None, (0, -1)])
@pytest.mark.parametrize("name", list(CASES))
def test_features_only_equals_timms_own(name, out_indices, tmp_path):
    """``timm.create_model("vpe_<name>", features_only=True)`` with the architecture's own encoding is timm's own
    feature wrapper (the intermediate-layer getter for ViT, DeiT and Eva, the stage list for Swin) with the same
    ``feature_info``, and its features equal timm's, at the training size and at other sizes."""
    path = _checkpoint(name, tmp_path)
    extra = {} if out_indices is None else {"out_indices": out_indices}
    ours = _features(name, path, prefix="vpe_", **extra)
    assert ours.pretrained_cfg["fixed_input_size"] is False  # it runs at any size (timm's ViT cfg says True)
    for size in SIZES:
        theirs = _features(name, path, size=size, **extra)
        assert type(ours) is type(theirs)
        assert ours.feature_info.get_dicts() == theirs.feature_info.get_dicts()
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(size[1]))
        with torch.no_grad():
            mine, timms = ours(x), theirs(x)
        assert len(mine) == len(timms) == len(ours.feature_info.channels())
        for a, b in zip(mine, timms):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


ENCODINGS = [name for name, cls in vpe.registry.ENCODINGS.items() if 2 in cls.ndims]


@pytest.mark.parametrize("pe", ENCODINGS)
@pytest.mark.parametrize("name", ["vit_small_patch16_224", "eva02_tiny_patch14_224", "swin_tiny_patch4_window7_224"])
def test_features_only_with_every_encoding_at_any_size(name, pe):
    """Every encoding the family takes gives features at any input size, shaped as ``feature_info`` says (channels,
    reduction); one it refuses is the same error as ``visionpe.create_model``'s."""
    kw = dict(CASES[name], out_indices=(0, 1) if is_swin(name) else (0, 2))
    adapter = vpe.backbones.adapter_for(timm.create_model(name, **CASES[name]))
    if pe not in adapter.encodings():
        with pytest.raises(ValueError, match="encodings|needs window|is a global"):
            timm.create_model(f"vpe_{name}", pe=pe, features_only=True, **kw)
        return
    model = timm.create_model(f"vpe_{name}", pe=pe, features_only=True, **kw).eval()
    info = model.feature_info
    for size in SIZES:
        with torch.no_grad():
            features = model(torch.randn(1, 3, *size))
        for feature, channels, reduction in zip(features, info.channels(), info.reduction()):
            spatial = (feature.shape[1:3] if is_swin(name) else feature.shape[2:])  # Swin's stages are NHWC
            assert tuple(spatial) == (size[0] // reduction, size[1] // reduction), (size, feature.shape)
            assert channels in feature.shape and torch.isfinite(feature).all()


@pytest.mark.parametrize("name", ["eva02_tiny_patch14_224", "vit_medium_patch16_rope_reg1_gap_256"])
def test_eva_forward_intermediates_equal_timms(name):
    """timm's ``forward_intermediates`` arguments on a patched Eva (native encoding): the same prefix tokens,
    normed intermediates, NLC layout and final features as timm's own Eva."""
    torch.manual_seed(0)
    eva = timm.create_model(name, dynamic_img_size=True, **VIT_KW).eval()
    perturbed(eva)
    ours = vpe.apply(copy.deepcopy(eva), pe="native")
    x = torch.randn(2, 3, 40, 24)
    for kwargs in (dict(indices=2), dict(indices=[0, -1], return_prefix_tokens=True, norm=True),
                   dict(indices=1, output_fmt="NLC", stop_early=True)):
        with torch.no_grad():
            final_ours, mine = ours.forward_intermediates(x, **kwargs)
            final_timm, timms = eva.forward_intermediates(x, **kwargs)
        torch.testing.assert_close(final_ours, final_timm, atol=2e-5, rtol=1e-5)
        for a, b in zip(mine, timms):
            for u, v in zip(a, b) if isinstance(a, tuple) else [(a, b)]:
                torch.testing.assert_close(u, v, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "swin_tiny_patch4_window7_224"])
def test_load_timm_checkpoint_into_a_features_model(name, tmp_path):
    """``vpe.load_timm_checkpoint`` into a ``features_only`` model: the ViT's getter (keys under ``model.``) is seen
    through, so ``pos_embed`` becomes its table and the features equal timm's; Swin's stage list, whose keys timm
    renames, is refused by name (issue 43: the table stayed at its random init and the call returned normally)."""
    path = _checkpoint(name, tmp_path)
    ours = vpe.create_model(name, pe="native", features_only=True, **CASES[name]).eval()
    if is_swin(name):
        with pytest.raises(ValueError, match="FeatureListNet.*pretrained_cfg_overlay"):
            vpe.load_timm_checkpoint(ours, path)
        return
    report = vpe.load_timm_checkpoint(ours, path)
    assert any(line.startswith("pos_embed -> pe_tokens.") for line in report.converted), report
    theirs = _features(name, path, size=(32, 32))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for a, b in zip(ours(x), theirs(x)):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
