"""Bucketed relative bias (T5 buckets, iRPE piecewise index; product and cross methods) against closed forms."""
import math

import pytest
import torch

import visionpe as vpe
from visionpe import Grid
from visionpe.bias import piecewise_index, t5_bucket


def t5_reference(d: int, num_buckets: int = 32, max_distance: int = 128) -> int:
    """T5's bidirectional bucket for one offset ``d = key - query``, written out as in the paper's code (float32
    log, as Mesh TensorFlow computes it)."""
    half = num_buckets // 2
    base = half if d > 0 else 0
    n = abs(d)
    max_exact = half // 2
    if n < max_exact:
        return base + n
    ratio = torch.tensor(n / max_exact, dtype=torch.float32).log() / math.log(max_distance / max_exact)
    return base + min(half - 1, max_exact + int(ratio * (half - max_exact)))


def test_t5_bucket_closed_form_offsets_minus200_to_200():
    offsets = torch.arange(-200, 201)
    got = t5_bucket(offsets, num_buckets=32, max_distance=128).tolist()
    assert got == [t5_reference(d) for d in range(-200, 201)]
    # hand-checked values: exact near zero, direction in the upper half, saturation beyond max_distance
    table = dict(zip(range(-200, 201), got))
    assert [table[d] for d in (0, -1, 1, -7, 7, -8, 8)] == [0, 1, 17, 7, 23, 8, 24]
    assert table[-128] == table[-200] == 15 and table[128] == table[200] == 31
    assert set(got) == set(range(32)) - {16}  # T5 never uses bucket num_buckets/2 (offset 0 is in the lower half)


def piecewise_reference(d: float, alpha=1.9, beta=3.8, gamma=15.2) -> int:
    if abs(d) <= alpha:
        return round(d)
    value = alpha + math.log(abs(d) / alpha) / math.log(gamma / alpha) * (beta - alpha)
    return int(math.copysign(min(beta, round(value)), d))


def test_piecewise_index_closed_form():
    offsets = torch.arange(-40, 41)
    assert piecewise_index(offsets).tolist() == [piecewise_reference(d) for d in range(-40, 41)]
    assert piecewise_index(torch.tensor([0, 1, -1, 2, 3, 4, 100])).tolist() == [0, 1, -1, 2, 2, 3, 3]


@pytest.mark.parametrize("method", ["product", "cross"])
def test_irpe_2d_product_and_cross_formulas(method):
    torch.manual_seed(0)
    pe = vpe.build("bucket_bias", num_heads=2, ndim=2, bucket="piecewise", method=method)
    shape = (4, 9)
    bias = pe(Grid(shape))
    table, beta = pe.relative_position_bias_table.detach(), 3
    coords = [(r, c) for r in range(shape[0]) for c in range(shape[1])]
    for i, (ri, ci) in enumerate(coords):
        for j, (rj, cj) in enumerate(coords):
            gy, gx = piecewise_reference(rj - ri) + beta, piecewise_reference(cj - ci) + beta
            expected = table[gy * 7 + gx] if method == "product" else table[gy] + table[7 + gx]
            torch.testing.assert_close(bias[:, i, j], expected)


@pytest.mark.parametrize("shape", [(40,), (6, 7), (3, 4, 5)], ids=lambda s: f"{len(s)}d")
@pytest.mark.parametrize("bucket", ["t5", "piecewise"])
def test_translation_invariant_any_size_saturating(shape, bucket):
    torch.manual_seed(0)
    pe = vpe.build("bucket_bias", num_heads=3, ndim=len(shape), bucket=bucket, num_buckets=8, max_distance=16)
    grid = Grid(shape, prefix=1)
    bias = pe(grid)
    assert bias.shape == (3, grid.num_tokens, grid.num_tokens)
    assert bias[:, 0].abs().sum() == 0 and bias[:, :, 0].abs().sum() == 0  # prefix: zero rows and columns
    coords = grid.coords().long()
    seen = {}
    for i in range(grid.num_patches):
        for j in range(grid.num_patches):
            key = tuple((coords[j] - coords[i]).tolist())
            if key in seen:
                assert torch.equal(bias[:, 1 + i, 1 + j], seen[key])
            seen[key] = bias[:, 1 + i, 1 + j]
    torch.testing.assert_close(pe(Grid(shape, offset=(5,) * len(shape))), pe(Grid(shape)))  # shifted grid


def test_far_offsets_share_the_last_bucket():
    pe = vpe.build("bucket_bias", num_heads=1, ndim=1, num_buckets=8, max_distance=16)
    bias = pe(Grid((60,)))[0]
    assert bias[0, 20] == bias[0, 59] and bias[59, 0] == bias[39, 0]


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "swin_tiny_patch4_window7_224"])
def test_trains_in_backbones(name):
    kw = dict(img_size=16, patch_size=4, embed_dim=16, num_classes=3)
    kw.update(depth=2, num_heads=2) if name.startswith("vit") else kw.update(window_size=2, depths=(1,),
                                                                             num_heads=(2,))
    model = vpe.create_model(name, pe="bucket_bias", pe_kwargs={"num_buckets": 8, "max_distance": 16}, **kw)
    model(torch.randn(2, 3, 16, 24)).sum().backward()
    table = vpe.encodings_of(model)["bias"][0].relative_position_bias_table
    assert table.grad is not None and table.grad.abs().sum() > 0


@pytest.mark.parametrize("kwargs,words", [
    (dict(bucket="log"), ["bucket", "'t5'", "'piecewise'"]),
    (dict(method="sum"), ["method", "'product'", "'cross'"]),
    (dict(num_buckets=7), ["num_buckets", "even"]),
    (dict(max_distance=2, num_buckets=32), ["max_distance"]),
    (dict(alpha=0), ["alpha"]),
    (dict(beta=1.0), ["beta"]),
    (dict(gamma=float("nan")), ["gamma", "finite"]),
])
def test_bad_keywords_named(kwargs, words):
    with pytest.raises(ValueError) as info:
        vpe.build("bucket_bias", num_heads=2, **kwargs)
    assert all(w in str(info.value) for w in words), str(info.value)
