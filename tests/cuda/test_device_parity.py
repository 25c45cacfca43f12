"""Every family in every backbone gives on ``--device`` what a float64 CPU copy gives: in float32 (TF32 off) and
under bf16 autocast, with SDPA and, for the bias family, FlexAttention. The CPU run holds CPU float32/bf16 to the
same float64 reference, so the test fails there too if a table is built in low precision.

Compared: every token after the last block (|features| <= 4; positions move them by 0.02-4.8). Tolerances: float32
``atol=2e-5, rtol=1e-5`` (measured on CPU: at most 5.2e-6, Swin-V2's cosine attention; 2.6e-6 elsewhere); bf16
autocast ``atol=6e-2, rtol=4e-2`` (measured on CPU: at most 3.0e-2) and ``atol=0.2`` for Swin-V2 (0.125 measured:
its cosine attention multiplies bf16-rounded unit vectors by a logit scale of 10). bf16 cannot see ALiBi's 2-head
effect (0.02-0.14 here); float32 does."""
import pytest
import torch
from conftest import requires
from devicecases import CASES, CPU_FLEX, FLEX_CASES, autocast, float64_reference, params

TOLERANCE = {"float32": dict(atol=2e-5, rtol=1e-5), "bfloat16": dict(atol=6e-2, rtol=4e-2)}
SWINV2_BF16 = dict(atol=0.2, rtol=4e-2)


def check_against_float64(case, device, precision, attention="auto"):
    model = case.build(attention)
    x = case.input()
    with torch.no_grad():
        reference = case.features(float64_reference(model), x.double())
        model = model.to(device)
        with autocast(device, precision):
            out = case.features(model, x.to(device))
    assert out.device.type == device.type and torch.isfinite(out).all()
    tolerance = SWINV2_BF16 if (case.backbone, precision) == ("swinv2", "bfloat16") else TOLERANCE[precision]
    torch.testing.assert_close(out.double().cpu(), reference, **tolerance)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", params(CASES))
def test_outputs_equal_the_float64_cpu_reference(device, case, precision):
    check_against_float64(case, device, precision)


@requires("torch", "2.5", "torch.nn.attention.flex_attention")
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", params(FLEX_CASES, cpu=CPU_FLEX))
def test_flex_outputs_equal_the_float64_cpu_reference(device, case, precision):
    """attention="flex": compiled flex_attention on the device (inference on CPU: it has no CPU backward)."""
    check_against_float64(case, device, precision, attention="flex")
