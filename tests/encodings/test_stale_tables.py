"""Cached tables follow their parameters: every way of changing a weight outside autograd (``p.data.mul_()``,
``p.data = ...``, an in-place write under ``no_grad``, ``load_state_dict``) changes the next evaluation output."""
import pytest
import torch
from conftest import DIM, NUM_HEADS, SHAPES, build_kwargs

import visionpe as vpe
from visionpe import Grid
from visionpe.cache import ParameterWatch, TableCache
from visionpe.registry import ENCODINGS

# every built-in encoding with parameters, on a grid where its eval output comes from a cached table
CASES = {
    "learned": (dict(dim=8, grid_shape=(2, 3)), Grid((3, 4), prefix=1)),  # another size: a resampled table
    "learned-normalized": (dict(dim=8, grid_shape=(2, 3), coords="normalized"), Grid((3, 4))),
    "learned-factorized": (dict(dim=8, grid_shape=(2, 3), factorized=True), Grid((2, 3))),
    "rope_mixed": (dict(head_dim=8, num_heads=2), Grid((2, 3), prefix=1)),
    "string": (dict(head_dim=8, num_heads=2), Grid((2, 3), prefix=1)),
    "comrope": (dict(head_dim=8, num_heads=2), Grid((2, 3), prefix=1)),
    "liere": (dict(head_dim=8, num_heads=2), Grid((2, 3), prefix=1)),
    "swin_bias": (dict(num_heads=2, window_size=(2, 3)), Grid((2, 3))),
    "rel_bias": (dict(num_heads=2, grid_shape=(2, 3)), Grid((2, 3), prefix=1)),
    "cpb": (dict(num_heads=2, window_size=(2, 3), hidden_dim=8), Grid((2, 3))),
    "bucket_bias": (dict(num_heads=2), Grid((2, 3))),
    "fire": (dict(num_heads=2, grid_shape=(2, 3)), Grid((2, 3))),
}


def build(case: str):
    kwargs, grid = CASES[case]
    return vpe.build(case.split("-")[0], **kwargs).eval(), grid


def output(pe, grid: Grid) -> torch.Tensor:
    with torch.no_grad():
        if pe.family == "tokens":
            return pe(torch.zeros(1, grid.num_tokens, pe.dim), grid)
        if pe.family == "rotary":
            q = torch.ones(1, pe.num_heads, grid.num_tokens, pe.head_dim)
            return pe(q, q, grid)[0]
        return pe(grid)


def change_through_data(p):
    p.data.mul_(0.5).add_(0.25)


def assign_data(p):
    p.data = p.data * 0.5 + 0.25


def change_in_place(p):
    with torch.no_grad():
        p.mul_(0.5).add_(0.25)


def change_one_value(p):
    p.data[(0,) * p.ndim] += 1.0


CHANGES = {"data.mul_": change_through_data, "data=": assign_data, "no_grad mul_": change_in_place,
           "one value through data": change_one_value}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("case", list(CASES))
def test_output_follows_a_changed_parameter(case, change):
    pe, grid = build(case)
    before = output(pe, grid)
    assert torch.equal(output(pe, grid), before)  # served from the cache
    fresh = vpe.build(case.split("-")[0], **CASES[case][0]).eval()
    for p in pe.parameters():
        CHANGES[change](p)
    fresh.load_state_dict(pe.state_dict())
    after = output(pe, grid)
    assert not torch.equal(after, before)
    torch.testing.assert_close(after, output(fresh, grid), rtol=0, atol=0)  # what a module built with them gives


@pytest.mark.parametrize("case", ["rope_mixed", "rel_bias", "learned"])
def test_load_state_dict_changes_the_output(case):
    pe, grid = build(case)
    before = output(pe, grid)
    other, _ = build(case)
    pe.load_state_dict(other.state_dict())
    assert not torch.equal(output(pe, grid), before)
    torch.testing.assert_close(output(pe, grid), output(other, grid), rtol=0, atol=0)


@torch.no_grad()
def test_unchanged_parameters_keep_the_table():
    """A hit returns the very table built before (no rebuild), also after ``p.data = `` an equal tensor."""
    pe, grid = build("rope_mixed")
    table = pe.rotations(grid)
    assert pe.rotations(grid) is table
    pe.freqs.data = pe.freqs.data.clone()
    assert pe.rotations(grid) is table


@torch.no_grad()
def test_watch_keeps_parameters_of_different_lookups_apart():
    """STRING looks up its basis with one parameter and its rotations with all: neither empties the other's cache."""
    pe, grid = build("string")
    table = pe.rotations(grid)
    pe._cache.get(("basis", "cpu"), lambda: torch.zeros(1), (pe.skew,))
    assert pe.rotations(grid) is table


def test_watch_sees_values_whatever_the_version_says():
    watch, p = ParameterWatch(), torch.nn.Parameter(torch.ones(3))
    assert watch.changed((p,)) and not watch.changed((p,))
    p.data[1] = 2.0  # the version of p stays 0
    assert p._version == 0 and watch.changed((p,)) and not watch.changed((p,))
    p.data = torch.ones(3)  # another storage, the version kept
    assert p._version == 0 and watch.changed((p,)) and not watch.changed((p,))
    p.data = torch.ones(4)  # another shape
    assert watch.changed((p,))


def test_cache_without_parameters_is_unaffected():
    cache, calls = TableCache(), []
    for _ in range(3):
        cache.get("k", lambda: calls.append(1) or torch.zeros(1))
    assert len(calls) == 1


@pytest.mark.parametrize("name", sorted(vpe.available()))
def test_tables_cached_under_inference_mode_serve_a_later_backward(name):
    """A forward under ``torch.inference_mode()`` (an evaluation loop, a served request) caches tables that a later
    training forward reads: they are ordinary tensors, so autograd can save them for the backward (an inference tensor
    in a shared index table made every bias encoding's next backward raise)."""
    ndim = 2 if 2 in ENCODINGS[name].ndims else 3
    pe = vpe.build(name, **build_kwargs(name, ndim))
    attn = vpe.Attention(DIM, NUM_HEADS, rotary=pe if pe.family == "rotary" else None,
                         bias=pe if pe.family == "bias" else None)
    grid = Grid(SHAPES[ndim], prefix=1)

    def forward(x):
        return attn(pe(x, grid) if pe.family == "tokens" else x, grid)

    x = torch.randn(2, grid.num_tokens, DIM)
    with torch.inference_mode():
        evaluated = forward(x.clone())
    assert torch.is_inference(evaluated)
    x.requires_grad_(True)
    forward(x).square().mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
