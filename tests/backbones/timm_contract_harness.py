"""conftest.py of the timm contract run (tests/backbones/test_timm_contract.py copies it beside timm's own
``tests/test_models.py``, taken from the installed release's sdist).

Every test that timm's file gives a model (its parametrize lists come from ``timm.list_models``), this harness gives
to exactly one side, named by ``VPE_CONTRACT_SIDE``: ``twin`` (timm's model) or ``vpe`` (its ``vpe_`` name in
visionpe's registry). ``list_models`` answers as timm's own would, with each listed model of ``VPE_CONTRACT`` (pretrained
tags kept) renamed to that side's name, so a ``vpe_`` model gets the tests its twin gets, no more, no fewer. Both
sides are built with the same keywords (``VPE_CONTRACT``: ``{timm name: {"kwargs": {...}, "pe": name}}``; ``pe`` for
the ``vpe_`` side only).
"""
import functools
import json
import os

import pytest
import timm
import timm.models
from timm.models import _registry

import visionpe  # noqa: F401  registers the vpe_ names

CASES = json.loads(os.environ["VPE_CONTRACT"])
SIDE = os.environ["VPE_CONTRACT_SIDE"]
PREFIX = "vpe_" if SIDE == "vpe" else ""
assert SIDE in ("twin", "vpe"), SIDE

for twin, case in CASES.items():
    name = PREFIX + twin
    keywords = {**case["kwargs"], **({"pe": case["pe"]} if SIDE == "vpe" else {})}
    _registry._model_entrypoints[name] = functools.partial(_registry._model_entrypoints[name], **keywords)

_list_models = timm.list_models


@functools.wraps(_list_models)
def list_models(*args, **kwargs):
    return [PREFIX + name for name in _list_models(*args, **kwargs) if name.split(".")[0] in CASES]


timm.list_models = timm.models.list_models = list_models


def pytest_configure(config):
    for marker in ("base", "cfg", "cfg_nonstd", "torchscript", "features", "fxforward", "fxbackward", "forward",
                   "backward", "timeout"):
        config.addinivalue_line("markers", marker)


def pytest_collection_modifyitems(config, items):
    """Only the tests of this side's models (timm's file also has tests of fixed models, e.g. resnet18)."""
    def ours(item) -> bool:
        name = getattr(getattr(item, "callspec", None), "params", {}).get("model_name")
        return isinstance(name, str) and name.startswith(PREFIX) and name[len(PREFIX):].split(".")[0] in CASES
    keep = [item for item in items if ours(item)]
    config.hook.pytest_deselected(items=[item for item in items if not ours(item)])
    items[:] = keep
