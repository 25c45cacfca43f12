"""timm's ``MaxxVit`` (MaxViT, MaxxViT, CoAtNet) with visionpe bias and rotary encodings: timm's own models at random
weights are the oracle (both run at any size whose feature maps the partitions divide; CoAtNet's transformer stages at
their build size); a rotated attention is checked against attention written here with q and k rotated by hand."""
import copy

import pytest
import timm
import torch
from conftest import max_logit_diff

import visionpe as vpe
from timm.models.maxxvit import Attention2d, AttentionCl

from visionpe.backbones.maxxvit import MaxxVitPE, PartitionBias, RotatedQKV, rotate_through_qkv

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
def test_every_fitting_encoding_swaps_in(pe):
    """Every window bias and every 2D rotary encoding fits, in block and grid attention alike; every other weight is
    kept, under timm's keys (heads of 8 channels: some rotary layouts need 4 pairs)."""
    model = _timm_maxxvit("maxvit_nano_rw_256", transformer_dim_head=8)
    kept = {k: v.clone() for k, v in model.state_dict().items() if "rel_pos" not in k}
    ours = vpe.apply(model, pe=pe)
    assert all(isinstance(m.rel_pos, PartitionBias) for m in ours.modules() if hasattr(m, "rel_pos"))
    state = ours.state_dict()
    assert all(torch.equal(state[k], v) for k, v in kept.items())
    with torch.no_grad():
        assert torch.isfinite(ours(torch.randn(1, 3, 128, 64))).all()


@pytest.mark.parametrize("pe,message", [("learned", "takes bias and rotary encodings.*tokens encodings"),
                                        ("rel_bias", "rel_bias is a global"),
                                        ("pape", "does not pass"),
                                        ("decomposed_rel_pos", "reads the attention's queries.*does not pass")])
def test_unfitting_encodings_are_refused_with_the_allowed_ones(pe, message):
    assert set(FITS) >= {"swin_bias", "cpb", "alibi", "rope_axial", "rope_mixed"} and pe not in FITS
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


def rope_axial_by_hand(x: torch.Tensor, shape) -> torch.Tensor:
    """``x (B, heads, N, d)`` on the row-major ``shape`` grid turned as ``rope_axial``'s default: interleaved pairs,
    the first ``d / 4`` along x (column), the next along y (row), band ``i`` at ``100^(-i / (d / 4))`` rad per index."""
    h, w = shape
    n = x.shape[-1] // 4
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64).repeat(h)
    bands = 100.0 ** -(torch.arange(n, dtype=torch.float64) / n)
    angles = torch.cat([cols[:, None] * bands, rows[:, None] * bands], -1)  # (N, d / 2)
    pairs = x.double().unflatten(-1, (-1, 2))
    cos, sin = angles.cos(), angles.sin()
    turned = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 0] * sin + pairs[..., 1] * cos], -1)
    return turned.flatten(-2).float()


def attention_by_hand(attn, x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """timm's MaxxVit attention written out with q and k rotated by hand: the qkv projection's channels read as
    ``(heads, [q, k, v], d)`` (head first) or ``([q, k, v], heads, d)``, ``softmax(q k^T / sqrt(d)) v``, heads merged
    as ``(heads, d)`` channels, then the output projection."""
    heads, d = attn.num_heads, attn.dim_head
    if channels_last:
        b, h, w, _ = x.shape
        packed = torch.nn.functional.linear(x, attn.qkv.weight, attn.qkv.bias).reshape(b, h * w, -1)
    else:
        b, _, h, w = x.shape
        packed = torch.nn.functional.conv2d(x, attn.qkv.weight, attn.qkv.bias).reshape(b, -1, h * w).transpose(1, 2)
    parts = packed.unflatten(-1, (heads, 3, d) if attn.head_first else (3, heads, d))
    q, k, v = ((parts[:, :, :, i] if attn.head_first else parts[:, :, i]).transpose(1, 2) for i in range(3))
    q, k = rope_axial_by_hand(q, (h, w)), rope_axial_by_hand(k, (h, w))
    out = ((q @ k.transpose(-1, -2)) * d ** -0.5).softmax(-1) @ v  # (B, heads, N, d)
    out = out.transpose(1, 2).reshape(b, h * w, heads * d)
    if channels_last:
        return attn.proj(out.reshape(b, h, w, -1))
    return attn.proj(out.transpose(1, 2).reshape(b, -1, h, w))


@pytest.mark.parametrize("cls", [AttentionCl, Attention2d])
@pytest.mark.parametrize("head_first", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_rotated_attention_is_attention_of_q_and_k_rotated_by_hand(cls, head_first, fused):
    """Both of timm's layouts, heads first or not, fused or not: the attention with its qkv projection rotating is
    the attention computed by hand with q and k turned by the partition's grid (a 3 x 4 window)."""
    torch.manual_seed(0)
    attn = cls(16, dim_head=8, head_first=head_first).eval()
    attn.fused_attn = fused
    rotary = vpe.build("rope_axial", head_dim=8, num_heads=2)
    attn.rel_pos = PartitionBias(None, (3, 4), rotary)
    rotate_through_qkv(attn, attn.rel_pos)
    assert isinstance(attn.qkv, RotatedQKV) and set(attn.state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight",
                                                                            "proj.bias"}
    x = torch.randn(2, 3, 4, 16) if cls is AttentionCl else torch.randn(2, 16, 3, 4)
    with torch.no_grad():
        expected = attention_by_hand(attn, x, channels_last=cls is AttentionCl)
        torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-5)
        attn.rel_pos.rotary = None  # no rotation: timm's attention
        assert not torch.allclose(attn(x), expected, atol=1e-3)


@pytest.mark.parametrize("name,extra", [("maxvit_nano_rw_256", {}),  # AttentionCl (TF's head layout: by hand above)
                                        ("coatnet_0_rw_224", dict(transformer_window_size=None))])  # Attention2d
def test_rotary_in_block_grid_and_transformer_attention_trains_and_keeps_timms_keys(name, extra):
    """``pe="rope_mixed+swin_bias"``: each attention rotates by its own partition (learned frequencies per attention,
    trained), timm's table taken over, the state dict's keys timm's plus the rotary's; re-applying a bias alone gives
    the model without rotation (timm's logits with ``pe="native"``)."""
    model = _timm_maxxvit(name, **extra)
    before = copy.deepcopy(model)
    ours = vpe.apply(model, pe="swin_bias+rope_mixed")
    rotaries = vpe.encodings_of(ours)["rotary"]
    assert len(rotaries) == len(vpe.encodings_of(ours)["bias"]) > 0
    keys, timms = set(ours.state_dict()), {k for k in before.state_dict() if ".rel_pos." not in k}
    assert timms <= keys and {k for k in keys - timms if k.endswith(".rel_pos.rotary.freqs")}
    assert all(k.endswith((".rel_pos.rotary.freqs", ".rel_pos.bias.relative_position_bias_table")) for k in keys - timms)
    assert max_logit_diff(vpe.apply(copy.deepcopy(ours), pe="native"), before, (64, 64)) < 1e-5
    assert max_logit_diff(ours, before, (64, 64)) > 1e-4  # the rotation is in use
    ours.train()(torch.randn(2, 3, 64, 64)).sum().backward()
    assert all(r.freqs.grad is not None and r.freqs.grad.abs().sum() > 0 for r in rotaries)
