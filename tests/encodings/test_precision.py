"""Long axes: RoPE rotations and sincos tables stay exact to float32 rounding at any length (float32 angles
were off by up to 1.6e-2 at position 262 143), checked against float64 closed forms."""
import pytest
import torch

import visionpe as vpe
from visionpe import Grid

SHAPES = [(262_144,), (512, 512), (64, 64, 64)]
ATOL = 4e-7  # a few float32 ulps of values in [-1, 1]


def closed_form_coords(shape) -> torch.Tensor:
    """Row-major integer coordinates in float64, ``(N, ndim)``, grid axis order."""
    axes = [torch.arange(s, dtype=torch.float64) for s in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(shape))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
def test_axial_rope_exact_on_long_axes(shape):
    ndim, n = len(shape), 4  # 4 bands per axis
    pe = vpe.build("rope_axial", head_dim=2 * n * ndim, ndim=ndim, theta=100)
    cis = pe.cis(Grid(shape))[0]  # (N, pairs) complex64
    coords = closed_form_coords(shape).flip(-1)  # xy order: the last grid axis owns the first bands
    freqs = 100.0 ** -(torch.arange(n, dtype=torch.float64) / n)
    angles = torch.cat([coords[:, a, None] * freqs for a in range(ndim)], dim=-1)
    expected = torch.polar(torch.ones_like(angles), angles)
    assert cis.dtype == torch.complex64
    assert (cis.to(torch.complex128) - expected).abs().max() < ATOL


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
def test_mixed_rope_exact_on_long_axes(shape):
    ndim = len(shape)
    pe = vpe.build("rope_mixed", head_dim=6 * ndim, num_heads=2, ndim=ndim)
    with torch.no_grad():
        cis = pe.cis(Grid(shape))
    angles = torch.einsum("na,ahp->hnp", closed_form_coords(shape).flip(-1), pe.freqs.detach().double())
    expected = torch.polar(torch.ones_like(angles), angles)
    assert (cis.to(torch.complex128) - expected).abs().max() < ATOL


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
def test_sincos_exact_on_long_axes(shape):
    ndim, bands = len(shape), 4
    table = vpe.build("sincos", dim=2 * bands * ndim, ndim=ndim).table(Grid(shape))
    coords = closed_form_coords(shape).flip(-1)  # MAE layout: last axis first
    omega = 1.0 / 10000.0 ** (torch.arange(bands, dtype=torch.float64) / bands)
    expected = torch.cat([torch.cat([(coords[:, a, None] * omega).sin(), (coords[:, a, None] * omega).cos()], -1)
                          for a in range(ndim)], -1)
    assert table.dtype == torch.float32
    assert (table.double() - expected).abs().max() < ATOL


def test_large_offsets_stay_exact():
    """A clip far into a long video: offset 1e6 frames, positions exact in float64."""
    pe = vpe.build("rope_axial", head_dim=8, ndim=1, theta=100)
    cis = pe.cis(Grid((4,), offset=(1_000_000.5,)))[0]
    pos = torch.arange(4, dtype=torch.float64) + 1_000_000.5
    angles = pos[:, None] * 100.0 ** -(torch.arange(4, dtype=torch.float64) / 4)
    assert (cis.to(torch.complex128) - torch.polar(torch.ones_like(angles), angles)).abs().max() < ATOL
