"""The 2025-2026 encodings against their formulas (closed forms written here, in float64) and their official code's
conventions (each official algorithm written again here from the commit its module names): Spiral RoPE, HARoPE,
ViT-5's register RoPE, RIFLEx, PaPE and PaPE-RI; their behaviour on a resolution change."""
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import requires

import visionpe as vpe
from visionpe import Grid
from visionpe.grid import Layout
from visionpe.rotary.riflex import band_periods, intrinsic_band

VIT = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=3)


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Adjacent channel pairs ``(x[2p], x[2p+1])`` of ``x (..., T, d)`` turned by ``angles (T, d/2)``, float64."""
    x = x.double().unflatten(-1, (-1, 2))
    cos, sin = angles.cos(), angles.sin()
    return torch.stack([x[..., 0] * cos - x[..., 1] * sin, x[..., 0] * sin + x[..., 1] * cos], -1).flatten(-2)


def rows_cols(shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column index of each patch of a 2D grid, row-major, float64."""
    yx = Grid(tuple(shape)).coords(dtype=torch.float64)
    return yx[:, 0], yx[:, 1]


def axial_angles(rows, cols, bands: int, theta: float) -> torch.Tensor:
    """2D axial RoPE with the row pairs first: ``(N, 2 bands)``, band ``i`` at ``theta^(-i / bands)`` per patch."""
    w = theta ** -(torch.arange(bands, dtype=torch.float64) / bands)
    return torch.cat([rows[:, None] * w, cols[:, None] * w], -1)


def pair_angles(pe, grid) -> torch.Tensor:
    """The angle of each pair of each patch in a rotary module's table, ``(N, pairs)`` (heads shared)."""
    rotations = pe.rotations(grid)[0, grid.prefix:].double()
    return torch.atan2(rotations[..., 1], rotations[..., 0])


def wrapped(angle: torch.Tensor) -> torch.Tensor:
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def assert_same_turns(got: torch.Tensor, expected: torch.Tensor, atol: float = 2e-5) -> None:
    """Equal rotations: the same cos and sin (angles equal modulo 2 pi)."""
    torch.testing.assert_close(got.cos(), expected.cos(), atol=atol, rtol=0)
    torch.testing.assert_close(got.sin(), expected.sin(), atol=atol, rtol=0)


def randomised(pe, std: float = 0.5):
    with torch.no_grad():
        for p in pe.parameters():
            p.normal_(std=std)
    return pe


# -- Spiral RoPE -------------------------------------------------------------------------------------------------------

def spiral_angles(rows, cols, head_dim: int, directions: int, theta=10000.0, max_freq=1.5) -> torch.Tensor:
    """The paper's rotation: pair ``p`` turns by ``|f_p| <c, u_p>``, ``u_p`` the y (first half) or x axis (second
    half) turned by ``((p // 2) mod (K / 2)) pi / K``; ``(N, head_dim / 2)``."""
    n = head_dim // 4
    angles = []
    for p in range(2 * n):
        magnitude = max_freq * theta ** -((p % n) / n)
        a = ((p // 2) % (directions // 2)) * math.pi / directions
        dy, dx = (math.cos(a), math.sin(a)) if p < n else (-math.sin(a), math.cos(a))
        angles.append(magnitude * (dy * rows + dx * cols))
    return torch.stack(angles, -1)


@pytest.mark.parametrize("head_dim,directions", [(16, 4), (24, 4), (32, 8), (16, 2)])
def test_spiral_rope_is_its_formula(head_dim, directions):
    pe = vpe.build("spiral_rope", head_dim=head_dim, num_directions=directions)
    shape = (5, 6)
    grid = Grid(shape, prefix=1)
    q = torch.randn(2, 3, grid.num_tokens, head_dim)
    expected = torch.cat([q[:, :, :1].double(), rotate_pairs(q[:, :, 1:], spiral_angles(*rows_cols(shape), head_dim,
                                                                                          directions))], 2)
    torch.testing.assert_close(pe.rotate(q, grid).double(), expected, atol=2e-5, rtol=1e-5)


def test_spiral_rope_spreads_k_directions_evenly():
    for directions in (2, 4, 8):
        pe = vpe.build("spiral_rope", head_dim=64, num_directions=directions)
        fx, fy = pe.frequency_vectors()[:, 0]  # axis_order "ij": components (y, x)
        angles = torch.remainder(torch.atan2(fy, fx), math.pi)  # a line's direction, mod pi
        found = sorted({round(float(a), 6) % round(math.pi, 6) for a in angles})
        assert found == pytest.approx([i * math.pi / directions for i in range(directions)], abs=1e-5)
    two = vpe.build("spiral_rope", head_dim=16, num_directions=2, max_freq=1.0)
    axial = vpe.build("rope_axial", head_dim=16, theta=10000, axis_order="ij")
    grid = Grid((4, 5), prefix=1)
    torch.testing.assert_close(two.rotations(grid), axial.rotations(grid))  # K = 2 is axial RoPE


def official_spiral_angles(n: int, pt: int, head_dim: int, rotate: int, max_freq=1.5, theta=10000.0) -> torch.Tensor:
    """The official ``VisionRotaryEmbedding(head_dim // 2, pt, rotate=rotate, max_freq_lang=max_freq,
    same_theta=False)`` angles, one per pair, ``(n * n, head_dim / 2)``: the y (rows) and x (columns) angle images of
    the geometric spectrum from ``max_freq`` down, positions ``i / n * pt``, every chunk ``i`` of 4 channels of each
    ``4 rotate`` turned by ``i * 90 / rotate`` degrees with ``affine_grid`` + ``grid_sample`` (bilinear, border,
    align_corners)."""
    dim = head_dim // 2
    low = max_freq / theta ** ((dim - 2) / dim)
    half = dim // 2
    freqs = low * (max_freq / low) ** (torch.arange(half - 1, -1, -1, dtype=torch.float64) / (half - 1))
    t = torch.arange(n, dtype=torch.float64) / n * pt
    line = torch.outer(t, freqs).repeat_interleave(2, -1)  # (n, dim), pairs repeated
    image = torch.cat([line[:, None].expand(n, n, dim), line[None].expand(n, n, dim)], -1)  # rows | columns
    image = image.reshape(n, n, -1, 4 * rotate).clone()
    for i in range(1, rotate):
        chunk = image[..., 4 * i:4 * (i + 1)].reshape(n, n, -1).permute(2, 0, 1)[None]
        a = math.radians(i * 90 / rotate)
        affine = torch.tensor([[[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]]],
                              dtype=torch.float64)
        sample = F.affine_grid(affine, list(chunk.shape), align_corners=True)
        turned = F.grid_sample(chunk, sample, mode="bilinear", padding_mode="border", align_corners=True)
        image[..., 4 * i:4 * (i + 1)] = turned[0].permute(1, 2, 0).reshape(n, n, -1, 4)
    return image.reshape(n * n, head_dim)[:, ::2]


def inside_after_turning(n: int, rotate: int) -> torch.Tensor:
    """``(n * n,)``: the patches whose turned coordinates stay inside the grid for every turn (no border clamp)."""
    rows, cols = rows_cols((n, n))
    yn, xn = 2 * rows / (n - 1) - 1, 2 * cols / (n - 1) - 1
    inside = torch.ones(n * n, dtype=torch.bool)
    for i in range(1, rotate):
        a = math.radians(i * 90 / rotate)
        for turned in (math.sin(a) * xn + math.cos(a) * yn, math.cos(a) * xn - math.sin(a) * yn):
            inside &= turned.abs() <= 1 + 1e-9
    return inside


@pytest.mark.parametrize("head_dim,rotate,n,pt", [(16, 2, 8, 8), (24, 2, 8, 8), (32, 4, 8, 8), (16, 2, 12, 8)])
def test_spiral_rope_matches_the_official_angle_images(head_dim, rotate, n, pt):
    """Relative angles (the scores see only these) equal the official ones on every patch whose turned coordinate
    stays inside the grid; at the corners the official border padding clamps them, which is not reproduced."""
    pe = vpe.build("spiral_rope", head_dim=head_dim, num_directions=2 * rotate, scaling="pi", ref_shape=(pt, pt))
    ours, official = pair_angles(pe, Grid((n, n))), official_spiral_angles(n, pt, head_dim, rotate)
    inside = inside_after_turning(n, rotate)
    reference = (n // 2) * n + n // 2  # an inside patch
    assert inside[reference] and inside.sum() < n * n
    difference = wrapped((ours - ours[reference]) - (official - official[reference]))
    assert difference[inside].abs().max() < 1e-4
    assert difference[~inside].abs().max() > 1e-2  # the official clamp at the corners


def test_spiral_rope_in_a_vit_interpolates_other_sizes():
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="spiral_rope", **VIT)
    rotary = model.blocks[0].attn.rotary
    assert rotary.scaling == "pi" and rotary.ref_shape == (4, 4)
    for size in (32, 48):
        out = model(torch.randn(2, 3, size, size))
        out.sum().backward()
        assert torch.isfinite(out).all()
    angles = pair_angles(rotary, Grid((6, 6)))  # 48 px: positions i * 4 / 6 (the official t = i / n * pt)
    rows, cols = rows_cols((6, 6))
    assert_same_turns(angles, spiral_angles(rows * 4 / 6, cols * 4 / 6, 12, 4))


# -- HARoPE ------------------------------------------------------------------------------------------------------------

def official_harope(q, k, pe, shape):
    """The official ``SVDBasedMatrix`` and DiT rotary, in float64: ``M = U diag(s) V^T``, ``M_inv = V diag(1/s)
    U^T`` with ``U, V = matrix_exp(skew)``, ``s = softplus(sigma) + 1e-6``; ``q @ M^T``, ``k @ M_inv``, then
    ``get_1d_rotary_pos_embed(head_dim / 2, ids[:, axis], theta=10000)`` per axis (rows then columns),
    ``repeat_interleave`` cos/sin on adjacent pairs. ``q, k: (B, heads, N, d)`` (no prefix: the DiT has none)."""
    def skew(a):
        return 0.5 * (a - a.transpose(-1, -2))

    u, v = torch.linalg.matrix_exp(skew(pe.A_u.double())), torch.linalg.matrix_exp(skew(pe.A_v.double()))
    s = F.softplus(pe.sigma.double()) + 1e-6
    m = u @ (s[..., None] * v.transpose(-1, -2))
    m_inv = v @ ((1.0 / s)[..., None] * u.transpose(-1, -2))
    q, k = q.double() @ m.transpose(-1, -2), k.double() @ m_inv
    axis_dim = pe.head_dim // 2
    freqs = 1.0 / 10000.0 ** (torch.arange(0, axis_dim, 2, dtype=torch.float64)[:axis_dim // 2] / axis_dim)
    rows, cols = rows_cols(shape)
    angles = torch.cat([torch.outer(rows, freqs), torch.outer(cols, freqs)], -1)
    return rotate_pairs(q, angles), rotate_pairs(k, angles)


def test_harope_matches_the_official_learned_map_and_rotation():
    torch.manual_seed(0)
    pe = randomised(vpe.build("harope", head_dim=8, num_heads=2), std=0.3)
    shape = (3, 4)
    q, k = torch.randn(2, 2, 2, 12, 8).unbind(0)
    ours = pe(q, k, Grid(shape))
    for got, expected in zip(ours, official_harope(q, k, pe, shape)):
        torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-5)
    assert pe.no_weight_decay() == {"A_u", "A_v", "sigma"}


def test_harope_starts_as_rope_and_stays_relative():
    torch.manual_seed(0)
    grid = Grid((3, 4), prefix=1)
    q, k = torch.randn(2, 1, 2, grid.num_tokens, 8).unbind(0)
    fresh = vpe.build("harope", head_dim=8, num_heads=2)
    rope = vpe.build("rope_axial", head_dim=8, theta=10000, axis_order="ij")
    for got, expected in zip(fresh(q, k, grid), rope(q, k, grid)):  # M = I at initialisation
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    pe = randomised(vpe.build("harope", head_dim=8, num_heads=2), std=0.3)
    scores = []
    for offset in [(0, 0), (2, 5)]:
        rq, rk = pe(q, k, Grid((3, 4), prefix=1, offset=offset))
        scores.append(rq @ rk.transpose(-1, -2))
    torch.testing.assert_close(scores[0][..., 1:, 1:], scores[1][..., 1:, 1:], atol=1e-4, rtol=1e-5)  # offsets only
    torch.testing.assert_close(scores[0][..., 0, 0], (q @ k.transpose(-1, -2))[..., 0, 0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(scores[0], (lambda r: r[0] @ r[1].transpose(-1, -2))(rope(q, k, grid)), atol=1e-3)
    one = pe.rotate(q, grid), pe.rotate(k, grid, side="key")
    for got, expected in zip(one, pe(q, k, grid)):
        torch.testing.assert_close(got, expected)


# -- ViT-5's register RoPE ---------------------------------------------------------------------------------------------

def official_vit5_angles(n: int, pt: int, head_dim: int, theta: float) -> torch.Tensor:
    """The official ``VisionRotaryEmbedding(head_dim // 2, pt, theta=theta)`` on an ``n x n`` grid, one angle per
    pair: ``1 / theta^(arange(0, dim, 2) / dim)``, ``dim = head_dim / 2``, at ``i / n * pt``, rows then columns."""
    dim = head_dim // 2
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[:dim // 2] / dim)
    t = torch.arange(n, dtype=torch.float64) / n * pt
    return torch.cat([torch.outer(t, freqs)[:, None].expand(n, n, -1),
                      torch.outer(t, freqs)[None].expand(n, n, -1)], -1).reshape(n * n, -1)


@pytest.mark.parametrize("n", [4, 6])
def test_vit5_rope_follows_the_official_model(n):
    """Class token unrotated, 4 registers on their own 2 x 2 grid at base 100, patches at base 10000 interpolated to
    the 4 x 4 training grid."""
    head_dim = 16
    pe = vpe.build("vit5_rope", head_dim=head_dim, num_registers=4, scaling="pi", ref_shape=(4, 4))
    grid = Grid((n, n), prefix=5)
    q = torch.randn(2, 3, grid.num_tokens, head_dim)
    expected = torch.cat([q[:, :, :1].double(), rotate_pairs(q[:, :, 1:5], official_vit5_angles(2, 2, head_dim, 100.0)),
                          rotate_pairs(q[:, :, 5:], official_vit5_angles(n, 4, head_dim, 10000.0))], 2)
    torch.testing.assert_close(pe.rotate(q, grid).double(), expected, atol=2e-5, rtol=1e-5)


def test_vit5_rope_takes_the_models_registers():
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="learned+vit5_rope", reg_tokens=4, no_embed_class=True, **VIT)
    rotary = model.blocks[0].attn.rotary
    assert rotary.num_registers == 4 and rotary.register_shape == (2, 2)
    assert model.pe_tokens.num_prefix_tokens == 0  # ViT-5's table covers the patches only
    for size in (32, 48):
        out = model(torch.randn(2, 3, size, size))
        out.sum().backward()
        assert out.shape == (2, 3) and torch.isfinite(out).all()
    model.eval()
    images = [torch.randn(3, 32, 40), torch.randn(3, 40, 32)]
    with torch.no_grad():
        torch.testing.assert_close(model.forward_batch(images), torch.cat([model(i[None]) for i in images]),
                                   atol=2e-5, rtol=2e-5)
        x = torch.randn(2, 3, 32, 32)
        torch.testing.assert_close(model.forward_masked(x, keep=torch.arange(16).expand(2, -1))[0],
                                   model.forward_features(x))
    plain = vpe.create_model("vit_tiny_patch16_224", pe="vit5_rope", **VIT).blocks[0].attn.rotary
    axial = vpe.build("rope_axial", head_dim=12, theta=10000, axis_order="ij", scaling="pi", ref_shape=(4, 4))
    assert plain.num_registers == 0  # a model without registers: the patches' RoPE alone, as the official model
    torch.testing.assert_close(plain.rotations(Grid((5, 5), prefix=1)), axial.rotations(Grid((5, 5), prefix=1)))


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_vit5_rope_with_registers_compiles_as_one_graph():
    torch._dynamo.reset()
    model = vpe.create_model("vit_tiny_patch16_224", pe="learned+vit5_rope", reg_tokens=4, **VIT).eval()
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="eager")(x), model(x),
                                   atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


# -- RIFLEx ------------------------------------------------------------------------------------------------------------

def test_riflex_finds_the_official_intrinsic_bands():
    """``identify_k``'s example (HunyuanVideo: b = 256, 16 time channels, repetition at 48 latent frames -> k = 4,
    N_k = 50) and the README's two choices from the training length (33 latent frames; CogVideoX-5B: 13 latent
    frames at b = 10000 -> k = 2, N_k = 20)."""
    hunyuan = band_periods(8, 256.0)
    assert hunyuan == [6, 13, 25, 50, 101, 201, 402, 804]
    assert intrinsic_band(hunyuan, repetition_frame=48) == 4
    assert intrinsic_band(hunyuan, train_frames=33) == 4
    cogvideox = band_periods(8, 10000.0)
    assert cogvideox[:3] == [6, 20, 63]
    assert intrinsic_band(cogvideox, train_frames=13) == 2
    pe = vpe.build("riflex", head_dim=48, sections=(8, 8, 8), theta=256, ref_shape=(33, 4, 4))
    assert pe.intrinsic() == (4, 50)
    assert vpe.build("riflex", head_dim=48, sections=(8, 8, 8), theta=256, ref_shape=(33, 4, 4),
                     repetition_frame=110).intrinsic() == (5, 101)
    assert vpe.build("riflex", head_dim=48, sections=(8, 8, 8), theta=256, ref_shape=(33, 4, 4),
                     intrinsic_index=2).intrinsic() == (2, 13)


def official_riflex_time_angles(frames: int, dim: int, theta: float, k: int | None, test_frames: int):
    """``get_1d_rotary_pos_embed_riflex(dim, frames, theta, k=k, L_test=test_frames)``'s angles: ``freqs = 1 /
    theta^(arange(0, dim, 2) / dim)``, ``freqs[k - 1] = 0.9 * 2 pi / L_test``, times the frame index."""
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[:dim // 2] / dim)
    if k is not None:
        freqs[k - 1] = 0.9 * 2 * math.pi / test_frames
    return torch.outer(torch.arange(frames, dtype=torch.float64), freqs)


@pytest.mark.parametrize("frames,side,lowered", [(33, 4, False), (45, 4, False), (66, 4, True), (99, 8, True)])
def test_riflex_lowers_the_intrinsic_band_past_its_period(frames, side, lowered):
    """Time: the official RIFLEx angles (band 4 at ``0.9 * 2 pi / L`` once ``L > N_k = 50``, never interpolated);
    space: RoPE interpolated to the 4 x 4 training grid."""
    pe = vpe.build("riflex", head_dim=48, sections=(8, 8, 8), theta=256, ref_shape=(33, 4, 4), scaling="pi")
    grid = Grid((frames, side, side))
    angles = pair_angles(pe, grid)  # axis_order "xy": pairs x, y, then t
    time = official_riflex_time_angles(frames, 16, 256.0, 4 if lowered else None, frames)
    assert_same_turns(angles[:, 16:], time.repeat_interleave(side * side, 0))
    t, y, x = Grid((frames, side, side)).coords(dtype=torch.float64).unbind(-1)
    w = 256.0 ** -(torch.arange(8, dtype=torch.float64) / 8)
    space = torch.cat([x[:, None] * 4 / side * w, y[:, None] * 4 / side * w], -1)
    assert_same_turns(angles[:, :16], space)
    axial = vpe.build("rope_axial", head_dim=48, ndim=3, sections=(8, 8, 8), theta=256, ref_shape=(33, 4, 4),
                      scaling="pi")
    same = torch.equal(pe.rotations(Grid((frames, 4, 4))), axial.rotations(Grid((frames, 4, 4))))
    assert same is (frames == 33)  # only the training clip is plain (PI) RoPE: RIFLEx never interpolates time


def test_riflex_in_a_video_model_at_a_longer_clip():
    torch.manual_seed(0)
    model = vpe.create_video_model("vit_tiny_patch16_224", pe="riflex", pe_kwargs={"theta": 10.0}, num_frames=4,
                                   img_size=16, tubelet_size=(2, 4, 4), embed_dim=24, num_heads=2, depth=1,
                                   num_classes=3)
    rotary = model.blocks[0].attn.rotary
    assert rotary.ref_shape == (2, 4, 4) and rotary.intrinsic() == (1, 6)  # theta 10, 2 time bands: periods 6, 20
    for frames in (4, 16):
        out = model(torch.randn(1, 3, frames, 16, 16))
        out.sum().backward()
        assert torch.isfinite(out).all()
    angles = pair_angles(rotary, Grid((8, 4, 4)))  # 8 tubelets > 6: band 1 at 0.9 * 2 pi / 8
    t = Grid((8, 4, 4)).coords(dtype=torch.float64)[:, 0]
    assert_same_turns(angles[:, 4], t * 0.9 * 2 * math.pi / 8)


# -- PaPE and PaPE-RI --------------------------------------------------------------------------------------------------

def image_positions(shape, prefix: int = 1) -> torch.Tensor:
    """The official image model's positions ``(P + N, 2)``: patches ``(column, row)`` from 1, the class token at
    ``(0, 0)``."""
    rows, cols = rows_cols(shape)
    return torch.cat([torch.zeros(prefix, 2, dtype=torch.float64), torch.stack([cols + 1, rows + 1], -1)])


def official_pape_logits(pe, q, k, x, positions) -> torch.Tensor:
    """The official ``ParabolicPositionEncoder.encode_query_key`` then ``q @ k^T * head_size^-0.5``, float64:
    ``position`` (``num_positions -> heads * M``) and ``ab`` (``hidden -> 2 * heads * M``, viewed ``(B, L, 2, heads,
    M)``) concatenated to q and k as ``[q, a . -p^2, a, 2 a p, b . p, b]`` and ``[k, 1, -p^2, p, 1, -p]``."""
    batch, heads, length, _ = q.shape
    m = pe.num_parabolas
    p = (positions @ pe.position.weight.double().T).view(1, length, heads, m).permute(0, 2, 1, 3).expand(batch, -1, -1,
                                                                                                       -1)
    ab = (x.double() @ pe.ab.weight.double().T).view(batch, length, 2, heads, m).permute(2, 0, 3, 1, 4)
    a, b = F.softplus(ab[0]), ab[1]
    ones = torch.ones(batch, heads, length, 1, dtype=torch.float64)
    query = torch.cat([q.double(), (a * -p ** 2).sum(-1, keepdim=True), a, a * 2 * p, (b * p).sum(-1, keepdim=True),
                       b], -1)
    key = torch.cat([k.double(), ones, -p ** 2, p, ones, -p], -1)
    return query @ key.transpose(-1, -2) * pe.head_dim ** -0.5


def official_pape_ri_logits(pe, q, k, x, positions) -> torch.Tensor:
    """The official ``ParabolicRotationInvariantPositionEncoder``: positions times a fixed scale per head, ``a =
    softplus(hidden @ A^T)`` per head, ``[q, a . -p^2, a..., 2 a p]`` and ``[k, 1, -p^2, p]``."""
    batch, heads, length, _ = q.shape
    p = positions[None, None] * pe.position_scales.double().view(1, heads, 1, 1)
    p = p.expand(batch, -1, -1, -1)
    a = F.softplus((x.double() @ pe.a.weight.double().T).view(batch, length, heads).transpose(1, 2))
    a = a[..., None].expand(-1, -1, -1, positions.shape[-1])
    ones = torch.ones(batch, heads, length, 1, dtype=torch.float64)
    query = torch.cat([q.double(), (a * -p ** 2).sum(-1, keepdim=True), a, a * 2 * p], -1)
    key = torch.cat([k.double(), ones, -p ** 2, p], -1)
    return query @ key.transpose(-1, -2) * pe.head_dim ** -0.5


def visionpe_logits(pe, q, k, x, grid) -> torch.Tensor:
    return q.double() @ k.double().transpose(-1, -2) * pe.head_dim ** -0.5 + pe(grid, x).double()


@pytest.mark.parametrize("name,official", [("pape", official_pape_logits), ("pape_ri", official_pape_ri_logits)])
def test_pape_matches_the_official_query_key_extension(name, official):
    torch.manual_seed(0)
    kw = {"num_parabolas": 5} if name == "pape" else {}
    pe = randomised(vpe.build(name, dim=16, num_heads=2, head_dim=8, **kw), std=0.3)
    shape = (3, 4)
    grid = Grid(shape, prefix=1)
    q, k = torch.randn(2, 2, 2, grid.num_tokens, 8).unbind(0)
    x = torch.randn(2, grid.num_tokens, 16)
    expected = official(pe, q, k, x, image_positions(shape))
    torch.testing.assert_close(visionpe_logits(pe, q, k, x, grid), expected, atol=1e-4, rtol=1e-5)


def test_pape_video_reads_time_rows_columns_as_the_official_video_model():
    """The official video model's positions are (t, y, x) from 1, the class token at 0: ``axis_order="ij"``."""
    torch.manual_seed(0)
    pe = randomised(vpe.build("pape", dim=16, num_heads=2, head_dim=8, ndim=3, num_parabolas=3, axis_order="ij"))
    shape = (2, 2, 3)
    grid = Grid(shape, prefix=1)
    q, k = torch.randn(2, 1, 2, grid.num_tokens, 8).unbind(0)
    x = torch.randn(1, grid.num_tokens, 16)
    positions = torch.cat([torch.zeros(1, 3, dtype=torch.float64), Grid(shape).coords(dtype=torch.float64) + 1])
    torch.testing.assert_close(visionpe_logits(pe, q, k, x, grid), official_pape_logits(pe, q, k, x, positions),
                               atol=1e-4, rtol=1e-5)


def test_pape_is_its_formula():
    """``bias_h(i, j) = s sum_m [-a_im (u_im - u_jm)^2 + b_im (u_im - u_jm)]``, ``u = W c``, ``a = softplus``."""
    torch.manual_seed(0)
    pe = randomised(vpe.build("pape", dim=8, num_heads=2, head_dim=8, num_parabolas=3), std=0.3)
    shape = (3, 4)
    grid = Grid(shape, prefix=1)
    x = torch.randn(2, grid.num_tokens, 8)
    rows, cols = rows_cols(shape)
    c = torch.cat([torch.tensor([[-1.0, -1.0]], dtype=torch.float64), torch.stack([cols, rows], -1)])  # corner first
    u = (c @ pe.position.weight.double().T).view(-1, 2, 3)  # (T, heads, M)
    ab = (x.double() @ pe.ab.weight.double().T).view(2, -1, 2, 2, 3)
    a, b = F.softplus(ab[:, :, 0]), ab[:, :, 1]  # (B, T, heads, M)
    d = u[:, None] - u[None]  # (T, T, heads, M): u_i - u_j
    bias = (-a[:, :, None] * d ** 2 + b[:, :, None] * d).sum(-1).permute(0, 3, 1, 2) * 8 ** -0.5
    torch.testing.assert_close(pe(grid, x).double(), bias, atol=1e-4, rtol=1e-5)
    zero = -math.log(2) * (d ** 2).sum(-1).permute(2, 0, 1)[:, 1:, 1:] * 8 ** -0.5  # a = softplus(0), b = 0
    torch.testing.assert_close(pe.pair_map(Grid(shape)).double(), zero, atol=1e-4, rtol=1e-5)


def test_pape_depends_on_offsets_and_content_and_extends_to_larger_grids():
    torch.manual_seed(0)
    for name in ("pape", "pape_ri"):
        pe = randomised(vpe.build(name, dim=8, num_heads=2, head_dim=8, **({"num_parabolas": 4} if name == "pape"
                                                                              else {})))
        small, big = Grid((3, 4), prefix=1), Grid((5, 6), prefix=1)
        x_big = torch.randn(1, big.num_tokens, 8)
        inside = torch.cat([torch.zeros(1, dtype=torch.long),
                            1 + torch.tensor([r * 6 + c for r in range(3) for c in range(4)])])  # the (3, 4) corner
        with torch.no_grad():
            on_small, on_big = pe(small, x_big[:, inside]), pe(big, x_big)
            torch.testing.assert_close(on_small, on_big[:, :, inside][:, :, :, inside], atol=1e-4, rtol=1e-5)
            shifted = pe(Grid((3, 4), prefix=1, offset=(7, -2)), x_big[:, inside])
            torch.testing.assert_close(shifted, on_small, atol=1e-4, rtol=1e-5)  # offsets only
            assert not torch.allclose(pe(small, torch.randn(1, small.num_tokens, 8)), on_small)  # and content
        assert pe.adaptation_label() == "parabolas over the new grid's offsets (no adaptation)"


def test_pape_ri_is_rotation_invariant_and_pape_is_not():
    torch.manual_seed(0)
    grid = Grid((3, 3))
    x = torch.randn(1, 9, 8)
    centre, around = 4, [1, 3, 5, 7]  # up, left, right, down of the centre patch
    for name, invariant in (("pape_ri", True), ("pape", False)):
        pe = randomised(vpe.build(name, dim=8, num_heads=2, head_dim=8))
        with torch.no_grad():
            row = pe(grid, x)[0, :, centre, around]
        assert torch.allclose(row, row[:, :1].expand_as(row), atol=1e-5) is invariant


def test_pape_prefix_positions():
    torch.manual_seed(0)
    grid = Grid((2, 3), prefix=2)
    x = torch.randn(2, grid.num_tokens, 8)
    none = randomised(vpe.build("pape", dim=8, num_heads=2, head_dim=8, prefix_position="none"))
    bias = none(grid, x)
    assert bias[:, :, :2].abs().max() == 0 and bias[:, :, :, :2].abs().max() == 0 and bias[:, :, 2:].abs().max() > 0
    corner = vpe.build("pape", dim=8, num_heads=2, head_dim=8)
    corner.load_state_dict(none.state_dict())
    on_corner = corner(grid, x)
    torch.testing.assert_close(on_corner[:, :, 2:, 2:], bias[:, :, 2:, 2:])
    # a prefix token sits one step before patch (0, 0): its bias on a key equals a patch query's at that offset
    torch.testing.assert_close(on_corner[:, :, 0, 1], torch.zeros_like(on_corner[:, :, 0, 1]))  # same position
    assert on_corner[:, :, 0, 2:].abs().max() > 0


def test_pape_reads_kept_tokens_in_their_order():
    torch.manual_seed(0)
    pe = randomised(vpe.build("pape", dim=8, num_heads=2, head_dim=8, num_parabolas=3))
    grid = Grid((3, 4), prefix=1)
    keep = torch.tensor([[5, 0, 11], [2, 7, 3]])
    layout = Layout(grid, keep)
    x = torch.randn(2, grid.num_tokens, 8)
    index = layout.token_index()
    kept = x.gather(1, index[..., None].expand(-1, -1, 8))
    with torch.no_grad():
        full = pe(grid, x)
        expected = torch.stack([full[b][:, index[b]][:, :, index[b]] for b in range(2)])
        torch.testing.assert_close(pe(layout, kept), expected, atol=1e-5, rtol=1e-5)


# -- in the models -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pe", ["spiral_rope", "harope", "vit5_rope", "pape", "pape_ri"])
def test_each_trains_in_a_vit_at_two_sizes(pe):
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, **VIT)
    for size in [(32, 32), (48, 40)]:
        model.zero_grad()
        out = model(torch.randn(2, 3, *size))
        out.sum().backward()
        assert out.shape == (2, 3) and torch.isfinite(out).all()
        encodings = sum(vpe.encodings_of(model).values(), [])
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for e in encodings for p in e.parameters())


def test_where_they_have_no_meaning_they_refuse():
    swin = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2), num_classes=3)
    with pytest.raises(ValueError, match="riflex is defined on .T, H, W. grids"):
        vpe.create_model("swin_tiny_patch4_window7_224", pe="riflex", **swin)
    video_swin = pytest.importorskip("torchvision.models.video.swin_transformer")
    model = video_swin.SwinTransformer3d(patch_size=[2, 4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2],
                                         window_size=[2, 4, 4], num_classes=3)
    with pytest.raises(ValueError, match="spiral_rope turns frequency directions in the image plane"):
        vpe.apply(model, "spiral_rope")
    windows = vpe.create_model("swin_tiny_patch4_window7_224", pe="vit5_rope", **swin)
    assert {m.num_registers for m in vpe.encodings_of(windows)["rotary"]} == {0}  # windows hold no registers


DOC = Path(__file__).resolve().parents[2] / "docs" / "encodings.md"


BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_the_guides_code_blocks_run(block):
    """Every code block of docs/encodings.md runs as it is."""
    exec(compile(block, str(DOC), "exec"), {})
