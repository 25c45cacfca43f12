"""Decomposed relative positions (``decomposed_rel_pos``, MViTv2 / ViTDet / SAM): timm's
``get_decomposed_rel_pos_bias`` is the 2D oracle (its tables resampled linearly at other sizes), the definition written
out per token pair the 1D and 3D one; attention hands the bias its queries."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer_sam import get_decomposed_rel_pos_bias

import visionpe as vpe
from visionpe.grid import Layout

HEADS, HEAD_DIM = 2, 4


def build(grid_shape, seed: int = 0):
    torch.manual_seed(seed)
    return vpe.build("decomposed_rel_pos", num_heads=HEADS, head_dim=HEAD_DIM, grid_shape=grid_shape, init_std=0.5)


def queries(batch: int, tokens: int, seed: int = 1) -> torch.Tensor:
    """``(batch, heads, T, head_dim)`` queries."""
    return torch.randn(batch, HEADS, tokens, HEAD_DIM, generator=torch.Generator().manual_seed(seed))


def merged(q: torch.Tensor) -> torch.Tensor:
    return q.transpose(1, 2).flatten(2)


@pytest.mark.parametrize("shape", [(4, 3), (6, 5), (2, 3)], ids=["native", "larger", "smaller"])
def test_2d_bias_is_timms_decomposed_bias_at_every_size(shape):
    """timm's (ViTDet's) bias from the same ``rel_pos_h``, ``rel_pos_w``: at the tables' grid, and at a larger and a
    smaller one, where timm resamples each table linearly to the new offsets."""
    pe = build((4, 3))
    n = shape[0] * shape[1]
    q = queries(3, n)
    expected = get_decomposed_rel_pos_bias(q.reshape(3 * HEADS, n, HEAD_DIM), pe.rel_pos_h, pe.rel_pos_w, shape,
                                           shape).reshape(3, HEADS, n, n)
    torch.testing.assert_close(pe(vpe.Grid(shape), merged(q)), expected, rtol=0, atol=1e-5)


def definition(pe, shape, q: torch.Tensor) -> torch.Tensor:
    """``sum_a q_i . R_a[c_ia - c_ja + S_a - 1]`` per token pair, each table resampled linearly to ``2 S_a - 1`` rows
    (half-pixel centres) where its length differs."""
    tables = [getattr(pe, name) for name in ("rel_pos_t", "rel_pos_h", "rel_pos_w")[3 - len(shape):]]
    tables = [F.interpolate(t.t()[None], size=2 * s - 1, mode="linear")[0].t() for t, s in zip(tables, shape)]
    coords = list(itertools.product(*[range(s) for s in shape]))
    out = torch.zeros(q.shape[0], HEADS, len(coords), len(coords))
    for i, ci in enumerate(coords):
        for j, cj in enumerate(coords):
            rows = torch.stack([t[a - b + s - 1] for t, a, b, s in zip(tables, ci, cj, shape)])  # (ndim, head_dim)
            out[:, :, i, j] = (q[:, :, i, None, :] * rows).sum((-1, -2))
    return out


@pytest.mark.parametrize("native,shape", [((5,), (5,)), ((5,), (3,)), ((2, 3, 2), (2, 3, 2)), ((2, 3, 2), (3, 2, 3))])
def test_1d_and_3d_bias_is_the_definition(native, shape):
    """One table per axis, ``(2 S_a - 1, head_dim)`` (3D: MViTv2's ``rel_pos_t``, ``rel_pos_h``, ``rel_pos_w``)."""
    pe = build(native)
    assert [p.shape for p in pe.parameters()] == [(2 * s - 1, HEAD_DIM) for s in native]
    q = queries(2, len(list(itertools.product(*[range(s) for s in shape]))))
    torch.testing.assert_close(pe(vpe.Grid(shape), merged(q)), definition(pe, shape, q), rtol=0, atol=1e-5)


def test_prefix_tokens_get_zero_bias_and_kept_tokens_their_own_rows():
    pe = build((3, 3))
    q = queries(2, 1 + 9)
    full = pe(vpe.Grid((3, 3), prefix=1), merged(q))
    assert full[:, :, 0].abs().max() == 0 and full[:, :, :, 0].abs().max() == 0
    torch.testing.assert_close(full[:, :, 1:, 1:], pe(vpe.Grid((3, 3)), merged(q[:, :, 1:])))
    keep = torch.tensor([[4, 0, 8], [1, 2, 7]])
    index = torch.cat([torch.zeros(2, 1, dtype=torch.long), keep + 1], 1)
    kept_q = torch.stack([q[b][:, index[b]] for b in range(2)])
    expected = torch.stack([full[b][:, index[b]][:, :, index[b]] for b in range(2)])
    torch.testing.assert_close(pe(Layout(vpe.Grid((3, 3), prefix=1), keep), merged(kept_q)), expected)


def test_attention_hands_the_bias_its_queries():
    """:class:`visionpe.Attention` with the bias is ``softmax(q k^T / sqrt(d) + bias(q)) v`` (q after ``q_norm``, the
    bias unscaled), written out."""
    torch.manual_seed(0)
    pe = build((3, 4))
    attn = vpe.Attention(HEADS * HEAD_DIM, num_heads=HEADS, qk_norm=True, bias=pe).eval()
    x = torch.randn(2, 12, HEADS * HEAD_DIM)
    q, k, v = attn.qkv(x).unflatten(-1, (3, HEADS, HEAD_DIM)).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q), attn.k_norm(k)
    logits = q @ k.transpose(-1, -2) * HEAD_DIM ** -0.5 + pe(vpe.Grid((3, 4)), merged(q))
    expected = attn.proj((logits.softmax(-1) @ v).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attn(x, vpe.Grid((3, 4))), expected, rtol=1e-5, atol=1e-5)


def test_a_vit_takes_it_at_any_size_and_trains_its_tables():
    """A timm ViT: each block's bias on the patch grid (the class token's rows zero), run at other sizes, the tables
    get gradients."""
    model = vpe.create_model("vit_tiny_patch16_224", pe="decomposed_rel_pos", img_size=32, patch_size=8, depth=2,
                             embed_dim=16, num_heads=2, num_classes=3)
    bias = model.blocks[0].attn.bias
    assert isinstance(bias, vpe.bias.DecomposedRelPos) and bias.grid_shape == (4, 4)
    assert bias.rel_pos_h.shape == (7, 8)
    for size in ((32, 32), (48, 24)):
        assert torch.isfinite(model(torch.randn(2, 3, *size))).all()
    model(torch.randn(2, 3, 40, 40)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in bias.parameters())


def test_a_call_without_queries_or_with_the_wrong_width_is_refused():
    pe = build((3, 3))
    with pytest.raises(ValueError, match=r"reads the attention's queries.*num_heads \* head_dim = 8"):
        pe(vpe.Grid((3, 3)))
    with pytest.raises(ValueError, match=r"queries must be .*\(batch, 9, num_heads \* head_dim = 8\).*got \(2, 9, 6\)"):
        pe(vpe.Grid((3, 3)), torch.randn(2, 9, 6))
    with pytest.raises(ValueError, match="grid has 3 axes.*ndim=2"):
        pe(vpe.Grid((2, 2, 2)), torch.randn(1, 8, 8))
    with pytest.raises(ValueError, match="init_std must be >= 0"):
        vpe.build("decomposed_rel_pos", num_heads=2, head_dim=4, init_std=-1.0)
