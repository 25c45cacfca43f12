"""Shared fixtures and helpers for the core tests: tiny tensors, fixed seeds, and ``requires`` for tests that need a
newer release than the oldest one visionpe supports (they skip there, saying why: .ci/check_floor.sh runs the whole
suite at that floor)."""
import random
import threading
from importlib.metadata import version

import numpy as np
import pytest
import torch

from visionpe import ModelContext, apply, encodings_of
from visionpe import data as vdata
from visionpe.registry import ENCODINGS

# Small keyword sets that build every encoding at a given number of grid axes (used by several files).
HEAD_DIM, NUM_HEADS, DIM = 12, 2, 24  # head_dim 12 is divisible by 2*ndim for ndim in 1..3
SHAPES = {2: (3, 4), 3: (2, 3, 4)}


CONTEXTS = {ndim: ModelContext(shape, DIM, NUM_HEADS, HEAD_DIM, num_prefix_tokens=1) for ndim, shape in SHAPES.items()}


def build_kwargs(name: str, ndim: int) -> dict:
    """Constructor keywords for ``visionpe.build(name, **kw)`` on an ``ndim``-axis grid of ``SHAPES[ndim]``: what a
    model would give the encoding (:meth:`Encoding.model_defaults`), with a small CPB MLP."""
    kw = ENCODINGS[name].model_defaults(CONTEXTS[ndim])
    return {**kw, "hidden_dim": 16} if name == "cpb" else kw


def bias_input(pe, num_tokens: int, batch: int = 2, generator=None) -> torch.Tensor | None:
    """What a bias that reads more than positions is called with besides the grid: random input tokens ``(batch, T,
    dim)`` (``reads_tokens``, PaPE) or queries ``(batch, T, heads * head_dim)`` (``reads_queries``, decomposed
    relative positions); None for any other encoding."""
    if getattr(pe, "reads_tokens", False):
        return torch.randn(batch, num_tokens, pe.dim, generator=generator)
    if getattr(pe, "reads_queries", False):
        return torch.randn(batch, num_tokens, pe.num_heads * pe.head_dim, generator=generator)
    return None


# every built-in image task rendered at any size on a square canvas (the aspect task draws its own canvases)
SQUARE_TASKS = tuple(n for n in vdata.names("image", synthetic=True) if n != vdata.aspect.TASK)


def render_task_scene(task: str, index: int, size, split: str = "val"):
    """Scene ``index`` (seed 0) of a square built-in task (:data:`SQUARE_TASKS`) drawn at ``size``, ``uint8 (H, W,
    3)``: each task through its own module's scene and renderer."""
    if task in vdata.clutter.CLUTTER:
        return vdata.clutter.render_clutter(vdata.clutter.clutter_scene(task, 0, index, split), size)
    return vdata.render(vdata.scene(task, 0, index, split), size)


def _release(package: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version(package).split("+")[0].split(".")[:3] if part.isdigit())


def perturbed(model: torch.nn.Module, std: float = 0.05) -> torch.nn.Module:
    """``model`` with random non-trivial weights added in place (timm, transformers and torchvision start tokens,
    tables, biases and heads at or near zero, which would hide a wrong index, mask or a weight not loaded)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)
    return model


def saved_and_loaded(model: torch.nn.Module, cls: type, path) -> torch.nn.Module:
    """A patched transformers ``model`` whose first rotary encoding's parameters are moved off their initial values,
    saved with ``save_pretrained`` to ``path`` and loaded back with ``vpe.from_pretrained(cls, path)``; asserts that
    loading reported nothing missing, unexpected or mismatched, and returns the loaded model."""
    from visionpe import from_pretrained  # the Hugging Face part: loaded only by the tests that use it
    with torch.no_grad():
        for p in encodings_of(model)["rotary"][0].parameters():
            p.add_(0.1)
    model.save_pretrained(path)
    loaded, info = from_pretrained(cls, path, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info
    return loaded


def requires(package: str, at_least: str, why: str):
    """Skip marker: the test needs ``package >= at_least`` (``why``: what it uses); visionpe supports older ones."""
    needed = tuple(int(part) for part in at_least.split("."))
    return pytest.mark.skipif(_release(package) < needed, reason=f"needs {package} >= {at_least}: {why} "
                                                                  f"(installed {version(package)})")


def requires_that(available: bool, why: str):
    """Skip marker for a test that needs a feature of a newer release (``why`` names it and the release)."""
    return pytest.mark.skipif(not available, reason=f"needs {why}")


@pytest.fixture(autouse=True)
def _seed():
    """Each test starts from the same global RNG states, whatever ran before it in its worker (timm's transforms draw
    from Python's ``random``, its Mixup from NumPy's)."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _registries():
    """Every test leaves the encoding, data set and adapter registries as it found them, and forgets the user modules
    it imported with --import (a user's registrations must not leak into the next test)."""
    import sys

    from visionpe.backbones import ADAPTERS
    from visionpe.data import DATASETS
    saved = [(registry, dict(registry)) for registry in (ENCODINGS, DATASETS, ADAPTERS)]
    modules = set(sys.modules)
    yield
    for registry, entries in saved:
        registry.clear()
        registry.update(entries)
    for name in [m for m in sys.modules if m.startswith("visionpe_user_") and m not in modules]:
        del sys.modules[name]


# -- the device of tests/cuda: `pytest --device cuda tests/cuda` on a GPU machine; CPU by default ---------------------
NO_CUDA = "no CUDA device on this machine (torch.cuda.is_available() is False)"


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=("cpu", "cuda"),
                     help="device of the device-parametrized tests (tests/cuda); cuda skips them without a GPU")


def pytest_configure(config):
    config.addinivalue_line("markers", f"cuda: needs a CUDA device (skipped when there is {NO_CUDA})")
    config.addinivalue_line("markers", "cuda_matrix: a case run with --device cuda only (the CPU run takes a subset)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--device") == "cpu":
        matrix = [item for item in items if item.get_closest_marker("cuda_matrix") is not None]
        if matrix:
            config.hook.pytest_deselected(items=matrix)
            items[:] = [item for item in items if item.get_closest_marker("cuda_matrix") is None]
    if not torch.cuda.is_available():
        for item in items:
            if item.get_closest_marker("cuda") is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs CUDA: {NO_CUDA}"))


@pytest.fixture
def device(request) -> torch.device:
    """The ``--device`` under test; ``--device cuda`` without a GPU skips the test."""
    name = request.config.getoption("--device")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"--device cuda: {NO_CUDA}")
    return torch.device(name)


@pytest.fixture
def one_thread_kernels():
    """Our threads interleave, not the kernels' own: deterministic outputs to compare exactly."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_concurrently(model, inputs, iterations: int, threads: int = 4, atol: float = 0.0) -> list[str]:
    """Each of ``threads`` threads runs ``model`` on the inputs round-robin ``iterations`` times (without gradients)
    against its single-threaded outputs; returns every mismatch (shape, or any element off by more than ``atol``: 0
    is exact; NaN is a mismatch) or error."""
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    errors = []

    def worker(start: int):
        try:
            with torch.no_grad():
                for i in range(iterations):
                    k = (i + start) % len(inputs)
                    out = model(inputs[k])
                    if out.shape != expected[k].shape or not torch.allclose(out, expected[k], rtol=0.0, atol=atol):
                        errors.append(f"input {k} differed in thread {start}")
        except Exception as err:  # noqa: BLE001 (collected and reported by the test)
            errors.append(f"{type(err).__name__}: {err}")

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors


def compiled_matches_eager_and_trains(model, x: torch.Tensor, output=lambda out: out, **tolerance) -> list[str]:
    """``torch.compile(model, fullgraph=True, backend="eager")`` (one graph, no break) gives the eager model's output
    on ``x`` in evaluation (``assert_close`` with ``tolerance``), and a backward through it in training reaches the
    parameters of every rotary encoding; returns the names of those that got no gradient. ``output`` picks the
    tensor from a model's output (e.g. ``.logits``)."""
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(output(compiled(x)), output(model(x)), **tolerance)
    model.train()
    output(compiled(x)).sum().backward()
    return [name for enc in encodings_of(model)["rotary"] for name, p in enc.named_parameters()
            if p.grad is None or not p.grad.abs().sum() > 0]


def assert_swapped_encoding_works(model: torch.nn.Module, source: dict, sizes) -> None:
    """A model whose encoding was swapped by ``vpe.apply``: its other weights are ``source``'s (``{name: tensor}``),
    it runs at each of ``sizes`` (finite ``(1, 3)`` logits), every encoding parameter gets a finite gradient, and a
    window encoding is refused on it."""
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in source.items())
    for size in sizes:
        with torch.no_grad():
            out = model.eval()(torch.randn(1, 3, *size))
        assert out.shape == (1, 3) and torch.isfinite(out).all()
    model.train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    found = [p for family in encodings_of(model).values() for e in family for p in e.parameters()]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in found)
    with pytest.raises(ValueError, match="swin_bias needs window attention"):
        apply(model, "swin_bias")


def max_logit_diff(ours: torch.nn.Module, theirs: torch.nn.Module, size) -> float:
    """Largest logit difference at ``size`` (a ``(H, W)``) between ``ours`` and a reference model ``theirs`` (built
    for that size), on a batch of two drawn from a seed of the size."""
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
    with torch.no_grad():
        return (ours(x) - theirs.eval()(x)).abs().max().item()
