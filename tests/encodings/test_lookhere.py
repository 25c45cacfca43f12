"""LookHere against the official convention (GreenCUBIC/lookhere, lookhere.py: create_lh_bias_tensor, read, not
copied), written down here:

- grid coordinates (x = column, y = row, rows growing downwards); d = key - query;
- "right" masks keys with kx < qx (np.less(x, compare_x)): a right head sees its own column too; "up" masks ky > qy;
- triangles: the 90-degree cone around a direction, its diagonals included (np.tri with the query's diagonal k):
  tri_up sees dy <= -|dx|, tri_down dy >= |dx|, tri_left dx <= -|dy|, tri_right dx >= |dy|;
- a head masks the union of its entries' masks (it sees the intersection), except a "diag_a_b" entry, which masks the
  intersection of triangles a and b (it sees their union, a diagonal half-plane);
- bias = -(global_slope * head_slope) * Euclidean distance (sqrt / square options), masked -> -max(bf16) there
  (-inf here), "zero" heads 0, "center" heads the key's distance to ((W-1)/2, (H-1)/2);
- slopes per run of one set: directional 2^-(1 + j // 4); none/zero/center [1/4, 1/16, 1/64, 1/256];
- the class token row and column are zero.
"""
import math

import pytest
import torch

import visionpe as vpe
from visionpe import Grid

INF = float("inf")


def sees(entry: str, dx: int, dy: int) -> bool:
    cones = {"up": dy <= -abs(dx), "down": dy >= abs(dx), "left": dx <= -abs(dy), "right": dx >= abs(dy)}
    halves = {"up": dy <= 0, "down": dy >= 0, "left": dx <= 0, "right": dx >= 0}
    if entry.startswith("tri_"):
        return cones[entry[4:]]
    if entry.startswith("diag_"):
        _, a, b = entry.split("_")
        return cones[a] or cones[b]
    return halves[entry]


def reference_mask(entries, shape) -> torch.Tensor:
    """``(N, N)`` bool: query row sees key column under the written-down convention."""
    h, w = shape
    cells = [(r, c) for r in range(h) for c in range(w)]
    directional = [e for e in entries if e not in ("zero", "center")]
    return torch.tensor([[all(sees(e, kc - qc, kr - qr) for e in directional) for kr, kc in cells]
                         for qr, qc in cells])


SETS = {
    "halves": [["up"], ["down"], ["left"], ["right"]],
    "corners": [["up", "left"], ["up", "right"], ["down", "left"], ["down", "right"]],
    "triangles": [["tri_up"], ["tri_down"], ["tri_left"], ["tri_right"]],
    "diagonals": [["diag_up_right"], ["diag_up_left"], ["diag_down_right"], ["diag_down_left"]],
    "eighths1": [["tri_up", "left"], ["tri_down", "left"], ["tri_left", "up"], ["tri_right", "up"]],
    "eighths2": [["tri_up", "right"], ["tri_down", "right"], ["tri_left", "down"], ["tri_right", "down"]],
    "zerotriangles": [["zero", "tri_up"], ["zero", "tri_down"], ["zero", "tri_left"], ["zero", "tri_right"]],
}


@pytest.mark.parametrize("name", list(SETS))
@pytest.mark.parametrize("shape", [(3, 3), (4, 6), (5, 2)])
def test_masks_are_the_stated_directions(name, shape):
    pe = vpe.build("lookhere", num_heads=4, head_directions=name)
    masks = pe.masks(shape)
    for head, entries in enumerate(SETS[name]):
        assert torch.equal(masks[head], reference_mask(entries, shape)), (name, head)
    assert bool(masks.diagonal(dim1=1, dim2=2).all())  # every query sees itself: no empty row


def test_a_written_down_3x3_case():
    """The centre query (1, 1) of a 3x3 grid, visible keys as (row, col)."""
    def visible(directions, head):
        pe = vpe.build("lookhere", num_heads=4, head_directions=directions)
        row = pe.masks((3, 3))[head, 4]
        return {(k // 3, k % 3) for k in row.nonzero().flatten().tolist()}

    assert visible("triangles", 0) == {(0, 0), (0, 1), (0, 2), (1, 1)}          # tri_up
    assert visible("eighths1", 0) == {(0, 0), (0, 1), (1, 1)}                  # tri_up and left
    assert visible("halves", 3) == {(r, c) for r in range(3) for c in (1, 2)}  # right, own column included
    assert visible("diagonals", 0) == {(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)}  # up-right half-plane
    assert visible("corners", 1) == {(0, 1), (0, 2), (1, 1), (1, 2)}          # up and right


@pytest.mark.parametrize("directions,heads,slopes", [
    ("halves-none", 6, [0.5] * 4 + [0.25, 0.0625]),
    ("halves-none", 12, [0.5] * 4 + [0.25] * 4 + [0.25, 0.0625, 0.015625, 0.00390625]),
    ("halves-triangles-none", 12, [0.5] * 8 + [0.25, 0.0625, 0.015625, 0.00390625]),
    ("triangles", 12, [0.5] * 4 + [0.25] * 4 + [0.125] * 4),
    ("none", 8, [0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.00390625, 0.00390625]),
    ("halves", 2, [0.5, 0.5]),  # generalised: the official code handles runs of multiples of 4 heads
])
def test_slopes_follow_the_official_rule(directions, heads, slopes):
    assert vpe.build("lookhere", num_heads=heads, head_directions=directions).slopes.tolist() == slopes


def test_head_assignment_as_the_official_blocks():
    """6 heads, 'halves-none': up, down, left, right, none, none; 12 heads, two sets: the first set twice."""
    pe = vpe.build("lookhere", num_heads=6, head_directions="halves-none")
    assert pe.head_entries == (("up",), ("down",), ("left",), ("right",), (), ())
    pe = vpe.build("lookhere", num_heads=12, head_directions="triangles-diagonals")
    assert [e[0] for e in pe.head_entries] == ["tri_up", "tri_down", "tri_left", "tri_right"] * 2 + [
        "diag_up_right", "diag_up_left", "diag_down_right", "diag_down_left"]


def test_bias_formula_and_prefix():
    grid, global_slope = Grid((3, 4), prefix=1), 0.5
    pe = vpe.build("lookhere", num_heads=8, head_directions="halves-center", global_slope=global_slope)
    bias = pe(grid).double()
    assert bias.shape == (8, 13, 13)
    assert torch.equal(bias[:, 0], torch.zeros(8, 13, dtype=torch.float64))
    assert torch.equal(bias[:, :, 0], torch.zeros(8, 13, dtype=torch.float64))
    coords = Grid((3, 4)).coords(dtype=torch.float64)
    distance = torch.cdist(coords, coords)
    for head, entries in enumerate(SETS["halves"]):
        expected = (-global_slope * 0.5 * distance).masked_fill(~reference_mask(entries, (3, 4)), -INF)
        torch.testing.assert_close(bias[head, 1:, 1:], expected)
    centre = torch.tensor([1.0, 1.5], dtype=torch.float64)  # ((H-1)/2, (W-1)/2)
    to_centre = (coords - centre).norm(dim=-1)
    for j, slope in enumerate([0.25, 0.0625, 0.015625, 0.00390625]):
        torch.testing.assert_close(bias[4 + j, 1:, 1:], (-global_slope * slope * to_centre).expand(12, -1))


@pytest.mark.parametrize("distance,power", [("sqrt", 0.5), ("square", 2.0)])
def test_distance_options(distance, power):
    grid = Grid((3, 3))
    pe = vpe.build("lookhere", num_heads=4, head_directions="none", distance=distance)
    coords = grid.coords(dtype=torch.float64)
    expected = -0.25 * torch.cdist(coords, coords) ** power
    torch.testing.assert_close(pe(grid)[0].double(), expected)


def test_zero_heads_carry_no_position():
    pe = vpe.build("lookhere", num_heads=4, head_directions="none1zero3")
    bias = pe(Grid((3, 3)))
    assert torch.equal(bias[1:], torch.zeros(3, 9, 9)) and bool((bias[0] < 0).sum() > 0)


def test_attention_is_finite_and_each_head_ignores_what_it_cannot_see():
    torch.manual_seed(0)
    pe = vpe.build("lookhere", num_heads=4, head_directions="triangles")
    grid = Grid((4, 4), prefix=1)
    q, k, v = torch.randn(3, 2, 4, grid.num_tokens, 8).unbind(0)
    out = vpe.attend(q, k, v, grid, bias=pe)
    assert torch.isfinite(out).all()
    v2 = v.clone()
    masks = pe.masks((4, 4))
    query = 1 + 5  # patch (1, 1)
    hidden = (~masks[0, 5]).nonzero().flatten() + 1
    v2[:, 0, hidden] = 1e4  # values of keys head 0 of that query cannot see
    torch.testing.assert_close(vpe.attend(q, k, v2, grid, bias=pe)[:, 0, query], out[:, 0, query])


def test_masks_and_bias_are_cached_and_distances_follow_coordinates():
    pe = vpe.build("lookhere", num_heads=4).eval()
    grid = Grid((3, 3))
    assert pe(grid) is pe(grid) and pe.masks((3, 3)) is pe.masks((3, 3))
    normalized = vpe.build("lookhere", num_heads=4, coords="normalized")
    index_bias, normalized_bias = pe(grid), normalized(grid)
    assert torch.equal(torch.isinf(index_bias), torch.isinf(normalized_bias))  # same fields of view
    finite = torch.isfinite(index_bias) & (index_bias != 0)
    torch.testing.assert_close(normalized_bias[finite], index_bias[finite] * (2 / 3))  # a patch is 2/3 unit
    augmented = vpe.build("lookhere", num_heads=4, rescale_coords=2.0).train()
    first, second = augmented(grid), augmented(grid)
    assert not torch.equal(first, second) and torch.equal(torch.isinf(first), torch.isinf(second))
    assert torch.equal(augmented.eval()(grid), pe(grid))


@pytest.mark.parametrize("kwargs,message", [
    (dict(ndim=3), "2D grids"), (dict(ndim=1), "2D grids"), (dict(head_directions="sideways"), "sideways"),
    (dict(head_directions="halves-corners"), "block"), (dict(head_directions=""), "direction set"),
    (dict(distance="cubic"), "distance='cubic'"), (dict(global_slope=-1.0), "global_slope"),
])
def test_lookhere_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vpe.build("lookhere", num_heads=4, **kwargs)


def test_lookhere_refuses_a_grid_of_other_axes():
    with pytest.raises(ValueError, match="grid has 3 axes"):
        vpe.build("lookhere", num_heads=2)(Grid((2, 2, 2)))
    assert math.isnan(float(vpe.build("lookhere", num_heads=4).pair_map(Grid((3, 3)))[0, 4, 7]))  # masked: blank
