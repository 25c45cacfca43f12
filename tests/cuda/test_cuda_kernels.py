"""CUDA only: which attention kernel each family gets, and FlexAttention's CUDA kernel against SDPA.

- SDPA restricted with ``torch.nn.attention.sdpa_kernel`` to the preferred backends still runs (SDPA raises when
  none of the allowed backends can take a call): flash or cuDNN for none/tokens/rotary (no mask), in bf16 training
  (forward and backward); memory-efficient for the bias family, with the bias's gradient.
- ``attention="flex"`` with the compiled CUDA kernel equals SDPA with the materialised bias, forward and backward
  (gradients of q, k, v and the bias parameters), on grids, token subsets and padded mixed batches; and at 4096
  tokens its forward holds no ``(heads, T, T)`` tensor.

On a machine without CUDA every test here skips (the ``cuda`` marker); CPU counterparts: the flex pair forms and
their reference backward in tests/encodings/test_flex_attention.py, SDPA's CPU paths everywhere else."""
import pytest
import torch
from devicecases import Case

import visionpe as vpe
from visionpe import Grid
from visionpe.grid import Layout, MixedLayout

pytestmark = pytest.mark.cuda
CUDA = torch.device("cuda")
NO_MASK = [Case("vit", pe, (3, 32, 40)) for pe in ("none", "sincos", "learned", "rope_axial", "rope_mixed",
                                                  "rope_mixed+learned")]
NO_MASK += [Case("video", pe, (3, 4, 16, 24)) for pe in ("learned", "rope_mixed")]
BIASED = [Case("vit", pe, (3, 32, 40)) for pe in ("rel_bias", "cpb", "alibi", "bucket_bias", "rope_axial+alibi")]
BIASED += [Case("swin", pe, (3, 32, 48)) for pe in ("swin_bias", "cpb")] + [Case("video_swin", "swin_bias",
                                                                                 (3, 4, 32, 40))]


def bf16_training_step(case: Case, backends) -> torch.nn.Module:
    from torch.nn.attention import sdpa_kernel

    model = case.build("sdpa").train().to(CUDA)
    x = case.input().to(CUDA)
    with sdpa_kernel(backends), torch.autocast("cuda", dtype=torch.bfloat16):
        model(x).float().sum().backward()
    return model


@pytest.mark.parametrize("case", NO_MASK, ids=lambda c: c.id)
def test_unmasked_families_take_flash_or_cudnn(case):
    from torch.nn.attention import SDPBackend

    bf16_training_step(case, [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION])


@pytest.mark.parametrize("case", BIASED, ids=lambda c: c.id)
def test_bias_family_takes_memory_efficient_attention_with_a_bias_gradient(case):
    from torch.nn.attention import SDPBackend

    model = bf16_training_step(case, [SDPBackend.EFFICIENT_ATTENTION])
    biases = vpe.encodings_of(model)["bias"]
    grads = [p.grad for enc in biases for p in enc.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert not grads or any(g.abs().sum() > 0 for g in grads)


# -- FlexAttention's CUDA kernel -------------------------------------------------------------------------------------

HEADS, HEAD_DIM = 4, 32


def bias_for(name: str) -> torch.nn.Module:
    kwargs = {"num_heads": HEADS}
    if name == "rel_bias":
        kwargs["grid_shape"] = (6, 7)
    elif name in ("swin_bias", "cpb"):
        kwargs["window_size"] = (6, 7)
    torch.manual_seed(0)
    pe = vpe.build(name, **kwargs).to(CUDA)
    for p in pe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return pe


def layout_of(kind: str):
    grid = Grid((6, 7), prefix=1)
    if kind == "grid":
        return grid, 2
    if kind == "layout":
        keep = torch.stack([torch.randperm(42)[:20] for _ in range(2)]).to(CUDA)
        return Layout(grid, keep), 2
    return MixedLayout((Grid((3, 5), prefix=1), grid, Grid((4, 4), prefix=1))), 3


@pytest.mark.parametrize("kind", ["grid", "layout", "mixed"])
@pytest.mark.parametrize("name", ["alibi", "rel_bias", "swin_bias", "cpb", "bucket_bias"])
def test_flex_kernel_equals_sdpa_forward_and_backward(name, kind):
    pe = bias_for(name)
    layout, batch = layout_of(kind)
    q, k, v = (torch.randn(batch, HEADS, layout.num_tokens, HEAD_DIM, device=CUDA, requires_grad=True)
               for _ in range(3))
    leaves = [q, k, v, *pe.parameters()]
    weights = torch.randn(batch, HEADS, layout.num_tokens, HEAD_DIM, device=CUDA)
    if isinstance(layout, MixedLayout):
        weights = weights * layout.key_mask(CUDA)[:, None, :, None]  # padded query rows are ignored downstream
    results = []
    for attention in ("flex", "sdpa"):
        out = vpe.attend(q, k, v, layout, bias=pe, attention=attention)
        results.append((out * weights, torch.autograd.grad((out * weights).sum(), leaves)))
    (flex_out, flex_grads), (sdpa_out, sdpa_grads) = results
    torch.testing.assert_close(flex_out, sdpa_out, atol=1e-4, rtol=1e-4)
    for got, expected in zip(flex_grads, sdpa_grads):
        torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-3)


def test_flex_forward_holds_no_pairwise_tensor():
    """4096 tokens, 8 heads, batch 2: a (B, heads, T, T) float32 bias is 1 GiB; flex's extra memory stays under a
    tenth of it, SDPA's materialised bias reaches it."""
    pe = vpe.build("rel_bias", num_heads=8, grid_shape=(64, 64)).to(CUDA)
    grid = Grid((64, 64))
    q, k, v = torch.randn(3, 2, 8, grid.num_tokens, 64, device=CUDA, dtype=torch.bfloat16).unbind(0)
    pairwise = 2 * 8 * grid.num_tokens**2 * 4
    peaks = {}
    with torch.no_grad():
        for attention in ("flex", "sdpa", "flex"):  # the first flex call compiles
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            vpe.attend(q, k, v, grid, bias=pe, attention=attention)
            torch.cuda.synchronize()
            peaks[attention] = torch.cuda.max_memory_allocated() - base
    assert peaks["flex"] < pairwise / 10, peaks
    assert peaks["sdpa"] >= pairwise / 2, peaks  # materialised (B, heads, T, T) in bf16 at least
