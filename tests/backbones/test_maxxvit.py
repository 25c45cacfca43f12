"""timm's ``MaxxVit`` (MaxViT, MaxxViT, CoAtNet) with visionpe bias encodings: timm's own models at random weights are
the oracle (both run at any size whose feature maps the partitions divide; CoAtNet's transformer stages at their build
size)."""
import copy

import pytest
import timm
import torch
from conftest import max_logit_diff

import visionpe as vpe
from visionpe.backbones.maxxvit import MaxxVitPE, PartitionBias

KW = dict(img_size=64, num_classes=3, embed_dim=(8, 8, 8, 8), depths=(1, 1, 1, 1), stem_width=8,
          transformer_dim_head=4, transformer_window_size=2)  # 2x2 windows and grids in the last stages
VARIANTS = [  # (timm name, extra keywords, native pe, sizes)
    ("maxvit_nano_rw_256", {}, "swin_bias", ((64, 64), (128, 64))),  # timm's RelPosBias
    ("maxvit_tiny_tf_224", {}, "swin_bias", ((64, 64), (64, 128))),  # TensorFlow's RelPosBiasTf
    ("maxxvit_rmlp_nano_rw_256", {}, "cpb", ((64, 64), (128, 64))),  # RelPosMlp (cr), ConvNeXt blocks
    ("coatnet_0_rw_224", dict(transformer_window_size=None), "swin_bias", ((64, 64),)),  # global over the map
]


def _timm_maxxvit(name, **extra):
    """A tiny timm MaxxVit, its weights perturbed (its relative tables and MLPs strongly), in eval mode."""
    torch.manual_seed(0)
    model = timm.create_model(name, **{**KW, **extra}).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (1.0 if "rel_pos" in key else 0.05))
    return model


@pytest.mark.parametrize("name,extra,native,sizes", VARIANTS)
def test_native_encoding_is_timms(name, extra, native, sizes):
    """``apply(maxxvit, pe="native")``: each attention's table (timm's or TensorFlow's layout) becomes a ``swin_bias``,
    its MLP a ``cpb(mode="cr")``, on the attention's partition (or CoAtNet's feature map); timm's logits at each size,
    patched in place."""
    model = _timm_maxxvit(name, **extra)
    before = copy.deepcopy(model)
    ours = vpe.apply(model, pe="native")
    assert ours is model and isinstance(ours, MaxxVitPE) and ours.pe == native
    biases = vpe.encodings_of(ours)["bias"]
    assert biases and all(type(b).__name__ == type(biases[0]).__name__ for b in biases)
    for size in sizes:
        assert max_logit_diff(ours, before, size) < 1e-5, size
    assert max_logit_diff(vpe.apply(ours, pe="none"), before, sizes[0]) > 1e-3  # the bias was in use


FITS = vpe.backbones.adapter_for(_timm_maxxvit("maxvit_nano_rw_256")).encodings()


@pytest.mark.parametrize("pe", FITS)
def test_every_fitting_bias_swaps_in(pe):
    """Every window bias fits, in block and grid attention alike; every other weight is kept."""
    model = _timm_maxxvit("maxvit_nano_rw_256")
    kept = {k: v.clone() for k, v in model.state_dict().items() if "rel_pos" not in k}
    ours = vpe.apply(model, pe=pe)
    assert all(isinstance(m.rel_pos, PartitionBias) for m in ours.modules() if hasattr(m, "rel_pos"))
    state = ours.state_dict()
    assert all(torch.equal(state[k], v) for k, v in kept.items())
    with torch.no_grad():
        assert torch.isfinite(ours(torch.randn(1, 3, 128, 64))).all()


@pytest.mark.parametrize("pe,message", [("rope_axial", "takes bias encodings.*rotary encodings"),
                                        ("learned", "takes bias encodings.*tokens encodings"),
                                        ("rel_bias", "rel_bias is a global"),
                                        ("pape", "does not pass"),
                                        ("decomposed_rel_pos", "reads the attention's queries.*does not pass")])
def test_unfitting_encodings_are_refused_with_the_allowed_ones(pe, message):
    assert set(FITS) >= {"swin_bias", "cpb", "alibi"} and pe not in FITS
    with pytest.raises(ValueError, match=message):
        vpe.apply(_timm_maxxvit("maxvit_nano_rw_256"), pe=pe)


def test_registry_name_loads_timms_state_dict_and_trains():
    """``vpe_maxvit_*`` is in timm's registry, native by default; timm's state dict loads into it (TensorFlow's tables
    flipped into Swin's order) and gives timm's logits; a swapped bias trains."""
    model = _timm_maxxvit("maxvit_tiny_tf_224")
    ours = timm.create_model("vpe_maxvit_tiny_tf_224", **KW).eval()
    assert ours.pe == "swin_bias"
    report = vpe.load_timm_checkpoint(ours, model, strict=True)
    assert any(line.endswith(".rel_pos.bias.relative_position_bias_table") for line in report.converted)
    assert max_logit_diff(ours, model, (64, 64)) < 1e-5
    features = timm.create_model("vpe_maxvit_tiny_tf_224", features_only=True, **KW)  # timm's stage list
    assert [f.shape[-1] for f in features(torch.randn(1, 3, 64, 64))] == [32, 16, 8, 4, 2]
    other = vpe.apply(ours.train(), pe="alibi")
    other(torch.randn(2, 3, 64, 64)).sum().backward()
    assert all(p.grad is not None for b in vpe.encodings_of(other)["bias"] for p in b.parameters())
