"""Spherical RoPE (arXiv 2511.08368) and GeoPE (arXiv 2512.04963) against closed forms written here (float64 matrix
exponentials of the so(3) generators, not the modules' formulas) and their defining properties; everywhere else the
other encodings go comes from the registry-wide tests (``-k spherical_rope`` / ``-k geope``)."""
import math

import pytest
import torch

import visionpe as vpe
from visionpe import Grid

# so(3) generators written out: rotation about the first, second, third axis of a channel triplet
ABOUT = torch.tensor([[[0, 0, 0], [0, 0, -1], [0, 1, 0]],
                      [[0, 0, 1], [0, 0, 0], [-1, 0, 0]],
                      [[0, -1, 0], [1, 0, 0], [0, 0, 0]]], dtype=torch.float64)
YAW, ROLL = ABOUT[2], ABOUT[0]


def expm(a: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_exp(a)


def scores(pe, grid, seed: int = 0) -> torch.Tensor:
    """``q_i . k_j`` of one random q and k (the same vector at every token) rotated by ``pe``: ``(N, N)``."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 1, 1, pe.head_dim, generator=g).expand(-1, 1, 1, grid.num_tokens, -1).unbind(0)
    q, k = pe(q.contiguous(), k.contiguous(), grid)
    return (q @ k.transpose(-1, -2))[0, 0, grid.prefix:, grid.prefix:]


def assert_orthogonal(blocks: torch.Tensor) -> None:
    blocks = blocks.double()
    eye = torch.eye(blocks.shape[-1], dtype=torch.float64).expand_as(blocks)
    torch.testing.assert_close(blocks.transpose(-1, -2) @ blocks, eye, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.linalg.det(blocks), torch.ones(blocks.shape[:-2], dtype=torch.float64),
                               atol=1e-6, rtol=0)


# -- Spherical RoPE ----------------------------------------------------------------------------------------------------

def spherical_blocks(shape, head_dim: int, base: float = 100.0) -> torch.Tensor:
    """The paper's Spherical RoPE (Sec. 4, Fig. 2, App. G): positions evenly over [-pi, pi] per axis (top-left -pi),
    ``omega_d = base^(-2 d / head_dim)``, triplet ``d`` rotated first by the yaw ``exp(omega_d p_x G_yaw)`` then by the
    roll ``exp(omega_d p_y G_roll)``: ``(N, head_dim // 3, 3, 3)``, patches row-major."""
    rows, cols = shape
    ys, xs = (math.pi * torch.linspace(-1, 1, n, dtype=torch.float64) for n in shape)
    omegas = base ** (-2.0 * torch.arange(head_dim // 3, dtype=torch.float64) / head_dim)
    out = torch.empty(rows * cols, head_dim // 3, 3, 3, dtype=torch.float64)
    for i in range(rows):
        for j in range(cols):
            for d, w in enumerate(omegas):
                out[i * cols + j, d] = expm(w * ys[i] * ROLL) @ expm(w * xs[j] * YAW)
    return out


@pytest.mark.parametrize("shape,head_dim", [((3, 4), 12), ((4, 2), 9)])
def test_spherical_rope_is_its_formula(shape, head_dim):
    pe = vpe.build("spherical_rope", head_dim=head_dim)
    blocks = pe.rotation_blocks(Grid(shape, prefix=1))[0]
    torch.testing.assert_close(blocks.double(), spherical_blocks(shape, head_dim), atol=1e-6, rtol=0)
    assert_orthogonal(blocks)


def test_spherical_rope_rotates_q_by_the_blocks_and_leaves_the_rest_and_the_prefix():
    """head_dim 8: two triplets rotated, the last 2 channels and the class token untouched."""
    pe = vpe.build("spherical_rope", head_dim=8)
    grid = Grid((2, 3), prefix=1)
    x = torch.randn(2, 3, grid.num_tokens, 8, dtype=torch.float64).float()
    out = pe.rotate(x, grid)
    blocks = spherical_blocks((2, 3), 8).float()
    expected = (blocks @ x[:, :, 1:, :6].unflatten(-1, (2, 3))[..., None]).squeeze(-1).flatten(-2)
    torch.testing.assert_close(out[:, :, 1:, :6], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[..., 6:], x[..., 6:]) and torch.equal(out[:, :, 0], x[:, :, 0])


def test_spherical_rope_is_not_relative():
    """Shifting the grid changes scores (Mixed RoPE's do not). Along a row the roll cancels, ``Y(x_i)^T Y(x_j)``:
    relative in x; down a column ``Y(x)^T R(dy) Y(x)`` depends on the column: the yaw is applied first."""
    pe = vpe.build("spherical_rope", head_dim=12, coords="index", scale=0.7)
    mixed = vpe.build("rope_mixed", head_dim=12, num_heads=1)
    shifted = Grid((3, 4), offset=(1.0, 2.0))
    assert not torch.allclose(scores(pe, shifted), scores(pe, Grid((3, 4))), atol=1e-3)
    torch.testing.assert_close(scores(mixed, shifted), scores(mixed, Grid((3, 4))), atol=1e-4, rtol=1e-4)
    s = scores(pe, Grid((3, 4)))
    at = lambda y, x: 4 * y + x  # noqa: E731
    torch.testing.assert_close(s[at(0, 0), at(0, 1)], s[at(2, 2), at(2, 3)])  # along a row: x offset only
    assert not torch.allclose(s[at(0, 0), at(1, 0)], s[at(0, 3), at(1, 3)], atol=1e-3)  # down two columns


def test_spherical_rope_refuses_bad_settings():
    with pytest.raises(ValueError, match="ndim"):
        vpe.build("spherical_rope", head_dim=12, ndim=3)
    with pytest.raises(ValueError, match="head_dim"):
        vpe.build("spherical_rope", head_dim=2)
    with pytest.raises(ValueError, match="base"):
        vpe.build("spherical_rope", head_dim=12, base=1.0)


# -- GeoPE -------------------------------------------------------------------------------------------------------------

def geope_blocks(shape, head_dim: int, base: float = 100.0, scale: float = 1.0) -> torch.Tensor:
    """GeoPE's operator: ``exp`` of the mean over the grid axes of ``omega_d c_a G_a`` (the log of each axis rotation),
    integer coordinates, axis ``a`` turning about the triplet's ``a``-th axis: ``(N, head_dim // 3, 3, 3)``."""
    omegas = scale * base ** (-2.0 * torch.arange(head_dim // 3, dtype=torch.float64) / head_dim)
    coords = torch.cartesian_prod(*(torch.arange(n, dtype=torch.float64) for n in shape)).reshape(-1, len(shape))
    out = torch.empty(len(coords), head_dim // 3, 3, 3, dtype=torch.float64)
    for t, c in enumerate(coords):
        for d, w in enumerate(omegas):
            out[t, d] = expm(sum(w * c[a] * ABOUT[a] for a in range(len(shape))) / len(shape))
    return out


@pytest.mark.parametrize("shape,head_dim,scale", [((3, 4), 12, 1.0), ((2, 2, 3), 9, 2.5), ((5, 2), 10, 0.5)])
def test_geope_is_the_exponential_of_the_mean_of_the_axes_generators(shape, head_dim, scale):
    pe = vpe.build("geope", head_dim=head_dim, ndim=len(shape), scale=scale)
    blocks = pe.rotation_blocks(Grid(shape, prefix=1))[0]
    torch.testing.assert_close(blocks.double(), geope_blocks(shape, head_dim, scale=scale), atol=1e-6, rtol=0)
    assert_orthogonal(blocks)


def test_geope_is_symmetric_in_the_axes():
    """Swapping the two axes' generators (the proper rotation P exchanging a triplet's first two axes) is swapping the
    coordinates: ``P R(y, x) P^T = R(x, y)``; the ordered product of the axis rotations is not symmetric so."""
    pe = vpe.build("geope", head_dim=12, scale=3.0)
    blocks = pe.rotation_blocks(Grid((3, 3)))[0].double().unflatten(0, (3, 3))  # (y, x, m, 3, 3)
    swap = torch.tensor([[0, 1, 0], [1, 0, 0], [0, 0, -1]], dtype=torch.float64)
    torch.testing.assert_close(swap @ blocks @ swap.T, blocks.transpose(0, 1), atol=1e-6, rtol=0)
    ordered = expm(ABOUT[0]) @ expm(2 * ABOUT[1])
    assert not torch.allclose(swap @ ordered @ swap.T, expm(2 * ABOUT[0]) @ expm(ABOUT[1]), atol=1e-3)


def test_geope_on_one_axis_is_a_plane_rotation_at_half_the_frequency():
    """A row of patches: triplet ``d`` turns its channels (2, 0) by ``omega_d x / 2`` with channel 1 fixed (RoPE's
    rotation, the mean halving the frequency), so scores along the row are relative."""
    pe = vpe.build("geope", head_dim=6, scale=2.0)
    blocks = pe.rotation_blocks(Grid((1, 5)))[0].double()
    angles = torch.arange(5, dtype=torch.float64)[:, None] * 2.0 * 100.0 ** (-2.0 * torch.arange(2) / 6) / 2
    c, s, one, zero = angles.cos(), angles.sin(), torch.ones_like(angles), torch.zeros_like(angles)
    expected = torch.stack([c, zero, s, zero, one, zero, -s, zero, c], dim=-1).unflatten(-1, (3, 3))
    torch.testing.assert_close(blocks, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(scores(pe, Grid((1, 5), offset=(0.0, 3.0))), scores(pe, Grid((1, 5))), atol=1e-5,
                               rtol=1e-5)


def test_geope_is_not_relative_off_the_axes():
    pe = vpe.build("geope", head_dim=12, scale=2.0)
    assert not torch.allclose(scores(pe, Grid((3, 4), offset=(1.0, 2.0))), scores(pe, Grid((3, 4))), atol=1e-3)


def test_geope_refuses_bad_settings():
    with pytest.raises(ValueError, match="ndim"):
        vpe.build("geope", head_dim=12, ndim=1)
    with pytest.raises(ValueError, match="scale"):
        vpe.build("geope", head_dim=12, scale=0.0)
