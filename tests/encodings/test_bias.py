"""Bias family: Swin/Video-Swin/BEiT relative tables, Swin-V2 CPB and ALiBi against timm and closed forms."""
import math

import numpy as np
import pytest
import timm
import torch
from timm.layers import RelPosMlp, gen_relative_log_coords, gen_relative_position_index, \
    resize_rel_pos_bias_table_simple

import visionpe as vpe
from visionpe import Grid
from visionpe.bias import RelativePositionBias, alibi_slopes
from visionpe.bias import grid_offset_index
from visionpe.bias.cpb import log_relative_coords


def timm_style_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Swin/BEiT: ``table[index.view(-1)].view(T, T, heads).permute(2, 0, 1)``."""
    t = index.shape[0]
    return table[index.reshape(-1)].reshape(t, t, -1).permute(2, 0, 1)


def shifted_pairs_equal(bias: torch.Tensor, shape) -> None:
    """``bias[h, i, j]`` is unchanged when both patches move by one step along every axis."""
    b = bias.reshape(bias.shape[0], *shape, *shape)
    nd = len(shape)
    head = (slice(None),)
    early = head + (slice(None, -1),) * 2 * nd
    late = head + (slice(1, None),) * 2 * nd
    torch.testing.assert_close(b[late], b[early], rtol=0, atol=1e-6)
    assert bias.std() > 1e-4  # not trivially constant


# -- swin_bias -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [(3, 5), (4, 4), (7, 7)])
def test_swin_index_matches_timm(window):
    ours = grid_offset_index(window, window)
    torch.testing.assert_close(ours, gen_relative_position_index(window), rtol=0, atol=0)


@pytest.mark.parametrize("window", [(3, 5), (4, 4)])
def test_swin_bias_equals_table_lookup(window):
    pe = vpe.build("swin_bias", num_heads=3, window_size=window)
    table = pe.relative_position_bias_table
    assert table.shape == ((2 * window[0] - 1) * (2 * window[1] - 1), 3)
    torch.testing.assert_close(pe(Grid(window)), timm_style_bias(table, gen_relative_position_index(window)))


def test_swin_bias_smaller_grid_uses_window_offsets():
    """A grid inside the window sees the bias of the window's top-left patches."""
    window, shape = (3, 5), (2, 3)
    pe = vpe.build("swin_bias", num_heads=2, window_size=window)
    full = pe(Grid(window)).reshape(2, *window, *window)
    ref = full[:, :2, :3, :2, :3].reshape(2, 6, 6)
    torch.testing.assert_close(pe(Grid(shape)), ref, rtol=0, atol=0)


def test_swin_3d_index_matches_video_swin():
    window = (2, 3, 4)
    wt, wh, ww = window
    c = np.stack(np.meshgrid(*[np.arange(w) for w in window], indexing="ij")).reshape(3, -1)
    dt, dh, dw = c[:, :, None] - c[:, None, :]
    ref = (dt + wt - 1) * (2 * wh - 1) * (2 * ww - 1) + (dh + wh - 1) * (2 * ww - 1) + (dw + ww - 1)
    assert torch.equal(grid_offset_index(window, window), torch.from_numpy(ref))
    pe = vpe.build("swin_bias", num_heads=2, window_size=window)
    assert pe.relative_position_bias_table.shape[0] == (2 * wt - 1) * (2 * wh - 1) * (2 * ww - 1)
    torch.testing.assert_close(pe(Grid(window)),
                               timm_style_bias(pe.relative_position_bias_table, torch.from_numpy(ref)))


@pytest.mark.parametrize("new", [(5, 5), (4, 6), (2, 2)])
def test_swin_resize_matches_timm(new):
    pe = vpe.build("swin_bias", num_heads=3, window_size=(3, 3))
    rows = (2 * new[0] - 1) * (2 * new[1] - 1)
    ref = resize_rel_pos_bias_table_simple(pe.relative_position_bias_table.detach(), new, (rows, 3))
    pe.resize(new)
    assert pe.window_size == new
    torch.testing.assert_close(pe.relative_position_bias_table, ref, atol=1e-5, rtol=1e-5)
    assert pe(Grid(new)).shape == (3, math.prod(new), math.prod(new))


@pytest.mark.parametrize("spatial", [(3, 3), (4, 5)])
def test_inflate_2d_to_3d_repeats_resized_table_over_time(spatial):
    src = vpe.build("swin_bias", num_heads=2, window_size=(3, 3))
    resized = vpe.build("swin_bias", num_heads=2, window_size=(3, 3))
    resized.load_state_dict(src.state_dict())
    resized.resize(spatial)
    out = RelativePositionBias.inflate(src, (2,) + spatial)
    per_time = out.relative_position_bias_table.reshape(3, -1, 2)  # 2 * Wt - 1 time offsets
    torch.testing.assert_close(per_time, resized.relative_position_bias_table[None].expand(3, -1, -1))
    # every frame pair sees the spatial bias of the 2D window
    bias = out(Grid((2,) + spatial)).reshape(2, 2, math.prod(spatial), 2, math.prod(spatial))
    torch.testing.assert_close(bias[:, 0, :, 1], resized(Grid(spatial)))


# -- rel_bias (BEiT) -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 3), (2, 4)])
def test_rel_bias_prefix_entries_match_timm_class_token(shape):
    pe = vpe.build("rel_bias", num_heads=3, grid_shape=shape)
    table = pe.relative_position_bias_table  # (offsets + 3, heads)
    index = gen_relative_position_index(shape, class_token=True)
    num_rel = table.shape[0] - 3
    # timm/BEiT: row 0 (class query) -> entry num_rel, column 0 (class key) -> num_rel + 1, corner -> num_rel + 2
    assert index[0, 1:].unique().tolist() == [num_rel] and index[1:, 0].unique().tolist() == [num_rel + 1]
    assert index[0, 0] == num_rel + 2
    bias = pe(Grid(shape, prefix=1))
    torch.testing.assert_close(bias, timm_style_bias(table, index))
    # so our last three rows are: prefix -> patch, patch -> prefix, prefix -> prefix
    n = math.prod(shape)
    torch.testing.assert_close(bias[:, 0, 1:], table[-3][:, None].expand(-1, n))
    torch.testing.assert_close(bias[:, 1:, 0], table[-2][:, None].expand(-1, n))
    torch.testing.assert_close(bias[:, 0, 0], table[-1])


def test_rel_bias_larger_grid_resamples_smaller_uses_offsets():
    pe = vpe.build("rel_bias", num_heads=2, grid_shape=(3, 3))
    small = pe(Grid((2, 2))).reshape(2, 2, 2, 2, 2)
    full = pe(Grid((3, 3))).reshape(2, 3, 3, 3, 3)
    torch.testing.assert_close(small, full[:, :2, :2, :2, :2])
    grown = pe(Grid((4, 5), prefix=1))
    resized = vpe.build("rel_bias", num_heads=2, grid_shape=(3, 3))
    resized.load_state_dict(pe.state_dict())
    resized.resize((4, 5))
    torch.testing.assert_close(grown, resized(Grid((4, 5), prefix=1)), atol=1e-6, rtol=1e-6)
    assert torch.equal(resized.relative_position_bias_table[-3:], pe.relative_position_bias_table[-3:])


def test_swin_bias_prefix_rows_are_zero():
    pe = vpe.build("swin_bias", num_heads=2, window_size=(2, 3))
    bias = pe(Grid((2, 3), prefix=2))
    assert bias.shape == (2, 8, 8) and bias[:, :2].abs().max() == 0 and bias[:, :, :2].abs().max() == 0
    torch.testing.assert_close(bias[:, 2:, 2:], pe(Grid((2, 3))))


@pytest.mark.parametrize("new", [(2, 3), (3, 3), (6, 5)])
def test_rel_bias_fit_resizes_the_table_to_every_grid_as_timms_beit(new):
    """``rel_bias(grow="fit", interpolation="geometric")``: the table resized to each grid's own offsets, smaller
    ones too, by timm's ``resize_rel_pos_bias_table`` (what timm's BEiT ``set_input_size`` calls); the default
    (``"resample"``) reads a smaller grid's offsets from the table as it is."""
    heads, train = 2, (4, 4)
    torch.manual_seed(0)
    table = torch.randn((2 * train[0] - 1) * (2 * train[1] - 1) + 3, heads)  # BEiT's: offsets, then 3 prefix rows
    fit = vpe.build("rel_bias", num_heads=heads, grid_shape=train, interpolation="geometric", grow="fit")
    kept = vpe.build("rel_bias", num_heads=heads, grid_shape=train, interpolation="geometric")
    with torch.no_grad():
        fit.relative_position_bias_table.copy_(table)
        kept.relative_position_bias_table.copy_(table)
        resized = timm.layers.resize_rel_pos_bias_table(  # a square source window (all the floor's timm reads)
            table, new_window_size=new, new_bias_shape=((2 * new[0] - 1) * (2 * new[1] - 1) + 3, heads))
        index = timm.models.beit.gen_relative_position_index(new)
        expected = resized[index.reshape(-1)].reshape(*index.shape, heads).permute(2, 0, 1)
        grid = Grid(new, prefix=1)
        torch.testing.assert_close(fit(grid), expected, atol=1e-5, rtol=1e-5)
        if new[0] <= train[0] and new[1] <= train[1]:
            assert (kept(grid) - expected).abs().max() > 1e-3
    with pytest.raises(ValueError, match="grow='error' is not supported; allowed values: 'resample', 'fit'"):
        vpe.build("rel_bias", num_heads=heads, grid_shape=train, grow="error")


# -- cpb -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pretrained", [None, (6, 5)])
@pytest.mark.parametrize("window", [(3, 4), (4, 4)])
def test_cpb_log_coords_match_timm(window, pretrained):
    ours = log_relative_coords(window, pretrained or window)
    ref = gen_relative_log_coords(window, pretrained or (0, 0), mode="swin")
    torch.testing.assert_close(ours, ref.reshape(-1, 2), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("pretrained", [None, (0, 0), (6, 5)])  # timm's (0, 0) means "no pretrained window"
@pytest.mark.parametrize("window", [(3, 4), (4, 4)])
def test_cpb_matches_timm_rel_pos_mlp(window, pretrained):
    heads = 3
    timm_cpb = RelPosMlp(window, num_heads=heads, hidden_dim=512, mode="swin",
                         pretrained_window_size=pretrained or (0, 0)).eval()
    pe = vpe.build("cpb", num_heads=heads, window_size=window, pretrained_window_size=pretrained).eval()
    pe.load_state_dict({"cpb_mlp.0.weight": timm_cpb.mlp.fc1.weight, "cpb_mlp.0.bias": timm_cpb.mlp.fc1.bias,
                        "cpb_mlp.2.weight": timm_cpb.mlp.fc2.weight})
    with torch.no_grad():
        torch.testing.assert_close(pe(Grid(window)), timm_cpb.get_bias()[0], atol=1e-5, rtol=1e-5)


def test_cpb_new_window_evaluates_mlp_on_new_offsets():
    pe = vpe.build("cpb", num_heads=2, window_size=(3, 3), hidden_dim=32)
    big = vpe.build("cpb", num_heads=2, window_size=(5, 5), pretrained_window_size=(3, 3), hidden_dim=32)
    big.load_state_dict(pe.state_dict())
    torch.testing.assert_close(pe(Grid((5, 5))), big(Grid((5, 5))))


def test_cpb_training_gradients_match_timm():
    window, heads, hidden = (4, 5), 3, 64
    timm_cpb = RelPosMlp(window, num_heads=heads, hidden_dim=hidden, mode="swin").eval()  # eval: no MLP dropout
    pe = vpe.build("cpb", num_heads=heads, window_size=window, hidden_dim=hidden).train()
    pe.load_state_dict({"cpb_mlp.0.weight": timm_cpb.mlp.fc1.weight, "cpb_mlp.0.bias": timm_cpb.mlp.fc1.bias,
                        "cpb_mlp.2.weight": timm_cpb.mlp.fc2.weight})
    weight = torch.randn(heads, 20, 20)
    (pe(Grid(window)) * weight).sum().backward()
    (timm_cpb.get_bias()[0] * weight).sum().backward()
    for ours, theirs in ((pe.cpb_mlp[0].weight, timm_cpb.mlp.fc1.weight), (pe.cpb_mlp[0].bias, timm_cpb.mlp.fc1.bias),
                         (pe.cpb_mlp[2].weight, timm_cpb.mlp.fc2.weight)):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5)


def _timm_weights(timm_mlp: RelPosMlp, with_fc2_bias: bool) -> dict:
    state = {"cpb_mlp.0.weight": timm_mlp.mlp.fc1.weight, "cpb_mlp.0.bias": timm_mlp.mlp.fc1.bias,
             "cpb_mlp.2.weight": timm_mlp.mlp.fc2.weight}
    return {**state, "cpb_mlp.2.bias": timm_mlp.mlp.fc2.bias} if with_fc2_bias else state


def _rw_log_coords(window) -> torch.Tensor:
    """timm 0.6's ``gen_relative_log_coords(mode="rw")`` (timm 1.0.31 asserts ``mode in ('swin', 'cr')``): integer
    offsets divided by ``window - 1``, times 8, ``sign(x) log2(1 + |x|) / log2(9)``."""
    axes = [torch.arange(-(w - 1), w, dtype=torch.float32) / (w - 1) * 8 for w in window]
    table = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)
    return torch.sign(table) * torch.log2(1.0 + table.abs()) / math.log2(9)


@pytest.mark.parametrize("window", [(3, 4), (4, 4), (2, 5)])
def test_cpb_cr_mode_matches_timm_rel_pos_mlp(window):
    """timm's ``RelPosMlp(mode="cr")`` (its default: ``sign(d) ln(1 + |d|)`` of the offsets themselves, an MLP with
    both biases, no squashing) at random weights."""
    heads = 3
    torch.manual_seed(0)
    timm_mlp = RelPosMlp(window, num_heads=heads, hidden_dim=64, mode="cr").eval()  # eval: no MLP dropout
    with torch.no_grad():
        for p in timm_mlp.parameters():
            p.normal_()
    pe = vpe.build("cpb", num_heads=heads, window_size=window, hidden_dim=64, mode="cr").eval()
    pe.load_state_dict(_timm_weights(timm_mlp, True))
    torch.testing.assert_close(log_relative_coords(window, window, mode="cr"),
                               gen_relative_log_coords(window, mode="cr").reshape(-1, 2), atol=1e-6, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(pe(Grid(window)), timm_mlp.get_bias()[0], atol=1e-5, rtol=1e-5)
        with_prefix = pe(Grid(window, prefix=1))
    timm_prefix = RelPosMlp(window, num_heads=heads, hidden_dim=64, mode="cr", prefix_tokens=1).eval()
    timm_prefix.load_state_dict(timm_mlp.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(with_prefix, timm_prefix.get_bias()[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [(3, 4), (4, 4), (2, 5)])
def test_cpb_rw_mode_matches_timm_rel_pos_mlp_with_rw_coords(window):
    """``mode="rw"``: timm 0.6's ``RelPosMlp(mode="rw")``, ``4 tanh(MLP(rw log coords))``. timm 1.0.31 no longer
    builds it (its log coordinates assert ``mode in ('swin', 'cr')``), so the oracle is its ``RelPosMlp`` (index
    gather, MLP with both biases) given 0.6's ``rw`` coordinates, activation and gain."""
    heads = 2
    torch.manual_seed(1)
    timm_mlp = RelPosMlp(window, num_heads=heads, hidden_dim=32, mode="cr").eval()
    with torch.no_grad():
        for p in timm_mlp.parameters():
            p.normal_()
        timm_mlp.rel_coords_log.copy_(_rw_log_coords(window))
    timm_mlp.bias_act, timm_mlp.bias_gain = torch.nn.Tanh(), 4
    pe = vpe.build("cpb", num_heads=heads, window_size=window, hidden_dim=32, mode="rw").eval()
    pe.load_state_dict(_timm_weights(timm_mlp, True))
    torch.testing.assert_close(log_relative_coords(window, window, mode="rw"), _rw_log_coords(window).reshape(-1, 2),
                               atol=1e-6, rtol=0)
    with torch.no_grad():
        bias = pe(Grid(window))
        torch.testing.assert_close(bias, timm_mlp.get_bias()[0], atol=1e-5, rtol=1e-5)
    assert bias.abs().max() <= 4


def test_cpb_modes_check_their_arguments_and_train():
    with pytest.raises(ValueError, match="mode='xy' is not supported; allowed values: 'swin', 'cr', 'rw'"):
        vpe.build("cpb", num_heads=2, window_size=(3, 3), mode="xy")
    with pytest.raises(ValueError, match="pretrained_window_size=.*mode='cr' reads the offsets themselves"):
        vpe.build("cpb", num_heads=2, window_size=(3, 3), pretrained_window_size=(4, 4), mode="cr")
    for mode in ("cr", "rw"):
        model = vpe.create_model("vit_tiny_patch16_224", pe="cpb", pe_kwargs={"mode": mode}, img_size=16, patch_size=4,
                                 embed_dim=24, depth=1, num_heads=2, num_classes=3, global_pool="avg")
        model(torch.randn(2, 3, 24, 20)).square().sum().backward()
        bias = vpe.encodings_of(model)["bias"][0]
        assert bias.mode == mode and "cpb_mlp.2.bias" in dict(bias.named_parameters())
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in bias.parameters())


# -- alibi ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", [1, 4, 6])
def test_alibi_slopes(heads):
    ref = torch.tensor([2.0 ** (-8 * h / heads) for h in range(1, heads + 1)])
    torch.testing.assert_close(alibi_slopes(heads), ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_alibi_closed_form_symmetric_zero_diagonal(shape):
    heads = 4
    grid = Grid(shape, prefix=1)
    bias = vpe.build("alibi", num_heads=heads, ndim=len(shape))(grid)
    c = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1).reshape(-1, len(shape))
    dist = np.sqrt(((c[:, None] - c[None]) ** 2).sum(-1))
    slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
    ref = torch.from_numpy(-slopes[:, None, None] * dist).float()
    torch.testing.assert_close(bias[:, 1:, 1:], ref, atol=1e-6, rtol=1e-6)
    assert bias[:, 0].abs().max() == 0 and bias[:, :, 0].abs().max() == 0
    assert torch.equal(bias, bias.transpose(1, 2))
    assert bias.diagonal(dim1=1, dim2=2).abs().max() == 0


# -- properties ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["swin_bias", "rel_bias", "cpb", "alibi"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4)])
def test_bias_translation_invariant(name, shape):
    kw = {"swin_bias": dict(window_size=shape), "rel_bias": dict(grid_shape=shape),
          "cpb": dict(window_size=shape, hidden_dim=32), "alibi": dict(ndim=len(shape))}[name]
    pe = vpe.build(name, num_heads=2, **kw)
    with torch.no_grad():
        shifted_pairs_equal(pe(Grid(shape)), shape)


@pytest.mark.parametrize("shape, window, prefix, entries", [((3, 4), (3, 4), 0, False), ((3, 4), (4, 5), 2, False),
                                                           ((2, 2, 3), (2, 3, 3), 1, True), ((5,), (6,), 3, True)])
def test_pair_bias_is_the_gathered_table_with_prefix_rows(shape, window, prefix, entries):
    """pair_bias (one gather through a cached pair index) equals the offset table gathered at grid_offset_index with
    prefix rows and columns zero or BEiT's three entries, values and gradients."""
    from visionpe.bias._base import pair_bias
    table = torch.randn(math.prod(2 * w - 1 for w in window), 2, requires_grad=True)
    extra = torch.randn(3, 2, requires_grad=True) if entries else None
    grid = Grid(shape, prefix=prefix)
    patches = table[grid_offset_index(shape, window)].permute(2, 0, 1)
    expected = torch.zeros(2, grid.num_tokens, grid.num_tokens)
    if entries:
        expected[:, :prefix, :] = extra[0][:, None, None]  # prefix -> patch
        expected[:, :, :prefix] = extra[1][:, None, None]  # patch -> prefix
        expected[:, :prefix, :prefix] = extra[2][:, None, None]  # prefix -> prefix
    expected[:, prefix:, prefix:] = patches
    result = pair_bias(table, grid, window, extra)
    assert result.is_contiguous()
    torch.testing.assert_close(result, expected, rtol=0, atol=0)
    leaves = [table] + ([extra] if entries else [])
    upstream = torch.randn_like(result)
    for grad, reference in zip(torch.autograd.grad(result, leaves, upstream),
                               torch.autograd.grad(expected, leaves, upstream)):
        torch.testing.assert_close(grad, reference)


def test_alibi_is_exact_at_any_offset_and_cached_per_spacing():
    """An offset cancels in distances: a crop at 3e7 (past float32's exact integers) or 1e300 gets the table of the
    origin, not one with neighbours at distance 0 or NaN; a table cached for one spacing is not served to another."""
    pe = vpe.build("alibi", num_heads=2)
    origin = pe(Grid((2, 3), prefix=1))
    for offset in [(3e7, 0.5), (1e300, -1e300)]:
        assert torch.equal(pe(Grid((2, 3), prefix=1, offset=offset)), origin), offset
    spaced = pe(Grid((2, 3), prefix=1, spacing=(2.0, 1.0)))
    assert spaced[0, 1, 4] == 2 * origin[0, 1, 4] != 0  # patches 0 and 3 are one row apart: distance 2, not 1
    torch.testing.assert_close(pe(Grid((2, 3), prefix=1, spacing=(2.0, 1.0), offset=(5e8, 0))), spaced)


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize("name, kwargs", [("swin_bias", dict(window_size=(3, 3))), ("rel_bias", dict(grid_shape=(3, 3)))])
def test_resize_keeps_a_frozen_table_frozen(name, kwargs, frozen):
    """timm's set_input_size resizes the tables of a frozen model (timm's own test: frozen stays frozen)."""
    pe = vpe.build(name, num_heads=2, **kwargs).requires_grad_(not frozen)
    pe.resize((4, 5))
    assert pe.relative_position_bias_table.requires_grad is not frozen
    assert pe.relative_position_bias_table.grad_fn is None
