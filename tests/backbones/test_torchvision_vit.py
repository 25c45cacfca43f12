"""torchvision's image ViT (VisionTransformer, vit_b_16 family) with visionpe encodings: torchvision itself is the
oracle at its own size; at other sizes torchvision has no run-time rule, so the reference is torchvision's model built
at that size around the table resampled independently here (F.interpolate, timm's convention)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import compiled_matches_eager_and_trains, requires, run_concurrently, perturbed
from torchvision.models import resnet18
from torchvision.models.vision_transformer import ConvStemConfig, VisionTransformer
from trainutil import train_main

import visionpe as vpe
from visionpe.backbones import GridMultiheadAttention, TorchvisionViTPE, named_constructor

TV = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5)


def _perturb(model):
    return perturbed(model).eval()


def _reference(**kw):
    torch.manual_seed(0)
    return _perturb(VisionTransformer(**{**TV, **kw}))


@pytest.mark.parametrize("kw", [dict(), dict(representation_size=24),
                                dict(conv_stem_configs=[ConvStemConfig(16, 3, 2), ConvStemConfig(16, 3, 2),
                                                        ConvStemConfig(16, 3, 2)])],
                         ids=["plain", "representation", "conv-stem"])
def test_learned_reproduces_torchvision_logits(kw):
    ref = _reference(**kw)
    model = vpe.apply(copy.deepcopy(ref), "learned")
    assert type(model) is TorchvisionViTPE and model.encoder.pos_embedding is None
    table = ref.encoder.pos_embedding[0]
    assert torch.equal(model.pe_tokens.prefix, table[:1]) and torch.equal(model.pe_tokens.table.reshape(16, -1),
                                                                          table[1:])
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max() < 1e-5


@pytest.mark.parametrize("size", [48, 16, 40])
def test_learned_at_another_size_resamples_the_table_as_timm(size):
    """torchvision asserts its image size; the patched model resamples the table (bicubic, align_corners=False,
    antialias): equal to torchvision's own model built at ``size`` around that table."""
    ref = _reference()
    model = vpe.apply(copy.deepcopy(ref), "learned")
    table = ref.encoder.pos_embedding.detach()
    grid = table[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    side = size // 8
    resized = F.interpolate(grid, size=(side, side), mode="bicubic", align_corners=False, antialias=True)
    at_size = VisionTransformer(**{**TV, "image_size": size}).eval()
    state = {**ref.state_dict(), "encoder.pos_embedding": torch.cat(
        [table[:, :1], resized.permute(0, 2, 3, 1).reshape(1, side * side, -1)], dim=1)}
    at_size.load_state_dict(state)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert (model(x) - at_size(x)).abs().max() < 1e-5
    with pytest.raises(Exception, match="Wrong image height"):
        ref(x)  # torchvision itself runs one size only


def test_apply_keeps_every_weight_and_names():
    ref = _reference()
    before = ref.state_dict()
    model = vpe.apply(copy.deepcopy(ref), "rope_mixed+learned")
    after = model.state_dict()
    kept = set(before) - {"encoder.pos_embedding"}
    assert kept <= set(after) and all(torch.equal(before[k], after[k]) for k in kept)
    new = set(after) - kept
    assert new == {"pe_tokens.table", "pe_tokens.prefix"} | {f"encoder.layers.encoder_layer_{i}.self_attention."
                                                             f"rotary.freqs" for i in range(2)}
    assert all(isinstance(b.self_attention, GridMultiheadAttention) for b in model.encoder.layers)


def test_grid_attention_is_multihead_attention():
    """Without a rotary or bias encoding a block's attention gives nn.MultiheadAttention's own result."""
    ref = _reference()
    model = vpe.apply(copy.deepcopy(ref), "none")
    x = torch.randn(2, 17, 32)
    layout = vpe.Grid((4, 4), prefix=1)
    with torch.no_grad():
        for block, ref_block in zip(model.encoder.layers, ref.encoder.layers):
            expected, _ = ref_block.self_attention(x, x, x, need_weights=False)
            assert (block.self_attention(x, layout) - expected).abs().max() < 1e-6


def test_save_and_load_weights_round_trip(tmp_path):
    model = _perturb(vpe.apply(VisionTransformer(**TV), "rope_mixed+learned"))
    vpe.save_weights(model, tmp_path / "w.safetensors")
    other = vpe.apply(VisionTransformer(**TV), "rope_mixed+learned").eval()
    vpe.load_weights(other, tmp_path / "w.safetensors")
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        assert torch.equal(model(x), other(x))


def test_concurrent_forwards_at_different_sizes_equal_single_threaded():
    model = vpe.apply(_reference(), "rope_axial+learned")
    inputs = [torch.randn(1, 3, 32, 48), torch.randn(1, 3, 48, 32), torch.randn(2, 3, 16, 16)]
    errors = run_concurrently(model, inputs, iterations=30, threads=3)
    assert not errors, errors[:3]

@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_fullgraph_compile_matches_eager_and_trains():
    model = vpe.apply(_reference(), "rope_mixed+learned")
    assert not compiled_matches_eager_and_trains(model, torch.randn(2, 3, 32, 40))
    assert model.encoder.layers[0].self_attention.rotary.freqs.grad.abs().sum() > 0

def test_named_models_train_from_the_command_line(tmp_path):
    build = named_constructor("tv_vit_b_16")[1]
    model = build(num_classes=3, img_size=16, patch_size=4, in_chans=1, embed_dim=16, depth=1, num_heads=2)
    assert isinstance(model, VisionTransformer) and model.conv_proj.in_channels == 1 and model.image_size == 16
    assert sorted(n for n in vpe.backbones.ADAPTERS[VisionTransformer].constructors) == [
        "tv_vit_b_16", "tv_vit_b_32", "tv_vit_h_14", "tv_vit_l_16", "tv_vit_l_32"]
    summary = train_main(["--model", "tv_vit_b_16", "--pe", "rope_mixed", "--data", "shapes-position",
                          "--train-samples", "32", "--val-samples", "16", "--batch-size", "16", "--epochs", "1",
                          "--img-size", "16", "--patch-size", "4", "--embed-dim", "16", "--depth", "1",
                          "--num-heads", "2", "--warmup-epochs", "0", "--no-progress", "--threads", "1",
                          "--eval-res", "24", "--output", tmp_path / "run"])
    assert set(summary["results"]["last"]) == {"16", "24"}
    with pytest.raises(ValueError, match="takes the keywords embed_dim, depth"):
        build(hidden_dim=16)
    with pytest.raises(ValueError, match="no stochastic depth"):
        build(drop_path_rate=0.1)
    with pytest.raises(ValueError, match="square img_size"):
        build(img_size=(16, 32))
    with pytest.raises(ValueError, match="multiple of patch_size"):
        build(img_size=20, patch_size=8)
    with pytest.raises(ValueError, match="depth must be a positive integer, got 0"):
        build(depth=0)
    with pytest.raises(ValueError, match="embed_dim=30 must be divisible by num_heads=4"):
        build(embed_dim=30, num_heads=4)


def test_unsupported_classes_name_their_library():
    with pytest.raises(ValueError, match=r"model class torchvision\.models\.resnet\.ResNet is not supported; "
                                         r"supported: timm VisionTransformer.*torchvision VisionTransformer"):
        vpe.apply(resnet18(), "learned")

    class MyViT(VisionTransformer):
        pass

    with pytest.raises(ValueError, match="subclasses torchvision VisionTransformer"):
        vpe.apply(MyViT(**TV), "learned")
    with pytest.raises(ValueError, match="swin_bias needs window attention"):
        vpe.apply(VisionTransformer(**TV), "swin_bias")
    with pytest.raises(ValueError, match="each side must be a positive multiple of"):
        vpe.apply(VisionTransformer(**TV), "learned")(torch.randn(1, 3, 30, 32))


def test_grid_offset_reaches_the_encodings():
    """A 2x2 crop at offset (1, 2) reads that window of the learned 4x4 table."""
    model = vpe.apply(_reference(), "learned")
    x = torch.randn(2, 3, 16, 16)
    tokens, layout = model.embed(x, grid_offset=(1, 2))
    patches = model.conv_proj(x).flatten(2).transpose(1, 2)
    window = model.pe_tokens.table[1:3, 2:4].reshape(4, -1)
    assert layout.grid.offset == (1, 2) and (tokens[:, 1:] - (patches + window)).abs().max() < 1e-6
    with torch.no_grad():
        assert not torch.allclose(model(x, grid_offset=(1, 2)), model(x))


def test_apply_twice_switches_encoding_and_keeps_the_table():
    ref = _reference()
    model = vpe.apply(copy.deepcopy(ref), "learned")
    vpe.apply(model, "rope_axial+learned")
    assert len(vpe.encodings_of(model)["rotary"]) == 2
    vpe.apply(model, "learned")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max() < 1e-5
