"""One model on ``--device`` serves concurrent forwards at different sizes: every thread gets the single-threaded
output (the grid travels with each call; the caches are shared). On CPU the kernels run single-threaded and outputs
must be identical; on CUDA each thread has its own cuBLAS handle, so outputs must agree to 1e-5. Compiled
FlexAttention agrees to float32 rounding only (1e-6; measured on CPU: 7.5e-8): under threads dynamo may compile
another variant of a shape or run a call through flex_attention's unfused reference."""
import pytest
from conftest import run_concurrently
from devicecases import CASES, CPU_FLEX, FLEX_CASES, params

CONCURRENT = params([(case, "auto") for case in CASES]) + params([(FLEX_CASES[0], "flex")], cpu=CPU_FLEX)


@pytest.mark.parametrize("case,attention", CONCURRENT)
def test_concurrent_forwards_equal_single_threaded(one_thread_kernels, device, case, attention):
    model = case.build(attention).to(device)
    inputs = [case.input(shape=shape).to(device) for shape in [case.shape, *case.other_shapes()]]
    atol = 1e-6 if attention == "flex" else 0.0 if device.type == "cpu" else 1e-5
    errors = run_concurrently(model, inputs, iterations=9, atol=atol)
    assert not errors, errors[:5]
