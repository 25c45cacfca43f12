"""What the built wheel and sdist hold: every module, py.typed, the shipped recipes, the explorer page's files, the
``visionpe`` console script, the license, the version and the dependencies.

CI (.ci/check_dist.sh) passes the files ``python -m build`` made in ``VISIONPE_WHEEL`` / ``VISIONPE_SDIST``;
elsewhere the test builds them from a copy of the tree with the installed setuptools (skipped where it is older
than the build backend needs)."""
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import visionpe
from visionpe.viz import explorer

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("pyproject.toml", "README.md", "LICENSE", "visionpe")


def _setuptools_can_build() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    from packaging.version import Version
    return Version(setuptools.__version__) >= Version("77")


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    if os.environ.get("VISIONPE_WHEEL"):
        return {"wheel": Path(os.environ["VISIONPE_WHEEL"]), "sdist": Path(os.environ["VISIONPE_SDIST"])}
    if not _setuptools_can_build():
        pytest.skip("setuptools >= 77 is not installed here (the build backend's floor); CI builds with "
                    "python -m build and runs this test on its files (.ci/check_dist.sh)")
    tree = tmp_path_factory.mktemp("tree")
    for name in SHIPPED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tree / name)
    out = tree / "dist"
    code = ("import sys; from setuptools import build_meta as b; out = sys.argv[1]; "  # build_meta rewrites sys.argv
            "print(b.build_wheel(out), b.build_sdist(out), file=open('built.txt', 'w'))")
    result = subprocess.run([sys.executable, "-c", code, str(out)], cwd=tree, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    wheel, sdist = (tree / "built.txt").read_text().split()
    return {"wheel": out / wheel, "sdist": out / sdist}


def _metadata(text: str):
    return Parser().parsestr(text)


def test_wheel_holds_every_module_py_typed_and_the_license(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = _metadata(wheel.read(f"{info}/METADATA").decode())
        assets = {n: wheel.read(n) for n in names if n.startswith("visionpe/viz/assets/")}
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "visionpe").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert "visionpe/py.typed" in names
    assert assets == {f"visionpe/viz/assets/{name}": (ROOT / "visionpe" / "viz" / "assets" / name).read_bytes()
                      for name in explorer.ASSETS}, sorted(assets)  # the explorer page's files, as in the tree
    for shipped, least in (("configs", 5), ("bench/configs", 10)):  # the user recipes; the benchmark's own files
        files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "visionpe" / shipped).glob("*.yaml")}
        assert len(files) >= least and files == {n for n in names if n.startswith(f"visionpe/{shipped}/")}
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "configs/", "docs/"))]
    assert f"{info}/licenses/LICENSE" in names
    assert "[console_scripts]\nvisionpe = visionpe.cli.commands:console" in entry_points
    assert metadata["Name"] == "visionpe" and metadata["Version"] == visionpe.__version__
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    core = [r for r in requires if r.marker is None]
    assert {r.name for r in core} >= {"torch", "torchvision", "timm"}
    assert all([s.operator for s in r.specifier] == [">="] for r in core), core


def test_sdist_builds_the_same_package(dists):
    with tarfile.open(dists["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
        top = sdist.getnames()[0].split("/")[0]
        metadata = _metadata(sdist.extractfile(f"{top}/PKG-INFO").read().decode())
    assert {"pyproject.toml", "README.md", "LICENSE", "visionpe/__init__.py", "visionpe/py.typed"} <= names
    assert {f"visionpe/viz/assets/{name}" for name in explorer.ASSETS} <= names
    assert {f"visionpe/configs/{p.name}" for p in (ROOT / "visionpe" / "configs").glob("*.yaml")} <= names
    assert metadata["Version"] == visionpe.__version__ and metadata["License-Expression"] == "Apache-2.0"
