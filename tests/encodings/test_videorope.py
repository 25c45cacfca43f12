"""VideoRoPE against the official convention, and Qwen2.5-VL's absolute time through the grid's spacing.

The official code (Wiselnn570/VideoRoPE, videorope-transformer/modeling_videorope.py, read, not copied), with no text
before the clip (its text offset adds the same constant to t, h and w, which cancels in every score):

    positions (get_t_scale_rope_index, scale_factor d = 2.0 in its runs):
        t' = d t,   h' = h - (H - 1) // 2 + d t,   w' = w - (W - 1) // 2 + d t
    frequencies (apply_m_modify_multimodal_rotary_pos_emb, mrope_section (16, 24, 24), head_dim 128, rotate_half):
        inv_freq[j] = 10000^(-2 j / 128), j < 64, on both halves of the head;
        channel j < 48: h if j is even, w if odd; channel j >= 48 (the 16 lowest frequencies): t.
"""
import math

import pytest
import torch

import visionpe as vpe
from visionpe import Grid


def official_positions(shape, d: float) -> torch.Tensor:
    """``(N, 3)`` float64 (t', h', w') of every patch, row-major, as the official index function."""
    t_len, h_len, w_len = shape
    t, h, w = (c.reshape(-1).double() for c in torch.meshgrid(*(torch.arange(s) for s in shape), indexing="ij"))
    t_scaled = t * d
    return torch.stack([t_scaled, h - (h_len - 1) // 2 + t_scaled, w - (w_len - 1) // 2 + t_scaled], dim=-1)


def official_axis_of_channel(num_pairs: int, time_pairs: int) -> torch.Tensor:
    j = torch.arange(num_pairs)
    return torch.where(j >= num_pairs - time_pairs, 0, torch.where(j % 2 == 0, 1, 2))


def rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 3)])
def test_videorope_matches_the_official_convention(shape):
    head_dim, theta, d = 128, 10000.0, 2.0
    pe = vpe.build("videorope", head_dim=head_dim, theta=theta, pairs="half", sections=(16, 24, 24),
                   temporal_spacing=d)
    positions = official_positions(shape, d)
    axis = official_axis_of_channel(64, 16)
    inv_freq = theta ** (-2 * torch.arange(64, dtype=torch.float64) / head_dim)
    angles = positions[:, axis] * inv_freq  # (N, 64)
    grid = Grid(shape)
    cis = pe.cis(grid)[0].to(torch.complex128)
    assert float((cis - torch.polar(torch.ones_like(angles), angles)).abs().max()) < 1e-6
    q = torch.randn(2, 1, grid.num_tokens, head_dim, dtype=torch.float64)
    emb = torch.cat([angles, angles], dim=-1)
    expected = q * emb.cos() + rotate_half(q) * emb.sin()  # the official application (Qwen2-VL's rotate_half)
    torch.testing.assert_close(pe.rotate(q.float(), grid).double(), expected, atol=2e-5, rtol=1e-5)


def test_time_takes_the_lowest_frequencies():
    pe = vpe.build("videorope", head_dim=24, sections=(4, 4, 4))
    components = pe.freqs[:, 0]  # (x, y, t components, pairs)
    time = components[2].abs()
    spatial = components[:2].abs().sum(0)
    assert float(spatial[time == 0].min()) > float(time[time > 0].max())
    assert (time > 0).sum() == 4 and torch.equal((components[:2] != 0).sum(1), torch.tensor([4, 4]))


def test_temporal_spacing_and_diagonal_options():
    grid = Grid((3, 2, 3))
    base = vpe.build("videorope", head_dim=12, temporal_spacing=1.0)
    spaced = vpe.build("videorope", head_dim=12, temporal_spacing=3.0)
    plain = vpe.build("videorope", head_dim=12, temporal_spacing=1.0, diagonal=False)
    angles = base.cis(grid).angle()
    # the diagonal layout: moving one frame moves every component by d (mod 2 pi); centring shifts h and w
    freqs = base.freqs[:, 0].double()  # (x, y, t components, pairs)
    positions = official_positions(grid.shape, 1.0)[:, [2, 1, 0]]  # x (w), y (h), t
    expected = positions @ freqs
    torch.testing.assert_close(base.cis(grid)[0].to(torch.complex128), torch.polar(torch.ones_like(expected), expected),
                               atol=1e-6, rtol=0)
    raw = grid.coords(dtype=torch.float64)[:, [2, 1, 0]] @ freqs  # no centring, no time offset
    torch.testing.assert_close(plain.cis(grid)[0].to(torch.complex128), torch.polar(torch.ones_like(raw), raw),
                               atol=1e-6, rtol=0)
    expected3 = official_positions(grid.shape, 3.0)[:, [2, 1, 0]] @ freqs
    torch.testing.assert_close(spaced.cis(grid)[0].to(torch.complex128),
                               torch.polar(torch.ones_like(expected3), expected3), atol=1e-6, rtol=0)
    assert not torch.allclose(angles, spaced.cis(grid).angle())


def test_videorope_kernel_is_relative():
    """Its positions are an affine map of the patch indices, so the kernel depends on index offsets only."""
    pe = vpe.build("videorope", head_dim=12, num_heads=1)
    shape = (3, 3, 3)
    big = pe.pair_map(Grid((4, 4, 4)))
    coords = Grid((4, 4, 4)).coords()
    lo, hi = (coords < 3).all(1), (coords >= 1).all(1)
    torch.testing.assert_close(big[:, lo][:, :, lo], big[:, hi][:, :, hi], atol=1e-5, rtol=0)
    torch.testing.assert_close(pe.pair_map(Grid(shape, offset=(2, 1, 1))), pe.pair_map(Grid(shape)), atol=1e-5, rtol=0)


def test_videorope_in_a_model_interpolates_only_away_from_the_training_grid():
    context = vpe.ModelContext((2, 3, 3), dim=24, num_heads=2, head_dim=12)
    pe = vpe.registry.ENCODINGS["videorope"].for_model(context)
    assert pe.scaling == "pi" and pe.ref_shape == (2, 3, 3)
    plain = vpe.build("videorope", head_dim=12, num_heads=2)
    torch.testing.assert_close(pe.cis(Grid((2, 3, 3))), plain.cis(Grid((2, 3, 3))))
    assert not torch.allclose(pe.cis(Grid((4, 3, 3))), plain.cis(Grid((4, 3, 3))))


@pytest.mark.parametrize("kwargs,message", [
    (dict(ndim=2), "ndim must be 3"), (dict(temporal_spacing=0), "temporal_spacing"),
    (dict(temporal_spacing=-1.0), "temporal_spacing"), (dict(diagonal="yes"), "diagonal"),
])
def test_videorope_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vpe.build("videorope", head_dim=12, **kwargs)
    with pytest.raises(ValueError, match="spectrum='videorope'.*ndim=3"):
        vpe.build("rope_axial", head_dim=12, spectrum="videorope")


# -- Qwen2.5-VL's absolute time ------------------------------------------------------------------------------------
def qwen25_time_index(num_temporal_patches: int, fps: float, temporal_patch_size: int = 2,
                      tokens_per_second: float = 2.0) -> torch.Tensor:
    """Qwen2.5-VL's get_rope_index: second_per_grid_t = temporal_patch_size / fps,
    t_index = (t * second_per_grid_t * tokens_per_second).long()."""
    return (torch.arange(num_temporal_patches, dtype=torch.float64) * (temporal_patch_size / fps)
            * tokens_per_second).long()


def test_absolute_time_matches_qwen25_vl():
    """Qwen2.5-VL: M-RoPE (one spectrum, chunks (t, h, w)) on positions (t_index, h, w). The grid's spacing carries
    the frame rate: spacing_t = seconds per temporal patch * tokens per second. Qwen truncates each time position to
    an integer (.long()); the unrounded positions here equal it whenever that step is an integer (fps 1, 2, 4 with
    its temporal patch of 2 frames and 2 tokens per second); at other rates they keep the times evenly spaced."""
    head_dim, theta, sections = 32, 1e6, (4, 6, 6)
    pe = vpe.build("rope_axial", head_dim=head_dim, ndim=3, theta=theta, pairs="half", spectrum="mrope",
                   sections=sections)
    inv_freq = theta ** (-2 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    axis = torch.tensor([0] * 4 + [1] * 6 + [2] * 6)
    for fps in (1.0, 2.0, 4.0):
        shape = (4, 2, 3)
        grid = Grid(shape, spacing=(2 / fps * 2.0, 1, 1))
        t = qwen25_time_index(4, fps).double()
        h, w = (c.reshape(-1).double() for c in torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij"))
        positions = torch.stack([t.repeat_interleave(6), h.repeat(4), w.repeat(4)], dim=-1)
        angles = positions[:, axis] * inv_freq
        error = pe.cis(grid)[0].to(torch.complex128) - torch.polar(torch.ones_like(angles), angles)
        assert float(error.abs().max()) < 1e-6


def test_clips_at_different_frame_rates_share_one_time_axis():
    """The temporal patch at 2 s gets the same rotation in a 2 fps clip (patch 2, 1 s each) and a 1 fps clip (patch 1,
    2 s each), for rope_axial and videorope alike; with integer steps the two differ."""
    for pe in (vpe.build("rope_axial", head_dim=12, ndim=3), vpe.build("videorope", head_dim=12)):
        fast, slow = Grid((4, 2, 2), spacing=(2.0, 1, 1)), Grid((2, 2, 2), spacing=(4.0, 1, 1))
        torch.testing.assert_close(pe.cis(fast)[:, 2 * 4:3 * 4], pe.cis(slow)[:, 1 * 4:2 * 4])
        assert not torch.allclose(pe.cis(Grid((4, 2, 2)))[:, 8:12], pe.cis(Grid((2, 2, 2)))[:, 4:8])


def test_an_axis_with_a_spacing_is_absolute_under_resolution_scaling():
    """PI against ref_shape (2, 2, 2) on a (4, 4, 2) grid with a time step 3: time keeps its steps (0, 3, 6, 9), height
    is interpolated (a step of 2/4), width is at its reference; i.e. the unscaled RoPE on spacing (3, 0.5, 1). With
    integer time (no spacing) time is interpolated too, so the two differ."""
    pe = vpe.build("rope_axial", head_dim=12, ndim=3, scaling="pi", ref_shape=(2, 2, 2))
    plain = vpe.build("rope_axial", head_dim=12, ndim=3)
    timed = pe.cis(Grid((4, 4, 2), spacing=(3.0, None, None)))
    torch.testing.assert_close(timed, plain.cis(Grid((4, 4, 2), spacing=(3.0, 0.5, 1.0))))
    torch.testing.assert_close(pe.cis(Grid((4, 4, 2))), plain.cis(Grid((4, 4, 2), spacing=(0.5, 0.5, 1.0))))
    assert not torch.allclose(timed, pe.cis(Grid((4, 4, 2))))
    string = vpe.build("string", head_dim=12, ndim=3, scaling="pi", ref_shape=(2, 2, 2))  # the learned rotations
    torch.testing.assert_close(string.rotations(Grid((4, 4, 2), spacing=(3.0, None, None))),
                               string.with_scaling("none").rotations(Grid((4, 4, 2), spacing=(3.0, 0.5, 1.0))))
    normalized = vpe.build("rope_axial", head_dim=12, ndim=3, coords="normalized")
    with pytest.raises(ValueError, match="spacing.*coords='index'"):
        normalized.cis(Grid((2, 2, 2), spacing=(3.0, 1, 1)))


@pytest.mark.parametrize("spacing,message", [
    ((1.0,), "one positive number"), ((0.0, 1.0), "spacing must be > 0"), ((-1.0, 1.0), "spacing"),
    ("ab", "one positive number"), ((math.inf, 1.0), "finite"), (("1", None), "finite number"),
])
def test_grid_spacing_checks(spacing, message):
    with pytest.raises(ValueError, match=message):
        Grid((2, 3), spacing=spacing)


def test_grid_spacing_is_part_of_the_grid():
    grid = Grid((2, 3), prefix=1, spacing=(2.5, 1))
    assert grid == Grid((2, 3), prefix=1, spacing=(2.5, 1.0)) and Grid((2, 3), spacing=(None, None)).spacing is None
    unit = Grid((2, 3), spacing=(1, None))  # an absolute axis of step 1: the index coordinates, never rescaled
    assert unit != Grid((2, 3)) and unit.absolute_axes == (True, False) and unit.steps == (1.0, 1.0)
    torch.testing.assert_close(unit.coords(), Grid((2, 3)).coords())
    assert grid.without_prefix().spacing == (2.5, 1.0) and grid.with_shape((4, 4)).spacing == (2.5, 1.0)
    torch.testing.assert_close(grid.coords()[:, 0], torch.tensor([0.0, 0, 0, 2.5, 2.5, 2.5]))
    alibi = vpe.build("alibi", num_heads=1)  # distances read the spaced coordinates too
    assert float(alibi(Grid((2, 1), spacing=(2.5, 1)))[0, 0, 1]) == pytest.approx(-2.5 * 2 ** -8)


@pytest.mark.parametrize("frames", [4, 16], ids=["half-frame-rate", "double-frame-rate"])
def test_interpolation_puts_every_frame_on_the_training_time_grid(frames):
    """With ``scaling="pi"`` a clip of the same duration at another frame rate is scored as the training clip: 4
    frames score as training frames 0, 2, 4, 6 (16 frames: their even frames as all 8), spatial diagonal shift
    included (the video benchmark's reading rests on it)."""
    torch.manual_seed(0)
    pe = vpe.build("videorope", head_dim=24, ndim=3, scaling="pi", ref_shape=(8, 4, 4))
    train = vpe.build("videorope", head_dim=24, ndim=3)
    tokens = lambda t: torch.randn(1, 1, t * 16, 24)
    if frames < 8:
        q, k = tokens(8), tokens(8)
        picked = lambda x: x.view(1, 1, 8, 16, 24)[:, :, ::2].reshape(1, 1, frames * 16, 24)
        small = pe(picked(q), picked(k), Grid((frames, 4, 4)))
        full = train(q, k, Grid((8, 4, 4)))
        expected = (full[0] @ full[1].transpose(-1, -2)).view(8, 16, 8, 16)[::2, :, ::2].reshape(64, 64)
        got = (small[0] @ small[1].transpose(-1, -2))[0, 0]
    else:
        q, k = tokens(frames), tokens(frames)
        picked = lambda x: x.view(1, 1, frames, 16, 24)[:, :, ::2].reshape(1, 1, 128, 24)
        long = pe(q, k, Grid((frames, 4, 4)))
        short = train(picked(q), picked(k), Grid((8, 4, 4)))
        got = (long[0] @ long[1].transpose(-1, -2)).view(frames, 16, frames, 16)[::2, :, ::2].reshape(128, 128)
        expected = (short[0] @ short[1].transpose(-1, -2))[0, 0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
