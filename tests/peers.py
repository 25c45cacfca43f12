"""The peers' own test code, taken at test time from the sdist of the installed release on the package index (never
copied into this repository): ``peer_sdist("timm")`` is the unpacked source tree of the installed timm's sdist.

The sdist is downloaded once per machine into a cache folder (``VISIONPE_PEER_CACHE``, default
``~/.cache/visionpe/peer-sdists``) and unpacked there atomically, so concurrent pytest-xdist workers and later runs
share it. Where the package index cannot be reached the calling test skips and says why; CI reaches it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest


def cache_root() -> Path:
    return Path(os.environ.get("VISIONPE_PEER_CACHE", Path.home() / ".cache" / "visionpe" / "peer-sdists"))


def peer_sdist(package: str) -> Path:
    """The unpacked sdist (``<cache>/<package>-<version>``) of the installed release of ``package``; skips the
    calling test when pip cannot download it."""
    release = version(package)
    root = cache_root()
    target = root / f"{package}-{release}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as work:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                              "--disable-pip-version-check", "-q", "-d", work, f"{package}=={release}"],
                             capture_output=True, text=True, timeout=600)
        archives = sorted(Path(work).glob("*.tar.gz"))
        if got.returncode or not archives:
            pytest.skip(f"the sdist of {package}=={release} could not be downloaded from the package index: "
                        f"{(got.stderr or got.stdout).strip().splitlines()[-1:]}")
        with tarfile.open(archives[0]) as tar:
            tar.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        unpacked = [p for p in Path(work).iterdir() if p.is_dir()]
        assert len(unpacked) == 1, f"{archives[0].name} holds {len(unpacked)} top folders"
        try:
            unpacked[0].rename(target)  # atomic: another worker that got there first keeps its copy
        except OSError:
            if not target.is_dir():
                raise
    return target


def junit_outcomes(report: Path) -> list[tuple[str, str, str, str]]:
    """A pytest junit XML report -> ``(class name, test name, outcome, message)`` per test, outcome ``passed``,
    ``failed`` (a failure or an error) or ``skipped``; a test reported twice (a teardown error) keeps its worst
    outcome."""
    import xml.etree.ElementTree as ET
    worst: dict[tuple[str, str], tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", (child.get("message") or "")[:300]
                break
            if child.tag == "skipped":
                outcome, message = "skipped", (child.get("message") or "")[:300]
        key = (case.get("classname").rsplit(".", 1)[-1], case.get("name"))
        if worst.get(key, ("",))[0] != "failed":
            worst[key] = (outcome, message)
    return [(*key, *result) for key, result in worst.items()]
