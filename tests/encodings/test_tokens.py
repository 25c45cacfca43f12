"""Tokens family: sincos (MAE / timm parity), learned tables (timm resampling parity), PEG."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from timm.layers import build_sincos2d_pos_embed, resample_abs_pos_embed

import visionpe as vpe
from visionpe import Grid
from visionpe.tokens import PEG, Learned, SinCos, sincos_table


def mae_1d(dim: int, pos: np.ndarray) -> np.ndarray:
    """MAE ``get_1d_sincos_pos_embed_from_grid``: ``[sin(pos w), cos(pos w)]``, ``w_i = 1/10000^(i/(dim/2))``."""
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def mae_2d(dim: int, shape) -> np.ndarray:
    """MAE ``get_2d_sincos_pos_embed`` (generalised to H != W): channels ``[sin x, cos x, sin y, cos y]``."""
    grid = np.meshgrid(np.arange(shape[1], dtype=np.float64), np.arange(shape[0], dtype=np.float64))  # (x, y)
    return np.concatenate([mae_1d(dim // 2, grid[0]), mae_1d(dim // 2, grid[1])], axis=1)


def sincos_patch_table(pe, grid):
    return pe(torch.zeros(1, grid.num_tokens, pe.dim), grid)[0, grid.prefix:]


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (4, 4)])
def test_sincos_mae_layout_matches_mae_formula(shape):
    pe = vpe.build("sincos", dim=16, layout="mae")
    ours = sincos_patch_table(pe, Grid(shape))
    torch.testing.assert_close(ours, torch.from_numpy(mae_2d(16, shape)).float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", [(3, 5), (5, 3)])
def test_sincos_timm_layout_matches_timm(shape):
    pe = vpe.build("sincos", dim=16, layout="timm")
    ref = build_sincos2d_pos_embed(list(shape), dim=16, interleave_sin_cos=True)
    torch.testing.assert_close(sincos_patch_table(pe, Grid(shape)), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout,axes", [("mae", (2, 1, 0)), ("timm", (0, 1, 2))])
def test_sincos_3d_is_per_axis_1d_blocks(layout, axes):
    """3D: one MAE 1D block per axis, last grid axis first for ``mae`` and grid order for ``timm``."""
    grid = Grid((2, 3, 4))
    coords = grid.coords().double().numpy()
    ref = np.concatenate([mae_1d(8, coords[:, a]) for a in axes], axis=1)
    ours = sincos_patch_table(vpe.build("sincos", dim=24, ndim=3, layout=layout), grid)
    torch.testing.assert_close(ours, torch.from_numpy(ref).float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["mae", "timm"])
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_sincos_position_zero_and_prefix(layout, ndim):
    """Position 0 is ``[0]*b + [1]*b`` per axis (sin 0, cos 0); prefix tokens get nothing."""
    dim, bands = 12, 12 // (2 * ndim)
    grid = Grid((2,) * ndim, prefix=1)
    out = vpe.build("sincos", dim=dim, ndim=ndim, layout=layout)(torch.zeros(1, grid.num_tokens, dim), grid)[0]
    assert out[0].abs().max() == 0
    assert out[1].tolist() == ([0.0] * bands + [1.0] * bands) * ndim
    assert out[2:].abs().sum() > 0


def test_sincos_ref_shape_stretches_coordinates():
    pe = SinCos(16, ref_shape=(3, 5))
    ref = sincos_table(Grid((6, 10)).coords() * 0.5, 16)
    torch.testing.assert_close(pe.table(Grid((6, 10))), ref)


# -- learned --------------------------------------------------------------------------------------------
def timm_posemb(pe: Learned) -> torch.Tensor:
    """Our table in timm's ``pos_embed`` layout ``(1, P + N, dim)``."""
    return torch.cat([pe.prefix, pe.table.reshape(-1, pe.dim)])[None].detach()


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("new", [(6, 9), (2, 3), (5, 2), (3, 5)])
def test_learned_resample_matches_timm(new, antialias):
    pe = Learned(8, grid_shape=(3, 5), num_prefix_tokens=1, antialias=antialias)
    ref = resample_abs_pos_embed(timm_posemb(pe), list(new), old_size=[3, 5], num_prefix_tokens=1,
                                 antialias=antialias)
    grid = Grid(new, prefix=1)
    with torch.no_grad():
        torch.testing.assert_close(pe.patch_table(grid), ref[0, 1:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pe(torch.zeros(1, grid.num_tokens, 8), grid), ref, atol=1e-5, rtol=1e-5)
        # resize() for good gives the same table, and the call on the new grid then uses it as is
        resized = pe.resize(new).table.reshape(-1, 8)
    torch.testing.assert_close(resized, ref[0, 1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("factorized", [False, True])
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_learned_resize_to_same_shape_is_identity(shape, factorized):
    pe = Learned(8, ndim=len(shape), grid_shape=shape, factorized=factorized)
    grid = Grid(shape)
    before = pe.patch_table(grid).detach().clone()
    with torch.no_grad():
        pe.resize(shape)
    torch.testing.assert_close(pe.patch_table(grid), before, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_learned_factorized_is_broadcast_sum(shape):
    pe = Learned(8, ndim=len(shape), grid_shape=shape, factorized=True)
    total = sum(t.reshape([-1 if i == a else 1 for i in range(len(shape))] + [8])
                for a, t in enumerate(pe.axis_tables))
    torch.testing.assert_close(pe.patch_table(Grid(shape)), total.reshape(-1, 8))


@pytest.mark.parametrize("antialias", [True, False])
def test_learned_factorized_resizes_each_axis(antialias):
    """Each axis table is resampled alone (timm's resampling of an ``(n, 1)`` grid), then summed."""
    pe = Learned(8, grid_shape=(3, 5), factorized=True, antialias=antialias)
    new = (6, 2)
    axis_refs = [resample_abs_pos_embed(t.detach()[None], [n, 1], old_size=[t.shape[0], 1], num_prefix_tokens=0,
                                        antialias=antialias)[0] for t, n in zip(pe.axis_tables, new)]
    ref = (axis_refs[0][:, None] + axis_refs[1][None, :]).reshape(-1, 8)
    torch.testing.assert_close(pe.patch_table(Grid(new)), ref, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        pe.resize(new)
    assert [tuple(t.shape) for t in pe.axis_tables] == [(6, 8), (2, 8)]
    torch.testing.assert_close(pe.patch_table(Grid(new)), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("table,grid", [((3, 5), (4, 6)), ((4, 4), (6, 3)), ((4, 4), (2, 3)), ((4, 6), (4, 6))])
@pytest.mark.parametrize("align_corners", [False, True])
def test_learned_square_crop_resamples_to_the_longer_side_and_crops(table, grid, align_corners):
    """``fit="square_crop"``: ``F.interpolate`` to a square of the grid's longer side, then its first rows and columns
    (timm NaFlexVit's ``pos_embed_ar_preserving``); the table itself at its own shape. The sampled positions
    (coordinate augmentation's base) are the same."""
    pe = Learned(4, grid_shape=table, fit="square_crop", interpolation="bilinear", antialias=False,
                 align_corners=align_corners)
    side = max(grid)
    square = F.interpolate(pe.table.detach().permute(2, 0, 1)[None], size=(side, side), mode="bilinear",
                           align_corners=align_corners)[0, :, :grid[0], :grid[1]]
    expected = pe.table.detach() if grid == table else square.permute(1, 2, 0)
    with torch.no_grad():
        torch.testing.assert_close(pe.patch_table(Grid(grid)), expected.reshape(-1, 4))
        if grid != table:
            torch.testing.assert_close(pe._sampled_table(Grid(grid)).reshape(-1, 4), expected.reshape(-1, 4))


def test_learned_offset_selects_window():
    pe = Learned(4, grid_shape=(3, 5))
    window = pe.patch_table(Grid((2, 3), offset=(1, 2)))
    torch.testing.assert_close(window, pe.table[1:3, 2:5].reshape(-1, 4))


def test_learned_eval_cache_follows_parameter_updates():
    pe = Learned(4, grid_shape=(3, 3))
    with torch.no_grad():
        first = pe.patch_table(Grid((4, 4))).clone()
        pe.table.add_(1.0)
        second = pe.patch_table(Grid((4, 4)))
    torch.testing.assert_close(second, first + 1.0, atol=1e-5, rtol=0)  # bicubic weights sum to one


# -- PEG ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_peg_is_depthwise_conv_over_patches(shape):
    ndim, dim = len(shape), 6
    pe = PEG(dim, ndim=ndim)
    grid = Grid(shape, prefix=1)
    x = torch.randn(2, grid.num_tokens, dim)
    fmap = x[:, 1:].transpose(1, 2).reshape(2, dim, *shape)
    conv = getattr(F, f"conv{ndim}d")(fmap, pe.proj.weight, pe.proj.bias, padding=1, groups=dim)
    ref = x[:, 1:] + conv.flatten(2).transpose(1, 2)
    out = pe(x, grid)
    torch.testing.assert_close(out[:, :1], x[:, :1], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 1:], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("factorized", [False, True])
@pytest.mark.parametrize("frozen", [True, False])
def test_learned_resize_keeps_a_frozen_table_frozen(frozen, factorized):
    pe = Learned(8, ndim=2, grid_shape=(3, 5), factorized=factorized).requires_grad_(not frozen)
    pe.resize((4, 6))
    assert all(p.requires_grad is not frozen for p in pe.parameters())
