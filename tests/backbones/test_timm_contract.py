"""timm's own model tests as a contract (DESIGN.md section 10): ``tests/test_models.py`` from the installed timm
release's sdist (``tests/peers.py``) runs on timm's models of every family visionpe's registry covers (ViT, DeiT,
distilled DeiT, DeiT-III, Eva and its RoPE port, DINOv2, DINOv3, BEiT, the RelPos ViT, Swin, Swin-V2) and on their
``vpe_`` twins, each twin with the registry default (``native``) and a tokens, a rotary, a bias and a frontier
encoding (:data:`MODELS`). Every test that timm gives a model through ``timm.list_models`` (the generic ones:
forward, backward, the cfg checks, features, forward_intermediates, FX, TorchScript), the harness
(``timm_contract_harness.py``) gives to its ``vpe_`` twin, and whatever timm's model passes, the twin passes too,
TorchScript included (every encoding of :data:`MODELS` has a TorchScript form, docs/deploy.md): no open items.

The selection is timm's own CI's: its markers, and ``GITHUB_ACTIONS`` set, which leaves out, as timm's CI does, the
unmarked slow tests (``test_prune_intermediate_layers_contract``, FX then TorchScript) and the pretrained downloads;
``test_model_inference`` downloads weights and is left out too. Both sides are built with the same keywords, which
make timm's architectures shallower and narrower (:data:`MODELS`) so that the contract fits CI: the tests are
timm's, unchanged, the models a reduced form of the same classes. The tests timm writes for named models only
(``test_swin_family_*`` on ``swin_tiny_patch4_window7_224``, ...) are not a model-list contract and do not run on
twins.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from peers import junit_outcomes, peer_sdist

HARNESS = Path(__file__).with_name("timm_contract_harness.py")
ROOT = HARNESS.parents[2]
VIT, SWIN = {"depth": 3}, {"depths": [2, 2, 2, 2], "embed_dim": 48}
NARROW = {**VIT, "embed_dim": 192, "num_heads": 3}
# timm model -> (keywords for both sides, the twin's encodings: the registry default first, then a tokens, a rotary,
# a bias and a frontier encoding; Swin's windows take no tokens encoding)
MODELS = {
    "test_vit": (VIT, ("native", "sincos", "rope_mixed", "rel_bias", "lookhere")),
    "deit_tiny_patch16_224": (VIT, ("native", "peg", "rope_axial", "alibi", "fire")),
    "deit_tiny_distilled_patch16_224": (VIT, ("native", "sincos", "rope_mixed", "cpb", "string")),
    "deit3_small_patch16_224": (NARROW, ("native", "learned", "comrope", "rel_bias", "bucket_bias")),
    "eva02_tiny_patch14_224": (VIT, ("native", "learned", "rope_axial", "alibi", "liere")),
    "vit_small_patch16_rope_224": (NARROW, ("native", "peg", "rope_mixed", "fire", "spiral_rope")),
    "vit_small_patch14_reg4_dinov2": (NARROW, ("native", "sincos", "rope_mixed", "rel_bias", "pape")),
    "vit_small_patch16_dinov3": (NARROW, ("native", "learned", "rope_axial", "cpb", "harope")),
    "beit_base_patch16_224": (NARROW, ("native", "learned", "rope_mixed", "alibi", "fire")),
    "vit_relpos_small_patch16_224": (NARROW, ("native", "sincos", "rope_axial", "rel_bias", "comrope")),
    "swin_tiny_patch4_window7_224": (SWIN, ("native", "rope_mixed", "cpb", "string")),
    "swinv2_tiny_window8_256": (SWIN, ("native", "rope_axial", "swin_bias", "comrope")),
}
SLOTS = range(max(len(pes) for _, pes in MODELS.values()))
MARKERS = "base or cfg or torchscript or features or fxforward or fxbackward or forward or backward"


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """junit XML -> ``{test id with the vpe_ prefix dropped: (outcome, message)}``."""
    return {test.replace("vpe_", ""): (outcome, message) for _, test, outcome, message in junit_outcomes(report)}


def run_side(side: str, cases: dict, folder: Path) -> dict[str, tuple[str, str]]:
    """timm's test_models.py on one side (``twin`` or ``vpe``) of ``cases`` (``{timm name: {"kwargs", "pe"}}``), in a
    pytest subprocess: the outcomes."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(peer_sdist("timm") / "tests" / "test_models.py", folder / "test_models.py")
    shutil.copy(HARNESS, folder / "conftest.py")
    (folder / "pytest.ini").write_text("[pytest]\n")
    report = folder / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(VPE_CONTRACT=json.dumps(cases), VPE_CONTRACT_SIDE=side, GITHUB_ACTIONS="1", HF_HUB_OFFLINE="1",
               MPLBACKEND="Agg", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                          "-c", str(folder / "pytest.ini"), "--rootdir", str(folder), "-m", MARKERS,
                          "-k", "not test_model_inference", f"--junitxml={report}", "test_models.py"],
                         capture_output=True, text=True, env=env, cwd=folder, timeout=1200)
    assert report.is_file(), f"the {side} run wrote no report:\n{got.stdout[-3000:]}\n{got.stderr[-3000:]}"
    return outcomes(report)


@pytest.fixture(scope="session")
def twin_outcomes(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """timm's models' outcomes, run once for every pytest worker (the first computes them under a file lock)."""
    shared = tmp_path_factory.getbasetemp().parent
    saved = shared / "timm_contract_twins.json"
    with FileLock(str(saved) + ".lock"):
        if not saved.is_file():
            cases = {name: {"kwargs": kwargs, "pe": None} for name, (kwargs, _) in MODELS.items()}
            saved.write_text(json.dumps(run_side("twin", cases, shared / "timm_contract_twins")))
        return {test: tuple(result) for test, result in json.loads(saved.read_text()).items()}


def counts(found: dict) -> str:
    values = [outcome for outcome, _ in found.values()]
    return ", ".join(f"{values.count(o)} {o}" for o in ("passed", "failed", "skipped"))


@pytest.mark.parametrize("slot", SLOTS)
def test_vpe_models_pass_what_timm_models_pass(slot, twin_outcomes, tmp_path):
    cases = {name: {"kwargs": kwargs, "pe": pes[slot]} for name, (kwargs, pes) in MODELS.items() if slot < len(pes)}
    ours = run_side("vpe", cases, tmp_path)
    print(f"slot {slot} ({', '.join(c['pe'] for c in cases.values())}): {counts(ours)}; twins: {counts(twin_outcomes)}")
    twins = {test: result for test, result in twin_outcomes.items()
             if any(f"-{name}" in test or f"[{name}" in test for name in cases)}
    assert len(ours) > 8 * len(cases), f"too few tests ran: {sorted(ours)}"
    assert set(ours) <= set(twins), f"tests the twins did not get: {sorted(set(ours) - set(twins))}"
    failing = {test for test in ours if twins[test][0] == "passed" and ours[test][0] != "passed"}
    assert not failing, "tests timm's models pass and their vpe_ twins do not:\n" + "\n".join(
        f"{test}: {ours[test][0]} {ours[test][1]}" for test in sorted(failing))
