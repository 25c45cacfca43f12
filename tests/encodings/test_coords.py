"""Coordinate systems (index, interpolated, DINOv3-normalised) and train-time coordinate augmentation for every
coordinate-reading encoding: parity with timm (``RotaryEmbeddingDinoV3``, ``RotaryEmbeddingCat``,
``RotaryEmbeddingMixed``, ``_build_grid``, ``_apply_coord_augs``, ``F.grid_sample``) and closed forms."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
try:  # the oracles: timm's DINOv3 RoPE and coordinate augmentation (newer than the timm floor)
    from timm.layers import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed, apply_rot_embed_cat, \
        resample_abs_pos_embed
    from timm.layers.pos_embed_sincos import _apply_coord_augs, _build_grid
except ImportError as err:
    pytest.skip(f"needs a timm with its DINOv3 RoPE and coordinate augmentation: {err}", allow_module_level=True)

import visionpe as vpe
from visionpe import Grid
from visionpe.bias import alibi_slopes
from visionpe.coords import CoordinateSystem, axis_positions
from visionpe.resample import sample_grid
from visionpe.tokens import sincos_table

NAMES = ("sincos", "learned", "rope_axial", "rope_mixed", "alibi", "cpb")
AUGS = {"shift": dict(shift_coords=0.5), "jitter": dict(jitter_coords=1.5), "rescale": dict(rescale_coords=2.0),
        "all": dict(shift_coords=0.3, jitter_coords=1.4, rescale_coords=1.8)}
SHAPES = {1: (5,), 2: (3, 4), 3: (2, 3, 4)}


def build(name: str, ndim: int = 2, **kw):
    """A small encoding for a grid of ``SHAPES[ndim]``."""
    shape = SHAPES[ndim]
    base = {"sincos": dict(dim=24, ndim=ndim), "learned": dict(dim=24, ndim=ndim, grid_shape=shape),
            "rope_axial": dict(head_dim=12, num_heads=2, ndim=ndim), "rope_mixed": dict(head_dim=12, num_heads=2,
                                                                                       ndim=ndim),
            "alibi": dict(num_heads=2, ndim=ndim), "cpb": dict(num_heads=2, window_size=shape, hidden_dim=16)}[name]
    return vpe.build(name, **{**base, **kw})


def run(pe, grid: Grid) -> torch.Tensor:
    """The encoding's output on ``grid``: tokens added to zeros, rotated q (= k), or the bias."""
    if pe.family == "tokens":
        return pe(torch.zeros(1, grid.num_tokens, pe.dim), grid)
    if pe.family == "rotary":
        q = torch.ones(1, pe.num_heads, grid.num_tokens, pe.head_dim)
        q, k = pe(q, q.clone(), grid)
        assert torch.equal(q, k)  # one draw for q and k
        return q
    return pe(grid)


def param_grads(pe) -> list:
    return [p.grad for p in pe.parameters()]


# -- coordinates --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["separate", "min", "max"])
@pytest.mark.parametrize("shape", [(5,), (3, 5), (5, 3), (2, 3, 4)])
def test_normalized_coordinates_match_timm_centered_grid(shape, mode):
    ref = _build_grid(list(shape), grid_type="centered", normalize_coords=mode, grid_indexing="ij")
    ours = CoordinateSystem("normalized", mode).positions(Grid(shape))
    torch.testing.assert_close(ours, ref.reshape(-1, len(shape)), rtol=0, atol=1e-7)
    side = {"separate": None, "min": min(shape), "max": max(shape)}[mode]
    for n, p in zip(shape, axis_positions(shape, coords="normalized", normalize_coords=mode)):
        if side in (None, n):  # this axis spans [-1, 1]: patch centres 1/n inside either end
            assert abs(float(p[0] + 1) - 1 / n) < 1e-6 and abs(float(1 - p[-1]) - 1 / n) < 1e-6


def test_normalized_coordinates_with_offset_match_timm():
    ref = _build_grid([3, 5], grid_type="centered", grid_offset=1.5, normalize_coords="separate")
    ours = CoordinateSystem("normalized").positions(Grid((3, 5), offset=(1.5, 1.5)))
    torch.testing.assert_close(ours, ref.reshape(-1, 2), rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape", [(5,), (3, 5), (1, 4), (2, 3, 4)])
def test_pixel_coordinates_match_timm_pixel_grid(shape):
    """``coords="pixel"``: timm's ``grid_type="pixel"`` (``linspace(-1, 1, s)``: the end patches on -1 and 1, one
    patch at -1)."""
    ref = _build_grid(list(shape), grid_type="pixel", grid_indexing="ij")
    ours = CoordinateSystem("pixel").positions(Grid(shape))
    torch.testing.assert_close(ours, ref.reshape(-1, len(shape)), rtol=0, atol=1e-7)


@pytest.mark.parametrize("new", [(6, 9), (5, 2), (3, 5)])
def test_pixel_learned_is_interpolate_with_aligned_corners(new):
    """A learned table read at pixel coordinates: its own patches on the corners of [-1, 1], so a new grid reads it
    as ``F.interpolate(align_corners=True)`` does; on its own grid, the table itself."""
    pe = vpe.build("learned", dim=8, grid_shape=(3, 5), coords="pixel", interpolation="bilinear")
    table = pe.table.detach()
    ref = F.interpolate(table.permute(2, 0, 1)[None], size=new, mode="bilinear", align_corners=True)
    with torch.no_grad():
        torch.testing.assert_close(pe.patch_table(Grid(new)), ref[0].permute(1, 2, 0).reshape(-1, 8), atol=1e-5,
                                   rtol=1e-5)


def test_index_coordinates_and_interpolation():
    grid = Grid((6, 10), offset=(1, 2))
    index = CoordinateSystem()
    assert torch.equal(index.positions(grid), grid.coords())
    torch.testing.assert_close(index.positions(grid, ref_shape=(3, 5)), grid.coords() * 0.5, rtol=0, atol=0)
    ref = _build_grid([6, 10], grid_type="index", ref_feat_shape=[3, 5])  # Eva's PI
    torch.testing.assert_close(index.positions(Grid((6, 10)), ref_shape=(3, 5)), ref.reshape(-1, 2))


# -- augmentation draws -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("aug", list(AUGS))
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_draw_matches_timm_apply_coord_augs(aug, ndim):
    system = CoordinateSystem(**AUGS[aug])
    coords = Grid(SHAPES[ndim]).coords()
    torch.manual_seed(3)
    ref = _apply_coord_augs(coords, **AUGS[aug])
    torch.manual_seed(3)
    transform = system.draw(True, ndim)
    assert torch.equal(transform(coords), ref)
    assert system.draw(False, ndim) is None and CoordinateSystem().draw(True, ndim) is None
    for a in range(ndim):  # one axis at a time, as CPB and learned tables read it
        assert torch.equal(transform.on_axis(a, coords[:, a]), ref[:, a])


# -- RoPE ---------------------------------------------------------------------------------------------------------
def dinov3_pair(mode="separate", head_dim=16, heads=2, **kw):
    timm_kw = {k: v for k, v in kw.items() if k != "theta"}
    timm_rope = RotaryEmbeddingDinoV3(head_dim, temperature=kw.get("theta", 100.0), normalize_coords=mode,
                                      **timm_kw)
    ours = vpe.build("rope_axial", head_dim=head_dim, num_heads=heads, coords="normalized", normalize_coords=mode,
                     axis_order="ij", pairs="half", **kw)
    return timm_rope, ours


@pytest.mark.parametrize("periods", [{}, {"theta": 10.0}, {"min_period": 0.5, "max_period": 40.0}])
@pytest.mark.parametrize("mode", ["separate", "min", "max"])
@pytest.mark.parametrize("shape", [(3, 5), (6, 4)])
def test_normalized_rope_matches_timm_dinov3(shape, mode, periods):
    timm_rope, pe = dinov3_pair(mode, **periods)
    q = torch.randn(2, 2, 2 + shape[0] * shape[1], 16)
    ref = apply_rot_embed_cat(q[:, :, 2:], timm_rope.get_embed(list(shape)), half=True)
    ours = pe.rotate(q, Grid(shape, prefix=2))
    torch.testing.assert_close(ours[:, :, 2:], ref, atol=5e-6, rtol=0)  # timm: float32 angles up to 4 pi
    assert torch.equal(ours[:, :, :2], q[:, :, :2])  # prefix tokens are not rotated


@pytest.mark.parametrize("aug", list(AUGS))
@pytest.mark.parametrize("mode", ["separate", "max"])
def test_augmented_rope_matches_timm_dinov3(mode, aug):
    shape = (4, 6)
    timm_rope, pe = dinov3_pair(mode, **AUGS[aug])
    timm_rope.train(), pe.train()
    q, k = torch.randn(2, 1, 2, 24, 16)
    torch.manual_seed(11)
    emb = timm_rope.get_embed(list(shape))
    ref = [apply_rot_embed_cat(t, emb, half=True) for t in (q, k)]
    torch.manual_seed(11)
    ours = pe(q, k, Grid(shape))
    for o, r in zip(ours, ref):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=0)
    assert not torch.allclose(ours[0], pe.eval()(q, k, Grid(shape))[0], atol=1e-3)  # the draw moved positions


@pytest.mark.parametrize("aug", list(AUGS))
@pytest.mark.parametrize("pairs", ["interleaved", "half"])
def test_augmented_axial_matches_timm_rotary_cat(pairs, aug):
    shape = (3, 5)
    timm_rope = RotaryEmbeddingCat(dim=16, temperature=100, in_pixels=False, feat_shape=None, grid_indexing="xy",
                                   rotate_half=pairs == "half", **AUGS[aug]).train()
    pe = vpe.build("rope_axial", head_dim=16, pairs=pairs, **AUGS[aug]).train()
    q = torch.randn(2, 1, 15, 16)
    torch.manual_seed(5)
    ref = apply_rot_embed_cat(q, timm_rope.get_embed(list(shape)), half=pairs == "half")
    torch.manual_seed(5)
    torch.testing.assert_close(pe(q, q, Grid(shape))[0], ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("aug", list(AUGS))
def test_augmented_mixed_matches_timm_rotary_mixed(aug):
    heads, head_dim, shape = 2, 16, (4, 3)
    timm_rope = RotaryEmbeddingMixed(head_dim * heads, depth=1, num_heads=heads, temperature=10, grid_indexing="xy",
                                     **AUGS[aug]).train()
    pe = vpe.build("rope_mixed", head_dim=head_dim, num_heads=heads, **AUGS[aug]).train()
    with torch.no_grad():
        pe.freqs.copy_(timm_rope.freqs[:, 0])
    q = torch.randn(2, heads, 12, head_dim)
    torch.manual_seed(9)
    ref = apply_rot_embed_cat(q, timm_rope.get_embed(list(shape))[0])
    torch.manual_seed(9)
    torch.testing.assert_close(pe(q, q, Grid(shape))[0], ref, atol=2e-5, rtol=1e-5)


def test_normalized_rope_spans_the_same_range_on_every_grid():
    """The first and last patch of any grid sit at -1 + 1/n and 1 - 1/n: their rotations approach the same ones."""
    pe = vpe.build("rope_axial", head_dim=8, coords="normalized", ndim=1)
    cis = [pe.cis(Grid((n,)))[0] for n in (8, 64)]
    angles = [c.angle() for c in cis]
    assert (angles[1][-1] - angles[0][-1]).abs().max() < 2 * math.pi * (1 / 8 - 1 / 64) + 1e-5


def test_mixed_normalized_init_magnitudes_are_dinov3_periods():
    pe = vpe.build("rope_mixed", head_dim=16, num_heads=3, coords="normalized", theta=100.0)
    magnitude = pe.freqs.detach().norm(dim=0)  # (heads, pairs)
    expected = 2 * math.pi * 100.0 ** -(torch.arange(4) / 4)
    torch.testing.assert_close(magnitude, expected.repeat(2).expand(3, -1), atol=1e-5, rtol=1e-5)
    periods = vpe.build("rope_mixed", head_dim=16, num_heads=3, min_period=1.0, max_period=8.0)
    torch.testing.assert_close(periods.freqs.detach().norm(dim=0)[0, :4], 2 * math.pi / torch.tensor([1., 2, 4, 8]))


# -- tokens -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["separate", "min"])
def test_normalized_sincos_closed_form(mode):
    shape, dim, temperature = (3, 5), 16, 100.0
    pe = vpe.build("sincos", dim=dim, coords="normalized", normalize_coords=mode, temperature=temperature)
    c = _build_grid(list(shape), grid_type="centered", normalize_coords=mode).reshape(-1, 2).double()
    omega = 2 * math.pi / temperature ** (torch.arange(4, dtype=torch.float64) / 4)
    blocks = [torch.cat([(c[:, a, None] * omega).sin(), (c[:, a, None] * omega).cos()], -1) for a in (1, 0)]  # mae
    torch.testing.assert_close(pe.table(Grid(shape)), torch.cat(blocks, -1).float(), atol=1e-6, rtol=0)


def grid_sample_2d(table: torch.Tensor, positions, mode: str) -> torch.Tensor:
    """``F.grid_sample`` of a ``(S0, S1, C)`` table at fractional indices ``positions[a]`` (product grid)."""
    u = [2 * (p + 0.5) / s - 1 for p, s in zip(positions, table.shape[:2])]
    uy, ux = torch.meshgrid(u[0], u[1], indexing="ij")
    points = torch.stack([ux, uy], -1)[None].to(table.dtype)
    out = F.grid_sample(table.permute(2, 0, 1)[None], points, mode=mode, padding_mode="border", align_corners=False)
    return out[0].permute(1, 2, 0)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
def test_sample_grid_matches_grid_sample(mode):
    table = torch.randn(4, 5, 3)
    positions = [torch.tensor([-2.7, -0.4, 0.0, 1.25, 2.5, 3.0, 4.6]), torch.linspace(-1.3, 5.2, 9)]
    torch.testing.assert_close(sample_grid(table, positions, mode), grid_sample_2d(table, positions, mode),
                               atol=1e-5, rtol=1e-5)


def test_sample_grid_3d_bilinear_matches_grid_sample():
    table = torch.randn(3, 4, 5, 2)
    positions = [torch.tensor([-0.3, 0.5, 1.9]), torch.tensor([0.2, 2.5]), torch.tensor([-1.0, 1.5, 3.3, 4.8])]
    u = [2 * (p + 0.5) / s - 1 for p, s in zip(positions, table.shape[:3])]
    ut, uy, ux = torch.meshgrid(*u, indexing="ij")
    ref = F.grid_sample(table.permute(3, 0, 1, 2)[None], torch.stack([ux, uy, ut], -1)[None], mode="bilinear",
                        padding_mode="border", align_corners=False)[0].permute(1, 2, 3, 0)
    torch.testing.assert_close(sample_grid(table, positions, "bilinear"), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("factorized", [False, True])
@pytest.mark.parametrize("mode", ["separate", "min", "max"])
def test_normalized_learned_is_the_table_on_the_training_grid(mode, factorized):
    plain = vpe.build("learned", dim=8, grid_shape=(3, 5), factorized=factorized)
    pe = vpe.build("learned", dim=8, grid_shape=(3, 5), factorized=factorized, coords="normalized",
                   normalize_coords=mode)
    pe.load_state_dict(plain.state_dict())
    assert torch.equal(pe.patch_table(Grid((3, 5))), plain.patch_table(Grid((3, 5))))


@pytest.mark.parametrize("new", [(6, 9), (5, 2), (3, 5)])
def test_normalized_separate_learned_is_interpolate_without_antialias(new):
    pe = vpe.build("learned", dim=8, grid_shape=(3, 5), num_prefix_tokens=1, coords="normalized")
    posemb = torch.cat([pe.prefix, pe.table.reshape(-1, 8)])[None].detach()
    ref = resample_abs_pos_embed(posemb, list(new), old_size=[3, 5], num_prefix_tokens=1, antialias=False)
    with torch.no_grad():
        torch.testing.assert_close(pe.patch_table(Grid(new)), ref[0, 1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("new", [(6, 4), (2, 7)])
def test_normalized_learned_samples_at_normalised_positions(new, mode):
    """Closed form: the table sits at its grid's centred coordinates; each patch reads it (grid_sample) at its own."""
    train = (3, 5)
    pe = vpe.build("learned", dim=4, grid_shape=train, coords="normalized", normalize_coords=mode)
    d_train = (min if mode == "min" else max)(train)
    c = [t.float() for t in axis_positions(new, coords="normalized", normalize_coords=mode)]
    ref = grid_sample_2d(pe.table.detach(), [(p + 1) * d_train / 2 - 0.5 for p in c], "bicubic")
    with torch.no_grad():
        torch.testing.assert_close(pe.patch_table(Grid(new)), ref.reshape(-1, 4), atol=1e-5, rtol=1e-5)


def test_normalized_learned_offset_reads_shifted_positions():
    """On the training grid's shape, an offset of one patch reads the next table rows; past the edge, the edge."""
    pe = vpe.build("learned", dim=4, grid_shape=(4, 4), coords="normalized", interpolation="bilinear")
    with torch.no_grad():
        torch.testing.assert_close(pe.patch_table(Grid((4, 4), offset=(1, 0))),
                                   pe.table[[1, 2, 3, 3]].reshape(-1, 4), atol=1e-6, rtol=0)


@pytest.mark.parametrize("coords", ["index", "normalized"])
def test_augmented_learned_samples_at_augmented_positions(coords):
    aug = AUGS["all"]
    pe = vpe.build("learned", dim=4, grid_shape=(3, 5), coords=coords, **aug).train()
    base = Grid((3, 5)).coords() if coords == "index" else CoordinateSystem("normalized").positions(Grid((3, 5)))
    torch.manual_seed(2)
    moved = _apply_coord_augs(base, **aug)
    positions = [moved.reshape(3, 5, 2)[:, 0, 0].double(), moved.reshape(3, 5, 2)[0, :, 1].double()]
    if coords == "normalized":
        positions = [(p + 1) * s / 2 - 0.5 for p, s in zip(positions, (3, 5))]
    ref = grid_sample_2d(pe.table.detach().double(), positions, "bicubic").float()
    torch.manual_seed(2)
    torch.testing.assert_close(pe.patch_table(Grid((3, 5)), augment=True), ref.reshape(-1, 4), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["mae", "timm"])
def test_augmented_sincos_is_the_table_of_augmented_coordinates(layout):
    aug = AUGS["all"]
    pe = vpe.build("sincos", dim=16, layout=layout, **aug).train()
    grid = Grid((3, 5), prefix=1)
    torch.manual_seed(4)
    ref = sincos_table(_apply_coord_augs(grid.coords(), **aug), 16, layout=layout)
    torch.manual_seed(4)
    torch.testing.assert_close(run(pe, grid)[0, 1:], ref, atol=1e-5, rtol=0)


# -- bias ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("coords", ["index", "normalized"])
def test_augmented_alibi_closed_form(coords):
    aug = AUGS["all"]
    pe = vpe.build("alibi", num_heads=3, coords=coords, **aug).train()
    base = CoordinateSystem(coords).positions(Grid((3, 5)))
    torch.manual_seed(6)
    moved = _apply_coord_augs(base, **aug)
    ref = -alibi_slopes(3)[:, None, None] * torch.cdist(moved, moved)
    torch.manual_seed(6)
    torch.testing.assert_close(pe(Grid((3, 5))), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("coords", ["index", "normalized"])
@pytest.mark.parametrize("augment", [False, True])
def test_cpb_closed_form(coords, augment):
    """``16 sigmoid(MLP(log_map(d / unit)))`` on the pairwise offsets of the (augmented) coordinates, unit ``W - 1``
    in patches (Swin-V2) or 2 in normalised coordinates."""
    aug = AUGS["all"] if augment else {}
    window = (3, 4)
    pe = vpe.build("cpb", num_heads=2, window_size=window, hidden_dim=16, coords=coords, **aug).train()
    base = CoordinateSystem(coords).positions(Grid(window))
    torch.manual_seed(8)
    moved = _apply_coord_augs(base, **aug) if augment else base
    unit = torch.tensor([2.0, 2.0]) if coords == "normalized" else torch.tensor([w - 1.0 for w in window])
    x = (moved[:, None] - moved[None]) / unit * 8
    logged = torch.sign(x) * torch.log2(1 + x.abs()) / 3
    ref = 16 * torch.sigmoid(pe.cpb_mlp(logged)).permute(2, 0, 1)
    torch.manual_seed(8)
    torch.testing.assert_close(pe(Grid(window)), ref, atol=1e-5, rtol=1e-5)


def test_alibi_normalized_distances_are_in_grid_extents():
    pe = vpe.build("alibi", num_heads=1, ndim=1, coords="normalized")
    for n in (4, 16):  # the ends of any 1D grid are 2 - 2/n apart
        assert abs(float(-pe(Grid((n,)))[0, 0, -1] / alibi_slopes(1)[0]) - (2 - 2 / n)) < 1e-6


# -- augmentation contract, every encoding ------------------------------------------------------------------------
@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("name", NAMES)
def test_augmentation_off_in_eval_on_in_training_reproducible(name, ndim):
    plain = build(name, ndim)
    pe = build(name, ndim, **AUGS["all"])
    pe.load_state_dict(plain.state_dict())
    grid = Grid(SHAPES[ndim], prefix=1)
    with torch.no_grad():
        assert torch.equal(run(pe.eval(), grid), run(plain.eval(), grid))  # eval: bitwise no augmentation
        pe.train()
        torch.manual_seed(1)
        first = run(pe, grid)
        second = run(pe, grid)  # a fresh draw, not a cached table
        torch.manual_seed(1)
        again = run(pe, grid)
    assert not torch.allclose(first, second)
    assert torch.equal(first, again)


@pytest.mark.parametrize("name", NAMES)
def test_eval_tables_stay_cached_and_training_gradients_flow(name):
    pe = build(name, 2, **AUGS["all"])
    grid = Grid(SHAPES[2], prefix=1)
    table = {"sincos": lambda: pe.table(grid), "learned": lambda: pe.patch_table(Grid((5, 6))),
             "rope_axial": lambda: pe.rotations(grid), "rope_mixed": lambda: pe.rotations(grid),
             "alibi": lambda: pe(grid), "cpb": lambda: pe(grid)}[name]
    with torch.no_grad():
        pe.eval()
        assert table() is table()
    pe.train()
    out = run(pe, grid)
    if any(True for _ in pe.parameters()):
        out.square().sum().backward()
        assert all(g is not None and g.abs().sum() > 0 for g in param_grads(pe))


@pytest.mark.parametrize("aug", list(AUGS))
@pytest.mark.parametrize("coords", ["index", "normalized", "pixel"])
@pytest.mark.parametrize("pe", NAMES)
def test_every_encoding_and_augmentation_trains_in_a_vit(pe, coords, aug):
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs={"coords": coords, **AUGS[aug]}, img_size=16,
                             patch_size=4, embed_dim=24, depth=1, num_heads=2, num_classes=3,
                             global_pool="avg").train()  # with one block, only patch rows carry a bias's gradient
    encodings = [m for ms in vpe.encodings_of(model).values() for m in ms if m is not None]
    assert encodings and all(m.coordinates == CoordinateSystem(coords, **AUGS[aug]) for m in encodings)
    x = torch.randn(2, 3, 16, 16)
    model(x).square().sum().backward()
    grads = [p.grad for m in encodings for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))


def test_draws_survive_activation_checkpointing():
    """Each block draws inside its own call, so checkpointing's recomputation (RNG state restored) redraws the
    same transform: gradients equal those without checkpointing."""
    kw = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=3)
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+learned", pe_kwargs=AUGS["all"], **kw).train()
    other = copy.deepcopy(model)
    other.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 16, 16)
    for m in (model, other):
        torch.manual_seed(21)
        m(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_combination_takes_the_keywords_once_each():
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial+sincos+alibi",
                             pe_kwargs={"coords": "normalized", "normalize_coords": "max"}, img_size=16,
                             patch_size=4, embed_dim=24, depth=1, num_heads=2, num_classes=3)
    for modules in vpe.encodings_of(model).values():
        assert all(m.coordinates.normalize_coords == "max" for m in modules if m is not None)
    model(torch.randn(1, 3, 24, 32))


# -- bad values ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kw,words", [
    (dict(coords="corners"), ["coords='corners'", "'index', 'normalized', 'pixel'"]),
    (dict(coords="normalized", normalize_coords="diag"), ["normalize_coords='diag'", "'separate', 'min', 'max'"]),
    (dict(shift_coords=-1.0), ["shift_coords", ">= 0"]),
    (dict(jitter_coords=0.5), ["jitter_coords", ">= 1"]),
    (dict(rescale_coords="2"), ["rescale_coords", "finite number"]),
    (dict(rescale_coords=True), ["rescale_coords", "finite number"]),
    (dict(shift_coords=float("nan")), ["shift_coords", "finite number"]),
])
def test_bad_coordinate_values_are_named(name, kw, words):
    with pytest.raises(ValueError) as info:
        build(name, **kw)
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("call,words", [
    (lambda: vpe.build("rope_axial", head_dim=8, coords="normalized", scaling="pi", ref_shape=(4, 4)),
     ["scaling='pi'", "coords='index'"]),
    (lambda: vpe.build("rope_mixed", head_dim=8, num_heads=2, coords="normalized").with_scaling("ntk", (4, 4)),
     ["scaling='ntk'", "scaling='none'"]),
    (lambda: vpe.build("rope_axial", head_dim=8, min_period=1.0), ["min_period", "max_period"]),
    (lambda: vpe.build("rope_axial", head_dim=8, min_period=4.0, max_period=2.0), ["max_period", ">= 4.0"]),
    (lambda: vpe.build("rope_mixed", head_dim=8, num_heads=2, min_period=0.0, max_period=2.0), ["min_period", "> 0"]),
    (lambda: vpe.build("sincos", dim=8, coords="normalized", ref_shape=(3, 3)), ["ref_shape", "coords='index'"]),
    (lambda: vpe.build("learned", dim=8, coords="normalized", interpolation="area"),
     ["interpolation='area'", "'bicubic', 'bilinear', 'nearest'"]),
    (lambda: vpe.build("learned", dim=8, jitter_coords=1.5, interpolation="area"), ["interpolation='area'"]),
])
def test_bad_combinations_are_named(call, words):
    with pytest.raises(ValueError) as info:
        call()
    assert all(w in str(info.value) for w in words), str(info.value)
