"""The package metadata: lower bounds only (and they are the floor CI tests), an SPDX license, one version."""
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import visionpe

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FLOOR = ROOT / ".ci" / "floor-requirements.txt"


def _floor_pins() -> dict[str, Version]:
    pins = [Requirement(line) for line in FLOOR.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in pins), pins
    return {r.name.lower(): Version(next(iter(r.specifier)).version) for r in pins}


def test_dependencies_have_lower_bounds_only():
    requirements = [Requirement(r) for r in PROJECT["dependencies"]]
    assert {r.name for r in requirements} >= {"torch", "torchvision", "timm"}
    for r in requirements:
        assert [s.operator for s in r.specifier] == [">="], f"{r}: only a lower bound (>=) belongs in the metadata"


def test_lower_bounds_are_the_floor_that_ci_tests():
    """Each dependency's lower bound is the release .ci/run's floor step installs (a bound we claim is one we run)."""
    pins = _floor_pins()
    for r in (Requirement(r) for r in PROJECT["dependencies"]):
        bound = Version(next(iter(r.specifier)).version)
        assert r.name.lower() in pins, f"{r.name} is not installed at the floor ({FLOOR.name})"
        floor = pins[r.name.lower()]
        assert (floor.major, floor.minor) == (bound.major, bound.minor) and floor >= bound, \
            f"{r.name}: the metadata says >={bound}, the floor CI installs {floor}"


def test_license_is_an_spdx_expression_with_its_file():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    # PEP 639: the expression replaces license classifiers
    assert not [c for c in PROJECT.get("classifiers", []) if c.startswith("License ::")]


def test_version_has_one_place():
    """pyproject.toml reads visionpe.__version__ (no second copy), a PEP 440 version with its CHANGELOG section."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "visionpe.__version__"}
    version = Version(visionpe.__version__)
    assert str(version) == visionpe.__version__
    source = (ROOT / "visionpe" / "__init__.py").read_text()
    # a plain string assignment: setuptools reads it without importing visionpe
    assert re.search(rf'^__version__ = "{re.escape(visionpe.__version__)}"', source, re.M)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(visionpe.__version__)}\]", changelog, re.M)
    assert "Semantic Versioning" in changelog


def test_py_typed_is_package_data():
    assert (ROOT / "visionpe" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["visionpe"]
