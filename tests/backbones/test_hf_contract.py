"""transformers' own model tests as a contract (DESIGN.md section 10): ``ModelTesterMixin``, from the installed
release's sdist (``tests/peers.py``), runs on the stock classes of every Hugging Face family visionpe adapts and on
the patched classes with two encodings each (``hf_contract_cases.py``), in a pytest subprocess per family; every test
the stock classes pass, the patched ones pass too, except the open items of :data:`KNOWN` (each with its reason). A
test the stock classes fail or skip may fail or skip for ours.

Skips at transformers < 5: the testers here are written for transformers 5's harness (its class-name lookups, its
attention-implementation API, the SigLIP 2 and Qwen3-VL towers), and 4's sdist ships another harness.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("the contract's testers are written for transformers 5's ModelTesterMixin (4's sdist ships another "
                "harness; SigLIP 2 and Qwen3-VL towers are transformers 5's)", allow_module_level=True)
pytest.importorskip("parameterized", reason="transformers' test_modeling_common imports parameterized (the dev extra)")

from peers import junit_outcomes, peer_sdist  # noqa: E402

CASES = Path(__file__).with_name("hf_contract_cases.py")
ROOT = CASES.parents[2]
# (family, the encodings its patched classes run with): hf_contract_cases.FAMILIES
FAMILIES = {"vit": ("rope_mixed", "learned+rel_bias"), "deit": ("rope_mixed", "learned+rel_bias"),
            "dinov2": ("rope_mixed", "learned+rel_bias"), "dinov3": ("rope_mixed", "native"),
            "swin": ("swin_bias", "cpb"), "siglip2": ("rope_mixed", "learned+rel_bias"),
            "siglip2_classifier": ("rope_mixed", "learned+rel_bias"), "qwen3_vl": ("rope_mixed", "native")}

# The tests the stock classes pass and the patched ones do not, each with its reason (the contract's open items); the
# test fails when one of them passes again, so the entry goes. Nothing else is left out.
KNOWN = {("qwen3_vl", "test_vision_axial_rope"): "it tests transformers' own axial RoPE layer class, found in the "
         "model; the patched tower has none (the encoding put in replaces it), and the test skips itself"}


def label(pe: str | None) -> str:
    return "stock" if pe is None else pe.replace("+", "_")


def outcomes(report: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """junit XML -> ``{case class: {test: (outcome, message)}}``, outcome ``passed``, ``failed`` or ``skipped``."""
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for case_class, test, outcome, message in junit_outcomes(report):
        found.setdefault(case_class, {})[test] = (outcome, message)
    return found


def run_family(family: str, tmp_path: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """The family's stock case and its encodings' cases, run in one pytest subprocess: their outcomes."""
    sdist = peer_sdist("transformers")
    cases = [f"{CASES}::Test_{family}__{label(pe)}" for pe in (None, *FAMILIES[family])]
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # one thread: the tiny models' kernels are slower on several (and CI runs two pytest workers on two cores)
    env.update(VISIONPE_PEER_SDIST=str(sdist), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                          "--noconftest", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
                          "--import-mode=importlib", f"--junitxml={report}", *cases],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert report.is_file(), \
        f"the contract run of {family} wrote no report:\n{got.stdout[-3000:]}\n{got.stderr[-3000:]}"
    return outcomes(report)


def broken_promises(found: dict, family: str) -> dict[str, list[str]]:
    """Per encoding: the tests the stock case passes and the encoding's case does not, with its outcome."""
    stock = found[f"Test_{family}__stock"]
    broken = {}
    for pe in FAMILIES[family]:
        ours = found.get(f"Test_{family}__{label(pe)}", {})
        broken[pe] = [f"{test}: {ours.get(test, ('missing', ''))[0]} {ours.get(test, ('', ''))[1]}"
                      for test, (outcome, _) in sorted(stock.items())
                      if outcome == "passed" and ours.get(test, ("missing",))[0] != "passed"]
    return broken


def counts(tests: dict) -> str:
    values = [o for o, _ in tests.values()]
    return ", ".join(f"{values.count(o)} {o}" for o in ("passed", "failed", "skipped"))


@pytest.mark.parametrize("family", FAMILIES)
def test_patched_classes_pass_what_stock_classes_pass(family, tmp_path):
    found = run_family(family, tmp_path)
    print(f"{family}: " + "; ".join(f"{case.split('__')[-1]}: {counts(tests)}" for case, tests in found.items()))
    assert f"Test_{family}__stock" in found and len(found[f"Test_{family}__stock"]) > 100, sorted(found)
    promises = broken_promises(found, family)
    known = {test for (where, test) in KNOWN if where == family}
    still = {test for tests in promises.values() for line in tests for test in [line.split(":")[0]] if test in known}
    assert still == known, f"known gaps of {family} that no longer fail (remove them from KNOWN): {known - still}"
    broken = {pe: [line for line in tests if line.split(":")[0] not in known] for pe, tests in promises.items()}
    broken = {pe: tests for pe, tests in broken.items() if tests}
    assert not broken, "\n".join(f"{pe}: {len(tests)} tests the stock classes pass:\n  " + "\n  ".join(tests)
                                 for pe, tests in broken.items())
