"""``torch.compile(fullgraph=True)`` with inductor, and DistributedDataParallel in one process, on ``--device``.

Inductor: the compiled model (eval, and a training step) equals eager. On CUDA every case runs; on CPU inductor
builds C++ per graph (tens of seconds each), so the CPU run takes the first case only (dynamo's tracing of every
encoding without graph breaks is tests/test_compile.py's, with backend="eager"). float32 without TF32; outputs
``atol=1e-4, rtol=1e-4`` (inductor reorders reductions), gradients ``atol=1e-4, rtol=1e-3``.

DDP: nccl on CUDA, gloo on CPU, world size 1: the gradients after backward equal the plain model's (the all-reduce
averages over one process), and the models stay equal after an optimizer step."""
import copy

import pytest
import torch
import torch.distributed as dist
from conftest import requires
from devicecases import Case, exact_float32

# one model of each family and backbone kind (an inductor compile takes tens of seconds even for these)
COMPILED = [(Case("vit", "rope_mixed", (3, 32, 40)), "auto"), (Case("vit", "rel_bias", (3, 32, 40)), "auto"),
            (Case("vit", "rel_bias", (3, 32, 40)), "flex"), (Case("swin", "swin_bias", (3, 32, 48)), "auto"),
            (Case("video", "learned", (3, 4, 16, 24)), "auto")]
COMPILED_IDS = [f"{c.id}-{a}" for c, a in COMPILED]


def skip_beyond_the_first_on_cpu(device, case_attention):
    if device.type == "cpu" and case_attention != COMPILED[0]:
        pytest.skip("inductor on CPU builds C++ per graph: the CPU run compiles the first case only")


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
@pytest.mark.parametrize("case_attention", COMPILED, ids=COMPILED_IDS)
def test_inductor_fullgraph_equals_eager(device, case_attention):
    skip_beyond_the_first_on_cpu(device, case_attention)
    case, attention = case_attention
    torch._dynamo.reset()
    model = case.build(attention).to(device)
    x = case.input().to(device)
    with torch.no_grad(), exact_float32():
        compiled = torch.compile(model, fullgraph=True)(x)
        torch.testing.assert_close(compiled, model(x), atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
@pytest.mark.parametrize("case", [Case("vit", "rope_mixed+learned", (3, 32, 40)), Case("vit", "cpb", (3, 32, 40))],
                         ids=lambda c: c.id)
def test_inductor_fullgraph_training_step_equals_eager(device, case):
    if device.type == "cpu":
        pytest.skip("inductor on CPU builds C++ per graph: compiled training is checked on CUDA")
    torch._dynamo.reset()
    model = case.build().train().to(device)
    compiled_model = copy.deepcopy(model)
    x = case.input().to(device)
    with exact_float32():
        torch.compile(compiled_model, fullgraph=True)(x).square().mean().backward()
        model(x).square().mean().backward()
    for (name, got), expected in zip(compiled_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, atol=1e-4, rtol=1e-3, msg=name)
    torch._dynamo.reset()


@pytest.fixture
def process_group(device, tmp_path):
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_available() or not getattr(dist, f"is_{backend}_available")():
        pytest.skip(f"torch.distributed {backend} is not available in this build")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("case", [Case("vit", "rope_mixed+learned", (3, 32, 40)), Case("vit", "rel_bias", (3, 32, 40)),
                                  Case("swin", "swin_bias", (3, 32, 48))], ids=lambda c: c.id)
def test_ddp_one_process_equals_the_plain_model(device, process_group, case):
    model = case.build().train().to(device)
    plain = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index or 0] if device.type == "cuda"
                                                     else None)
    x = case.input().to(device)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ddp, plain)]
    with exact_float32():
        for net, optimizer in zip((ddp, plain), optimizers):
            net(x).square().mean().backward()
        for (name, a), b in zip(model.named_parameters(), plain.parameters()):
            torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)
        for optimizer in optimizers:
            optimizer.step()
        torch.testing.assert_close(ddp(x), plain(x), atol=1e-5, rtol=1e-5)
