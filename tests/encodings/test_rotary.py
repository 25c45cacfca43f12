"""Rotary family: parity with rope-vit and timm, relative-position property, scaling (PI, NTK, YaRN), sections."""
import math

import pytest
import torch
from conftest import SHAPES
from timm.layers import RotaryEmbeddingCat, RotaryEmbeddingMixed, apply_rot_embed_cat

import visionpe as vpe
from visionpe import Grid
from visionpe.rotary import MixedRoPE
from visionpe.rotary.rope import apply_rotary, heads_inside_tokens, rotate_real


def rope_vit_axial_cis(dim: int, end_x: int, end_y: int, theta: float) -> torch.Tensor:
    """rope-vit ``compute_axial_cis``: ``(end_x * end_y, dim / 2)`` complex, x pairs then y pairs."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4)[: dim // 4].float() / dim))
    t = torch.arange(end_x * end_y, dtype=torch.float32)
    t_x, t_y = t % end_x, torch.div(t, end_x, rounding_mode="floor")
    ones = torch.ones(len(t), len(freqs))
    return torch.cat([torch.polar(ones, torch.outer(t_x, freqs)), torch.polar(ones, torch.outer(t_y, freqs))], -1)


def rope_vit_apply(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    """rope-vit ``apply_rotary_emb``: adjacent channel pairs as complex numbers times ``cis``."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis).flatten(3)


def axial_angles(shape, head_dim: int, thetas) -> torch.Tensor:
    """Closed-form axial angles ``(N, head_dim / 2)``: per grid axis ``a`` (theta ``thetas[a]``) a block of
    ``n`` pairs turning by ``c_a / theta_a^(i/n)``; blocks in xy order (last grid axis first)."""
    n = head_dim // (2 * len(shape))
    coords = Grid(shape).coords()
    blocks = [torch.outer(coords[:, a], thetas[a] ** -(torch.arange(n) / n)) for a in reversed(range(len(shape)))]
    return torch.cat(blocks, -1)


def rope(kind: str, ndim: int, pairs: str = "interleaved", **kw):
    return vpe.build(kind, head_dim=12, num_heads=2, ndim=ndim, pairs=pairs, **kw)


def patch_cis(pe, shape) -> torch.Tensor:
    """``cis`` rows of the patches of the first head: ``(N, head_dim / 2)`` complex."""
    return pe.cis(Grid(shape))[0]


# -- oracle parity --------------------------------------------------------------------------------------
@pytest.mark.parametrize("theta", [100.0, 10000.0])
@pytest.mark.parametrize("shape", [(3, 5), (5, 3)])
def test_axial_matches_rope_vit(shape, theta):
    pe = vpe.build("rope_axial", head_dim=16, num_heads=2, theta=theta)
    ref_cis = rope_vit_axial_cis(16, end_x=shape[1], end_y=shape[0], theta=theta)
    torch.testing.assert_close(patch_cis(pe, shape), ref_cis, atol=1e-5, rtol=0)
    q = torch.randn(2, 2, shape[0] * shape[1], 16)
    torch.testing.assert_close(pe.rotate(q, Grid(shape)), rope_vit_apply(q, ref_cis), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pairs", ["interleaved", "half"])
@pytest.mark.parametrize("shape", [(3, 5), (5, 3)])
def test_axial_matches_timm_rotary_cat(shape, pairs):
    half = pairs == "half"
    timm_rope = RotaryEmbeddingCat(dim=16, temperature=100, in_pixels=False, feat_shape=None, grid_indexing="xy",
                                   rotate_half=half)
    pe = vpe.build("rope_axial", head_dim=16, num_heads=2, pairs=pairs)
    q, k = torch.randn(2, 2, 2, shape[0] * shape[1], 16)
    ref = [apply_rot_embed_cat(t, timm_rope.get_embed(list(shape)), half=half) for t in (q, k)]
    ours = pe(q, k, Grid(shape))
    for o, r in zip(ours, ref):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(3, 5), (4, 2)])
def test_mixed_matches_timm_given_same_freqs(shape):
    heads, head_dim = 3, 16
    timm_rope = RotaryEmbeddingMixed(head_dim * heads, depth=1, num_heads=heads, temperature=10, grid_indexing="xy")
    pe = vpe.build("rope_mixed", head_dim=head_dim, num_heads=heads)
    assert pe.freqs.shape == timm_rope.freqs[:, 0].shape == (2, heads, head_dim // 2)
    with torch.no_grad():
        pe.freqs.copy_(timm_rope.freqs[:, 0])
    q = torch.randn(2, heads, shape[0] * shape[1], head_dim)
    with torch.no_grad():
        ref = apply_rot_embed_cat(q, timm_rope.get_embed(list(shape))[0])
        torch.testing.assert_close(pe.rotate(q, Grid(shape)), ref, atol=1e-5, rtol=1e-5)


def test_mixed_init_is_rope_vit_2d():
    """Per head: group 0 points along ``(cos phi, sin phi)``, group 1 along ``phi + pi/2``, magnitudes
    ``1/theta^(4i/d)`` (rope-vit ``init_random_2d_freqs``)."""
    head_dim, heads, theta = 16, 4, 10.0
    freqs = MixedRoPE(head_dim, heads, theta=theta).freqs.detach()  # (2 axes xy, heads, 8)
    mags = theta ** -(torch.arange(0, head_dim, 4).float() / head_dim)
    g0, g1 = freqs[..., :4], freqs[..., 4:]  # (2, heads, 4)
    phi = torch.atan2(g0[1, :, 0], g0[0, :, 0])  # (heads,)
    dir0 = torch.stack([phi.cos(), phi.sin()])[..., None]
    dir1 = torch.stack([(phi + math.pi / 2).cos(), (phi + math.pi / 2).sin()])[..., None]
    torch.testing.assert_close(g0, dir0 * mags, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g1, dir1 * mags, atol=1e-6, rtol=1e-5)
    assert phi.unique().numel() == heads  # a random direction per head


def test_mixed_init_nd_directions_orthonormal():
    """nD: per head the ``ndim`` groups point along orthonormal directions with the axial magnitudes."""
    ndim, head_dim, heads, theta = 3, 12, 4, 10.0
    freqs = MixedRoPE(head_dim, heads, ndim=ndim, theta=theta).freqs.detach()
    bands = head_dim // (2 * ndim)
    groups = freqs.reshape(ndim, heads, ndim, bands)  # (component, head, group, band)
    mags = theta ** -(torch.arange(bands) / bands)
    directions = groups / mags  # every band of a group points the same way
    torch.testing.assert_close(directions, directions[..., :1].expand_as(directions), atol=1e-6, rtol=1e-5)
    d = directions[..., 0].permute(1, 0, 2)  # (head, component, group)
    torch.testing.assert_close(d.transpose(1, 2) @ d, torch.eye(ndim).expand(heads, -1, -1), atol=1e-5, rtol=0)


def test_mixed_eval_cache_follows_freqs_and_no_weight_decay():
    pe, grid = rope("rope_mixed", 2), Grid((3, 3))
    with torch.no_grad():
        pe.cis(grid)  # cached
        pe.freqs.mul_(2.0)
        angles = torch.einsum("na,ahp->hnp", grid.coords().flip(-1), pe.freqs)
        torch.testing.assert_close(pe.cis(grid), torch.polar(torch.ones_like(angles), angles), atol=1e-5, rtol=0)
    assert pe.no_weight_decay() == {"freqs"}


# -- properties -----------------------------------------------------------------------------------------
ROPES = [(kind, ndim, pairs) for kind in ("rope_axial", "rope_mixed") for ndim in (2, 3)
         for pairs in ("interleaved", "half")]


@pytest.mark.parametrize("kind,ndim,pairs", ROPES)
def test_scores_depend_only_on_coordinate_difference(kind, ndim, pairs):
    pe, shape = rope(kind, ndim, pairs), SHAPES[ndim]
    n = math.prod(shape) + 1
    q, k = torch.randn(2, 1, 2, n, 12)

    def scores(o_q, o_k):
        rq = pe.rotate(q, Grid(shape, prefix=1, offset=o_q))
        rk = pe.rotate(k, Grid(shape, prefix=1, offset=o_k))
        return (rq @ rk.transpose(-1, -2))[..., 1:, 1:]  # patch pairs (the prefix has no position)

    o_q, o_k, d = torch.randn(3, ndim).mul(3).tolist()
    shifted = [a + b for a, b in zip(o_q, d)], [a + b for a, b in zip(o_k, d)]
    torch.testing.assert_close(scores(*shifted), scores(o_q, o_k), atol=1e-4, rtol=1e-4)
    assert (scores(shifted[0], o_k) - scores(o_q, o_k)).abs().max() > 1e-2  # moving q alone does change them


@pytest.mark.parametrize("kind,ndim,pairs", ROPES)
def test_rotation_preserves_norms_and_leaves_prefix(kind, ndim, pairs):
    pe, grid = rope(kind, ndim, pairs), Grid(SHAPES[ndim], prefix=2)
    q = torch.randn(2, 2, grid.num_tokens, 12)
    out = pe.rotate(q, grid)
    torch.testing.assert_close(out.norm(dim=-1), q.norm(dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, :, :2], q[:, :, :2], rtol=0, atol=0)
    assert (out[:, :, 3:] - q[:, :, 3:]).abs().max() > 1e-2


@pytest.mark.parametrize("kind,ndim,pairs", ROPES)
def test_fused_qkv_layout_and_real_formula_give_the_same_rotation(kind, ndim, pairs):
    """q, k sliced from a fused qkv (heads inside tokens in memory) take the token-major multiply and table, a
    contiguous q the head-major ones, ``torch.compile`` the real formula: the same numbers and gradients."""
    pe, grid = rope(kind, ndim, pairs), Grid(SHAPES[ndim], prefix=1)
    qkv = torch.randn(2, grid.num_tokens, 3, 2, 12, requires_grad=True)
    q_fused = qkv.permute(2, 0, 3, 1, 4)[0]  # (B, heads, T, head_dim) view, as timm's Attention slices it
    assert heads_inside_tokens(q_fused) and not heads_inside_tokens(q_fused.contiguous())
    q_plain = q_fused.detach().contiguous().requires_grad_()
    table = pe.rotations(grid, tokens_first=True)  # every head's rows, heads inside tokens in memory
    assert table.shape[0] == 2 and table.transpose(0, 1).is_contiguous()
    torch.testing.assert_close(table, pe.rotations(grid).expand_as(table), rtol=0, atol=0)
    outs = [apply_rotary(q_fused, table, pairs), apply_rotary(q_plain, pe.cis(grid), pairs),
            rotate_real(q_plain, pe.rotations(grid), pairs)]
    grad = torch.randn_like(q_plain)
    grads = [torch.autograd.grad(out, source, grad)[0] for out, source in zip(outs, (qkv, q_plain, q_plain))]
    grads[0] = grads[0].permute(2, 0, 3, 1, 4)[0]
    for out, g in zip(outs[1:], grads[1:]):
        torch.testing.assert_close(out, outs[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g, grads[0], rtol=1e-6, atol=1e-6)
    assert outs[0].transpose(1, 2).is_contiguous()  # the rotated q keeps the token-major layout


@pytest.mark.parametrize("sections", [None, (2, 2, 2), (2, 3, 3)])
def test_axial_nd_angles_closed_form(sections):
    """3D axial: each grid axis owns ``sections[a]`` pairs with ``1/theta^(i/n_a)``, x (last axis) first."""
    shape, theta = (2, 3, 4), 100.0
    head_dim = 12 if sections in (None, (2, 2, 2)) else 16
    pe = vpe.build("rope_axial", head_dim=head_dim, ndim=3, sections=sections)
    sections = sections or (2, 2, 2)
    coords = Grid(shape).coords()
    ref = torch.cat([torch.outer(coords[:, a], theta ** -(torch.arange(sections[a]) / sections[a]))
                     for a in (2, 1, 0)], -1)
    torch.testing.assert_close(patch_cis(pe, shape), torch.polar(torch.ones_like(ref), ref), atol=1e-5, rtol=0)


def test_sections_pairs_change_only_along_their_axis():
    shape, sections = (3, 4, 5), (2, 3, 3)
    pe = vpe.build("rope_axial", head_dim=16, ndim=3, sections=sections)
    cis = patch_cis(pe, shape).reshape(*shape, 8)
    moving = [(cis.narrow(a, 1, s - 1) - cis.narrow(a, 0, s - 1)).abs().amax(dim=(0, 1, 2)) > 1e-4
              for a, s in enumerate(shape)]
    assert [int(m.sum()) for m in moving] == list(sections)
    assert torch.stack(moving).sum(0).tolist() == [1] * 8  # every pair turns along exactly one axis
    assert [m.nonzero().flatten().tolist() for m in moving] == [[6, 7], [3, 4, 5], [0, 1, 2]]


# -- resolution scaling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,ref_shape", [((8, 4), (4, 4)), ((2, 8, 4), (4, 4, 2))])
def test_ntk_equals_theta_scaled_per_axis(shape, ref_shape):
    """NTK = axial with ``theta * s^(n/(n-1))`` on axes with ``s > 1``; axes with ``s <= 1`` untouched."""
    head_dim, theta = 24, 100.0
    n = head_dim // (2 * len(shape))
    pe = vpe.build("rope_axial", head_dim=head_dim, ndim=len(shape), scaling="ntk", ref_shape=ref_shape)
    thetas = [theta * (s / r) ** (n / (n - 1)) if s > r else theta for s, r in zip(shape, ref_shape)]
    ref = axial_angles(shape, head_dim, thetas)
    torch.testing.assert_close(patch_cis(pe, shape), torch.polar(torch.ones_like(ref), ref), atol=1e-5, rtol=0)
    plain = vpe.build("rope_axial", head_dim=head_dim, ndim=len(shape))
    assert (patch_cis(plain, shape) - patch_cis(pe, shape)).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["rope_axial", "rope_mixed"])
@pytest.mark.parametrize("shape,ref_shape", [((6, 10), (3, 4)), ((2, 6, 8), (1, 3, 4))])
def test_pi_scales_positions(kind, shape, ref_shape):
    ndim = len(shape)
    plain = rope(kind, ndim)
    pe = rope(kind, ndim, scaling="pi", ref_shape=ref_shape)
    pe.load_state_dict(plain.state_dict())
    factor = torch.tensor([r / s for r, s in zip(ref_shape, shape)])
    angles = torch.einsum("na,ahp->hnp", (Grid(shape).coords() * factor).flip(-1), plain.freqs)
    torch.testing.assert_close(pe.cis(Grid(shape)), torch.polar(torch.ones_like(angles), angles), atol=1e-5, rtol=0)


def test_pi_matches_timm_ref_feat_shape():
    shape, ref_shape = (6, 10), (3, 4)
    timm_rope = RotaryEmbeddingCat(dim=16, temperature=100, in_pixels=False, feat_shape=None, grid_indexing="xy",
                                   ref_feat_shape=list(ref_shape))
    pe = vpe.build("rope_axial", head_dim=16, scaling="pi", ref_shape=ref_shape)
    q = torch.randn(1, 1, 60, 16)
    torch.testing.assert_close(pe.rotate(q, Grid(shape)), apply_rot_embed_cat(q, timm_rope.get_embed(list(shape))),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scaling", ["yarn", "ntk"])
@pytest.mark.parametrize("shape", [(4, 4), (3, 2)])
def test_extension_scalings_identity_when_not_extending(scaling, shape):
    pe = vpe.build("rope_axial", head_dim=16, scaling=scaling, ref_shape=(4, 4))
    plain = vpe.build("rope_axial", head_dim=16)
    torch.testing.assert_close(pe.cis(Grid(shape, prefix=1)), plain.cis(Grid(shape, prefix=1)), rtol=0, atol=1e-7)


def test_yarn_ramp_and_temperature():
    """x doubles (s=2), y stays: x bands with ``r = ref * f / 2pi`` below alpha are divided by s, above beta kept,
    in between blended; y untouched; patch rows scaled by ``0.1 ln(s_mean) + 1`` with ``s_mean = sqrt 2``."""
    ref, theta, alpha, beta = 16, 100.0, 0.5, 2.0
    pe = vpe.build("rope_axial", head_dim=16, theta=theta, scaling="yarn", ref_shape=(ref, ref),
                   yarn_alpha=alpha, yarn_beta=beta)
    shape = (ref, 2 * ref)
    cis = patch_cis(pe, shape)
    f = theta ** -(torch.arange(4) / 4)  # [1, .32, .1, .03]: r = [2.5, .8, .25, .08]
    r = ref * f / (2 * math.pi)
    gamma = ((r - alpha) / (beta - alpha)).clamp(0, 1)
    assert gamma.tolist()[0] == 1 and 0 < gamma[1] < 1 and gamma.tolist()[2:] == [0, 0]  # the ramp is exercised
    fx = f * ((1 - gamma) / 2 + gamma)
    torch.testing.assert_close(cis[1, :4].angle(), fx, atol=1e-6, rtol=1e-5)  # patch (0, 1): x = 1
    torch.testing.assert_close(cis[shape[1], 4:].angle(), f, atol=1e-6, rtol=1e-5)  # patch (1, 0): y = 1
    torch.testing.assert_close(cis.abs(), torch.full(cis.shape, 0.1 * math.log(math.sqrt(2)) + 1), atol=1e-6,
                               rtol=0)


def test_yarn_lowest_bands_divided_by_s():
    pe = vpe.build("rope_axial", head_dim=16, scaling="yarn", ref_shape=(4, 4))
    shape, s = (12, 12), 3.0
    cis = patch_cis(pe, shape)
    f = 100.0 ** -(torch.arange(4) / 4)  # ref 4: r = 4 f / 2 pi < 1 for every band -> all interpolated
    torch.testing.assert_close(cis[1, :4].angle(), f / s, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(cis[12, 4:].angle(), f / s, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(cis.abs(), torch.full(cis.shape, 0.1 * math.log(s) + 1), atol=1e-6, rtol=0)


def test_with_scaling_is_a_copy_with_the_same_frequencies():
    rope = MixedRoPE(head_dim=8, num_heads=2, ref_shape=(4, 4))
    pi = rope.with_scaling("pi")
    assert rope.scaling == "none" and pi.scaling == "pi" and pi.ref_shape == (4, 4)
    assert torch.equal(pi.freqs, rope.freqs) and pi.freqs is not rope.freqs
    grid = Grid((8, 8))
    assert not torch.allclose(pi.cis(grid), rope.cis(grid))
    with pytest.raises(ValueError, match="scaling='pi' needs ref_shape"):
        MixedRoPE(head_dim=8, num_heads=2).with_scaling("pi")
