"""Token subsets (MAE masking, patch dropout, pruning): each kept token keeps its own position, per sample."""
import pytest
import torch

import visionpe as vpe
from visionpe import Grid
from visionpe.grid import Layout
from visionpe.registry import ENCODINGS

SHAPES = {2: (3, 4), 3: (2, 3, 3)}
HEADS, HEAD_DIM = 2, 12
ROTARY_BIAS = [n for n, f in vpe.available().items() if f in ("rotary", "bias")]


def random_keep(batch: int, num_patches: int, num_keep: int, seed: int = 0) -> torch.Tensor:
    """A different, unsorted keep set per sample."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(num_patches, generator=g)[:num_keep] for _ in range(batch)])


def gather_tokens(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``(B, heads, P + N, d) -> (B, heads, P + K, d)``: the layout's tokens."""
    index = layout.token_index()[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[-1])
    return t.gather(2, index)


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", ROTARY_BIAS)
def test_kept_tokens_attend_as_the_full_grid_restricted_to_them(name, ndim):
    if ndim not in ENCODINGS[name].ndims:
        pytest.skip(f"{name} is defined for {ENCODINGS[name].ndims}D grids")
    torch.manual_seed(0)
    shape = SHAPES[ndim]
    context = vpe.ModelContext(shape, HEADS * HEAD_DIM, HEADS, HEAD_DIM)
    pe = ENCODINGS[name].for_model(context)
    for p in pe.parameters():  # fresh tables are ~0: make every entry count
        torch.nn.init.normal_(p)
    grid = Grid(shape, prefix=1)
    layout = Layout(grid, random_keep(3, grid.num_patches, 5))
    q, k, v = torch.randn(3, 3, HEADS, grid.num_tokens, HEAD_DIM).unbind(0)
    x = torch.randn(3, 1, grid.num_tokens, HEADS * HEAD_DIM)  # the tokens a token-reading bias (PaPE) reads
    rotary, bias = (pe, None) if pe.family == "rotary" else (None, pe)
    out = vpe.attend(gather_tokens(q, layout), gather_tokens(k, layout), gather_tokens(v, layout), layout,
                     rotary, bias, tokens=gather_tokens(x, layout)[:, 0])
    for b in range(3):  # full grid, keys limited to sample b's kept set, queries restricted afterwards
        index = layout.token_index()[b]
        allowed = torch.zeros(grid.num_tokens, dtype=torch.bool)
        allowed[index] = True
        full = vpe.attend(q[b:b + 1], k[b:b + 1], v[b:b + 1], grid, rotary, bias,
                          attn_mask=allowed[None, :].expand(grid.num_tokens, -1), tokens=x[b, :1])
        torch.testing.assert_close(out[b], full[0][:, index], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", ["sincos", "learned"])
def test_tokens_encodings_give_kept_tokens_their_own_vectors(name, ndim):
    torch.manual_seed(0)
    shape = SHAPES[ndim]
    pe = ENCODINGS[name].for_model(vpe.ModelContext(shape, 24, HEADS, HEAD_DIM, num_prefix_tokens=1))
    grid = Grid(shape, prefix=1)
    layout = Layout(grid, random_keep(2, grid.num_patches, 4, seed=1))
    x = torch.randn(2, grid.num_tokens, 24)
    index = layout.token_index()[..., None].expand(-1, -1, 24)
    torch.testing.assert_close(pe(x.gather(1, index), layout), pe(x, grid).gather(1, index))


def test_peg_refuses_a_subset():
    pe = vpe.build("peg", dim=8)
    layout = Layout(Grid((3, 3)), random_keep(1, 9, 4))
    with pytest.raises(ValueError, match="full patch grid"):
        pe(torch.randn(1, 4, 8), layout)


VIT_KW = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=3)


@pytest.mark.parametrize("pe", ["none", "sincos", "learned", "rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi",
                                "bucket_bias", "rope_mixed+learned", "rope_axial+alibi"])
def test_timm_patch_dropout_trains_with_every_encoding(pe):
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, patch_drop_rate=0.5, **VIT_KW).train()
    logits = model(torch.randn(2, 3, 16, 20))
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    logits.sum().backward()
    for enc in sum(vpe.encodings_of(model).values(), []):
        for p in enc.parameters():
            assert p.grad is not None
    model.eval()  # no dropping in evaluation
    assert model(torch.randn(1, 3, 16, 20)).shape == (1, 3)


def test_patch_dropout_keeps_positions_of_the_kept_patches():
    """With the same keep draw, patch dropout equals the masked forward on those patches."""
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+rel_bias", patch_drop_rate=0.5, **VIT_KW)
    x = torch.randn(2, 3, 16, 16)
    torch.manual_seed(3)
    dropped = model.train().forward_features(x)
    torch.manual_seed(3)
    keep = torch.argsort(torch.randn(2, 16), dim=-1)[:, :8]  # timm's draw
    masked, _ = model.forward_masked(x, keep=keep)
    torch.testing.assert_close(dropped, masked)


def test_forward_masked_keeps_positions_and_draws_per_sample():
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial+learned", **VIT_KW).eval()
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        everything = torch.arange(24).expand(2, -1)
        torch.testing.assert_close(model.forward_masked(x, keep=everything)[0], model.forward_features(x))
        tokens, keep = model.forward_masked(x, mask_ratio=0.75)
    assert tokens.shape == (2, 1 + 6, 24) and keep.shape == (2, 6)
    assert all(len(set(row.tolist())) == 6 for row in keep) and not torch.equal(keep[0], keep[1])
    with pytest.raises(ValueError, match="mask_ratio"):
        model.forward_masked(x, mask_ratio=1.5)
    with pytest.raises(ValueError, match="keep"):
        model.forward_masked(x, keep=torch.zeros(3, 4, dtype=torch.long))


def test_masked_video_clip_keeps_3d_positions():
    torch.manual_seed(0)
    model = vpe.create_video_model("vit_tiny_patch16_224", pe="rope_axial", num_frames=4, img_size=8,
                                   tubelet_size=(2, 4, 4), embed_dim=24, depth=1, num_heads=2, num_classes=3).eval()
    tokens, keep = model.forward_masked(torch.randn(2, 3, 4, 8, 8), mask_ratio=0.5)
    assert tokens.shape == (2, 1 + 4, 24) and keep.shape == (2, 4)


def test_peg_after_the_first_block_as_cpvt():
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="peg", **VIT_KW).eval()
    assert model.pe_tokens.block_index == 1
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        tokens, layout = model.embed(x)  # no position yet
        tokens = model.blocks[0](tokens, layout.grid)
        tokens = model.pe_tokens(tokens, layout.grid)
        expected = model.norm(model.blocks[1](tokens, layout.grid))
        torch.testing.assert_close(model.forward_features(x), expected)
    early = vpe.create_model("vit_tiny_patch16_224", pe="peg", pe_kwargs={"block_index": 0}, **VIT_KW)
    assert early.pe_tokens.block_index == 0
    with pytest.raises(ValueError, match="block_index=5 is out of range"):
        vpe.create_model("vit_tiny_patch16_224", pe="peg", pe_kwargs={"block_index": 5}, **VIT_KW)
    one_block = vpe.create_model("vit_tiny_patch16_224", pe="peg", **{**VIT_KW, "depth": 1})
    assert one_block.pe_tokens.block_index == 0


@pytest.mark.parametrize("bad", [[-1, 0], [0, 6], [2, 100]], ids=["negative", "one-past-the-end", "far"])
def test_keep_indices_outside_the_grid_are_refused(bad):
    """-1 is not counted from the end (it would take the prefix token's position); N and beyond do not exist."""
    grid = Grid((2, 3), prefix=1)
    with pytest.raises(ValueError, match=r"allowed 0 \.\. 5"):
        Layout(grid, torch.tensor([bad]))
    Layout(grid, torch.tensor([[0, 5]]))  # both ends allowed
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial+learned", **VIT_KW).eval()
    with pytest.raises(ValueError, match=r"allowed 0 \.\. 15"):
        model.forward_masked(torch.randn(1, 3, 16, 16), keep=torch.tensor([[-1, 3]]))


def test_a_meta_keep_is_checked_for_its_device_not_its_values():
    """A meta tensor has no values to range-check; it is refused at the call, where the tokens' device is known."""
    grid = Grid((2, 3), prefix=1)
    layout = Layout(grid, torch.tensor([[0, 3]], device="meta"))
    q = torch.randn(2, HEADS, 3, HEAD_DIM)
    with pytest.raises(ValueError, match="keep is on meta but the tokens are on cpu"):
        vpe.attend(q, q, q, layout, vpe.build("rope_axial", head_dim=HEAD_DIM, num_heads=HEADS))
    with pytest.raises(ValueError, match="keep is on meta but the tokens are on cpu"):
        vpe.build("sincos", dim=8)(torch.randn(2, 3, 8), layout)


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", ROTARY_BIAS + ["sincos", "learned"])
def test_one_keep_row_is_the_same_patches_for_every_sample(name, ndim):
    """keep ``(1, K)`` with a batch of 3 equals the row repeated 3 times, in every family."""
    if ndim not in ENCODINGS[name].ndims:
        pytest.skip(f"{name} is defined for {ENCODINGS[name].ndims}D grids")
    torch.manual_seed(0)
    shape = SHAPES[ndim]
    pe = ENCODINGS[name].for_model(vpe.ModelContext(shape, HEADS * HEAD_DIM, HEADS, HEAD_DIM, num_prefix_tokens=1))
    for p in pe.parameters():
        torch.nn.init.normal_(p)
    grid = Grid(shape, prefix=1)
    one = random_keep(1, grid.num_patches, 5)
    shared, repeated = Layout(grid, one), Layout(grid, one.expand(3, -1).contiguous())
    if pe.family == "tokens":
        x = torch.randn(3, shared.num_tokens, HEADS * HEAD_DIM)
        torch.testing.assert_close(pe(x, shared), pe(x, repeated), rtol=0, atol=0)
        return
    q, k, v = torch.randn(3, 3, HEADS, shared.num_tokens, HEAD_DIM).unbind(0)
    x = torch.randn(3, shared.num_tokens, HEADS * HEAD_DIM)  # read by a token-reading bias (PaPE)
    rotary, bias = (pe, None) if pe.family == "rotary" else (None, pe)
    torch.testing.assert_close(vpe.attend(q, k, v, shared, rotary, bias, tokens=x),
                               vpe.attend(q, k, v, repeated, rotary, bias, tokens=x),
                               rtol=1e-6, atol=1e-6)  # broadcast and batched products round differently


def test_forward_masked_with_one_keep_row():
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+learned+rel_bias", **VIT_KW).eval()
    x = torch.randn(2, 3, 16, 16)
    one = torch.tensor([[5, 0, 9]])
    with torch.no_grad():
        tokens, keep = model.forward_masked(x, keep=one)
        expected, _ = model.forward_masked(x, keep=one.expand(2, -1))
    assert keep.shape == (2, 3) and torch.equal(keep, one.expand(2, -1))
    torch.testing.assert_close(tokens, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="batch=2 or 1"):
        model.forward_masked(x, keep=torch.zeros(3, 4, dtype=torch.long))


def test_a_keep_batch_unlike_the_tokens_is_refused():
    layout = Layout(Grid((2, 3), prefix=1), random_keep(2, 6, 2))
    q = torch.randn(3, HEADS, 3, HEAD_DIM)
    for rotary, bias in [(vpe.build("rope_axial", head_dim=HEAD_DIM, num_heads=HEADS), None),
                         (None, vpe.build("alibi", num_heads=HEADS))]:
        with pytest.raises(ValueError, match="keep has 2 rows but the batch has 3 samples"):
            vpe.attend(q, q, q, layout, rotary, bias)
