"""timm backbones with visionpe encodings: timm itself is the oracle."""
import pytest
import timm
import timm.optim
import torch
from packaging.version import Version

import visionpe as vpe
from visionpe import Attention
from visionpe.grid import Grid

from conftest import perturbed

VIT = "vit_tiny_patch16_224"
VIT_KW = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
SWIN = {"swin_tiny_patch4_window7_224": dict(img_size=32, patch_size=4, embed_dim=16, depths=(1, 1),
                                             num_heads=(2, 2), window_size=4, num_classes=4),
        "swinv2_tiny_window8_256": dict(img_size=32, patch_size=4, embed_dim=16, depths=(1, 1),
                                        num_heads=(2, 2), window_size=4, num_classes=4)}
VIT_PES = ["none", "sincos", "learned", "peg", "rope_axial", "rope_mixed", "rope_mixed+learned", "rel_bias",
           "cpb", "alibi", "rope_axial+alibi"]
SWIN_PES = ["none", "swin_bias", "cpb", "rope_axial", "rope_mixed", "alibi", "rope_mixed+swin_bias"]


@pytest.mark.parametrize("vit_kw", [dict(), dict(no_embed_class=True), dict(reg_tokens=2),
                                    dict(class_token=False, global_pool="avg"), dict(global_pool="avg"),
                                    dict(reg_tokens=1, no_embed_class=True, global_pool="token")])
def test_learned_vit_matches_timm_at_every_size(vit_kw):
    torch.manual_seed(0)
    ref = perturbed(timm.create_model(VIT, dynamic_img_size=True, **VIT_KW, **vit_kw)).eval()
    model = timm.create_model(VIT, **VIT_KW, **vit_kw).eval()
    model.load_state_dict(ref.state_dict())
    vpe.apply(model, "learned")
    for size in (32, 16, 48, 64, 40):
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            assert (model(x) - ref(x)).abs().max() < 1e-5, size


@pytest.mark.parametrize("indices", [None, 1, 2, [0], [-1], (0, -1), range(2)])
def test_forward_intermediates_takes_timm_indices(indices):
    """Every ``indices`` form timm takes (the last n blocks, block indices, negative from the end) gives timm's
    intermediates; indices out of range are a ValueError (the bad-input matrix)."""
    torch.manual_seed(0)
    ref = perturbed(timm.create_model(VIT, dynamic_img_size=True, **VIT_KW)).eval()
    model = timm.create_model(VIT, **VIT_KW).eval()
    model.load_state_dict(ref.state_dict())
    vpe.apply(model, "learned")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected, got = ref.forward_intermediates(x, indices=indices), model.forward_intermediates(x, indices=indices)
    assert len(got[1]) == len(expected[1])
    for a, b in zip(got[1], expected[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,pe", [("swin_tiny_patch4_window7_224", "swin_bias"), ("swinv2_tiny_window8_256", "cpb")])
def test_swin_native_bias_matches_timm(name, pe):
    torch.manual_seed(0)
    ref = perturbed(timm.create_model(name, **SWIN[name])).eval()
    model = timm.create_model(name, **SWIN[name]).eval()
    model.load_state_dict(ref.state_dict())
    vpe.apply(model, pe)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max() < 1e-5


def _train_steps(model, size, steps=6):
    torch.manual_seed(1)
    x, y = torch.randn(8, 3, size, size), torch.randint(0, 4, (8,))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("pe", VIT_PES)
def test_vit_every_encoding_any_size_and_learns(pe):
    torch.manual_seed(0)
    model = vpe.create_model(VIT, pe=pe, **VIT_KW)
    for size in (32, 16, 48, 64):  # 1x, 0.5x, 1.5x, 2x
        out = model(torch.randn(2, 3, size, size))
        assert out.shape == (2, 4)
        out.sum().backward()
    losses = _train_steps(model, 32)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", list(SWIN))
@pytest.mark.parametrize("pe", SWIN_PES)
def test_swin_every_encoding_any_size_and_learns(name, pe):
    torch.manual_seed(0)
    model = vpe.create_model(name, pe=pe, **SWIN[name])
    for size in (32, 16, 48, 64):
        out = model(torch.randn(2, 3, size, size))
        assert out.shape == (2, 4)
        out.sum().backward()
    losses = _train_steps(model, 32)
    assert losses[-1] < losses[0]


def test_done_when_example_runs_at_64_96_128():
    model = vpe.create_model("deit_tiny_patch16_224", pe="rope_mixed", img_size=64, patch_size=8, num_classes=10,
                             depth=2)
    for size in (64, 96, 128):
        assert model(torch.randn(1, 3, size, size)).shape == (1, 10)


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed"])
def test_vit_block_rotates_like_the_standalone_module(pe):
    """q and k inside a block equal the standalone module's rotation of timm's q, k (prefix untouched, once)."""
    torch.manual_seed(0)
    model = vpe.create_model(VIT, pe=pe, reg_tokens=1, **VIT_KW).eval()
    attn = model.blocks[0].attn
    seen = {}
    original = attn.rotary.forward

    def spy(q, k, grid):
        out = original(q, k, grid)
        seen.setdefault("in", (q.clone(), k.clone(), grid))  # block 0 (axial RoPE is shared by all blocks)
        seen.setdefault("out", out)
        return out

    attn.rotary.forward = spy
    captured = {}
    model.blocks[0].norm1.register_forward_hook(lambda m, i, o: captured.setdefault("x", o))
    with torch.no_grad():
        model(torch.randn(1, 3, 48, 32))
    q, k, _ = attn.qkv(captured["x"]).reshape(1, -1, 3, 2, 16).permute(2, 0, 3, 1, 4)
    grid = seen["in"][2]
    assert grid == Grid((6, 4), prefix=2)
    assert torch.allclose(seen["in"][0], q) and torch.allclose(seen["in"][1], k)  # no earlier rotation
    assert attn.rotary.scaling == "pi" and attn.rotary.ref_shape == (4, 4)  # the model default: interpolation
    standalone = vpe.build(pe, head_dim=16, num_heads=2, scaling="pi", ref_shape=(4, 4))
    if pe == "rope_mixed":
        standalone.freqs.data.copy_(attn.rotary.freqs)
    rq, rk = standalone(q, k, grid)
    assert torch.allclose(seen["out"][0], rq, atol=1e-6) and torch.allclose(seen["out"][1], rk, atol=1e-6)
    assert torch.equal(rq[:, :, :2], q[:, :, :2])  # prefix tokens unrotated
    assert not torch.allclose(rq[:, :, 2:], q[:, :, 2:])


def test_apply_keeps_non_positional_weights_and_converts_pos_embed():
    torch.manual_seed(0)
    vit = perturbed(timm.create_model(VIT, **VIT_KW))
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    vpe.apply(vit, "rope_mixed+learned")
    after = vit.state_dict()
    for key, value in before.items():
        if key == "pos_embed":
            assert torch.equal(after["pe_tokens.table"].reshape(-1, 32), value[0, 1:])
            assert torch.equal(after["pe_tokens.prefix"], value[0, :1])
        else:
            assert torch.equal(after[key], value), key
    assert "blocks.0.attn.rotary.freqs" in vit.no_weight_decay()
    assert "pe_tokens.table" in vit.no_weight_decay()


def test_apply_twice_switches_encoding_and_keeps_weights():
    model = perturbed(vpe.create_model(VIT, pe="learned", **VIT_KW))
    qkv = model.blocks[0].attn.qkv.weight.clone()
    table = model.pe_tokens.table.clone()
    vpe.apply(model, "rope_axial+learned")
    assert torch.equal(model.blocks[0].attn.qkv.weight, qkv)
    assert torch.equal(model.pe_tokens.table, table)
    assert model.blocks[0].attn.rotary is not None
    mixed = vpe.apply(model, "rope_mixed+rel_bias")
    freqs, bias = mixed.blocks[1].attn.rotary.freqs.clone(), mixed.blocks[1].attn.bias.relative_position_bias_table
    vpe.apply(model, "rope_mixed+rel_bias", scaling="pi")  # re-applying keeps learned frequencies and tables
    assert torch.equal(model.blocks[1].attn.rotary.freqs, freqs) and model.blocks[1].attn.rotary.scaling == "pi"
    assert torch.equal(model.blocks[1].attn.bias.relative_position_bias_table, bias)
    vpe.apply(model, "none")
    assert model.pe_tokens is None and model.blocks[0].attn.rotary is None
    assert isinstance(model.blocks[0].attn, Attention)


def test_encodings_of_lists_one_per_block():
    model = vpe.create_model(VIT, pe="rope_mixed+learned", **VIT_KW)
    found = vpe.encodings_of(model)
    assert len(found["tokens"]) == 1 and len(found["rotary"]) == 2 and found["bias"] == []
    assert found["rotary"][0] is not found["rotary"][1]  # rope_mixed learns frequencies per layer


def test_scaling_keywords_reach_rope_with_training_grid_as_reference():
    model = vpe.create_model(VIT, pe="rope_axial", pe_kwargs={"scaling": "pi"}, **VIT_KW)
    rotary = vpe.encodings_of(model)["rotary"][0]
    assert rotary.scaling == "pi" and rotary.ref_shape == (4, 4)


def test_checkpoint_round_trip(tmp_path):
    model = perturbed(vpe.create_model(VIT, pe="rope_mixed+learned", **VIT_KW)).eval()
    vpe.save_weights(model, tmp_path / "w.safetensors")
    other = vpe.create_model(VIT, pe="rope_mixed+learned", **VIT_KW).eval()
    vpe.load_weights(other, tmp_path / "w.safetensors")
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(model(x), other(x))
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary file left


def test_timm_checkpoint_report(tmp_path):
    torch.manual_seed(0)
    plain = perturbed(timm.create_model(VIT, **VIT_KW)).eval()
    torch.save(plain.state_dict(), tmp_path / "plain.pth")
    model = vpe.create_model(VIT, pe="learned", **VIT_KW).eval()
    report = vpe.load_timm_checkpoint(model, tmp_path / "plain.pth")
    assert report.converted == ["pos_embed -> pe_tokens.table", "pos_embed -> pe_tokens.prefix"]
    assert report.new == [] and report.dropped == []
    ref = timm.create_model(VIT, dynamic_img_size=True, **VIT_KW).eval()
    ref.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max() < 1e-5
    rope = vpe.create_model(VIT, pe="rope_axial", **VIT_KW)
    report = vpe.load_timm_checkpoint(rope, plain.state_dict())
    assert report.dropped == ["pos_embed"] and report.new == []


def test_timm_checkpoint_resizes_pos_embed_and_swin_tables():
    plain = perturbed(timm.create_model(VIT, **VIT_KW))
    big = vpe.create_model(VIT, pe="learned", **{**VIT_KW, "img_size": 64})
    report = vpe.load_timm_checkpoint(big, plain.state_dict())
    expected = timm.layers.resample_abs_pos_embed(plain.pos_embed, (8, 8), (4, 4), num_prefix_tokens=1)
    assert torch.allclose(big.pe_tokens.table.reshape(1, 64, -1), expected[:, 1:], atol=1e-5)
    assert len(report.converted) == 2
    name = "swin_tiny_patch4_window7_224"
    swin = perturbed(timm.create_model(name, **SWIN[name]))
    ours = vpe.create_model(name, pe="swin_bias", **{**SWIN[name], "window_size": 2})
    report = vpe.load_timm_checkpoint(ours, swin.state_dict())
    assert all(line.endswith("(resized 4x4 -> 2x2 (geometric))") for line in report.converted)  # timm's method
    assert len(report.converted) == 2
    source = swin.layers[0].blocks[0].attn.relative_position_bias_table.detach()
    expected = timm.layers.resize_rel_pos_bias_table(source, new_window_size=(2, 2), new_bias_shape=(9, 2))
    torch.testing.assert_close(ours.layers[0].blocks[0].attn.bias.relative_position_bias_table, expected, atol=1e-4,
                               rtol=1e-4)


def test_timm_checkpoint_of_a_non_square_grid(tmp_path):
    """A timm checkpoint at a 16x4 grid (64 patches, also a square count): into a 16x4 model it loads as is, as timm
    loads it; into another grid source_grid=(16, 4) gives timm's resample_abs_pos_embed from (16, 4), and so does the
    timm model itself as the source, while the square default reads it as 8x8 and says so (with the other grids 64
    fits and how to give one); 14x7 (not square) asks for source_grid."""
    kw = {**VIT_KW, "img_size": (128, 32)}
    plain = perturbed(timm.create_model(VIT, **kw))
    path = tmp_path / "vit_16x4.pth"
    torch.save(plain.state_dict(), path)
    same = vpe.create_model(VIT, pe="learned", **kw)
    vpe.load_timm_checkpoint(same, path)
    torch.testing.assert_close(same.pe_tokens.table.reshape(1, 64, -1), plain.pos_embed[:, 1:])
    x = torch.randn(2, 3, 128, 32)
    torch.testing.assert_close(same.eval()(x), plain.eval()(x), atol=1e-5, rtol=1e-5)
    other = vpe.create_model(VIT, pe="learned", **{**VIT_KW, "img_size": (64, 64)})
    vpe.load_timm_checkpoint(other, path, source_grid=(16, 4))
    # timm's resample_abs_pos_embed(pos_embed, (8, 8), old_size=(16, 4)) in closed form: the (16, 4) grid resized
    # bicubically with antialias (equal to timm's function at the pinned timm; timm 1.0.19 read a non-square
    # old_size otherwise, so the closed form is the oracle at every release)
    grid = plain.pos_embed[:, 1:].reshape(1, 16, 4, -1).permute(0, 3, 1, 2)
    expected = torch.nn.functional.interpolate(grid, size=(8, 8), mode="bicubic", antialias=True, align_corners=False)
    torch.testing.assert_close(other.pe_tokens.table, expected[0].permute(1, 2, 0), atol=1e-5, rtol=1e-5)
    if Version(timm.__version__) >= Version("1.0.31"):
        timm_resampled = timm.layers.resample_abs_pos_embed(plain.pos_embed, (8, 8), (16, 4), num_prefix_tokens=1)
        torch.testing.assert_close(other.pe_tokens.table.reshape(1, 64, -1), timm_resampled[:, 1:], atol=1e-5,
                                   rtol=1e-5)
    # the square default says what it assumed, and the timm model itself gives its grid
    square = vpe.create_model(VIT, pe="learned", **{**VIT_KW, "img_size": (64, 64)})
    report = vpe.load_timm_checkpoint(square, path)
    assert report.assumed == ["pos_embed: 64 patch positions read as the grid 8x8 (the model's grid; a checkpoint "
                              "stores no grid, and 64 also fits 16x4, 4x16, 32x2, 2x32): give "
                              "source_grid=(height, width) if it was another"]
    assert "\n  assumed   pos_embed: 64 patch positions read as the grid 8x8" in str(report)
    from_model = vpe.create_model(VIT, pe="learned", **{**VIT_KW, "img_size": (64, 64)})
    report = vpe.load_timm_checkpoint(from_model, plain)
    assert report.assumed == [] and not report.new and not report.dropped
    torch.testing.assert_close(from_model.pe_tokens.table, other.pe_tokens.table)
    tall = perturbed(timm.create_model(VIT, **{**VIT_KW, "img_size": (112, 56)}))
    with pytest.raises(ValueError, match=r"98 patch positions.*source_grid=\(height, width\)"):
        vpe.load_timm_checkpoint(vpe.create_model(VIT, pe="learned", **VIT_KW), tall.state_dict())
    with pytest.raises(ValueError, match=r"source_grid=\(16, 4\) has 64 patches .* holds 98"):
        vpe.load_timm_checkpoint(other, tall.state_dict(), source_grid=(16, 4))
    with pytest.raises(ValueError, match="source_grid must be"):
        vpe.load_timm_checkpoint(other, path, source_grid=(16, 4.0))


BEIT_KW = dict(patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)


def beit_checkpoint(tmp_path):
    """A tiny timm BEiT on a 4x4 grid with perturbed weights (its relative tables strongly), saved to a file, and
    timm's own BEiT built at 48 px (6x6) from that file (its checkpoint filter resizes the tables):
    ``(beit, path, theirs)``."""
    torch.manual_seed(0)
    beit = timm.create_model("beit_base_patch16_224", img_size=32, **BEIT_KW)
    with torch.no_grad():
        for name, p in beit.named_parameters():
            p.add_(torch.randn_like(p) * (1.0 if "relative_position" in name else 0.05))
    path = tmp_path / "beit.pth"
    torch.save(beit.state_dict(), path)
    theirs = timm.create_model("beit_base_patch16_224", img_size=48, pretrained=True, **BEIT_KW,
                               pretrained_cfg_overlay=dict(file=str(path), custom_load=False, num_classes=3)).eval()
    return beit, path, theirs


def test_beit_checkpoint_resizes_its_tables_as_timms_beit(tmp_path):
    """A timm BEiT checkpoint (4x4 grid) into a ViT with rel_bias on a 6x6 grid: its tables resized with BEiT's
    geometric method by default, as timm's own BEiT loads the file at 48 px (its checkpoint filter calls
    resize_rel_pos_bias_table): the same tables and logits; ``table_resize="bicubic"`` resizes them otherwise."""
    _, path, theirs = beit_checkpoint(tmp_path)
    kw = BEIT_KW
    tables = {}
    for resize in (None, "bicubic"):
        ours = vpe.create_model("vit_base_patch16_224", pe="rel_bias", img_size=48, init_values=0.1,
                                global_pool="avg", **kw).eval()
        report = vpe.load_timm_checkpoint(ours, path, strict=True, table_resize=resize)
        assert "blocks.0.attn.relative_position_bias_table -> blocks.0.attn.bias.relative_position_bias_table " \
               f"(resized 4x4 -> 6x6 ({resize or 'geometric'}))" in report.converted
        tables[resize] = ours.blocks[0].attn.bias.relative_position_bias_table.detach()
        if resize is None:
            torch.testing.assert_close(tables[None], theirs.blocks[0].attn.relative_position_bias_table, atol=1e-4,
                                       rtol=1e-4)
            x = torch.randn(2, 3, 48, 48)
            with torch.no_grad():
                torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
    assert (tables["bicubic"] - tables[None]).abs().max() > 0.1
    with pytest.raises(ValueError, match="table_resize"):
        vpe.load_timm_checkpoint(ours, path, table_resize="cubic")


def test_beit_checkpoint_at_its_grid_grows_its_table_on_a_larger_grid_as_timms_beit(tmp_path):
    """A timm BEiT checkpoint loaded at its own 4x4 grid, then run at 48 px (6x6): rel_bias grows its table on the
    fly with BEiT's geometric method (set by the load), giving timm's BEiT built at 48 px from the same file; a fresh
    rel_bias grows bicubically unless built with interpolation="geometric", which is timm's resize_rel_pos_bias_table."""
    beit, path, theirs = beit_checkpoint(tmp_path)
    kw = BEIT_KW
    ours = vpe.create_model("vit_base_patch16_224", pe="rel_bias", img_size=32, init_values=0.1, global_pool="avg",
                            **kw).eval()
    assert ours.blocks[0].attn.bias.interpolation == "bicubic"
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        vpe.load_timm_checkpoint(ours, path, strict=True)
        assert ours.blocks[0].attn.bias.interpolation == "geometric"
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
        bias, grid = ours.blocks[0].attn.bias, Grid((6, 6), prefix=1)
        geometric = bias(grid)
        bias.interpolation = "bicubic"  # its cached geometric bias must not be read again
        assert (bias(grid) - geometric).abs().max() > 0.1
    table = beit.blocks[0].attn.relative_position_bias_table.detach()  # (7 * 7 + 3, heads)
    expected = timm.layers.resize_rel_pos_bias_table(table, new_window_size=(6, 6), new_bias_shape=(11 * 11 + 3, 2))
    grown = {}
    for interpolation in ("geometric", "bicubic"):
        pe = vpe.build("rel_bias", num_heads=2, grid_shape=(4, 4), interpolation=interpolation)
        with torch.no_grad():
            pe.relative_position_bias_table.copy_(table)
            grown[interpolation] = pe(Grid((6, 6), prefix=1))
            if interpolation == "geometric":
                pe.resize((6, 6))  # the table for good, by the module's own method
                torch.testing.assert_close(pe.relative_position_bias_table, expected, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(pe(Grid((6, 6), prefix=1)), grown["geometric"], atol=1e-5, rtol=1e-5)
    assert (grown["geometric"] - grown["bicubic"]).abs().max() > 0.1  # the two methods differ (the test can fail)
    with pytest.raises(ValueError, match="interpolation='cubic' is not supported.*'geometric'"):
        vpe.build("rel_bias", num_heads=2, grid_shape=(4, 4), interpolation="cubic")


TINY = dict(patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)


@pytest.mark.parametrize("factorized", [False, True])
def test_timm_checkpoint_resamples_visionpe_learned_table(factorized, tmp_path, caplog):
    """A visionpe learned checkpoint from img_size 32 into a model at 48: the table is resampled (reported as
    converted), so the model gives the logits the source gives at 48 (where it resamples on the fly)."""
    torch.manual_seed(0)
    kw = {"pe_kwargs": {"factorized": factorized}, **TINY}
    small = perturbed(vpe.create_model(VIT, pe="learned", img_size=32, **kw)).eval()
    vpe.save_weights(small, tmp_path / "small.safetensors")
    big = vpe.create_model(VIT, pe="learned", img_size=48, **kw).eval()
    with caplog.at_level("WARNING", logger="visionpe.weights"):
        report = vpe.load_timm_checkpoint(big, tmp_path / "small.safetensors", strict=True)
    assert report.new == [] and report.dropped == [] and not caplog.records
    expected = (["pe_tokens.axis_tables.0 -> pe_tokens.axis_tables.0 (resampled 4 -> 6)",
                 "pe_tokens.axis_tables.1 -> pe_tokens.axis_tables.1 (resampled 4 -> 6)"] if factorized else
                ["pe_tokens.table -> pe_tokens.table (resampled 4x4 -> 6x6)"])
    assert report.converted == expected
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert (big(x) - small(x)).abs().max() < 1e-5


def test_timm_checkpoint_warns_when_more_than_the_head_is_dropped_or_new(caplog):
    """One report per load, each key once (a key of every block once): a warning when a non-positional weight
    beyond the head did not load, information when only another encoding's position weights and the head differ."""
    torch.manual_seed(0)
    model = vpe.create_model(VIT, pe="learned", img_size=16, **TINY)
    with caplog.at_level("INFO", logger="visionpe.weights"):
        report = vpe.load_timm_checkpoint(model, {})
    assert report.new and not report.kept
    [record] = caplog.records
    assert record.name == "visionpe.weights" and record.levelname == "WARNING"
    message = record.getMessage()
    assert "pe_tokens.table" in message and message.count("blocks.0.attn.qkv.weight") == 1
    caplog.clear()
    deeper = vpe.create_model(VIT, pe="learned", img_size=16, **{**TINY, "depth": 2})
    with caplog.at_level("WARNING", logger="visionpe.weights"):
        report = vpe.load_timm_checkpoint(model, deeper.state_dict())
    assert "blocks.1.attn.qkv.weight" in report.dropped
    assert len(caplog.records) == 1 and "dropped blocks.1." in caplog.records[0].getMessage()
    caplog.clear()
    plain = timm.create_model(VIT, img_size=16, **{**TINY, "depth": 2})
    rope = vpe.create_model(VIT, pe="rope_mixed", img_size=16, **{**TINY, "depth": 2})
    with caplog.at_level("INFO", logger="visionpe.weights"):
        report = vpe.load_timm_checkpoint(rope, plain.state_dict())
    assert report.dropped == ["pos_embed"]
    [record] = caplog.records
    assert record.levelname == "INFO" and record.getMessage() == (
        "load_timm_checkpoint: state dict into VisionTransformerPE: 31 kept, 0 converted, 2 new, 1 dropped\n"
        "  positional, not loaded: pos_embed (dropped); blocks.*.attn.rotary.freqs (2) (new)")
    caplog.clear()
    other_head = vpe.create_model(VIT, pe="learned", img_size=16, **{**TINY, "num_classes": 5})
    with caplog.at_level("WARNING", logger="visionpe.weights"):
        report = vpe.load_timm_checkpoint(model, other_head.state_dict())
    assert set(report.dropped) == set(report.new) == {"head.weight", "head.bias"}
    assert not caplog.records  # only the classifier differs: no warning


def test_timm_checkpoint_strict_raises_listing_new_and_dropped_keys():
    torch.manual_seed(0)
    model = vpe.create_model(VIT, pe="learned", img_size=16, **TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"strict=True") as info:
        vpe.load_timm_checkpoint(model, {}, strict=True)
    assert all(f"new     {k}\n" in f"{info.value}\n" for k in ("pe_tokens.table", "head.weight", "cls_token"))
    other_head = perturbed(vpe.create_model(VIT, pe="learned", img_size=16, **{**TINY, "num_classes": 5}))
    with pytest.raises(ValueError, match=r"dropped head\.weight \(shape \(5, 16\) in the checkpoint, \(3, 16\)"):
        vpe.load_timm_checkpoint(model, other_head.state_dict(), strict=True)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing loaded on failure
    same = perturbed(vpe.create_model(VIT, pe="learned", img_size=16, **TINY))
    report = vpe.load_timm_checkpoint(model, same.state_dict(), strict=True)
    assert report.new == report.dropped == [] and torch.equal(model.pe_tokens.table, same.pe_tokens.table)
    plain = timm.create_model(VIT, img_size=16, **TINY)  # pos_embed converted: allowed under strict
    assert vpe.load_timm_checkpoint(model, plain.state_dict(), strict=True).converted


def test_no_weight_decay_excludes_position_params_from_timm_optimizer():
    model = vpe.create_model(VIT, pe="rope_mixed+learned", **VIT_KW)
    optimizer = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert id(model.blocks[0].attn.rotary.freqs) in no_decay
    assert id(model.pe_tokens.table) in no_decay
    assert id(model.blocks[0].attn.qkv.weight) not in no_decay


def test_bad_input_messages():
    with pytest.raises(ValueError, match="supported: timm VisionTransformer, timm SwinTransformer"):
        vpe.apply(torch.nn.Linear(2, 2), "learned")
    with pytest.raises(ValueError, match="swin_bias needs window attention"):
        vpe.create_model(VIT, pe="swin_bias", **VIT_KW)
    name = "swin_tiny_patch4_window7_224"
    with pytest.raises(ValueError, match="tokens encodings"):
        vpe.create_model(name, pe="learned", **SWIN[name])
    with pytest.raises(ValueError, match="each side must be a positive multiple of"):
        vpe.create_model(VIT, pe="learned", **VIT_KW)(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match="available: sincos"):
        vpe.create_model(VIT, pe="rope", **VIT_KW)
    with pytest.raises(ValueError, match="both of family 'rotary'"):
        vpe.create_model(VIT, pe="rope_axial+rope_mixed", **VIT_KW)
    with pytest.raises(ValueError, match="not a timm model"):
        vpe.create_model("vit_nonexistent", pe="learned")
    with pytest.raises(ValueError, match="pe keyword 'nope'"):
        vpe.create_model(VIT, pe="learned", pe_kwargs={"nope": 1}, **VIT_KW)


@pytest.mark.parametrize("eva_name,pe", [("vit_small_patch16_rope_224", "rope_axial"),
                                         ("vit_small_patch16_rope_mixed_224", "rope_mixed")])
def test_timm_rope_vit_ports_load_with_identical_logits(eva_name, pe):
    """timm's rope-vit ports (Eva classes) -> a visionpe ViT: same logits, at the trained size and beyond."""
    torch.manual_seed(0)
    kw = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=2, num_classes=5)
    eva = perturbed(timm.create_model(eva_name, dynamic_img_size=True, **kw)).eval()
    # timm's ports extrapolate integer positions: scaling="none" reproduces them at every size; the model default
    # ("pi") equals them at the trained size and interpolates beyond it
    ours = vpe.create_model("vit_small_patch16_224", pe=pe, qkv_bias=True, init_values=1e-5, global_pool="token",
                            pe_kwargs={"scaling": "none"}, **kw).eval()
    default = vpe.create_model("vit_small_patch16_224", pe=pe, qkv_bias=True, init_values=1e-5, global_pool="token",
                               **kw).eval()
    report = vpe.load_timm_checkpoint(ours, eva.state_dict())
    assert report.new == [] and report.dropped == []
    vpe.load_timm_checkpoint(default, eva.state_dict())
    for size in (32, 48):
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            assert (ours(x) - eva(x)).abs().max() < 1e-5, size
            assert ((default(x) - eva(x)).abs().max() < 1e-5) == (size == 32), size


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed", "rope_mixed+learned"])
def test_rope_in_a_model_interpolates_by_default(pe):
    """The model default is position interpolation to the model's grid (docs/reports/BENCHMARK.md); scaling="none"
    extrapolates when asked; normalised coordinates take no scaling."""
    default = vpe.encodings_of(vpe.create_model(VIT, pe=pe, **VIT_KW))["rotary"][0]
    assert (default.scaling, default.ref_shape) == ("pi", (4, 4))
    explicit = vpe.encodings_of(vpe.create_model(VIT, pe=pe, pe_kwargs={"scaling": "none"}, **VIT_KW))["rotary"][0]
    assert explicit.scaling == "none"
    normalized = vpe.create_model(VIT, pe=pe, pe_kwargs={"coords": "normalized"}, **VIT_KW)
    assert vpe.encodings_of(normalized)["rotary"][0].scaling == "none"
    assert vpe.build(pe.split("+")[0], head_dim=16, num_heads=2).scaling == "none"  # a bare one has no model grid
