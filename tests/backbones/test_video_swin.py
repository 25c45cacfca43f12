"""torchvision's Video Swin (SwinTransformer3d) with visionpe encodings: torchvision itself is the oracle."""
import copy

import pytest
import torch
from torchvision.models.video import swin3d_t
from torchvision.models.video.swin_transformer import (ShiftedWindowAttention3d, SwinTransformer3d,
                                                       _compute_attention_mask_3d)

import visionpe as vpe
from visionpe.backbones import SwinTransformer3dPE, VideoWindowAttention
from visionpe.attention import attend
from visionpe.backbones.video_swin import effective_window
from visionpe.backbones.windows import shift_mask
from visionpe.bias import SwinBias
from visionpe.grid import Grid

from conftest import perturbed

# depths (2, 2): every stage has an unshifted and a shifted block
CFG = dict(patch_size=[2, 4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[2, 4, 4], num_classes=3)
PES = ["swin_bias", "cpb", "alibi", "bucket_bias", "rope_axial", "rope_mixed", "rope_mixed+swin_bias",
       "rope_axial+alibi"]


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    return perturbed(SwinTransformer3d(**CFG)).eval()


def _patched(ref, pe="swin_bias", slicing=None):
    model = vpe.apply(copy.deepcopy(ref), pe)
    if slicing is not None:
        for m in model.modules():
            if isinstance(m, VideoWindowAttention):
                m.table_slicing = slicing
    return model


def _max_diff(a, b, x):
    with torch.no_grad():
        return (a(x) - b(x)).abs().max().item()


@pytest.mark.parametrize("clip", [
    (4, 32, 32),  # tokens (2, 8, 8) then (2, 4, 4): the configured window everywhere
    (8, 64, 48),  # (4, 16, 12) then (4, 8, 6): shifted in T, H and W, padded W at stage 2
    (2, 32, 32),  # one time step: the window shrinks to (1, 4, 4)
    (4, 16, 16),  # (2, 4, 4) then (2, 2, 2): the frame window shrinks (torchvision's index slice)
    (3, 30, 17),  # not multiples of the patch: torchvision pads; windows padded and shifted
])
def test_swin_bias_reproduces_torchvision_logits(reference, clip):
    model = _patched(reference)
    assert type(model) is SwinTransformer3dPE
    for block, ref_block in zip(vpe.encodings_of(model)["bias"],
                                [m for m in reference.modules() if isinstance(m, ShiftedWindowAttention3d)]):
        assert torch.equal(block.relative_position_bias_table, ref_block.relative_position_bias_table)
    x = torch.randn(2, 3, *clip)
    assert _max_diff(model, reference, x) < 1e-5


def test_swin3d_t_reproduces_torchvision_logits():
    """The real swin3d_t configuration (window (8, 7, 7), head_dim 32) on a small clip: padded, shifted, shrunk."""
    torch.manual_seed(0)
    model = swin3d_t(weights=None, num_classes=5).eval()
    x = torch.randn(1, 3, 4, 64, 64)
    with torch.no_grad():
        expected = model(x)
        assert (vpe.apply(model, "swin_bias")(x) - expected).abs().max() < 1e-5
    vpe.apply(model, "rope_mixed+swin_bias")  # head_dim 32: rotation pairs (5, 5, 6) over (T, H, W)
    assert model.features[0][0].attn.rotary.sections == (5, 5, 6)


@pytest.mark.parametrize("padded,window,shift", [((4, 8, 8), (2, 4, 4), (1, 2, 2)), ((2, 12, 8), (2, 4, 4), (0, 2, 2)),
                                                 ((6, 6, 10), (3, 3, 5), (1, 1, 2)), ((4, 8, 4), (2, 4, 4), (1, 2, 0))])
def test_shift_mask_equals_torchvision(padded, window, shift):
    ours = shift_mask(padded, window, shift)
    theirs = _compute_attention_mask_3d(torch.zeros(1), padded, window, shift)
    assert torch.equal(ours, theirs)


def test_effective_window():
    assert effective_window((1, 8, 3), (2, 4, 4), (1, 2, 2)) == ((1, 4, 3), (0, 2, 0))
    assert effective_window((2, 4, 5), (2, 4, 4), (1, 2, 2)) == ((2, 4, 4), (0, 0, 2))


def test_shrunk_window_table_slicing(reference):
    """torchvision slices its full-window index for a shrunk window: the true offsets when the shrunk window is a
    leading row-major block (a shorter clip), other offsets when a frame axis shrinks. ``"offsets"`` gives the
    true ones: the same bias as a torchvision window attention built for the shrunk window."""
    attn = _patched(reference).features[0][0].attn
    full = attn.bias(Grid((2, 4, 4)))
    for window in ((1, 4, 4), (2, 2, 2), (1, 1, 3), (2, 4, 3), (1, 3, 1)):  # torchvision's slice
        n = window[0] * window[1] * window[2]
        assert torch.equal(attn._table_bias(window), full[:, :n, :n])
    assert torch.equal(attn._table_bias((1, 4, 4)), attn.bias(Grid((1, 4, 4))))  # leading block: the same
    assert not torch.allclose(attn._table_bias((2, 2, 2)), attn.bias(Grid((2, 2, 2))))
    x = torch.randn(2, 3, 2, 32, 32)  # only T shrinks: both slicings give torchvision's logits
    assert _max_diff(_patched(reference, slicing="offsets"), reference, x) < 1e-5
    x = torch.randn(2, 3, 4, 16, 16)  # the frame window shrinks at stage 2: they differ
    assert _max_diff(_patched(reference, slicing="offsets"), reference, x) > 1e-4

    # "offsets" == torchvision's attention built for the shrunk window, its table the matching centre of ours
    attn = _patched(reference, slicing="offsets").features[0][1].attn  # a shifted block
    window, heads = (2, 2, 2), attn.num_heads
    source = ShiftedWindowAttention3d(16, list(window), [0, 0, 0], heads).eval()
    source.qkv, source.proj = attn.qkv, attn.proj
    table = attn.bias.relative_position_bias_table.reshape(3, 7, 7, heads)
    with torch.no_grad():
        source.relative_position_bias_table.copy_(table[:, 2:5, 2:5].reshape(-1, heads))
    x = torch.randn(2, 2, 2, 2, 16)
    with torch.no_grad():
        assert (attn(x) - source(x)).abs().max() < 1e-6
    with pytest.raises(ValueError, match="table_slicing='rows' is not supported; allowed values: 'torchvision'"):
        attn.table_slicing = "rows"


@pytest.mark.parametrize("pe", PES)
def test_every_3d_encoding_trains(pe):
    torch.manual_seed(0)
    # no stochastic depth: a dropped residual branch would leave its block's encoding without gradient by chance
    model = vpe.apply(SwinTransformer3d(**CFG, stochastic_depth_prob=0.0), pe)
    encodings = vpe.encodings_of(model)
    assert all(e is not None for fam in ("rotary", "bias") for e in encodings[fam])
    assert len(encodings["rotary"] or encodings["bias"]) == 4
    params = {id(p) for fam in encodings.values() for e in fam for p in e.parameters()}
    for clip in ((4, 32, 32), (4, 16, 24)):  # configured window; frame window shrinks at stage 2
        model.zero_grad()
        x = torch.randn(1, 3, *clip)
        out = model(x)
        assert out.shape == (1, 3)
        out.square().sum().backward()
        for p in model.parameters():
            if id(p) in params:
                assert p.grad is not None and p.grad.abs().sum() > 0
    # the encoding is used: the same weights without it give other logits
    plain = vpe.apply(copy.deepcopy(model), "none").eval()
    assert _max_diff(model.eval(), plain, torch.randn(1, 3, 4, 32, 32)) > 1e-6
    opt = torch.optim.AdamW(model.train().parameters(), lr=3e-3)
    x, y = torch.randn(2, 3, 4, 32, 32), torch.randint(0, 3, (2,))
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_apply_twice_keeps_weights(reference):
    model = _patched(reference, "rope_mixed+swin_bias")
    perturbed(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    vpe.apply(model, "rope_mixed+swin_bias")
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    vpe.apply(model, "swin_bias")  # another combination keeps every non-positional weight
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_swin_bias_for_another_window_resizes_torchvision_table(reference):
    model = vpe.apply(copy.deepcopy(reference), "swin_bias", window_size=(2, 6, 6))
    bias = model.features[0][0].attn.bias
    native = SwinBias(2, (2, 4, 4))
    with torch.no_grad():
        native.relative_position_bias_table.copy_(reference.features[0][0].attn.relative_position_bias_table)
    assert bias.window_size == (2, 6, 6)
    assert torch.equal(bias.relative_position_bias_table, native.resize((2, 6, 6)).relative_position_bias_table)
    assert model(torch.randn(1, 3, 4, 32, 32)).shape == (1, 3)


def test_tokens_and_rel_bias_are_refused(reference):
    for pe in ("learned", "sincos+rope_axial", "peg"):
        with pytest.raises(ValueError, match="tokens encodings"):
            vpe.apply(copy.deepcopy(reference), pe)
    with pytest.raises(ValueError, match="rel_bias is a global"):
        vpe.apply(copy.deepcopy(reference), "rel_bias")


def test_encodings_of_lists_one_per_block(reference):
    model = _patched(reference, "rope_axial+swin_bias")
    found = vpe.encodings_of(model)
    assert found["tokens"] == [] and len(found["bias"]) == 4 and len(found["rotary"]) == 4
    assert all(isinstance(b, SwinBias) and b.window_size == (2, 4, 4) for b in found["bias"])
    assert all(r.ndim == 3 for r in found["rotary"])


def test_torchvision_state_dict_loads_strict(reference):
    model = vpe.apply(SwinTransformer3d(**CFG), "swin_bias").eval()
    model.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(1, 3, 4, 32, 32)
    assert _max_diff(model, reference, x) < 1e-5
    renamed = {k.replace("attn.relative_position_bias_table", "attn.bias.relative_position_bias_table")
               for k in reference.state_dict() if not k.endswith("relative_position_index")}
    assert set(model.state_dict()) == renamed
    model.load_state_dict(model.state_dict(), strict=True)  # its own state dict too


def test_no_weight_decay_is_the_encodings(reference):
    model = _patched(reference, "rope_mixed+cpb")
    names = model.no_weight_decay()
    params = dict(model.named_parameters())
    assert names and names <= params.keys()
    assert all(".attn.rotary." in n or ".attn.bias." in n for n in names)
    assert {n for n in params if ".attn.rotary." in n or ".attn.bias." in n} == names
    assert _patched(reference, "none").no_weight_decay() == set()


def test_bad_inputs(reference):
    model = _patched(reference)
    with pytest.raises(ValueError, match=r"takes a \(B, C, T, H, W\) batch tensor"):
        model(torch.randn(3, 4, 32, 32))
    with pytest.raises(ValueError, match="in_chans=3 but the input has 1 channels"):
        model(torch.randn(1, 1, 4, 32, 32))
    with pytest.raises(ValueError, match="floating-point"):
        model(torch.zeros(1, 3, 4, 32, 32, dtype=torch.uint8))


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed"])
def test_rope_on_a_shrunk_window_keeps_integer_positions(monkeypatch, reference, pe):
    """A clip axis shorter than the window: the window shrinks to the axis, and RoPE's position interpolation is
    taken against the effective window, so positions stay the configured window's integer patch positions (the
    closed form: the same frequencies with no scaling), not stretched by window / axis."""
    import visionpe.backbones.video_swin as video_swin
    model = vpe.apply(copy.deepcopy(reference), pe).eval()
    rotary = vpe.encodings_of(model)["rotary"][-1]  # the last block's (stage 2)
    assert rotary.scaling == "pi" and rotary.ref_shape == (2, 4, 4)
    seen, attend = [], video_swin.attend

    def spy(q, k, v, grid, rotary=None, *args, **kwargs):
        seen.append((grid, rotary))
        return attend(q, k, v, grid, rotary, *args, **kwargs)
    monkeypatch.setattr(video_swin, "attend", spy)
    with torch.no_grad():
        model(torch.randn(1, 3, 4, 16, 16))  # stage 2 has tokens (2, 2, 2): the window (2, 4, 4) shrinks to (2, 2, 2)
    grid, used = seen[-1]
    assert grid.shape == (2, 2, 2) and seen[0][0].shape == (2, 4, 4)
    integer = used.with_scaling("none").rotations(grid)
    torch.testing.assert_close(used.rotations(grid), integer)
    stretched = used.with_scaling("pi", ref_shape=(2, 4, 4)).rotations(grid)  # the configured window as reference
    assert not torch.allclose(stretched, integer, atol=1e-3)
    assert used.freqs is rotary.freqs and rotary.ref_shape == (2, 4, 4)  # shared, not copied; the module unchanged


def test_clips_take_their_own_time_step_in_every_window(monkeypatch, reference):
    """time_spacing through torchvision's stages to every window attention: each window of a clip gets the clip's
    step (windows ordered sample by sample), a batch of per-clip steps gives each clip its logits alone, a step of 1
    on the configured window is the index-time model, and the steps are read (the logits move)."""
    from visionpe.backbones import video_swin
    seen = []
    monkeypatch.setattr(video_swin, "attend", lambda q, k, v, grid, *a, **kw: seen.append(grid) or attend(
        q, k, v, grid, *a, **kw))
    x = torch.randn(3, 3, 8, 32, 32)  # tokens (4, 8, 8): 2 x 2 x 2 windows of (2, 4, 4) per clip at stage 1
    steps = torch.tensor([2.0, 1.0, 0.5])
    for pe in ("rope_axial", "cpb", "alibi", "rope_mixed+alibi"):
        model = _patched(reference, pe)
        seen.clear()
        with torch.no_grad():
            batch = model(x, time_spacing=steps)
            alone = torch.cat([model(x[i:i + 1], time_spacing=float(s)) for i, s in enumerate(steps)])
            torch.testing.assert_close(batch, alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model(x, time_spacing=1.0), model(x), rtol=1e-5, atol=1e-5)
            moved = (batch - model(x)).abs().amax(dim=-1)  # (clips,): the step-1 clip is the index-time model
            assert moved[1] < 1e-7 and (moved[[0, 2]] > 1e-6).all(), moved  # rounding: ~1e-8
        first = seen[0]  # stage 1, first block: 8 windows of each clip
        assert [g.spacing[0] for g in first.grids] == [2.0] * 8 + [1.0] * 8 + [0.5] * 8
        assert {g.shape for g in first.grids} == {(2, 4, 4)}


@pytest.mark.parametrize("clip", [(4, 32, 32), (2, 32, 32)], ids=["configured-window", "shrunk-window-slice"])
def test_a_window_table_refuses_a_time_step(reference, clip):
    model = _patched(reference, "swin_bias")
    with pytest.raises(ValueError, match="SwinBias indexes a table by integer positions"):
        model(torch.randn(1, 3, *clip), time_spacing=2.0)
