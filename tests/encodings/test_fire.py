"""FIRE against its formula in float64, and the paper's statement that below the threshold FIRE is its unnormalised
form (a function of the offset alone), while larger inputs are interpolated onto the trained range."""
import math

import pytest
import torch

import visionpe as vpe
from visionpe import Grid


def psi(x: torch.Tensor, c: float) -> torch.Tensor:
    return torch.log(torch.abs(c * x) + 1)


def mlp64(pe, u: torch.Tensor) -> torch.Tensor:
    """The module's MLP in float64: ``u (..., inputs) -> (..., heads)``."""
    first, last = pe.mlp[0], pe.mlp[2]
    hidden = torch.relu(u @ first.weight.double().T + first.bias.double())
    return hidden @ last.weight.double().T + last.bias.double()


def randomise(pe, c: float = 0.3, multiplier: float = 0.9):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in pe.mlp.parameters():
            p.normal_()
        pe.c.fill_(c)
        pe.threshold_multiplier.fill_(multiplier)
    return pe


def reference(pe, shape, distance: str) -> torch.Tensor:
    """``(heads, N, N)`` float64 from the formula: d = c_q - c_k, E_a = S_a - 1 (the grid diagonal for Euclidean),
    L = |m L0|, u = sign(d) psi(|d|) / (psi(max(E, L)) + eps) per axis, or psi(|d|) / (psi(max(E, L)) + eps)."""
    coords = Grid(shape).coords(dtype=torch.float64)
    d = coords[:, None] - coords[None]  # (N, N, ndim)
    c, eps = pe.c.item(), pe.eps
    threshold = abs(pe.threshold_multiplier.item() * pe.threshold_init.item())
    spans = torch.tensor([s - 1 for s in shape], dtype=torch.float64)
    if distance == "axes":
        u = torch.sign(d) * psi(d.abs(), c) / (psi(torch.clamp(spans, min=threshold), c) + eps)
    else:
        u = psi(d.norm(dim=-1, keepdim=True), c) / (psi(torch.clamp(spans.norm(), min=threshold), c) + eps)
    return mlp64(pe, u).permute(2, 0, 1)


@pytest.mark.parametrize("distance", ["axes", "euclidean"])
@pytest.mark.parametrize("shape", [(3, 4), (6, 2), (7,), (2, 3, 2)])
def test_fire_matches_its_formula_in_float64(distance, shape):
    pe = randomise(vpe.build("fire", num_heads=3, ndim=len(shape), grid_shape=(3,) * len(shape), distance=distance))
    grid = Grid(shape, prefix=1)
    bias = pe(grid).detach().double()
    assert bias.shape == (3, grid.num_tokens, grid.num_tokens)
    torch.testing.assert_close(bias[:, 1:, 1:], reference(pe, shape, distance), atol=1e-5, rtol=1e-5)
    assert not bias[:, 0].any() and not bias[:, :, 0].any()  # prefix rows and columns are zero


def test_one_dimensional_fire_is_the_paper_formula_for_causal_offsets():
    """1D, d = i - j >= 0: f(psi(d) / psi(max(E, L))), the paper's bias with the grid extent E in place of i."""
    pe = randomise(vpe.build("fire", num_heads=2, ndim=1, threshold=4.0))
    n = 9
    bias = pe(Grid((n,))).detach().double()
    i, j = torch.tril_indices(n, n)
    d = (i - j).double()[:, None]
    expected = mlp64(pe, psi(d, 0.3) / (psi(torch.tensor(max(n - 1, 0.9 * 4.0)), 0.3) + 1e-6))
    torch.testing.assert_close(bias[:, i, j].T, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("distance", ["axes", "euclidean"])
def test_below_the_threshold_fire_is_its_unnormalised_form(distance):
    """Trained on 4x4 (L0 = its extent): on the training grid and every smaller grid the normaliser is the constant
    psi(L), so an offset gets the same bias on all of them, MLP(psi(d) / psi(L)); FIRE's unnormalised form."""
    pe = randomise(vpe.build("fire", num_heads=2, grid_shape=(4, 4), distance=distance), multiplier=1.0)
    threshold = 3.0 if distance == "axes" else math.sqrt(18)
    assert pe.threshold().item() == pytest.approx(threshold)

    def unnormalised(d):
        if distance == "axes":
            u = torch.sign(d) * psi(d.abs(), 0.3) / (psi(torch.tensor(threshold), 0.3) + 1e-6)
        else:
            u = psi(d.norm(dim=-1, keepdim=True), 0.3) / (psi(torch.tensor(threshold), 0.3) + 1e-6)
        return mlp64(pe, u).permute(2, 0, 1)

    for shape in [(4, 4), (3, 3), (2, 4), (4, 1)]:
        coords = Grid(shape).coords(dtype=torch.float64)
        offsets = coords[:, None] - coords[None]  # c_q - c_k: the offset alone decides
        torch.testing.assert_close(pe(Grid(shape)).detach().double(), unnormalised(offsets), atol=1e-5, rtol=1e-5)


def test_beyond_the_threshold_offsets_are_interpolated_onto_the_trained_range():
    """On an 8x8 grid (extent 7 > L = 3) the longest offset maps where the training grid's longest did: the bias of
    offset (7, 7) on 8x8 equals that of (3, 3) on 4x4 (both inputs are (1, 1))."""
    pe = randomise(vpe.build("fire", num_heads=2, grid_shape=(4, 4)), multiplier=1.0)
    big, small = pe(Grid((8, 8))).detach(), pe(Grid((4, 4))).detach()
    torch.testing.assert_close(big[:, -1, 0], small[:, -1, 0], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(big[:, 3 * 8 + 3, 0], small[:, -1, 0])  # offset (3, 3) on 8x8 now maps inside


def test_default_threshold():
    assert float(vpe.build("fire", num_heads=2).threshold_init) == 512.0  # the paper's L0 without a grid
    assert float(vpe.build("fire", num_heads=2, grid_shape=(3, 5)).threshold_init) == 4.0
    assert float(vpe.build("fire", num_heads=2, grid_shape=(3, 5), distance="euclidean").threshold_init) == \
        pytest.approx(math.sqrt(20))
    normalized = vpe.build("fire", num_heads=2, grid_shape=(4, 4), coords="normalized")
    assert float(normalized.threshold_init) == pytest.approx(1.5)  # 2 (S - 1) / S normalised units


def test_parameters_learn_cache_in_eval_and_refresh_after_a_step():
    pe = vpe.build("fire", num_heads=2, grid_shape=(3, 3))
    grid = Grid((3, 3), prefix=1)
    pe.train()(grid).pow(2).sum().backward()
    for name in ("c", "threshold_multiplier", "mlp.0.weight", "mlp.2.weight"):
        assert pe.get_parameter(name).grad is not None, name
    assert float(pe.c.grad.abs()) > 0
    assert pe.no_weight_decay() == {name for name, _ in pe.named_parameters()}
    pe.eval()
    with torch.no_grad():
        first = pe(grid)
        assert pe(grid) is first
        torch.optim.SGD(pe.parameters(), lr=0.1).step()
        assert not torch.equal(pe(grid), first)
    augmented = vpe.build("fire", num_heads=2, grid_shape=(3, 3), jitter_coords=2.0).train()
    with torch.no_grad():
        assert not torch.equal(augmented(grid), augmented(grid))  # a fresh draw each call in training


@pytest.mark.parametrize("kwargs,message", [
    (dict(distance="manhattan"), "distance='manhattan'"), (dict(hidden_dim=0), "hidden_dim"),
    (dict(threshold=0.0), "threshold"), (dict(ndim=4), "ndim=4"), (dict(grid_shape=(3,)), "grid_shape"),
    (dict(eps=-1.0), "eps"),
])
def test_fire_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vpe.build("fire", num_heads=2, **kwargs)
    with pytest.raises(ValueError, match="grid has 3 axes"):
        vpe.build("fire", num_heads=2)(Grid((2, 2, 2)))
