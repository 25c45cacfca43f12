"""RoPE frequency layouts on rope_axial / rope_mixed: golden-angle directions, p-RoPE (rotate_fraction) and per-head
axes (head_axes), each against angles written here in float64, plus the property that defines it."""
import math

import pytest
import torch

import visionpe as vpe
from visionpe import Grid

GOLDEN = math.pi * (3 - math.sqrt(5))  # the golden angle, ~137.5 degrees


def expected_cis(angles: torch.Tensor) -> torch.Tensor:
    return torch.polar(torch.ones_like(angles), angles)


def max_error(pe, grid, angles) -> float:
    """Largest |cis - exp(i angles)| over heads, tokens and pairs (``angles: (heads, N, pairs)`` float64)."""
    return float((pe.cis(grid).detach().to(torch.complex128) - expected_cis(angles)).abs().max())


def xy(grid: Grid) -> tuple[torch.Tensor, torch.Tensor]:
    coords = grid.coords(dtype=torch.float64)
    return coords[:, 1], coords[:, 0]  # x is the column (last axis), y the row


# -- golden-angle directions -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,theta", [("rope_axial", 100.0), ("rope_mixed", 10.0)])
def test_golden_directions_closed_form(name, theta):
    """Pair p of head h, band i = p mod n of the axial layout (n = head_dim / 4 bands per axis): magnitude
    theta^(-i/n); its rank by decreasing magnitude is 2 i + (p >= n) (x before y); direction angle (h P + rank) gamma
    from the x axis towards y."""
    head_dim, heads, grid = 16, 3, Grid((3, 4))
    pe = vpe.build(name, head_dim=head_dim, num_heads=heads, theta=theta, directions="golden")
    pairs, n = head_dim // 2, head_dim // 4
    p = torch.arange(pairs, dtype=torch.float64)
    band = p % n
    magnitude = theta ** (-band / n)
    rank = 2 * band + (p >= n)
    phi = (torch.arange(heads, dtype=torch.float64)[:, None] * pairs + rank) * GOLDEN  # (heads, pairs)
    x, y = xy(grid)
    angles = x[None, :, None] * (magnitude * phi.cos())[:, None] + y[None, :, None] * (magnitude * phi.sin())[:, None]
    assert max_error(pe, grid, angles) < 1e-6
    assert pe.freqs.requires_grad == (name == "rope_mixed")


def test_golden_directions_are_spread_uniformly():
    """The directions of all heads' pairs are k gamma, k = 0 .. H P - 1 (each once): by the three-gap theorem the
    largest angular gap is at most phi^2 times the mean 2 pi / (H P); axial RoPE has only two directions."""
    heads, head_dim = 6, 32
    pe = vpe.build("rope_axial", head_dim=head_dim, num_heads=heads, directions="golden")
    angles = torch.atan2(pe.freqs[1], pe.freqs[0]).flatten().double().remainder(2 * math.pi).sort().values
    gaps = torch.diff(torch.cat([angles, angles[:1] + 2 * math.pi]))
    count = heads * head_dim // 2
    assert float(gaps.max()) <= (1 + math.sqrt(5)) ** 2 / 4 * 2 * math.pi / count + 1e-9
    assert float(gaps.min()) > 0  # no two pairs share a direction
    axial = vpe.build("rope_axial", head_dim=head_dim)
    assert torch.atan2(axial.freqs[1], axial.freqs[0]).unique().numel() == 2
    # the magnitudes are the axial layout's, head by head
    torch.testing.assert_close(pe.freqs.norm(dim=0), axial.freqs.norm(dim=0).expand(heads, -1))


def test_golden_kernel_is_relative():
    pe = vpe.build("rope_axial", head_dim=16, num_heads=2, directions="golden")
    maps = pe.pair_map(Grid((3, 3)))
    torch.testing.assert_close(pe.pair_map(Grid((3, 3), offset=(2, 5))), maps, atol=1e-6, rtol=0)


def test_mixed_directions_axial_starts_as_rope_axial():
    mixed = vpe.build("rope_mixed", head_dim=16, num_heads=2, theta=100, directions="axial")
    axial = vpe.build("rope_axial", head_dim=16, num_heads=2)
    grid = Grid((3, 4))
    torch.testing.assert_close(mixed.cis(grid), axial.cis(grid).expand(2, -1, -1))


def test_layout_errors_name_the_parameter():
    with pytest.raises(ValueError, match="directions='golden'.*2D"):
        vpe.build("rope_axial", head_dim=12, ndim=3, directions="golden")
    with pytest.raises(ValueError, match="directions='random'.*'axial', 'golden'"):
        vpe.build("rope_axial", head_dim=16, directions="random")
    with pytest.raises(ValueError, match="directions='spiral'"):
        vpe.build("rope_mixed", head_dim=16, num_heads=2, directions="spiral")
    for bad in (-0.1, 1.5, float("nan"), "half"):
        with pytest.raises(ValueError, match="rotate_fraction"):
            vpe.build("rope_axial", head_dim=16, rotate_fraction=bad)


# -- p-RoPE --------------------------------------------------------------------------------------------------------
def test_p_rope_closed_form_1d_as_barbero():
    """Barbero et al.'s p-RoPE: rope_angles = int(p * head_dim // 2) pairs keep 1 / theta^(2i/d), the rest get
    timescale inf (frequency 0)."""
    head_dim, theta, p = 16, 10000.0, 0.75
    pe = vpe.build("rope_axial", head_dim=head_dim, ndim=1, theta=theta, rotate_fraction=p)
    rope_angles = int(p * head_dim // 2)
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = torch.where(i < rope_angles, theta ** (-2 * i / head_dim), torch.zeros(()))
    grid = Grid((7,))
    angles = grid.coords(dtype=torch.float64)[:, :1] * inv_freq
    assert rope_angles == 6 and max_error(pe, grid, angles[None]) < 1e-6


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
def test_p_rope_leaves_the_lowest_frequencies_unrotated(name):
    """2D, 4 bands per axis, p = 0.5: bands 0, 1 of x and of y rotate; the channels of bands 2, 3 pass through
    exactly, and they are the lowest frequencies of the full layout."""
    torch.manual_seed(0)
    kw = dict(head_dim=16, num_heads=2, rotate_fraction=0.5)
    pe = vpe.build(name, **kw)
    full = vpe.build(name, **{**kw, "rotate_fraction": 1.0})  # magnitudes do not depend on the random directions
    rotating = torch.tensor([True, True, False, False] * 2)
    grid = Grid((3, 4), prefix=1)
    q = torch.randn(2, 2, grid.num_tokens, 16)
    out = pe.rotate(q, grid)
    channels = rotating.repeat_interleave(2)  # interleaved pairs (2p, 2p + 1)
    assert torch.equal(out[..., ~channels], q[..., ~channels])
    assert not torch.allclose(out[..., 1:, :][..., channels], q[..., 1:, :][..., channels])
    magnitude = full.freqs.detach().norm(dim=0)  # (heads, pairs)
    for band in (slice(0, 4), slice(4, 8)):
        kept, dropped = magnitude[:, band][:, rotating[band]], magnitude[:, band][:, ~rotating[band]]
        assert float(dropped.max()) < float(kept.min())
    assert not bool(pe.freqs.detach().norm(dim=0)[:, ~rotating].any())


def test_p_rope_extremes_are_nope_and_rope():
    q = torch.randn(1, 2, 12, 16)
    grid = Grid((3, 4))
    assert torch.equal(vpe.build("rope_axial", head_dim=16, rotate_fraction=0.0).rotate(q, grid), q)
    torch.testing.assert_close(vpe.build("rope_axial", head_dim=16, rotate_fraction=1.0).rotate(q, grid),
                               vpe.build("rope_axial", head_dim=16).rotate(q, grid), atol=0, rtol=0)


def test_p_rope_one_spectrum_drops_its_lowest_pairs():
    """With spectrum='mrope' the band is the whole spectrum: the last (lowest) pairs stop rotating, whatever axis."""
    pe = vpe.build("rope_axial", head_dim=24, ndim=3, spectrum="mrope", sections=(4, 4, 4), rotate_fraction=0.5)
    magnitude = pe.freqs.norm(dim=0)[0]
    assert torch.equal(magnitude[6:], torch.zeros(6)) and bool((magnitude[:6] > 0).all())


def test_p_rope_learned_pairs_stay_unrotated():
    """rope_mixed: the masked frequencies get zero gradient and are ignored when loaded nonzero."""
    torch.manual_seed(0)
    pe = vpe.build("rope_mixed", head_dim=16, num_heads=2, rotate_fraction=0.5)
    grid = Grid((3, 4))
    q, k = torch.randn(2, 1, 2, 12, 16).unbind(0)
    out_q, out_k = pe(q.requires_grad_(), k, grid)
    (out_q * out_k).sum().backward()
    masked = pe.freq_mask == 0
    assert bool(masked.any()) and torch.equal(pe.freqs.grad[masked], torch.zeros(int(masked.sum())))
    assert bool((pe.freqs.grad[~masked] != 0).any())
    before = pe.rotate(q.detach(), grid)
    with torch.no_grad():
        pe.freqs[masked] = 3.0
    torch.testing.assert_close(pe.rotate(q.detach(), grid), before, atol=0, rtol=0)


def test_p_rope_under_ntk_and_yarn_keeps_zero_frequencies():
    q = torch.randn(1, 1, 36, 16)
    for scaling in ("ntk", "yarn", "pi"):
        pe = vpe.build("rope_axial", head_dim=16, rotate_fraction=0.5, scaling=scaling, ref_shape=(3, 3))
        out = pe.rotate(q, Grid((6, 6)))
        factor = 0.1 * math.log(2.0) + 1.0 if scaling == "yarn" else 1.0
        dropped = torch.tensor([False, False, True, True] * 2).repeat_interleave(2)
        torch.testing.assert_close(out[..., dropped], q[..., dropped] * factor)


# -- per-head axes -------------------------------------------------------------------------------------------------
def test_head_axes_closed_form():
    """heads ("x", "y", "yx", ""), head_dim 8 (4 pairs): one-axis heads get 4 bands theta^(-i/4) on their axis; the
    two-axis head 2 bands per axis, x first (axis_order 'xy'); the last head is the identity."""
    theta, grid = 100.0, Grid((3, 4))
    pe = vpe.build("rope_axial", head_dim=8, num_heads=4, head_axes=("x", "y", "yx", ""))
    x, y = xy(grid)
    four = theta ** (-torch.arange(4, dtype=torch.float64) / 4)
    two = theta ** (-torch.arange(2, dtype=torch.float64) / 2)
    both = torch.cat([x[:, None] * two, y[:, None] * two], dim=1)
    angles = torch.stack([x[:, None] * four, y[:, None] * four, both, torch.zeros(12, 4, dtype=torch.float64)])
    assert max_error(pe, grid, angles) < 1e-6


def test_head_axes_properties():
    """An unrotated head passes q and k through; an x-only head's rotation depends on the column only."""
    pe = vpe.build("rope_axial", head_dim=8, num_heads=3, head_axes=("x", "", "y"))
    grid = Grid((3, 4), prefix=1)
    q = torch.randn(2, 3, grid.num_tokens, 8)
    out = pe.rotate(q, grid)
    assert torch.equal(out[:, 1], q[:, 1])
    cis = pe.cis(grid.without_prefix()).reshape(3, 3, 4, 4)  # (heads, rows, cols, pairs)
    assert torch.equal(cis[0], cis[0, :1].expand(3, -1, -1)) and not torch.equal(cis[0, :, 0], cis[0, :, 1])
    assert torch.equal(cis[2], cis[2, :, :1].expand(-1, 4, -1))


def test_head_axes_in_3d_use_sections_for_heads_of_every_axis():
    """A 'tyx' head splits its pairs by sections (as a video model passes them); a 't' head has all pairs on time;
    an 'yx' head splits them evenly (remainder to the later axis)."""
    pe = vpe.build("rope_axial", head_dim=10, num_heads=3, ndim=3, sections=(1, 2, 2), head_axes=("tyx", "t", "yx"))
    on_axis = (pe.freqs != 0).sum(-1)  # (components x, y, t; heads)
    assert on_axis[:, 0].tolist() == [2, 2, 1] and on_axis[:, 1].tolist() == [0, 0, 5]
    assert on_axis[:, 2].tolist() == [3, 2, 0]  # 5 pairs over (y, x): y 2, x 3


def test_head_axes_learned_stay_on_their_axes():
    torch.manual_seed(0)
    pe = vpe.build("rope_mixed", head_dim=8, num_heads=3, head_axes=("x", "yx", ""))
    initial = pe.freqs.detach()
    assert torch.equal(initial[1, 0], torch.zeros(4)) and torch.equal(initial[:, 2], torch.zeros(2, 4))
    optimizer = torch.optim.SGD(pe.parameters(), lr=1.0)
    grid = Grid((3, 4))
    q, k = torch.randn(2, 2, 3, 12, 8).unbind(0)
    rotated_q, rotated_k = pe(q, k, grid)
    (rotated_q * rotated_k).sum().backward()
    optimizer.step()
    freqs = pe.frequencies(torch.float64)
    assert torch.equal(freqs[1, 0], torch.zeros(4, dtype=torch.float64))  # the x head learned no y component
    assert torch.equal(freqs[:, 2], torch.zeros(2, 4, dtype=torch.float64))  # the unrotated head stays so
    assert bool((freqs[:, 1] != 0).all())  # the two-axis head turns its directions freely


def test_head_axes_ntk_fractions_per_head():
    pe = vpe.build("rope_axial", head_dim=8, num_heads=2, head_axes=("x", "yx"), scaling="ntk", ref_shape=(2, 2))
    torch.testing.assert_close(pe.band_fraction, torch.tensor([[0, 1 / 3, 2 / 3, 1], [0, 1, 0, 1]]))
    out = pe.frequencies(torch.float64)  # unscaled
    scaled = vpe.rotary.scaling.scale_frequencies(out, pe.band_fraction, torch.tensor([2.0, 2.0]), (2, 2), "ntk")
    fractions = torch.tensor([0, 1 / 3, 2 / 3, 1], dtype=torch.float64)
    torch.testing.assert_close(scaled[0, 0], out[0, 0] * 2.0 ** -fractions)


@pytest.mark.parametrize("head_axes,message", [
    (("x",), "num_heads=2"), ("xy", "sequence"), (("x", "z"), "'z'"), (("xx", "y"), "distinct"),
    (("x", 1), "entry 1"),
])
def test_head_axes_errors(head_axes, message):
    with pytest.raises(ValueError, match=message):
        vpe.build("rope_axial", head_dim=8, num_heads=2, head_axes=head_axes)


def test_head_axes_do_not_combine_with_golden_or_one_spectrum():
    with pytest.raises(ValueError, match="head_axes"):
        vpe.build("rope_mixed", head_dim=8, num_heads=2, head_axes=("x", "y"), directions="golden")
    with pytest.raises(ValueError, match="head_axes"):
        vpe.build("rope_axial", head_dim=12, ndim=3, num_heads=2, head_axes=("t", "y"), spectrum="mrope",
                  sections=(2, 2, 2))


def test_layout_in_repr():
    pe = vpe.build("rope_mixed", head_dim=8, num_heads=2, head_axes=("x", ""), rotate_fraction=0.5)
    assert "head_axes=('x', '')" in repr(pe) and "rotate_fraction=0.5" in repr(pe)


def test_layouts_compose_the_same_fixed_and_learned():
    """golden directions with p-RoPE: rope_axial's fixed table is rope_mixed's initialisation (same theta)."""
    kw = dict(head_dim=16, num_heads=3, theta=10.0, directions="golden", rotate_fraction=0.5)
    torch.testing.assert_close(vpe.build("rope_mixed", **kw).freqs.detach(), vpe.build("rope_axial", **kw).freqs)
