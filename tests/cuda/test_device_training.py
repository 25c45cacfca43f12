"""A training step of every family in every backbone on ``--device`` equals a float64 CPU copy's: the loss and
every parameter's gradient in float32 (TF32 off); under bf16 autocast the loss within bf16's resolution and the
gradients pointing the same way. Then one SGD step on both: the next loss still agrees (tables rebuilt from the
stepped weights, on the device). Timm's patch dropout trains on the device with every encoding.

Tolerances: float32 loss ``1e-5``, gradients ``atol=1e-5, rtol=1e-3`` (measured on CPU: loss 1.4e-7, gradients
1.6e-6); bf16 loss ``atol=2e-2, rtol=2e-2`` and gradient cosine similarity >= 0.99 for every parameter tensor with a
gradient above 1e-6 (measured on CPU: loss 7.7e-4 before the step and 2.3e-2 after it, cosine >= 0.9975, all three
Swin-V2, whose cosine attention scales bf16-rounded unit vectors by 10; elsewhere, before the step, loss <= 6e-4 and
cosine >= 0.9996)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from devicecases import CASES, VIT, autocast, exact_float32, params

import visionpe as vpe


def step(model, x, labels, precision: str, backward: bool = True):
    """Cross-entropy on fixed labels (in float32 at least) and its gradients; "float64" for the CPU reference."""
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(backward), autocast(x.device, "float32" if precision == "float64" else precision):
        logits = model(x)
    loss = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels)
    if backward:
        loss.backward()
    return loss.detach()


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", params(CASES))
def test_training_step_equals_the_float64_cpu_reference(device, case, precision):
    model = case.build().train()
    reference = copy.deepcopy(model).double()
    x, labels = case.input(), torch.tensor([1, 3])
    model = model.to(device)
    losses = [step(model, x.to(device), labels.to(device), precision), step(reference, x.double(), labels, "float64")]
    grads = [[p.grad for p in m.parameters()] for m in (model, reference)]
    assert all(g is not None for g in grads[0]) and len(grads[0]) == len(grads[1])
    encodings = [p for enc in sum(vpe.encodings_of(model).values(), []) for p in enc.parameters()]
    assert all(p.grad.abs().sum() > 0 for p in encodings)  # every position parameter learns
    check(losses, grads, precision)
    for m in (model, reference):  # SGD: an update proportional to the gradient (Adam's sign-like first step would
        torch.optim.SGD(m.parameters(), lr=0.5).step()  # turn bf16 noise of tiny gradients into full steps)
    stepped = [step(model, x.to(device), labels.to(device), precision, backward=False),
               step(reference, x.double(), labels, "float64", backward=False)]
    assert (stepped[1] - losses[1]).abs() > 1e-3  # the step moved the loss
    check(stepped, None, precision)


def check(losses, grads, precision):
    got, expected = losses[0].double().cpu(), losses[1]
    assert torch.isfinite(got)
    torch.testing.assert_close(got, expected, **(dict(atol=1e-5, rtol=0) if precision == "float32"
                                                 else dict(atol=2e-2, rtol=2e-2)))
    if grads is None:
        return
    for g, ref in zip(*grads):
        g = g.double().cpu()
        assert torch.isfinite(g).all()
        if precision == "float32":
            torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-3)
        elif ref.norm() > 1e-6:
            assert F.cosine_similarity(g.flatten(), ref.flatten(), dim=0) >= 0.99


@pytest.mark.parametrize("pe", ["none", "sincos", "learned", "rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi",
                                "bucket_bias", "rope_mixed+learned", "rope_axial+alibi"])
def test_patch_dropout_trains_on_the_device(device, pe):
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, patch_drop_rate=0.5, **VIT).train().to(device)
    with exact_float32():
        logits = model(torch.randn(2, 3, 32, 40, device=device))
        logits.sum().backward()
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
