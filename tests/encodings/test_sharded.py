"""Every encoding built on the meta device and materialised, cast, and sharded (FSDP2's ``fully_shard``): derived
buffers are recomputed exactly and stay float32, ``reset_parameters`` redraws what the constructor draws, and an
encoding whose parameters are DTensor shards gives the unsharded module's values (and gradients) from every method,
never keeping a shard or a stale table in its caches. The 2-process checks (real shards, FSDP vs DDP, DCP) are in
tests/train/test_parallel.py."""
import copy

import pytest
import torch
import torch.distributed as dist

import visionpe as vpe
from visionpe import Grid
from visionpe.cache import TableCache
from visionpe.registry import ENCODINGS
from visionpe.sharding import any_sharded, is_sharded

from conftest import SHAPES, bias_input, build_kwargs, requires

CASES = [(name, ndim) for name in ENCODINGS for ndim in (2, 3) if ndim in ENCODINGS[name].ndims]
IDS = [f"{name}-{ndim}d" for name, ndim in CASES]
FSDP2 = requires("torch", "2.6", "torch.distributed.fsdp.fully_shard (FSDP2's public API)")


def build(name: str, ndim: int, seed: int = 0):
    torch.manual_seed(seed)
    return vpe.build(name, **build_kwargs(name, ndim))


def grid_of(ndim: int) -> Grid:
    return Grid(SHAPES[ndim], prefix=1)


def output(pe, grid: Grid) -> torch.Tensor:
    """The forward of an encoding of any family on ``grid`` (fixed inputs)."""
    g = torch.Generator().manual_seed(1)
    if pe.family == "tokens":
        return pe(torch.randn(2, grid.num_tokens, pe.dim, generator=g), grid)
    if pe.family == "rotary":
        q = torch.randn(2, pe.num_heads, grid.num_tokens, pe.head_dim, generator=g)
        return torch.cat(pe(q, q.flip(-1), grid), dim=-1)
    extra = bias_input(pe, grid.num_tokens, generator=g)  # PaPE's input tokens, decomposed_rel_pos's queries
    return pe(grid) if extra is None else pe(grid, extra)


def buffers(module) -> dict:
    return dict(module.named_buffers())


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("name,ndim", CASES, ids=IDS)
def test_a_meta_build_materialised_and_reset_equals_the_eager_build(name, ndim):
    eager = build(name, ndim)
    with torch.device("meta"):
        pe = build(name, ndim)
    assert all(p.is_meta for p in pe.parameters())
    pe.to_empty(device="cpu")
    derived = {n for n in buffers(pe) if n not in pe.state_dict()}
    # to_empty alone: the derived (non-persistent) buffers are recomputed, not garbage
    assert_same_tensors({n: b for n, b in buffers(pe).items() if n in derived},
                        {n: b for n, b in buffers(eager).items() if n in derived})
    torch.manual_seed(0)  # the eager build's RNG state: reset_parameters draws what the constructor drew
    pe.reset_parameters()
    assert_same_tensors(pe.state_dict(), eager.state_dict())
    assert_same_tensors(buffers(pe), buffers(eager))
    grid = grid_of(ndim)
    torch.testing.assert_close(output(pe.eval(), grid), output(eager.eval(), grid), rtol=0, atol=0)


@pytest.mark.parametrize("name,ndim", CASES, ids=IDS)
def test_reset_parameters_redraws_the_parameters_and_keeps_the_buffers(name, ndim):
    pe = build(name, ndim)
    before = copy.deepcopy(pe.state_dict())
    with torch.no_grad():
        for p in pe.parameters():
            p.fill_(7.0)
    torch.manual_seed(0)
    pe.reset_parameters()
    assert_same_tensors(pe.state_dict(), before)
    torch.manual_seed(1)
    pe.reset_parameters()
    random = [n for n, p in pe.named_parameters() if p.numel() > 1 and not torch.equal(p, before[n])]
    fixed = ["skew", "c", "threshold_multiplier", "A_u", "A_v", "sigma"]  # drawn from nothing (zeros, constants)
    assert {n for n, p in pe.named_parameters() if p.numel() > 1} - set(random) <= set(fixed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,ndim", CASES, ids=IDS)
def test_a_cast_leaves_derived_buffers_float32_and_exact(name, ndim, dtype):
    """``model.to(bfloat16)`` would round frequency bands, slopes and bases; they are recomputed instead."""
    eager = build(name, ndim)
    pe = copy.deepcopy(eager).to(dtype)
    derived = {n for n in buffers(pe) if n not in pe.state_dict()}
    assert_same_tensors({n: b for n, b in buffers(pe).items() if n in derived},
                        {n: b for n, b in buffers(eager).items() if n in derived})
    assert all(p.dtype == dtype for p in pe.parameters())


@pytest.mark.parametrize("name,ndim", CASES, ids=IDS)
def test_parameters_are_contiguous(name, ndim):
    """FSDP2 shards contiguous parameters only (rope_mixed's frequencies were a permuted view)."""
    pe = build(name, ndim)
    assert all(p.is_contiguous() for p in pe.parameters())


# -- sharded: FSDP2 on a one-process gloo mesh (every parameter a DTensor outside the forward) ------------------------
@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('mesh') / 'store'}", rank=0,
                            world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def shard(pe, mesh):
    from torch.distributed.fsdp import fully_shard
    fully_shard(pe, mesh=mesh)
    return pe


def outside_forward(pe, grid: Grid) -> dict:
    """What visualisation, attention's flex path and the sweep read from an encoding, outside its forward."""
    reads = {}
    if pe.family == "tokens":
        reads["position_vectors"] = pe.position_vectors(grid)
        if hasattr(pe, "patch_table"):
            bigger = Grid(tuple(s + 1 for s in grid.shape), prefix=grid.prefix)  # a resampled table
            reads["patch_table"] = pe.patch_table(bigger)
    elif pe.family == "rotary":
        reads["rotation_blocks"] = pe.rotation_blocks(grid)
        reads["pair_map"] = pe.pair_map(grid)
        try:
            reads["frequency_vectors"] = pe.frequency_vectors()
        except ValueError:  # LieRE's rotations are not planes at fixed frequencies
            pass
    else:
        reads["pair_map"] = pe.pair_map(grid)
        extra = bias_input(pe, grid.num_tokens, generator=torch.Generator().manual_seed(2))
        score = pe.score_mod(grid) if extra is None else pe.score_mod(grid, extra)
        if score is not None:
            reads.update({f"score_mod table {i}": t for i, t in enumerate(score.tables)})
    return reads


@FSDP2
@pytest.mark.parametrize("name,ndim", CASES, ids=IDS)
def test_a_sharded_encoding_gives_the_unsharded_values_everywhere(name, ndim, mesh):
    plain = build(name, ndim)
    pe = shard(copy.deepcopy(plain), mesh)
    if any(True for _ in plain.parameters()):
        assert all(is_sharded(p) for p in pe.parameters())
    grid = grid_of(ndim)
    for mode in ("train", "eval"):
        plain.train(mode == "train"), pe.train(mode == "train")
        expected, got = outside_forward(plain, grid), outside_forward(pe, grid)
        assert expected.keys() == got.keys()
        for what in expected:
            assert not is_sharded(got[what]), what
            torch.testing.assert_close(got[what], expected[what], rtol=1e-6, atol=1e-6, equal_nan=True,
                                       msg=f"{mode} {what}")
        with torch.no_grad():
            torch.testing.assert_close(output(pe, grid), output(plain, grid), rtol=1e-6, atol=1e-6)
    for cache in (v for v in vars(pe).values() if isinstance(v, TableCache)):
        assert not any_sharded(t for table in cache.tables() for t in (table if isinstance(table, tuple) else (table,)))
        assert not any(is_sharded(t) for t in cache._watch._seen.values())


GRADIENT_CASES = ["learned", "rope_mixed", "string", "comrope", "liere", "rel_bias", "cpb", "bucket_bias", "fire", "peg"]


def gradients(pe, grid: Grid) -> dict:
    """Gradients of a training-mode read outside the forward (a resampled table, rotations, a flex table)."""
    pe.train()
    if pe.family == "tokens":
        bigger = Grid(tuple(s + 1 for s in grid.shape), prefix=grid.prefix)
        value = pe.patch_table(bigger) if hasattr(pe, "patch_table") else pe(torch.ones(1, bigger.num_tokens, pe.dim),
                                                                              bigger)
    elif pe.family == "rotary":
        value = pe.rotations(grid)
    else:
        score = pe.score_mod(grid)
        value = pe(grid) if score is None else score.tables[0]  # a bias without a pair form: its forward
    (value * torch.linspace(-1, 1, value.numel()).reshape(value.shape)).sum().backward()
    return {n: (p.grad.full_tensor() if is_sharded(p.grad) else p.grad) for n, p in pe.named_parameters()}


@FSDP2
@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_gradients_reach_sharded_parameters_read_outside_the_forward(name, mesh):
    plain = build(name, 2)
    pe = shard(copy.deepcopy(plain), mesh)
    grid = grid_of(2)
    expected, got = gradients(plain, grid), gradients(pe, grid)
    assert expected.keys() == got.keys() and any(g.abs().sum() > 0 for g in expected.values())
    for n in expected:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-5, atol=1e-6, msg=n)


@FSDP2
@pytest.mark.parametrize("name", ["learned", "rope_mixed", "rel_bias", "cpb", "fire", "liere"])
def test_a_cached_evaluation_table_follows_a_step_on_the_shards(name, mesh):
    """Evaluation tables are cached from the gathered parameters inside the forward; a step on the shards (what the
    optimizer changes) gives the next forward the new values, never a table of the old ones."""
    plain = build(name, 2).eval()
    pe = shard(copy.deepcopy(plain), mesh).eval()
    grid = Grid((4, 5), prefix=1) if name in ("learned", "rel_bias") else grid_of(2)  # learned: a resampled table
    with torch.no_grad():
        first = output(pe, grid)
        assert torch.equal(output(pe, grid), first)
        pe.reshard()  # a root keeps its gathered parameters after the forward; a backward would reshard them
        for p, q in zip(pe.parameters(), plain.parameters()):
            p.to_local().mul_(0.5).add_(0.125)
            q.mul_(0.5).add_(0.125)
        after = output(pe, grid)
    assert not torch.equal(after, first)
    torch.testing.assert_close(after, output(plain, grid), rtol=1e-6, atol=1e-6)


@FSDP2
@pytest.mark.parametrize("name", ["learned", "rel_bias"])
def test_resizing_a_sharded_table_is_a_clear_error(name, mesh):
    pe = shard(build(name, 2), mesh)
    with pytest.raises(ValueError, match="sharded"):
        pe.resize((5, 6))


@FSDP2
@pytest.mark.parametrize("name,ndim", CASES, ids=IDS)
def test_a_meta_build_sharded_then_materialised_and_reset_equals_the_eager_build(name, ndim, mesh):
    """DINOv3's order: build on the meta device, shard, ``to_empty``, initialise: each shard gets its part."""
    eager = build(name, ndim)
    with torch.device("meta"):
        pe = build(name, ndim)
    shard(pe, mesh)
    pe.to_empty(device="cpu")
    torch.manual_seed(0)
    pe.reset_parameters()
    state = {n: t.full_tensor() if is_sharded(t) else t for n, t in pe.state_dict().items()}
    assert_same_tensors(state, eager.state_dict())
    assert_same_tensors(buffers(pe), buffers(eager))
