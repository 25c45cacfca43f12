"""Shared fixtures and helpers for the core tests: tiny tensors, fixed seeds, and ``requires`` for tests that need a
newer release than the oldest one visionpe supports (they skip there, saying why: .ci/check_floor.sh runs the whole
suite at that floor)."""
from importlib.metadata import version

import pytest
import torch

from visionpe import ModelContext
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


def _release(package: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version(package).split("+")[0].split(".")[:3] if part.isdigit())


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
