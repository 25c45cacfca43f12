"""Grid layout and the axis-generic table resampling everything else builds on."""
import pytest
import torch
import torch.nn.functional as F

from visionpe import Grid
from visionpe.grid import as_grid
from visionpe.resample import resample_grid


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 4)])
def test_coords_row_major_last_axis_fastest(shape):
    coords = Grid(shape).coords()
    assert coords.shape == (torch.Size(shape).numel(), len(shape)) and coords.dtype == torch.float32
    # token t sits at the unravelled index of t (row-major), as x.flatten(2) orders patches
    expected = torch.stack(torch.unravel_index(torch.arange(coords.shape[0]), shape), -1).float()
    torch.testing.assert_close(coords, expected, rtol=0, atol=0)


def test_coords_offset_and_counts():
    grid = Grid((3, 5), prefix=2, offset=(1, -2.5))
    assert (grid.ndim, grid.num_patches, grid.num_tokens) == (2, 15, 17)
    torch.testing.assert_close(grid.coords(), Grid((3, 5)).coords() + torch.tensor([1.0, -2.5]))
    assert grid.coords()[1].tolist() == [1.0, -1.5]  # second patch: same row, next column


def test_grid_hashable_and_normalised():
    assert Grid([3, 4]) == Grid((3, 4)) and hash(Grid([3, 4])) == hash(Grid((3, 4)))
    assert Grid((3, 4), offset=(0, 0)) == Grid((3, 4))  # a zero offset is no offset
    assert Grid((3, 4), prefix=1) != Grid((3, 4))
    assert len({Grid((3, 4)), Grid((3, 4)), Grid((4, 3))}) == 2


def test_with_shape_keeps_prefix_and_offset():
    grid = Grid((3, 4), prefix=1, offset=(2, 2)).with_shape((5, 6))
    assert (grid.shape, grid.prefix, grid.offset) == ((5, 6), 1, (2.0, 2.0))
    assert as_grid((5, 6)) == Grid((5, 6)) and as_grid(grid) is grid


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("new", [(6, 9), (2, 3), (5, 2)])
def test_resample_grid_equals_2d_interpolate(new, antialias):
    """Resampling one axis at a time equals a single 2D bicubic ``F.interpolate``."""
    table = torch.randn(3, 5, 4)
    ours = resample_grid(table, new, "bicubic", antialias)
    ref = F.interpolate(table.permute(2, 0, 1)[None], size=new, mode="bicubic", align_corners=False,
                        antialias=antialias)[0].permute(1, 2, 0)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_resample_grid_3d_equals_trilinear():
    table = torch.randn(2, 3, 4, 5)
    ours = resample_grid(table, (4, 5, 3), "bilinear", antialias=False)
    ref = F.interpolate(table.permute(3, 0, 1, 2)[None], size=(4, 5, 3), mode="trilinear",
                        align_corners=False)[0].permute(1, 2, 3, 0)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
