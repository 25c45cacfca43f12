"""Memory at large grids: tables above the cache's byte limit are rebuilt per call, never kept one per block."""
from __future__ import annotations

import pytest
import torch

import visionpe as vpe
from visionpe.cache import MAX_TABLE_BYTES, TableCache, nbytes


def test_cache_keeps_small_tables_and_returns_large_ones_without_keeping_them():
    cache = TableCache(maxsize=4, max_bytes=1000)
    small, large = torch.zeros(10), torch.zeros(1000)
    assert cache.get("small", lambda: small) is small and cache.get("small", lambda: torch.ones(10)) is small
    assert cache.get("large", lambda: large) is large
    assert cache.get("large", lambda: torch.ones(1000)).eq(1).all()  # rebuilt: not kept
    assert [nbytes(t) for t in cache.tables()] == [40]
    assert nbytes((small, large)) == 40 + 4000


@pytest.mark.parametrize("pe", ["rel_bias", "cpb", "alibi", "rope_mixed", "learned"])
def test_large_grid_keeps_no_table_above_the_limit(pe):
    """A 64 x 64 grid (4096 tokens): a (heads, T, T) bias is 134 MB for 2 heads. After an eval forward no encoding
    keeps a table above the limit, and the output equals a second forward (rebuilt tables are the same tables)."""
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, img_size=32, patch_size=4, embed_dim=16, depth=2,
                             num_heads=2, num_classes=3).eval()
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        first, second = model(x), model(x)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    assert torch.isfinite(first).all()
    caches = {id(c): c for m in model.modules() for c in vars(m).values() if isinstance(c, TableCache)}.values()
    per_block = [nbytes(t) for c in caches if c.max_bytes is not None for t in c.tables()]
    assert max(per_block, default=0) <= MAX_TABLE_BYTES
    shared = [nbytes(t) for c in caches if c.max_bytes is None for t in c.tables()]
    assert len(shared) <= 1  # a module shared by every block (ALiBi) keeps its one table
    bias = vpe.encodings_of(model)["bias"]
    if bias:  # the over-limit path was taken: this grid's (heads, T, T) bias is larger than the limit
        with torch.no_grad():
            assert nbytes(bias[0](vpe.Grid((64, 64), prefix=1))) > MAX_TABLE_BYTES


def test_cache_copies_empty_and_pickles_without_its_tables():
    import copy
    import pickle
    cache = TableCache(maxsize=3, max_bytes=None)
    cache.get("a", lambda: torch.zeros(4))
    for other in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert (other.maxsize, other.max_bytes, other.tables()) == (3, None, [])


def test_shared_tables_are_built_once_per_forward_at_large_grids():
    """ALiBi (one module for every block) keeps its table whatever its size, and rel_bias blocks share one offset
    index: at 4096 tokens each is built once, not once per block."""
    from visionpe.bias._base import PAIR_INDEX
    for pe in ("alibi", "rel_bias"):
        model = vpe.create_model("vit_tiny_patch16_224", pe=pe, img_size=32, patch_size=4, embed_dim=16, depth=3,
                                 num_heads=2, num_classes=3).eval()
        PAIR_INDEX.clear()
        builds = []
        if pe == "alibi":
            (module,) = {id(m): m for m in vpe.encodings_of(model)["bias"]}.values()
            original = module._build
            module._build = lambda *a, **k: builds.append(1) or original(*a, **k)
        with torch.no_grad():
            model(torch.randn(1, 3, 256, 256))
            model(torch.randn(1, 3, 256, 256))
        if pe == "alibi":
            assert len(builds) == 1
        else:
            assert len(PAIR_INDEX.tables()) == 1  # one (N, N) index for the 3 blocks
