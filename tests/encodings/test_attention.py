"""attend / Attention against a hand-written reference and timm, permutation (non-)equivariance, and every
encoding's forward and backward at 2D and 3D grids in float32 and under bf16 autocast."""
import copy

import pytest
import torch
from conftest import DIM, HEAD_DIM, NUM_HEADS, SHAPES, build_kwargs, requires
from timm.layers import Attention as TimmAttention
from timm.layers import AttentionRope, RotaryEmbeddingCat

import visionpe as vpe
from visionpe import Attention, Grid, attend
from visionpe.grid import Layout, MixedLayout
from visionpe.tokens import Learned

NAMES = ("sincos", "learned", "peg", "rope_axial", "rope_mixed", "swin_bias", "rel_bias", "cpb", "alibi")
FAMILIES = {"sincos": "tokens", "learned": "tokens", "peg": "tokens", "rope_axial": "rotary", "rope_mixed": "rotary",
            "swin_bias": "bias", "rel_bias": "bias", "cpb": "bias", "alibi": "bias"}


def test_available_lists_every_core_encoding():
    available = vpe.available()
    assert {n: available.get(n) for n in NAMES} == FAMILIES
    for name in NAMES:
        assert vpe.build(name, **build_kwargs(name, 2)).family == FAMILIES[name]


def reference_attention(q, k, v, bias=None, scale=None):
    """``softmax(q k^T * scale + bias) v``."""
    logits = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    if bias is not None:
        logits = logits + bias
    return logits.softmax(-1) @ v


@pytest.mark.parametrize("bias_name", [None, "rel_bias", "alibi"])
@pytest.mark.parametrize("rotary_name", [None, "rope_axial", "rope_mixed"])
def test_attend_matches_reference(rotary_name, bias_name):
    grid = Grid((3, 4), prefix=1)
    rotary = rotary_name and vpe.build(rotary_name, **build_kwargs(rotary_name, 2))
    bias = bias_name and vpe.build(bias_name, **build_kwargs(bias_name, 2))
    q, k, v = torch.randn(3, 2, NUM_HEADS, grid.num_tokens, HEAD_DIM)
    with torch.no_grad():
        rq, rk = rotary(q, k, grid) if rotary else (q, k)
        ref = reference_attention(rq, rk, v, bias(grid) if bias else None)
        torch.testing.assert_close(attend(q, k, v, grid, rotary, bias), ref, atol=1e-5, rtol=1e-5)


def test_attend_masks_and_scale():
    grid = Grid((2, 3), prefix=1)
    q, k, v = torch.randn(3, 2, NUM_HEADS, grid.num_tokens, HEAD_DIM)
    bias = vpe.build("alibi", num_heads=NUM_HEADS)
    keep = torch.rand(grid.num_tokens, grid.num_tokens) > 0.3
    keep.fill_diagonal_(True)
    float_mask = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    ref = reference_attention(q, k, v, bias(grid) + float_mask, scale=0.3)
    torch.testing.assert_close(attend(q, k, v, grid, bias=bias, attn_mask=keep, scale=0.3), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attend(q, k, v, grid, bias=bias, attn_mask=float_mask, scale=0.3), ref,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["sincos", "rope_axial", "rope_mixed", "rel_bias", "alibi"])
def test_an_encoding_in_the_other_slot_is_refused(name):
    """A bias passed as ``rotary=`` (or the reverse, or a tokens encoding in either) is named, with its own slot."""
    pe = vpe.build(name, **build_kwargs(name, 2))
    grid = Grid((3, 4), prefix=1)
    q = torch.randn(1, NUM_HEADS, grid.num_tokens, HEAD_DIM)
    for slot in {"rotary", "bias"} - {pe.family}:
        hint = f"pass it as {pe.family}=" if pe.family != "tokens" else "added to the tokens before attention"
        with pytest.raises(ValueError, match=f"{slot}={type(pe).__name__} is a '{pe.family}' encoding.*{hint}"):
            attend(q, q, q, grid, **{slot: pe})
        with pytest.raises(ValueError, match=f"{slot}={type(pe).__name__} is a '{pe.family}' encoding"):
            Attention(DIM, num_heads=NUM_HEADS, **{slot: pe})
    with pytest.raises(ValueError, match="rotary must be a torch.nn.Module"):
        attend(q, q, q, grid, rotary=lambda q, k, grid: (q, k))


class UserRotary(torch.nn.Module):
    """A user's rotary module without a ``family`` attribute (accepted in the rotary slot), returning ``out(q, k)``."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def forward(self, q, k, grid):
        return self.out(q, k)


@pytest.mark.parametrize("out,got", [(lambda q, k: (q[..., :4], k), "[(1, 2, 13, 4), (1, 2, 13, 8)]"),
                                     (lambda q, k: (q, k[:, :, :-1]), "[(1, 2, 13, 8), (1, 2, 12, 8)]"),
                                     (lambda q, k: q, "returned Tensor"),
                                     (lambda q, k: (q, k, q), "returned [(1, 2, 13, 8), (1, 2, 13, 8), (1, 2, 13")],
                         ids=["narrower-q", "fewer-k-tokens", "one-tensor", "three-tensors"])
def test_attend_checks_what_a_rotary_returns(out, got):
    grid = Grid((3, 4), prefix=1)
    q = torch.randn(1, 2, grid.num_tokens, 8)
    torch.testing.assert_close(attend(q, q, q, grid, UserRotary(lambda q, k: (q, k))), attend(q, q, q, grid))
    # the plain, the kept-patches and the mixed-batch paths
    for layout in (grid, Layout(grid, torch.arange(12)[None]), MixedLayout((grid,))):
        with pytest.raises(ValueError) as info:
            attend(q, q, q, layout, UserRotary(out))
        message = str(info.value)
        assert message.startswith("rotary UserRotary returned") and got in message, message
        assert "must return (q, k) of the shapes it was given, (1, 2, 13, 8) and (1, 2, 13, 8)" in message
    with pytest.raises(ValueError, match="rotary UserRotary returned"):  # the mixed-batch path
        attend(q, q, q, MixedLayout((grid,)), UserRotary(out))


@requires("torch", "2.3", "PyTorch's fused CPU attention kernel with a bias")
@pytest.mark.parametrize("chunk_bytes", [2**20, 1], ids=["whole-batch", "per-sample-chunks"])
@pytest.mark.parametrize("mask_shape", [(1, 3, 7, 7), (3, 3, 7, 7), (3, 1, 7, 7), (7, 7)])
def test_fused_bias_attention_gradients_match_sdpa_math(mask_shape, chunk_bytes, monkeypatch):
    """A mask that needs a gradient takes the fused CPU path; every gradient equals SDPA's (math path), also
    with -inf entries, a fully masked row and a scale, with the backward in one chunk or one per sample, and
    gradcheck holds in float64."""
    from visionpe import attention
    from visionpe.attention import _sdpa
    monkeypatch.setattr(attention, "BACKWARD_CHUNK_BYTES", chunk_bytes)
    assert len(attention.batch_chunks(3, 3 * 7 * 7 * 8)) == (1 if chunk_bytes > 1 else 3)
    assert len(attention.batch_chunks(3, attention.CHUNKED_SAMPLE_BYTES)) == 1  # large maps: the whole batch
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 3, 7, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.randn(mask_shape, dtype=torch.float64)
    mask[..., 1, 2] = float("-inf")
    mask[..., 4, :] = float("-inf")  # a row with no key: output and gradients 0, not NaN
    mask.requires_grad_(True)
    out = _sdpa(q, k, v, mask, 0.0, 0.4)
    assert out.grad_fn.name().endswith("_FusedBiasAttentionBackward")
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.4)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, mask), upstream)
    expected_grads = torch.autograd.grad(expected, (q, k, v, mask), upstream)
    for grad, expected_grad in zip(grads, expected_grads):
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, expected_grad)
    finite = torch.randn(mask_shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: _sdpa(*t, 0.0, None), (q, k, v, finite))


@requires("torch", "2.3", "PyTorch's fused CPU attention kernel with a bias")
def test_fused_bias_attention_half_precision_and_fallbacks():
    """bf16 gradients follow float32 within bf16 precision; dropout, a mask without gradient, inference and a
    v of another width keep SDPA's own path."""
    from visionpe.attention import _sdpa
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 3, 9, 8)
    mask = torch.randn(1, 3, 9, 9)
    leaves32 = [t.clone().requires_grad_(True) for t in (q, k, v, mask)]
    leaves16 = [t.bfloat16().requires_grad_(True) for t in (q, k, v, mask)]
    grads32 = torch.autograd.grad(_sdpa(*leaves32, 0.0, None).square().sum(), leaves32)
    out16 = _sdpa(*leaves16, 0.0, None)
    assert out16.dtype == torch.bfloat16 and out16.grad_fn.name().endswith("_FusedBiasAttentionBackward")
    grads16 = torch.autograd.grad(out16.float().square().sum(), leaves16)
    for grad16, grad32 in zip(grads16, grads32):
        assert grad16.dtype == torch.bfloat16
        torch.testing.assert_close(grad16.float(), grad32, atol=0.05, rtol=0.05)
    learned = mask.clone().requires_grad_(True)
    assert "Fused" not in _sdpa(q, k, v, learned, 0.1, None).grad_fn.name()
    assert _sdpa(q, k, v, mask, 0.0, None).grad_fn is None
    with torch.no_grad():
        torch.testing.assert_close(_sdpa(q, k, v, learned, 0.0, None), _sdpa(q, k, v, mask, 0.0, None))
    wide_v = torch.randn(2, 3, 9, 4)
    assert "Fused" not in _sdpa(q, k, wide_v, learned, 0.0, None).grad_fn.name()
    weight = torch.randn(8, 8, requires_grad=True)  # a second derivative (e.g. a gradient penalty) raises
    (grad,) = torch.autograd.grad((_sdpa(q, k, v, learned, 0.0, None) @ weight).sum(), learned, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.square().sum().backward()


def test_attention_module_loads_timm_attention():
    timm_attn = TimmAttention(DIM, num_heads=NUM_HEADS, qkv_bias=True).eval()
    ours = Attention(DIM, NUM_HEADS, qkv_bias=True).eval()
    ours.load_state_dict(timm_attn.state_dict())
    x = torch.randn(2, 13, DIM)
    torch.testing.assert_close(ours(x, Grid((3, 4), prefix=1)), timm_attn(x), atol=1e-5, rtol=1e-5)


def test_attention_module_with_axial_rope_matches_timm_attention_rope():
    """timm's Eva-style ``AttentionRope`` (prefix tokens unrotated) with ``RotaryEmbeddingCat``."""
    shape = (3, 5)
    timm_attn = AttentionRope(DIM, num_heads=NUM_HEADS, qkv_bias=True, num_prefix_tokens=1).eval()
    timm_rope = RotaryEmbeddingCat(dim=HEAD_DIM, temperature=100, in_pixels=False, grid_indexing="xy")
    ours = Attention(DIM, NUM_HEADS, qkv_bias=True, rotary=vpe.build("rope_axial", head_dim=HEAD_DIM,
                                                                      num_heads=NUM_HEADS)).eval()
    ours.load_state_dict(timm_attn.state_dict(), strict=False)
    x = torch.randn(2, 16, DIM)
    with torch.no_grad():
        ref = timm_attn(x, rope=timm_rope.get_embed(list(shape)))
        torch.testing.assert_close(ours(x, Grid(shape, prefix=1)), ref, atol=1e-5, rtol=1e-5)


def encoded_attention(name):
    """``x -> Attention(tokens(x))`` with the 2D encoding ``name`` in its place (``None``: no encoding)."""
    pe = vpe.build(name, **build_kwargs(name, 2)) if name else None
    family = pe.family if pe is not None else None
    attn = Attention(DIM, NUM_HEADS, rotary=pe if family == "rotary" else None, bias=pe if family == "bias" else None)

    def run(x, grid):
        return attn(pe(x, grid) if family == "tokens" else x, grid)
    return run, attn


@pytest.mark.parametrize("name", [None, *NAMES])
def test_permutation_equivariance_only_without_encoding(name):
    run, attn = encoded_attention(name)
    grid = Grid(SHAPES[2], prefix=1)
    x = torch.randn(2, grid.num_tokens, DIM)
    perm = torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(grid.num_patches)])
    with torch.no_grad():
        if hasattr(attn.bias, "relative_position_bias_table"):  # well above the 0.02 init: a clear effect
            attn.bias.relative_position_bias_table.normal_()
        diff = (run(x[:, perm], grid) - run(x, grid)[:, perm]).abs().max()
    if name is None:
        assert diff < 1e-5
    else:
        assert diff > 1e-4


def make_table(pe, grid) -> torch.Tensor:
    """The float table an encoding adds or multiplies in: token vectors, rotations or logit bias."""
    if pe.family == "rotary":
        return pe.cis(grid)
    if pe.family == "bias":
        return pe(grid)
    return pe.patch_table(grid) if isinstance(pe, Learned) else pe.table(grid)


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", [n for n in NAMES if n != "peg"])  # PEG is a convolution, it has no table
def test_tables_float32_under_autocast(name, ndim):
    kw = build_kwargs(name, ndim)
    if "grid_shape" in kw:  # a training grid smaller than the call's grid exercises resampling
        kw["grid_shape"] = tuple(max(s - 1, 1) for s in kw["grid_shape"])
    pe = vpe.build(name, **kw)
    fresh = copy.deepcopy(pe)  # its own caches: the autocast table is computed, not looked up
    grid = Grid(SHAPES[ndim], prefix=1)
    with torch.no_grad():
        ref = make_table(pe, grid)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            table = make_table(fresh, grid)
    assert table.dtype in (torch.float32, torch.complex64)
    torch.testing.assert_close(table, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", NAMES)
def test_every_encoding_forward_backward(name, ndim, autocast):
    pe = vpe.build(name, **build_kwargs(name, ndim))
    attn = Attention(DIM, NUM_HEADS, rotary=pe if pe.family == "rotary" else None,
                     bias=pe if pe.family == "bias" else None)
    grid = Grid(SHAPES[ndim], prefix=1)
    x = torch.randn(2, grid.num_tokens, DIM, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = attn(pe(x, grid) if pe.family == "tokens" else x, grid)
    assert out.shape == x.shape and out.dtype == (torch.bfloat16 if autocast else torch.float32)
    out.float().square().mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    params = dict(pe.named_parameters())
    assert bool(params) == (name not in ("sincos", "rope_axial", "alibi"))
    for pname, p in params.items():
        assert p.dtype == torch.float32
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


@requires("torch", "2.3", "PyTorch's fused CPU attention kernel with a bias")
@pytest.mark.parametrize("model_name, pe", [("vit_tiny_patch16_224", "rel_bias"), ("vit_tiny_patch16_224", "cpb"),
                                            ("swin_tiny_patch4_window7_224", "swin_bias"),
                                            ("swinv2_tiny_window8_256", "cpb")])
def test_models_train_the_same_through_the_fused_bias_path(model_name, pe, monkeypatch):
    """In a training step every gradient (learned bias tables, cpb MLP, Swin's shifted windows) equals SDPA's own
    path; the fused path is the one taken."""
    import visionpe.attention as attention
    kwargs = dict(img_size=32, num_classes=4)
    if model_name.startswith("vit"):
        kwargs |= dict(patch_size=8, embed_dim=32, depth=2, num_heads=2)
    else:
        # no stochastic depth (timm's Swin default is 0.1): both passes must drop the same blocks, none
        kwargs |= dict(patch_size=4, window_size=4, embed_dim=16, depths=(2, 1), num_heads=(2, 2), drop_path_rate=0.0)
    torch.manual_seed(0)
    model = vpe.create_model(model_name, pe=pe, **kwargs).train()
    x = torch.randn(2, 3, 32, 32)
    calls = []
    fused = attention._FusedBiasAttention.apply
    monkeypatch.setattr(attention._FusedBiasAttention, "apply", lambda *a: calls.append(1) or fused(*a))
    grads = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    assert calls  # the learned bias took the fused path
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(attention, "_sdpa", lambda q, k, v, mask, p, scale: sdpa(q, k, v, attn_mask=mask, dropout_p=p,
                                                                              scale=scale))
    expected = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    for (name, _), grad, reference in zip(model.named_parameters(), grads, expected):
        torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-5, msg=name)


def saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps from a training forward for its backward."""
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum()
    return sum(storages.values())


def test_rope_keeps_no_more_for_backward_than_no_position():
    """SDPA saves the rotated q, k; the unrotated ones (and with them the fused qkv buffer) are not kept: RoPE
    rotates with a function that saves its product, and v gets its own copy."""
    kw = dict(img_size=32, patch_size=4, embed_dim=48, depth=2, num_heads=2, num_classes=3)
    x = torch.randn(8, 3, 32, 32)
    one_q = 8 * 65 * 48 * 4  # bytes of one block's q: (B, T, dim) float32
    base = saved_bytes(vpe.create_model("vit_tiny_patch16_224", pe="none", **kw).train(), x)
    for pe in ("rope_axial", "rope_mixed"):
        extra = saved_bytes(vpe.create_model("vit_tiny_patch16_224", pe=pe, **kw).train(), x) - base
        assert 0 < extra < one_q, pe  # the rotation tables (learned ones per block), independent of the batch


def test_rotation_gradients_in_complex_and_to_learned_frequencies():
    from visionpe.rotary.rope import _Rotate, rotate_real
    x = torch.randn(2, 3, 4, dtype=torch.complex128, requires_grad=True)
    cis = torch.polar(torch.rand(3, 4, dtype=torch.float64) + 0.5, torch.randn(3, 4, dtype=torch.float64))
    assert torch.autograd.gradcheck(_Rotate.apply, (x, cis.requires_grad_()))
    pe, grid = vpe.build("rope_mixed", head_dim=8, num_heads=2), Grid((3, 4), prefix=1)
    q = torch.randn(2, 2, grid.num_tokens, 8)
    grads = []
    for rotate in (lambda: pe.rotate(q, grid), lambda: rotate_real(q, pe.rotations(grid))):
        pe.zero_grad()
        rotate().square().mul(torch.arange(8.0)).sum().backward()
        grads.append(pe.freqs.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)
