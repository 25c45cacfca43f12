"""The late-2025 wave of encodings against their formulas (closed forms written here, in float64, from each paper and
its official code's conventions) and their defining property: V2PE, Circle-RoPE; then everywhere the other encodings
go (ViT at other sizes, kept tokens, mixed batches, Layout subsets, video where 3D, torch.compile); every
visualization kind and the CLI come from the registry-wide tests (tests/viz, tests/cli/test_every_script.py)."""
import math

import pytest
import torch
from conftest import requires

import visionpe as vpe
from visionpe import Grid
from visionpe.grid import Layout

VIT = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=3)
VIDEO = dict(num_frames=4, img_size=16, tubelet_size=(2, 4, 4), embed_dim=24, num_heads=2, depth=1, num_classes=3)


def pair_angles(pe, grid) -> torch.Tensor:
    """The angle of each pair of each patch in a rotary module's table, ``(N, pairs)`` (heads shared)."""
    rotations = pe.rotations(grid)[0, grid.prefix:].double()
    return torch.atan2(rotations[..., 1], rotations[..., 0])


def assert_same_turns(got: torch.Tensor, expected: torch.Tensor, atol: float = 2e-5) -> None:
    """Equal rotations: the same cos and sin (angles equal modulo 2 pi)."""
    torch.testing.assert_close(got.cos(), expected.cos(), atol=atol, rtol=0)
    torch.testing.assert_close(got.sin(), expected.sin(), atol=atol, rtol=0)


def scores(pe, grid, seed: int = 0) -> torch.Tensor:
    """``q_i . k_j`` of one random q and k (the same vector at every token) rotated by ``pe``: ``(N, N)``."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 1, 1, pe.head_dim, generator=g).expand(-1, 1, 1, grid.num_tokens, -1).unbind(0)
    q, k = pe(q.contiguous(), k.contiguous(), grid)
    return (q @ k.transpose(-1, -2))[0, 0, grid.prefix:, grid.prefix:]


# -- V2PE --------------------------------------------------------------------------------------------------------------

def v2pe_angles(shape, head_dim: int, step: float, theta: float) -> torch.Tensor:
    """The paper's positions: patch ``n`` of the raster order at ``step * n``; 1D RoPE ``theta^(-p/P)``."""
    n = torch.arange(math.prod(shape), dtype=torch.float64)
    pairs = head_dim // 2
    return step * n[:, None] * theta ** -(torch.arange(pairs, dtype=torch.float64) / pairs)


@pytest.mark.parametrize("shape,step", [((3, 5), 1 / 16), ((4, 4), 1.0), ((2, 3, 4), 1 / 256)])
def test_v2pe_is_its_formula(shape, step):
    pe = vpe.build("v2pe", head_dim=12, ndim=len(shape), step=step)
    assert_same_turns(pair_angles(pe, Grid(shape, prefix=1)), v2pe_angles(shape, 12, step, 10000.0))
    assert torch.equal(pe.rotations(Grid(shape, prefix=1))[0, 0], torch.tensor([[1.0, 0.0]] * 6))  # prefix: identity


def test_v2pe_is_relative_in_the_raster_index():
    """A grid shifted by any offset moves every patch's raster index by one constant: scores unchanged; and a score
    depends on the offset only through ``dy W + dx`` (one row down is ``W`` columns on)."""
    pe = vpe.build("v2pe", head_dim=16, step=0.25, theta=100.0)
    base = scores(pe, Grid((3, 5), prefix=1))
    torch.testing.assert_close(scores(pe, Grid((3, 5), prefix=1, offset=(2.0, 7.0))), base, atol=1e-5, rtol=1e-5)
    index = lambda y, x: 5 * y + x  # noqa: E731
    torch.testing.assert_close(base[index(0, 0), index(1, 0)], base[index(1, 3), index(2, 3)])  # one row down
    torch.testing.assert_close(base[index(0, 4), index(1, 0)], base[index(0, 0), index(0, 1)])  # dy W + dx = 1
    assert not torch.allclose(base[index(0, 0), index(1, 0)], base[index(0, 0), index(0, 1)])


def test_v2pe_refuses_a_step_outside_zero_to_one():
    for step in (0.0, 1.5, -0.25):
        with pytest.raises(ValueError, match="step"):
            vpe.build("v2pe", head_dim=8, step=step)
    for choices in ((), (0.5, 2.0), "1/2", 0.5):
        with pytest.raises(ValueError, match="step_choices"):
            vpe.build("v2pe", head_dim=8, step_choices=choices)


def turned_unit_pairs(pe, grid, training: bool) -> torch.Tensor:
    """The angle each pair of each patch is turned by in ``pe``'s forward (q made of unit pairs ``(1, 0)``)."""
    q = torch.tensor([1.0, 0.0]).repeat(pe.head_dim // 2).expand(1, 1, grid.num_tokens, -1).contiguous()
    q, _ = pe.train(training)(q, q, grid)
    q = q[0, 0, grid.prefix:].double().unflatten(-1, (-1, 2))
    return torch.atan2(q[..., 1], q[..., 0])


def test_v2pe_training_draws_the_step_from_its_choices_and_evaluation_keeps_the_fixed_one():
    """In training mode patch ``n`` sits at ``delta * n``, ``delta`` drawn from ``step_choices`` by torch's default
    generator (the same draw written here from the same seed); in evaluation mode at ``step * n`` whatever the RNG."""
    choices, shape = (1 / 2, 1 / 8, 1 / 64), (3, 4)
    pe = vpe.build("v2pe", head_dim=12, step=1 / 4, step_choices=choices)
    grid, drawn = Grid(shape, prefix=1), set()
    for seed in range(6):
        torch.manual_seed(seed)
        delta = choices[torch.randint(len(choices), ()).item()]
        drawn.add(delta)
        torch.manual_seed(seed)
        assert_same_turns(turned_unit_pairs(pe, grid, training=True), v2pe_angles(shape, 12, delta, 10000.0))
        torch.manual_seed(seed)
        assert_same_turns(turned_unit_pairs(pe, grid, training=False), v2pe_angles(shape, 12, 1 / 4, 10000.0))
    assert len(drawn) > 1  # a draw, not one fixed value
    fixed = vpe.build("v2pe", head_dim=12, step=1 / 4)  # no choices: the fixed step in training too
    assert_same_turns(turned_unit_pairs(fixed, grid, training=True), v2pe_angles(shape, 12, 1 / 4, 10000.0))


def test_v2pe_draws_one_step_per_model_forward_for_every_block():
    """A training forward of a 2-block ViT is the evaluation forward of the same weights at the one drawn step."""
    choices = (1.0, 1 / 4, 1 / 16)
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="v2pe", pe_kwargs={"step_choices": choices}, **VIT).train()
    x = torch.randn(1, 3, 16, 16)
    for seed in range(3):
        torch.manual_seed(seed)
        delta = choices[torch.randint(len(choices), ()).item()]
        fixed = vpe.create_model("vit_tiny_patch16_224", pe="v2pe", pe_kwargs={"step": delta}, **VIT).eval()
        fixed.load_state_dict(model.state_dict())
        torch.manual_seed(seed)
        with torch.no_grad():
            torch.testing.assert_close(model(x), fixed(x))


# -- Circle-RoPE -------------------------------------------------------------------------------------------------------

def circle_points(shape, radius: float, alpha: float) -> torch.Tensor:
    """The paper's circular image token projection, patch by patch: ``(N, 3)`` as (t, h, w) components."""
    rows, cols = shape
    points = []
    angles = [math.atan2(y - (rows - 1) / 2, x - (cols - 1) / 2) for y in range(rows) for x in range(cols)]
    low, high = min(angles), max(angles)
    u = (-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0)
    v = (-1 / math.sqrt(6), -1 / math.sqrt(6), 2 / math.sqrt(6))
    for n, angle in enumerate(angles):
        phi = alpha * (angle - low) / (high - low) * 2 * math.pi + (1 - alpha) * 2 * math.pi * n / (rows * cols)
        a, b = radius * math.cos(phi), radius * math.sin(phi)
        w, h, t = (a * u[i] + b * v[i] for i in range(3))
        points.append((t, h, w))
    return torch.tensor(points, dtype=torch.float64)


def mrope_angles(points: torch.Tensor, sections, theta: float) -> torch.Tensor:
    """M-RoPE's chunks of one spectrum: pair ``p`` turns with the component whose chunk holds it."""
    pairs = sum(sections)
    component = torch.repeat_interleave(torch.arange(3), torch.tensor(sections))
    w = theta ** -(torch.arange(pairs, dtype=torch.float64) / pairs)
    return points[:, component] * w


@pytest.mark.parametrize("shape,radius,alpha,sections", [((3, 4), 10.0, 0.5, (2, 2, 2)), ((4, 4), 3.0, 0.0, (2, 2, 2)),
                                                         ((2, 5), 10.0, 1.0, (4, 1, 1))])
def test_circle_rope_is_its_formula(shape, radius, alpha, sections):
    pe = vpe.build("circle_rope", head_dim=12, radius=radius, alpha=alpha, sections=sections)
    expected = mrope_angles(circle_points(shape, radius, alpha), sections, 100.0)
    assert_same_turns(pair_angles(pe, Grid(shape, prefix=1)), expected)


def test_circle_rope_puts_every_patch_on_a_ring_orthogonal_to_the_text_axis():
    """The defining property: all patches at distance ``R`` from the text axis's origin, in the plane orthogonal to
    ``(1, 1, 1)``, so every text position ``(p, p, p)`` is equidistant from all of them (per-token distance 0)."""
    pe = vpe.build("circle_rope", head_dim=12, radius="auto")
    grid = Grid((5, 7))
    points = pe.place(grid.coords(dtype=torch.float64), grid, None)
    torch.testing.assert_close(points.norm(dim=-1), torch.full((35,), 3.0, dtype=torch.float64))  # auto: (7 - 1) / 2
    torch.testing.assert_close(points.sum(-1), torch.zeros(35, dtype=torch.float64), atol=1e-12, rtol=0)
    for p in (-2.0, 0.0, 5.0):
        distance = (points - p).norm(dim=-1)
        torch.testing.assert_close(distance, distance[:1].expand(35))


def test_circle_rope_is_not_relative():
    """Two patch pairs with the same grid offset get different scores (the ring is spread over the grid), and a
    shifted grid keeps its scores (the ring is centred on the grid's own patches)."""
    pe = vpe.build("circle_rope", head_dim=12)
    base = scores(pe, Grid((4, 4), prefix=1))
    assert not torch.allclose(base[0, 1], base[5, 6], atol=1e-3)
    torch.testing.assert_close(scores(pe, Grid((4, 4), prefix=1, offset=(3.0, 1.0))), base)


def test_circle_rope_refuses_what_it_does_not_define():
    with pytest.raises(ValueError, match="circle_rope places the patches of an image grid on a ring"):
        vpe.build("circle_rope", head_dim=12, ndim=3)
    with pytest.raises(ValueError, match="radius='big'"):
        vpe.build("circle_rope", head_dim=12, radius="big")
    with pytest.raises(ValueError, match="sections"):
        vpe.build("circle_rope", head_dim=12, sections=(1, 1, 1))


def test_circle_rope_grid_placement_is_mrope_on_the_plain_grid():
    """AGE's other layers: ``placement="grid"`` puts patch ``(h, w)`` at ``(t', h', w') = (0, h, w)`` under the same
    M-RoPE rotation, relative in the grid (a shifted grid keeps its scores, one pair offset scores alike)."""
    shape, sections = (3, 4), (2, 2, 2)
    pe = vpe.build("circle_rope", head_dim=12, sections=sections, placement="grid")
    rows, cols = torch.meshgrid(torch.arange(3.0), torch.arange(4.0), indexing="ij")
    points = torch.stack([torch.zeros(12), rows.flatten(), cols.flatten()], -1).double()
    assert_same_turns(pair_angles(pe, Grid(shape, prefix=1)), mrope_angles(points, sections, 100.0))
    base = scores(pe, Grid((4, 4)))
    torch.testing.assert_close(base[0, 5], base[10, 15], atol=1e-5, rtol=1e-5)  # the same offset (1, 1)
    with pytest.raises(ValueError, match="placement='ring'"):
        vpe.build("circle_rope", head_dim=12, placement="ring")


@pytest.mark.parametrize("pattern,expected", [("alternate", ("circle", "grid", "circle", "grid")),
                                              ("circle_first", ("circle", "circle", "grid", "grid")),
                                              ("grid_first", ("grid", "grid", "circle", "circle")),
                                              (["grid", "circle", "circle", "grid"], ("grid", "circle", "circle", "grid"))])
def test_alternate_geometry_places_each_block_as_the_official_strategies(pattern, expected):
    """The official AGE_index_dict (strategy_4: the ring in layers 0, 2, ...; strategy_2: first half; strategy_3:
    second half) on a 4-block ViT: each block's table is its placement's closed form, and the forward uses them."""
    torch.manual_seed(0)
    kw = {**VIT, "depth": 4}
    model = vpe.create_model("vit_tiny_patch16_224", pe="circle_rope", **kw).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ring_only = model(x)
        assert vpe.rotary.circle_rope.alternate_geometry(model, pattern) == expected
        mixed = model(x)
    assert not torch.allclose(ring_only, mixed, atol=1e-6, rtol=0)  # the grid blocks rotate otherwise
    grid, sections = Grid((4, 4), prefix=1), model.blocks[0].attn.rotary.sections
    rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij")
    plain = torch.stack([torch.zeros(16), rows.flatten(), cols.flatten()], -1).double()
    for block, placement in zip(model.blocks, expected):
        points = circle_points((4, 4), 10.0, 0.5) if placement == "circle" else plain
        assert_same_turns(pair_angles(block.attn.rotary, grid), mrope_angles(points, sections, 100.0))
    model.train()(x).sum().backward()


def test_alternate_geometry_refuses_what_it_cannot_place():
    model = vpe.create_model("vit_tiny_patch16_224", pe="circle_rope", **VIT)
    for pattern in ("every_other", ["circle"], ["circle", "ring"]):
        with pytest.raises(ValueError, match="pattern="):
            vpe.rotary.circle_rope.alternate_geometry(model, pattern)
    with pytest.raises(ValueError, match="needs a model patched with pe='circle_rope'"):
        vpe.rotary.circle_rope.alternate_geometry(vpe.create_model("vit_tiny_patch16_224", pe="rope_axial", **VIT))


# -- HoPE --------------------------------------------------------------------------------------------------------------

def hope_angles(shape, head_dim: int, gamma: float = 1.0, theta: float = 10000.0) -> torch.Tensor:
    """The paper's hybrid allocation on VideoRoPE's diagonal layout with stride ``gamma``: one spectrum, h and w
    alternating from the highest frequency over all but the last quarter of the pairs (rounded down), which stay at
    zero frequency; patch ``(t, h, w)`` at ``(gamma t, h + gamma t, w + gamma t)``; ``(N, pairs)``."""
    pairs = head_dim // 2
    coords = Grid(tuple(shape)).coords(dtype=torch.float64)
    shift = gamma * coords[:, 0] if len(shape) == 3 else 0.0
    h, w = coords[:, -2] + shift, coords[:, -1] + shift
    angles = torch.zeros(coords.shape[0], pairs, dtype=torch.float64)
    for p in range(pairs - pairs // 4):
        angles[:, p] = (h if p % 2 == 0 else w) * theta ** -(p / pairs)
    return angles


@pytest.mark.parametrize("shape,head_dim,gamma", [((3, 4, 5), 16, 1.0), ((2, 3, 3), 12, 0.75), ((4, 6), 24, 1.5)])
def test_hope_is_its_formula(shape, head_dim, gamma):
    pe = vpe.build("hope", head_dim=head_dim, ndim=len(shape), temporal_scale=gamma)
    assert_same_turns(pair_angles(pe, Grid(shape, prefix=1)), hope_angles(shape, head_dim, gamma))


def test_hope_time_turns_nothing_but_shifts_space_along_the_diagonal():
    """The defining property: the temporal pairs never turn (zero frequency), so time reaches a score only through
    the diagonal layout: with gamma = 1 a key one frame later at (h - 1, w - 1) scores as the same-frame key at
    (h, w); and shifting the clip keeps every score (relative)."""
    pe = vpe.build("hope", head_dim=16)
    grid = Grid((2, 3, 3), prefix=1)
    assert torch.equal(pe.rotations(grid)[0, :, 6:], torch.tensor([1.0, 0.0]).expand(grid.num_tokens, 2, 2))
    base = scores(pe, grid).reshape(2, 3, 3, 2, 3, 3)  # (query t, h, w, key t, h, w)
    torch.testing.assert_close(base[0, 0, 0, 1, :2, :2], base[0, 0, 0, 0, 1:, 1:])
    torch.testing.assert_close(scores(pe, Grid((2, 3, 3), prefix=1, offset=(5.0, 1.0, 2.0))), scores(pe, grid))
    slower = vpe.build("hope", head_dim=16, temporal_scale=0.5)
    assert not torch.allclose(scores(slower, grid), scores(pe, grid))


# -- DyPE --------------------------------------------------------------------------------------------------------------

def axial_xy_angles(shape, bands: int, theta: float, freqs_scale=None, positions_scale=(1.0, 1.0)) -> torch.Tensor:
    """2D axial RoPE, x pairs first: ``(N, 2 bands)``; ``freqs_scale (2, bands)`` multiplies the frequencies,
    ``positions_scale`` divides x and y."""
    coords = Grid(tuple(shape)).coords(dtype=torch.float64)
    w = theta ** -(torch.arange(bands, dtype=torch.float64) / bands)
    scale = torch.ones(2, bands, dtype=torch.float64) if freqs_scale is None else freqs_scale
    x, y = coords[:, 1] / positions_scale[0], coords[:, 0] / positions_scale[1]
    return torch.cat([x[:, None] * w * scale[0], y[:, None] * w * scale[1]], -1)


@pytest.mark.parametrize("t", [0.0, 0.3, 0.7, 1.0])
def test_dype_schedule_is_the_papers_formula(t):
    """Eq. 13: kappa(t) = lambda_s t^lambda_t (1 at the noise end for lambda_s = 1, 0 at the clean end); Dy-YaRN
    uses lambda_s = 1 (Eq. 17)."""
    assert vpe.rotary.dype.dype_schedule(t, 2.0, 2.0) == pytest.approx(2.0 * t ** 2)
    assert vpe.rotary.dype.dype_schedule(t, 1.5, 0.5) == pytest.approx(1.5 * math.sqrt(t))
    for method, kappa in [("pi", 2.0 * t ** 2), ("ntk", 2.0 * t ** 2), ("yarn", t ** 2)]:
        assert vpe.build("dype", head_dim=8, scaling=method, ref_shape=(2, 2), timestep=t).kappa() == \
            pytest.approx(kappa)


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
def test_dype_pi_and_ntk_are_their_formulas(t):
    """Eq. 14: positions m / s^kappa; Eq. 15: band i of n at w_i s^(-kappa i / (n - 1)); s per axis."""
    shape, ref, bands = (8, 6), (4, 4), 4
    kappa = 2.0 * t ** 2
    sx, sy = 6 / 4, 8 / 4
    pi = vpe.build("dype", head_dim=16, scaling="pi", ref_shape=ref, timestep=t)
    expected = axial_xy_angles(shape, bands, 100.0, positions_scale=(sx ** kappa, sy ** kappa))
    assert_same_turns(pair_angles(pi, Grid(shape, prefix=1)), expected)
    ntk = vpe.build("dype", head_dim=16, scaling="ntk", ref_shape=ref, timestep=t)
    fraction = torch.arange(bands, dtype=torch.float64) / (bands - 1)
    scale = torch.stack([sx ** (-kappa * fraction), sy ** (-kappa * fraction)])
    assert_same_turns(pair_angles(ntk, Grid(shape, prefix=1)), axial_xy_angles(shape, bands, 100.0, scale))


@pytest.mark.parametrize("t", [0.0, 0.4, 1.0])
def test_dype_yarn_is_its_formula(t):
    """Eq. 16-17: YaRN's ramp over r = L w / (2 pi) with thresholds alpha t^lambda_t, beta t^lambda_t; the attention
    factor 0.1 ln s + 1 (s the geometric mean of the axes' ratios) on every rotation."""
    shape, ref, bands, alpha, beta = (16, 12), (4, 4), 4, 1.0, 32.0
    kappa = t ** 2
    pe = vpe.build("dype", head_dim=16, scaling="yarn", ref_shape=ref, timestep=t, theta=10.0)
    w = 10.0 ** -(torch.arange(bands, dtype=torch.float64) / bands)
    scale = []
    for s in (12 / 4, 16 / 4):
        r = 4 * w / (2 * math.pi)
        keep = torch.ones_like(r) if kappa == 0 else ((r - alpha * kappa) / (beta * kappa - alpha * kappa)).clamp(0, 1)
        scale.append((1 - keep) / s + keep)
    assert_same_turns(pair_angles(pe, Grid(shape, prefix=1)), axial_xy_angles(shape, bands, 10.0, torch.stack(scale)))
    magnitude = pe.rotations(Grid(shape)).norm(dim=-1)
    torch.testing.assert_close(magnitude, torch.full_like(magnitude, 0.1 * math.log(math.sqrt(3 * 4)) + 1))


@pytest.mark.parametrize("method", ["pi", "ntk", "yarn"])
def test_dype_is_the_static_scaling_at_kappa_one_and_none_at_kappa_zero(method):
    """At kappa = 1 (t = 1, lambda_s = 1) each Dy- method is the package's static one (rope_axial's ``scaling``);
    at t = 0 the frequencies and positions are unscaled."""
    grid, ref = Grid((10, 6), prefix=1), (4, 4)
    dy = vpe.build("dype", head_dim=16, scaling=method, ref_shape=ref, timestep=1.0, lambda_s=1.0)
    static = vpe.build("rope_axial", head_dim=16, scaling=method, ref_shape=ref)
    torch.testing.assert_close(dy.rotations(grid), static.rotations(grid))
    dy.timestep = 0.0
    plain = vpe.build("rope_axial", head_dim=16).rotations(grid)
    factor = dy.rotations(grid).norm(dim=-1, keepdim=True)  # Dy-YaRN keeps YaRN's attention factor
    torch.testing.assert_close(dy.rotations(grid) / factor, plain)


def test_dype_follows_the_step_set_on_a_model():
    model = vpe.create_model("vit_tiny_patch16_224", pe="dype", **VIT).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert vpe.rotary.dype.set_timestep(model, 1.0) == 1  # one rotary module shared by the blocks
        noisy = model(x)
        vpe.rotary.dype.set_timestep(model, 0.0)
        clean = model(x)
        vpe.rotary.dype.set_timestep(model, 1.0)
        torch.testing.assert_close(model(x), noisy)
    assert not torch.allclose(noisy, clean)
    with pytest.raises(ValueError, match="timestep"):
        vpe.rotary.dype.set_timestep(model, 1.5)


# -- MRoPE-Interleave (arXiv 2510.23095) and the qwen3_vl preset ---------------------------------------------------

def test_mrope_interleave_is_qwen3_vl_language_models_rotation():
    """MRoPE-I deals the pairs of one spectrum to t, h, w in turn (Qwen3-VL's sections (24, 20, 20) of 64 pairs: h
    and w on pairs 1 and 2 mod 3 below 60, t on the rest): ``rope_axial(spectrum="mrope_interleaved")`` on a
    (t, h, w) grid is transformers' Qwen3VLTextRotaryEmbedding at those positions (here 16 pairs, (6, 5, 5))."""
    pytest.importorskip("transformers.models.qwen3_vl", reason="Qwen3-VL's text rotary embedding: transformers >= 4.57")
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding
    config = Qwen3VLTextConfig(hidden_size=64, num_attention_heads=2, head_dim=32, num_hidden_layers=1,
                               num_key_value_heads=2, intermediate_size=64, vocab_size=8,
                               rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5]})
    grid = Grid((2, 3, 4))
    cos, sin = Qwen3VLTextRotaryEmbedding(config)(torch.zeros(1), grid.coords().long().T[:, None, :])
    pe = vpe.build("rope_axial", head_dim=32, ndim=3, theta=5e6, pairs="half", spectrum="mrope_interleaved",
                   sections=(6, 5, 5), axis_order="ij")
    rotations = pe.rotations(grid)[0]
    torch.testing.assert_close(rotations[..., 0], cos[0, :, :16], atol=1e-6, rtol=0)
    torch.testing.assert_close(rotations[..., 1], sin[0, :, :16], atol=1e-6, rtol=0)


def test_qwen3_vl_preset_is_the_towers_axial_rope_not_mrope_interleave():
    """What docs/presets.md states: the preset's rotary is the vision tower's 2D RoPE (a spectrum per axis, h pairs
    then w pairs), not the language model's MRoPE-I (one spectrum dealt in turn)."""
    rotary = vpe.preset("qwen3_vl", dim=64, num_heads=2).rotary
    assert rotary.spectrum == "axial" and rotary.sections == (8, 8) and rotary.axis_order == "ij"
    interleaved = vpe.build("rope_axial", head_dim=32, ndim=2, theta=rotary.theta, pairs="half",
                            spectrum="mrope_interleaved", sections=(6, 5, 5), inert_axes=1, axis_order="ij")
    grid = Grid((3, 4))
    assert not torch.allclose(rotary.rotations(grid), interleaved.rotations(grid), atol=1e-3)


# -- MHRoPE (arXiv 2510.23095): whole heads dealt to the axes -----------------------------------------------------

def test_mhrope_is_its_formula():
    """The official allocation at its default, 8 heads as (2, 3, 3) over (t, h, w): head ``h`` turns all ``P`` pairs
    by its one axis's index times the full spectrum ``theta^(-p/P)``; here also 2 heads left over, at the identity."""
    grid, pairs, theta = Grid((2, 3, 4), prefix=1), 4, 100.0
    pe = vpe.build("mhrope", head_dim=2 * pairs, num_heads=10, ndim=3, head_sections=(2, 3, 3), pairs="half")
    assert vpe.build("mhrope", head_dim=8, num_heads=8, ndim=3).head_sections == (2, 3, 3)  # the default split
    coords = grid.coords(dtype=torch.float64)  # (N, 3): t, h, w
    spectrum = theta ** -(torch.arange(pairs, dtype=torch.float64) / pairs)
    rotations = pe.rotations(grid).double()  # (heads, P + N, pairs, 2)
    for head, axis in enumerate([0, 0, 1, 1, 1, 2, 2, 2, None, None]):
        angles = torch.atan2(rotations[head, 1:, :, 1], rotations[head, 1:, :, 0])
        expected = torch.zeros_like(angles) if axis is None else coords[:, axis, None] * spectrum
        assert_same_turns(angles, expected)
    assert torch.equal(rotations[:, 0], torch.tensor([1.0, 0.0]).double().expand(10, pairs, 2))  # prefix: identity


def test_mhrope_each_head_is_relative_in_its_own_axis_only():
    """The defining property: a head's score depends on the offset along its own axis and on nothing else (moving
    the key along another axis leaves it unchanged); a head left over scores every pair alike."""
    grid = Grid((4, 5))
    pe = vpe.build("mhrope", head_dim=8, num_heads=3, head_sections=(1, 1))  # y, x, unrotated
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 3, 1, 8, generator=g).expand(-1, -1, -1, grid.num_tokens, -1).unbind(0)
    q, k = pe(q.contiguous(), k.contiguous(), grid)
    s = (q @ k.transpose(-1, -2))[0]  # (heads, N, N)
    at = lambda y, x: 5 * y + x  # noqa: E731
    for (y0, x0, y1, x1), (y2, x2, y3, x3) in [((0, 0, 2, 0), (1, 4, 3, 1)), ((3, 2, 1, 0), (2, 4, 0, 3))]:
        torch.testing.assert_close(s[0, at(y0, x0), at(y1, x1)], s[0, at(y2, x2), at(y3, x3)])  # same dy
    assert not torch.allclose(s[0, at(0, 0), at(1, 0)], s[0, at(0, 0), at(2, 0)])
    torch.testing.assert_close(s[1, at(0, 1), at(3, 4)], s[1, at(2, 0), at(0, 3)])  # same dx
    assert not torch.allclose(s[1, at(0, 0), at(0, 1)], s[1, at(0, 0), at(0, 2)])
    torch.testing.assert_close(s[2], s[2, :1, :1].expand(grid.num_tokens, grid.num_tokens))


def test_mhrope_refuses_what_it_does_not_define():
    for bad, match in [({"head_sections": (2, 2)}, "may sum to at most num_heads"),
                       ({"head_sections": (1,)}, "must be 2 integers >= 0"), ({"head_sections": (1, -1)}, ">= 0"),
                       ({"sections": (2, 2)}, "does not take 'sections'"),
                       ({"head_axes": ("x", "y", "")}, "does not take 'head_axes'")]:
        with pytest.raises(ValueError, match=match):
            vpe.build("mhrope", head_dim=8, num_heads=3, **bad)


# -- everywhere the others go ------------------------------------------------------------------------------------------

IMAGE = [("v2pe", {}), ("circle_rope", {}), ("hope", {}), ("dype", {}), ("mhrope", {})]
CLIPS = [("v2pe", {}), ("hope", {}), ("dype", {}), ("mhrope", {"head_sections": (1, 0, 1)})]


@pytest.mark.parametrize("pe,kw", IMAGE)
def test_vit_runs_at_other_sizes_with_kept_tokens_and_mixed_batches(pe, kw):
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIT)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    model.eval()
    images = [torch.randn(3, 16, 24), torch.randn(3, 24, 16), torch.randn(3, 32, 32)]
    with torch.no_grad():
        together = model.forward_batch(images)
        alone = torch.cat([model(image[None]) for image in images])
        torch.testing.assert_close(together, alone, atol=2e-5, rtol=2e-5)
        x = torch.randn(2, 3, 16, 16)
        torch.testing.assert_close(model.forward_masked(x, keep=torch.arange(16).expand(2, -1))[0],
                                   model.forward_features(x))


@pytest.mark.parametrize("pe,kw,shape", [(p, k, (3, 4)) for p, k in IMAGE] + [(p, k, (2, 3, 3)) for p, k in CLIPS])
def test_layout_subsets_attend_as_the_full_grid_restricted(pe, kw, shape):
    rotary = vpe.registry.ENCODINGS[pe].for_model(vpe.ModelContext(shape, 24, 2, 12), **kw)
    grid = Grid(shape, prefix=1)
    g = torch.Generator().manual_seed(0)
    keep = torch.stack([torch.randperm(grid.num_patches, generator=g)[:5] for _ in range(2)])
    layout = Layout(grid, keep)
    q, k, v = torch.randn(3, 2, 2, grid.num_tokens, 12, generator=g).unbind(0)
    index = layout.token_index()
    gather = lambda t: t.gather(2, index[:, None, :, None].expand(-1, 2, -1, 12))  # noqa: E731
    out = vpe.attend(gather(q), gather(k), gather(v), layout, rotary)
    for b in range(2):
        allowed = torch.zeros(grid.num_tokens, dtype=torch.bool)
        allowed[index[b]] = True
        full = vpe.attend(q[b:b + 1], k[b:b + 1], v[b:b + 1], grid, rotary,
                          attn_mask=allowed[None].expand(grid.num_tokens, -1))
        torch.testing.assert_close(out[b], full[0][:, index[b]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pe,kw", CLIPS)
def test_video_models(pe, kw):
    torch.manual_seed(0)
    model = vpe.create_video_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIDEO)
    for clip in [(4, 16, 16), (8, 24, 16)]:
        out = model(torch.randn(1, 3, *clip))
        assert out.shape == (1, 3) and torch.isfinite(out).all()


def test_image_only_encodings_refuse_video():
    with pytest.raises(ValueError, match="circle_rope places the patches of an image grid on a ring"):
        vpe.create_video_model("vit_tiny_patch16_224", pe="circle_rope", **VIDEO)


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_fullgraph_compile_matches_eager():
    """One of them (their placements share PlacedRoPE's path; the ring's is the longer one): no graph break."""
    torch._dynamo.reset()
    model = vpe.create_model("vit_tiny_patch16_224", pe="circle_rope", **{**VIT, "depth": 1}).eval()
    x = torch.randn(2, 3, 16, 20)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="eager")(x), model(x),
                                   atol=1e-5, rtol=1e-5)
