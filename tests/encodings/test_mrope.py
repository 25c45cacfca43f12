"""M-RoPE as Qwen2-VL (chunked) and Qwen3-VL / timm (interleaved) define it, and EVA's ``ij`` axis order."""
import pytest
import timm
import torch
from timm.layers import RotaryEmbeddingCat, RotaryEmbeddingMixed, apply_rot_embed_cat
try:  # the oracle: timm's M-RoPE (a recent timm)
    from timm.layers.pos_embed_sincos import RotaryEmbeddingMRope
except ImportError as err:
    pytest.skip(f"needs timm's RotaryEmbeddingMRope: {err}", allow_module_level=True)

import visionpe as vpe
from visionpe import Grid


@pytest.mark.parametrize("head_dim,sections", [(72, (12, 12, 12)), (72, (8, 12, 12)), (64, (8, 12, 12))])
@pytest.mark.parametrize("shape", [(3, 5), (4, 4)])
def test_interleaved_mrope_matches_timm(head_dim, sections, shape):
    """timm's RotaryEmbeddingMRope on an image is a 3D rope with time at 0: our 3D grid (1, H, W)."""
    timm_rope = RotaryEmbeddingMRope(head_dim, mrope_section=sections, temperature=10000.0)
    pe = vpe.build("rope_axial", head_dim=head_dim, ndim=3, theta=10000, pairs="half", spectrum="mrope_interleaved",
                   sections=sections)
    q = torch.randn(2, 3, shape[0] * shape[1], head_dim)
    expected = apply_rot_embed_cat(q, timm_rope.get_embed(list(shape)), half=True)
    torch.testing.assert_close(pe.rotate(q, Grid((1, *shape))), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim,sections", [(72, (12, 12, 12)), (64, (10, 11, 11)), (32, (10, 3, 3))])
@pytest.mark.parametrize("shape", [(3, 5), (4, 4)])
def test_interleaved_mrope_on_a_2d_grid_with_time_inert_matches_timm(head_dim, sections, shape):
    """The same on the image's own 2D grid: ``inert_axes=1`` keeps time (axis 0 of the (t, h, w) layout) at 0, so its
    pairs stay unrotated; equal to the 3D form on (1, H, W). (64, (10, 11, 11)) are the pair counts of timm's
    default (8, 12, 12) on a 64-wide head, (32, (10, 3, 3)) those of (2, 3, 3) on a 32-wide one."""
    timm_sections = {(64, (10, 11, 11)): (8, 12, 12), (32, (10, 3, 3)): (2, 3, 3)}.get((head_dim, sections), sections)
    timm_rope = RotaryEmbeddingMRope(head_dim, mrope_section=timm_sections, temperature=10000.0)
    pe = vpe.build("rope_axial", head_dim=head_dim, ndim=2, theta=10000, pairs="half", spectrum="mrope_interleaved",
                   sections=sections, inert_axes=1, axis_order="ij")
    q = torch.randn(2, 3, shape[0] * shape[1], head_dim)
    expected = apply_rot_embed_cat(q, timm_rope.get_embed(list(shape)), half=True)
    torch.testing.assert_close(pe.rotate(q, Grid(shape)), expected, atol=2e-5, rtol=1e-5)
    video = vpe.build("rope_axial", head_dim=head_dim, ndim=3, theta=10000, pairs="half", spectrum="mrope_interleaved",
                      sections=sections, axis_order="ij")
    torch.testing.assert_close(pe.rotate(q, Grid(shape)), video.rotate(q, Grid((1, *shape))), atol=1e-6, rtol=0)
    assert "inert_axes=1" in repr(pe)


def test_inert_axes_need_an_mrope_spectrum_in_its_own_order():
    with pytest.raises(ValueError, match="inert_axes=1 .*spectrum='mrope'"):
        vpe.build("rope_axial", head_dim=32, ndim=2, inert_axes=1)
    with pytest.raises(ValueError, match="inert_axes=1 .*pair_order='by_axis'"):
        vpe.build("rope_axial", head_dim=32, ndim=2, spectrum="mrope_interleaved", inert_axes=1, pair_order="by_axis")
    with pytest.raises(ValueError, match="inert_axes=-1 must be an integer >= 0"):
        vpe.build("rope_axial", head_dim=32, ndim=2, spectrum="mrope", inert_axes=-1)
    with pytest.raises(ValueError, match="sections"):  # one entry per axis of the layout: ndim + inert_axes
        vpe.build("rope_axial", head_dim=32, ndim=2, spectrum="mrope_interleaved", sections=(4, 4), inert_axes=1)
    chunked = vpe.build("rope_axial", head_dim=32, ndim=2, spectrum="mrope", sections=(4, 6, 6), inert_axes=1)
    assert (chunked.frequency_vectors()[..., :4] == 0).all()  # the time chunk never turns


def test_chunked_mrope_is_one_spectrum_cut_in_chunks():
    """Qwen2-VL: inv_freq = theta^(-2p/d) over all d/2 pairs; pairs [0, s_t) read t, [s_t, s_t + s_h) h, rest w."""
    head_dim, sections, theta = 32, (4, 6, 6), 10000.0
    pe = vpe.build("rope_axial", head_dim=head_dim, ndim=3, theta=theta, pairs="half", spectrum="mrope",
                   sections=sections)
    grid = Grid((2, 3, 4))
    pos = grid.coords(dtype=torch.float64)  # (N, 3): t, h, w
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    axis = torch.tensor([0] * 4 + [1] * 6 + [2] * 6)
    angles = pos[:, axis] * inv_freq
    expected = torch.polar(torch.ones_like(angles), angles)
    assert (pe.cis(grid)[0].to(torch.complex128) - expected).abs().max() < 1e-6
    # the per-axis form restarts the spectrum on every axis: a different rotation
    per_axis = vpe.build("rope_axial", head_dim=head_dim, ndim=3, theta=theta, pairs="half", sections=sections)
    assert not torch.allclose(per_axis.cis(grid), pe.cis(grid))


def test_mrope_sections_must_cover_the_pairs():
    with pytest.raises(ValueError, match="sections"):
        vpe.build("rope_axial", head_dim=32, ndim=3, spectrum="mrope", sections=(4, 4, 4))
    with pytest.raises(ValueError, match="spectrum"):
        vpe.build("rope_axial", head_dim=32, ndim=3, spectrum="qwen")
    with pytest.raises(ValueError, match="axis_order"):
        vpe.build("rope_axial", head_dim=32, axis_order="yx")


@pytest.mark.parametrize("shape", [(3, 5), (5, 2)])
def test_ij_axis_order_matches_timm_eva_default(shape):
    """timm's default grid_indexing='ij' (EVA): the first block of pairs turns with the row (y)."""
    timm_rope = RotaryEmbeddingCat(dim=16, temperature=100, in_pixels=False, feat_shape=None, grid_indexing="ij")
    pe = vpe.build("rope_axial", head_dim=16, axis_order="ij")
    q = torch.randn(1, 2, shape[0] * shape[1], 16)
    torch.testing.assert_close(pe.rotate(q, Grid(shape)), apply_rot_embed_cat(q, timm_rope.get_embed(list(shape))),
                               atol=1e-5, rtol=1e-5)
    xy = vpe.build("rope_axial", head_dim=16)
    assert not torch.allclose(xy.rotate(q, Grid(shape)), pe.rotate(q, Grid(shape)))


def test_ij_mixed_matches_timm_given_same_freqs():
    heads, head_dim, shape = 2, 16, (3, 4)
    timm_rope = RotaryEmbeddingMixed(head_dim * heads, depth=1, num_heads=heads, temperature=10, grid_indexing="ij")
    pe = vpe.build("rope_mixed", head_dim=head_dim, num_heads=heads, axis_order="ij")
    with torch.no_grad():
        pe.freqs.copy_(timm_rope.freqs[:, 0])
        q = torch.randn(1, heads, 12, head_dim)
        expected = apply_rot_embed_cat(q, timm_rope.get_embed(list(shape))[0])
        torch.testing.assert_close(pe.rotate(q, Grid(shape)), expected, atol=1e-5, rtol=1e-5)


def test_ij_scaling_reads_the_right_axis():
    """PI with ij order: each axis is scaled by its own ratio (a 6x10 grid against 3x4)."""
    timm_rope = RotaryEmbeddingCat(dim=16, temperature=100, in_pixels=False, feat_shape=None, grid_indexing="ij",
                                   ref_feat_shape=[3, 4])
    pe = vpe.build("rope_axial", head_dim=16, axis_order="ij", scaling="pi", ref_shape=(3, 4))
    q = torch.randn(1, 1, 60, 16)
    torch.testing.assert_close(pe.rotate(q, Grid((6, 10))), apply_rot_embed_cat(q, timm_rope.get_embed([6, 10])),
                               atol=1e-5, rtol=1e-5)


def test_timm_sbb_eva_rope_model_loads_with_identical_logits():
    """timm's own RoPE ViTs (Eva, rope_type='cat', grid_indexing='ij', temperature 10000, ref_feat_shape 16x16, q/v
    biases, layer scale, a register token, average pooling) -> a visionpe ViT with axial RoPE in ij order."""
    torch.manual_seed(0)
    kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)
    eva = timm.create_model("vit_medium_patch16_rope_reg1_gap_256", dynamic_img_size=True, **kw).eval()
    with torch.no_grad():
        for name, p in eva.named_parameters():
            if name.endswith(("q_bias", "v_bias", "gamma_1", "gamma_2")):
                p.normal_()  # zero / tiny at init: make every converted weight matter
    ours = vpe.create_model("vit_base_patch16_224", pe="rope_axial", class_token=False, reg_tokens=1,
                            global_pool="avg", qkv_bias=True, init_values=1e-5,
                            pe_kwargs=dict(theta=10000, axis_order="ij", scaling="pi", ref_shape=(16, 16)),
                            **kw).eval()
    report = vpe.load_timm_checkpoint(ours, eva.state_dict(), strict=True)
    assert "blocks.0.attn.q_bias + blocks.0.attn.v_bias -> blocks.0.attn.qkv.bias" in report.converted
    for size in ((32, 32), (48, 32)):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            assert (ours(x) - eva(x)).abs().max() < 1e-5, size


def test_interleaved_mrope_sections_past_the_head_are_refused():
    """Sections may leave pairs to axis 0 (timm, GenLIP) but not ask for more than head_dim / 2 (they were dropped)."""
    vpe.build("rope_axial", head_dim=32, ndim=3, spectrum="mrope_interleaved", sections=(4, 4, 4))  # 12 of 16
    vpe.build("rope_axial", head_dim=32, ndim=3, spectrum="mrope_interleaved", sections=(4, 6, 6))  # all 16
    with pytest.raises(ValueError, match=r"sections=\(4, 8, 8\) ask for 20 rotation pairs but head_dim / 2 = 16"):
        vpe.build("rope_axial", head_dim=32, ndim=3, spectrum="mrope_interleaved", sections=(4, 8, 8))
