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
    held = [nbytes(t) for m in model.modules() for c in vars(m).values() if isinstance(c, TableCache)
            for t in c.tables()]
    assert max(held, default=0) <= MAX_TABLE_BYTES
    bias = vpe.encodings_of(model)["bias"]
    if bias:  # the over-limit path was taken: this grid's (heads, T, T) bias is larger than the limit
        with torch.no_grad():
            assert nbytes(bias[0](vpe.Grid((64, 64), prefix=1))) > MAX_TABLE_BYTES
