"""Properties on ``--device``: relative encodings are translation invariant and absolute ones are not, cached tables
live on the device and follow every weight change, and (CUDA) a forward makes no host-device synchronisation."""
import copy

import pytest
import torch
from devicecases import CASES, exact_float32, params, tensors_of

import visionpe as vpe
from visionpe.bias._base import PAIR_INDEX
from visionpe.cache import TableCache

PARAMETER_FREE = ("none", "sincos", "rope_axial", "alibi", "rope_axial+alibi")
# no class token: its attention to the patches would carry no position, while tokens encodings give it none either
NO_CLASS = dict(class_token=False, global_pool="avg")
SHARP = 32 ** -0.5  # qkv init giving attention logits of order 1 (devicecases.Case.build)


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed", "alibi", "cpb", "sincos", "learned"])
def test_relative_encodings_ignore_a_grid_shift(device, pe):
    """``grid_offset`` moves every patch: relative encodings give the same logits, absolute ones other logits."""
    torch.manual_seed(0)
    kwargs = {"scaling": "none"} if pe.startswith("rope") else {}  # integer positions continue under a shift
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kwargs, img_size=48, patch_size=8,
                             embed_dim=32, depth=2, num_heads=2, num_classes=5, **NO_CLASS).eval().to(device)
    for name, p in model.named_parameters():
        if name.endswith("qkv.weight"):
            torch.nn.init.normal_(p, std=SHARP)
    for enc in sum(vpe.encodings_of(model).values(), []):
        for p in enc.parameters():
            torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(2, 3, 24, 32, device=device)
    with torch.no_grad(), exact_float32():
        plain, shifted = model.forward_features(x), model.forward_features(x, grid_offset=(1, 2))
    if pe in ("sincos", "learned"):
        assert (plain - shifted).abs().max() > 0.1
    else:
        torch.testing.assert_close(shifted, plain, atol=2e-5, rtol=1e-5)


def caches_of(model: torch.nn.Module) -> list[TableCache]:
    return [value for module in model.modules() for value in vars(module).values() if isinstance(value, TableCache)]


@pytest.mark.parametrize("case", params(CASES))
def test_cached_tables_live_on_the_device(device, case):
    model = case.build().to(device)
    x = case.input().to(device)
    PAIR_INDEX.clear()
    with torch.no_grad():
        model(x)
        first = model(x)  # a cache hit
    held = [t for cache in caches_of(model) + [PAIR_INDEX] for table in cache.tables() for t in tensors_of(table)]
    if case.pe not in ("none", "peg"):  # a convolution has no table
        assert held, "no table was cached"
    assert all(t.device.type == device.type for t in held), {str(t.device) for t in held}
    with torch.no_grad():
        torch.testing.assert_close(model(x), first, atol=0, rtol=0)


@pytest.mark.parametrize("case", params([c for c in CASES if c.pe not in PARAMETER_FREE]))
def test_a_weight_change_reaches_the_cached_tables(device, case):
    """After an in-place change of a position parameter (an optimizer step), the output equals a fresh copy's:
    no stale table survives."""
    model = case.build().to(device)
    x = case.input().to(device)
    with torch.no_grad():
        before = case.features(model, x)
        params = [p for enc in sum(vpe.encodings_of(model).values(), []) for p in enc.parameters()]
        assert params
        for p in params:
            p.mul_(-1.5)
        after = case.features(model, x)
        fresh = case.features(copy.deepcopy(model), x)  # a copy starts with empty caches
    assert (after - before).abs().max() > 1e-2
    torch.testing.assert_close(after, fresh, atol=0, rtol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_forward_makes_no_host_device_sync(case, train):
    """``torch.cuda.set_sync_debug_mode("error")`` around a forward (and the training step's backward) after a warm
    call: every table, index and mask it reads is on the device already."""
    device = torch.device("cuda")
    model = case.build().to(device).train(train)
    x = case.input().to(device)

    def step():
        with torch.set_grad_enabled(train):
            out = model(x)
            if train:
                out.sum().backward()

    step()  # warm: caches built, lazy CUDA state initialised
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
