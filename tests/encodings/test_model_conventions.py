"""The options foundation models' schemes needed (visionpe.presets composes them), each on its own encoding and
against an oracle: ``learned``'s ``align_corners``, ``fit="window"``, ``fit="tile"`` and ``rms_norm``;
``rope_axial``'s section rules, ``grid_offset``, ``ntk_factor``, ``pair_order`` and ``channel_frequencies="repeated"``."""
import inspect

import pytest
import torch
import torch.nn.functional as F
from timm.layers import RotaryEmbeddingCat, apply_rot_embed_cat

import visionpe as vpe
from visionpe import Grid
from visionpe.rotary.rope import repeated_channel_index, section_rule

from conftest import requires_that


# -- learned: align_corners ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,antialias", [("bilinear", False), ("bicubic", False), ("bilinear", True)])
@pytest.mark.parametrize("shape", [(5, 9), (12, 3), (6, 6)])
def test_align_corners_resize_is_f_interpolate(mode, antialias, shape):
    pe = vpe.build("learned", dim=4, grid_shape=(6, 6), interpolation=mode, antialias=antialias, align_corners=True)
    table = pe.table.detach().permute(2, 0, 1)[None]
    expected = F.interpolate(table, size=shape, mode=mode, align_corners=True, antialias=antialias)
    torch.testing.assert_close(pe.position_vectors(Grid(shape)), expected[0].permute(1, 2, 0).reshape(-1, 4),
                               atol=1e-6, rtol=1e-6)


def test_align_corners_keeps_the_end_rows_and_reads_augmented_positions_alike():
    pe = vpe.build("learned", dim=3, grid_shape=(4, 5), interpolation="bilinear", antialias=False,
                   align_corners=True, shift_coords=0.0)
    resized = pe.position_vectors(Grid((7, 9))).reshape(7, 9, 3)
    for corner in [(0, 0), (-1, -1), (0, -1), (-1, 0)]:
        torch.testing.assert_close(resized[corner], pe.table.detach()[corner])
    # training samples the table at the same source positions (a zero shift): the resized table again
    sampled = pe.train().patch_table(Grid((7, 9)), augment=True).detach().reshape(7, 9, 3)
    torch.testing.assert_close(sampled, resized, atol=1e-6, rtol=1e-6)
    assert "align_corners=True" in repr(pe)


# -- learned: fit="window" -----------------------------------------------------------------------------------------
def test_window_fit_cuts_the_table_and_never_resizes():
    pe = vpe.build("learned", dim=2, ndim=3, grid_shape=(6, 5, 4), factorized=True, fit="window")
    t, h, w = (table.detach() for table in pe.axis_tables)
    cut = pe.position_vectors(Grid((2, 3, 4))).reshape(2, 3, 4, 2)
    torch.testing.assert_close(cut, t[:2, None, None] + h[None, :3, None] + w[None, None, :4])
    later = pe.position_vectors(Grid((2, 3, 1), offset=(4, 1, 3))).reshape(2, 3, 1, 2)
    torch.testing.assert_close(later, t[4:6, None, None] + h[None, 1:4, None] + w[None, None, 3:4])
    with pytest.raises(ValueError, match=r"must lie inside the learned grid \(6, 5, 4\)"):
        pe.position_vectors(Grid((7, 1, 1)))
    with pytest.raises(ValueError, match="fit='window' reads the table at index positions"):
        vpe.build("learned", dim=2, fit="window", coords="normalized")
    with pytest.raises(ValueError, match="fit="):
        vpe.build("learned", dim=2, fit="crop")
    x = torch.zeros(1, 24, 2)
    pe(x, Grid((2, 3, 4))).sum().backward()  # gradients reach the rows the window read
    assert pe.axis_tables[0].grad[:2].abs().sum() > 0 and pe.axis_tables[0].grad[2:].abs().sum() == 0



# -- learned: fit="tile" -------------------------------------------------------------------------------------------
def test_tile_fit_repeats_the_table_and_never_resizes():
    """Every grid reads the table repeated along each axis (``Tensor.tile``, cut to the grid): SAM 3's tiling."""
    pe = vpe.build("learned", dim=3, grid_shape=(3, 4), fit="tile")
    table = pe.table.detach()
    for shape in [(3, 4), (2, 3), (7, 5), (3, 9)]:  # the table itself, a window of it, larger on one or both axes
        expected = table.tile(shape[0] // 3 + 1, shape[1] // 4 + 1, 1)[:shape[0], :shape[1]]
        torch.testing.assert_close(pe.position_vectors(Grid(shape)).reshape(*shape, 3), expected, rtol=0, atol=0)
    shifted = pe.position_vectors(Grid((2, 6), offset=(2, 3))).reshape(2, 6, 3)
    torch.testing.assert_close(shifted, table.tile(2, 3, 1)[2:4, 3:9], rtol=0, atol=0)
    factorized = vpe.build("learned", dim=2, ndim=3, grid_shape=(2, 3, 2), factorized=True, fit="tile")
    t, h, w = (a.detach() for a in factorized.axis_tables)
    expected = t[[0, 1, 0], None, None] + h[None, [0, 1, 2, 0], None] + w[None, None, [0, 1, 0]]
    torch.testing.assert_close(factorized.position_vectors(Grid((3, 4, 3))).reshape(3, 4, 3, 2), expected)
    assert pe.adaptation_label() == "table tiled" and "fit='tile'" in repr(pe)
    with pytest.raises(ValueError, match="fit='tile' reads the table at index positions"):
        vpe.build("learned", dim=2, fit="tile", coords="normalized")
    with pytest.raises(ValueError, match=r"offset=\(-1.0, 0.0\) must be non-negative integers"):
        pe.position_vectors(Grid((2, 2), offset=(-1, 0)))

# -- learned: rms_norm ---------------------------------------------------------------------------------------------
def test_rms_norm_divides_each_patch_by_its_rms():
    pe = vpe.build("learned", dim=8, grid_shape=(3, 4), num_prefix_tokens=1, rms_norm=True)
    raw = pe.table.detach().reshape(12, 8)
    expected = raw / (1e-6 + raw.pow(2).mean(-1, keepdim=True).sqrt())
    torch.testing.assert_close(pe.position_vectors(Grid((3, 4))), expected)
    x = torch.zeros(1, 13, 8)
    out = pe(x, Grid((3, 4), prefix=1))
    torch.testing.assert_close(out[0, 0], pe.prefix.detach()[0])  # prefix vectors are left as they are
    assert pe.to(torch.bfloat16).patch_table(Grid((5, 2))).dtype == torch.bfloat16


# -- rope_axial: section rules -------------------------------------------------------------------------------------
def test_section_rules():
    assert section_rule("rest_first", 128, 3) == ((22, 21, 21), 0)  # Wan's [64 - 2 (64 // 3), 64 // 3, 64 // 3]
    assert section_rule("rest_unrotated", 64, 3) == ((10, 10, 10), 2)  # V-JEPA 2: 2 * (64 // 6) channels per axis
    assert section_rule("rest_first", 10, 2) == ((3, 2), 0) and section_rule("rest_unrotated", 10, 2) == ((2, 2), 1)
    with pytest.raises(ValueError, match="head_dim=4 is too small"):
        section_rule("rest_first", 4, 3)
    with pytest.raises(ValueError, match="sections='thirds' is not supported"):
        vpe.build("rope_axial", head_dim=16, ndim=3, sections="thirds")
    with pytest.raises(ValueError, match="spectrum='mrope' has one spectrum"):
        vpe.build("rope_axial", head_dim=16, ndim=3, sections="rest_unrotated", spectrum="mrope")


def test_rest_unrotated_leaves_the_last_channels_alone():
    pe = vpe.build("rope_axial", head_dim=20, ndim=3, sections="rest_unrotated", theta=10.0)  # 3 x 3 pairs + 1
    assert pe.sections == (3, 3, 3) and pe.unrotated_pairs == 1
    q = torch.randn(2, 1, 24, 20)
    rotated = pe.rotate(q, Grid((2, 3, 4)))
    torch.testing.assert_close(rotated[..., 18:], q[..., 18:])
    # the rotated part is the 3D RoPE of the 9 pairs
    full = vpe.build("rope_axial", head_dim=18, ndim=3, theta=10.0)
    torch.testing.assert_close(rotated[..., :18], full.rotate(q[..., :18].contiguous(), Grid((2, 3, 4))))


# -- rope_axial: grid_offset ---------------------------------------------------------------------------------------
def test_grid_offset_is_a_constant_coordinate_shift():
    shifted = vpe.build("rope_axial", head_dim=16, grid_offset=1.0)
    plain = vpe.build("rope_axial", head_dim=16)
    torch.testing.assert_close(shifted.cis(Grid((3, 5), prefix=1)), plain.cis(Grid((3, 5), prefix=1, offset=(1, 1))))
    assert torch.equal(shifted.cis(Grid((3, 5), prefix=1))[:, 0], torch.ones(1, 8, dtype=torch.complex64))
    with pytest.raises(ValueError, match="grid_offset=1.0 shifts index coordinates"):
        vpe.build("rope_axial", head_dim=16, grid_offset=1.0, coords="normalized")


@requires_that("grid_offset" in inspect.signature(RotaryEmbeddingCat).parameters,
               "timm's RotaryEmbeddingCat(grid_offset=...) (a recent timm)")
@pytest.mark.parametrize("shape", [(24, 24), (16, 20)])
def test_grid_offset_before_interpolation_as_timm(shape):
    """timm adds grid_offset before scaling positions to ref_feat_shape (Perception Encoder's timm port)."""
    timm_rope = RotaryEmbeddingCat(dim=32, temperature=10000, in_pixels=False, feat_shape=None,
                                   ref_feat_shape=(24, 24), grid_offset=1.0, grid_indexing="xy")
    pe = vpe.build("rope_axial", head_dim=32, theta=10000.0, grid_offset=1.0, scaling="pi", ref_shape=(24, 24))
    q = torch.randn(1, 2, shape[0] * shape[1], 32)
    torch.testing.assert_close(pe.rotate(q, Grid(shape)), apply_rot_embed_cat(q, timm_rope.get_embed(list(shape))),
                               atol=1e-5, rtol=1e-5)


# -- rope_axial: ntk_factor ----------------------------------------------------------------------------------------
def test_fixed_ntk_factor_is_ntk_scaling_at_that_ratio():
    fixed = vpe.build("rope_axial", head_dim=24, ntk_factor=(2.0, 1.0))  # (y, x): y twice the reference
    derived = vpe.build("rope_axial", head_dim=24, scaling="ntk", ref_shape=(4, 6))
    torch.testing.assert_close(fixed.cis(Grid((8, 6))), derived.cis(Grid((8, 6))))
    # the same as raising theta on that axis: theta * s^(n / (n - 1)) with n = 6 bands
    raised = vpe.build("rope_axial", head_dim=12, ndim=1, theta=100.0 * 2.0 ** (6 / 5))
    torch.testing.assert_close(fixed.frequencies(torch.float64)[1, 0, 6:], raised.frequencies(torch.float64)[0, 0])
    with pytest.raises(ValueError, match="ntk_factor must be >= 1.0"):
        vpe.build("rope_axial", head_dim=24, ntk_factor=0.5)
    with pytest.raises(ValueError, match="one number >= 1 or one per grid axis"):
        vpe.build("rope_axial", head_dim=24, ntk_factor=(2.0, 1.0, 1.0))


# -- rope_axial: pair_order ----------------------------------------------------------------------------------------
def test_pair_orders_permute_the_pairs():
    axial = vpe.build("rope_axial", head_dim=16)  # x pairs 0..3, y pairs 4..7
    alternate = vpe.build("rope_axial", head_dim=16, pair_order="alternate")
    grid = Grid((3, 4))
    assert torch.equal(alternate.cis(grid), axial.cis(grid)[..., [0, 4, 1, 5, 2, 6, 3, 7]])
    strided = vpe.build("rope_axial", head_dim=16, spectrum="mrope_interleaved", axis_order="ij")
    by_axis = vpe.build("rope_axial", head_dim=16, spectrum="mrope_interleaved", axis_order="ij",
                        pair_order="by_axis")
    assert torch.equal(by_axis.cis(grid), strided.cis(grid)[..., [0, 2, 4, 6, 1, 3, 5, 7]])
    with pytest.raises(ValueError, match="need axis-aligned frequencies shared by the heads"):
        vpe.build("rope_axial", head_dim=16, num_heads=2, directions="golden", pair_order="alternate")


# -- rope_axial: channel_frequencies="repeated" -------------------------------------------------------------------
def test_repeated_channel_frequencies():
    """Each band's frequencies w_0 .. w_{n-1} laid out over its 2n channels as [w, w]: channel c reads w_{c mod n}."""
    assert repeated_channel_index([3], 4).tolist() == [[0, 1], [2, 0], [1, 2], [3, 3]]
    pe = vpe.build("rope_axial", head_dim=12, ndim=1, theta=10.0, channel_frequencies="repeated")
    grid = Grid((5,))
    w = 10.0 ** -(torch.arange(6, dtype=torch.float64) / 6)
    channel_freq = torch.cat([w, w])  # the .repeat(..., 2) layout
    angles = torch.arange(5, dtype=torch.float64)[:, None] * channel_freq  # (N, 12)
    q = torch.randn(1, 1, 5, 12, dtype=torch.float64)
    pairs = q.unflatten(-1, (-1, 2))
    partner = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
    expected = q * angles.cos() + partner * angles.sin()
    torch.testing.assert_close(pe.rotate(q.float(), grid).double(), expected, atol=1e-6, rtol=1e-6)
    blocks = pe.rotation_blocks(grid)
    assert blocks.shape == (1, 5, 6, 2, 2)
    with pytest.raises(ValueError, match="no single complex rotation"):
        pe.cis(grid)
    with pytest.raises(ValueError, match="no one frequency vector"):
        pe.frequency_vectors()
    with pytest.raises(ValueError, match="needs spectrum='axial', pairs='interleaved'"):
        vpe.build("rope_axial", head_dim=12, channel_frequencies="repeated", pairs="half")
    moved = pe.to(torch.float64)  # its buffers move with the module; none is saved
    assert moved.channel_index.dtype == torch.long and not moved.state_dict()


def test_repeated_channel_frequencies_in_a_model_trains():
    model = vpe.create_video_model("vit_tiny_patch16_224", pe="rope_axial", num_frames=4, img_size=16,
                                   tubelet_size=(2, 8, 8), embed_dim=32, num_heads=2, depth=1, num_classes=2,
                                   pe_kwargs=dict(sections="rest_unrotated", channel_frequencies="repeated"))
    out = model(torch.randn(2, 3, 4, 16, 24))
    out.sum().backward()
    assert torch.isfinite(out).all() and model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
