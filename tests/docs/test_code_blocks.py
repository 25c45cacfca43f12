"""The README and the guides as a user reads them: every ```python block runs as written, every relative link
resolves, every ``visionpe NAME`` of a shell block is a command.

A block that needs data, a GPU, a download or a long run is marked on the line before its fence with
``<!-- skip: the reason -->``; it is reported as skipped with that reason. Every other block runs in a fresh
namespace, in a temporary directory, with matplotlib's Agg backend.
"""
from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from visionpe.cli.commands import COMMANDS

try:  # the Hugging Face adapters register when transformers is imported: before conftest.py saves the registries
    import transformers  # noqa: F401
except ImportError:
    pass

ROOT = Path(__file__).resolve().parents[2]
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # what a user of the wheel reads
PAGES = [*GUIDES, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs" / "reports").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")


def fenced_blocks(text: str):
    """``(language, code, line, skip reason or None)`` for every fenced block of a markdown text."""
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").splitlines()
        marker = SKIP.search(before[-1]) if before else None
        yield (match["lang"], textwrap.dedent(match["body"]), text.count("\n", 0, match.start()) + 1,
               marker["reason"] if marker else None)


def python_blocks():
    for page in PAGES:
        for lang, code, line, reason in fenced_blocks(page.read_text()):
            if lang == "python":
                marks = [pytest.mark.skip(reason=reason)] if reason else []
                yield pytest.param(page, line, code, id=f"{page.relative_to(ROOT)}:{line}", marks=marks)


@pytest.mark.parametrize("page,line,code", list(python_blocks()))
def test_python_block_runs_as_written(page, line, code, tmp_path, monkeypatch):
    """The block runs alone (its own imports, no name from another block) in an empty working directory."""
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is the fastest on a shared machine
    filename = f"{page.relative_to(ROOT)}, the block at line {line}"
    for extra in sorted(set(re.findall(r"^\s*(?:from|import) (transformers|diffusers)\b", code, re.M))):
        pytest.importorskip(extra, reason=f"{filename} uses {extra} (an extra: pip install 'visionpe[hf]')")
    if re.search(r"\bexport\.|torch\.export\b", code):  # docs/deploy.md: torch.export, ONNX
        from visionpe import export
        if not export.torch_supports_export():
            pytest.skip(f"{filename} exports: torch >= {'.'.join(map(str, export.MIN_TORCH))} "
                        f"(installed {torch.__version__})")
        if "onnx" in code and export.missing_onnx_packages():
            pytest.skip(f"{filename} uses {', '.join(export.missing_onnx_packages())} (the export extra: pip install "
                        "'visionpe[export]')")
    from visionpe._compat import ADAPTER_MIN_TIMM, timm_release
    for family, release in ADAPTER_MIN_TIMM.items():  # an adapter of a newer timm: not registered at an older one
        if re.search(rf"\b{family.lower()}", code, re.I) and timm_release() < release:
            pytest.skip(f"{filename} uses the {family} adapter: timm >= {'.'.join(map(str, release))}")
    try:
        exec(compile("\n" * line + code, filename, "exec"), {"__name__": "__doc_block__"})
    except ImportError as error:  # a name of a newer transformers (DINOv3 from 4.56): skipped at an older one
        if "from 'transformers'" not in str(error):
            raise
        pytest.skip(f"{filename} needs a newer transformers: {error}")
    finally:
        torch.set_num_threads(threads)


def without_fences(text: str) -> str:
    """The text with fenced blocks blanked (a ``# comment`` in one is not a heading)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code spans blanked (their brackets are not links)."""
    return re.sub(r"`[^`\n]*`", "", without_fences(text))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page (lower case, punctuation dropped, spaces to '-', '-1' ... for
    repeats)."""
    seen, found = {}, set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", without_fences(page.read_text()).replace("`", ""), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


LINK = re.compile(r"!?\[[^\]\n]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    """Every relative link or picture names a file of the checkout, and its ``#anchor`` a heading of that page."""
    broken = []
    for target in LINK.findall(without_code(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_shell_blocks_name_existing_commands(page):
    """``visionpe NAME`` is a subcommand of the console command; ``python train_vit.py`` and ``python scripts/X.py``
    are files of the checkout (another ``python X.py``, such as timm's ``train.py``, is not ours to check)."""
    names = set(COMMANDS)
    wrong = []
    for lang, code, line, _ in fenced_blocks(page.read_text()):
        if lang not in ("bash", "sh", "shell"):
            continue
        for sub in re.findall(r"(?:^|[\s;&|(])visionpe\s+([a-z][\w-]*)", code):
            if sub not in names:
                wrong.append(f"line {line}: visionpe {sub} (commands: {', '.join(sorted(names))})")
        for script in re.findall(r"python3?\s+((?:scripts/)?\S*train_vit\.py|scripts/\S+\.py)\b", code):
            if not (ROOT / script).exists():
                wrong.append(f"line {line}: python {script}: no such file")
    assert not wrong, f"{page.relative_to(ROOT)}: " + "; ".join(wrong)


SCRIPT_NAMES = ["train_vit", "resolution_sweep", *(name.replace("-", "_") for name in COMMANDS if name != "train")]
CHECKOUT_PATH = re.compile(r"(?:scripts|visionpe)/[\w/]*\.py\b"  # a script, the package's source
                           rf"|\b(?:{'|'.join(SCRIPT_NAMES)})\.py\b"  # a command's file: the root wrapper, old scripts
                           r"|\bconfigs/\w+\.yaml\b")  # a recipe's file: --config takes its name


@pytest.mark.parametrize("page", GUIDES, ids=[str(p.relative_to(ROOT)) for p in GUIDES])
def test_guides_name_commands_not_checkout_paths(page):
    """A wheel user has no checkout: a guide names ``visionpe ...`` commands, modules (``torchrun -m
    visionpe.train``) and recipes by name (``--config shapes_tiny``), never a Python file of ``scripts/`` or of the
    package's source (``visionpe/train/sweep.py``), the checkout's ``train_vit.py`` or a command's former script
    (``bench_speed.py``; timm's ``train.py`` is timm's), nor a recipe's path (``configs/shapes_tiny.yaml``)."""
    found = CHECKOUT_PATH.findall(page.read_text())
    assert not found, f"{page.relative_to(ROOT)} names checkout paths: {found}"


def test_checkout_paths_are_recognised():
    """The pattern catches each kind of checkout path (what the guides said before) and passes the installed
    commands that replace them."""
    old = ("python train_vit.py --data shapes-position", "torchrun --nproc_per_node 2 train_vit.py --pe learned",
           "--config configs/shapes_tiny.yaml", "`configs/deit3_small_rope_imagenet.yaml` is",
           "(`visionpe/configs/small_folder.yaml`)", "`resolution_sweep.py --weights ema`",
           "`make_image_folders.py fashion-mnist`", "python scripts/benchmark.py", "visionpe/train/sweep.py")
    assert [bool(CHECKOUT_PATH.search(line)) for line in old] == [True] * len(old)
    new = ("visionpe train --data shapes-position", "torchrun --nproc_per_node 2 -m visionpe.train --pe learned",
           "--config shapes_tiny", "`visionpe.train.train_vit`, top to bottom", "timm's `train.py` names its folders",
           "a run's `config.yaml`", "`visionpe sweep --weights ema`", "tests/train/test_train.py")
    assert [bool(CHECKOUT_PATH.search(line)) for line in new] == [False] * len(new)


def test_docs_top_holds_the_guides_and_reports_hold_the_reports():
    """``ls docs`` shows guides: the reports (upper-case names: BENCHMARK*.md, PERFORMANCE.md) and their figures
    live in docs/reports/."""
    top = [p.name for p in (ROOT / "docs").iterdir() if p.is_file()]
    assert not [n for n in top if n.endswith(".png") or Path(n).stem.isupper()], top
    assert {"BENCHMARK.md", "PERFORMANCE.md"} <= {p.name for p in (ROOT / "docs" / "reports").glob("*.md")}


def test_a_skip_marker_is_read():
    """The marker on the line before a fence skips that block with its reason, and only that block."""
    text = "a\n<!-- skip: needs a GPU -->\n```python\nraise SystemExit\n```\n\n```python\nx = 1\n```\n"
    assert [(lang, reason) for lang, _, _, reason in fenced_blocks(text)] == [("python", "needs a GPU"),
                                                                               ("python", None)]


def tree_paths(page: Path) -> list[str]:
    """The paths the architecture tree of CONTRIBUTING.md names: each entry of its left column (a folder or file of
    the package, or of the checkout for entries at the margin) and the ``name.py`` files listed beside a folder."""
    tree = next(code for lang, code, _, _ in fenced_blocks(page.read_text()) if not lang and "visionpe/" in code)
    paths, folder = [], None
    for row in tree.splitlines()[1:]:
        left, words = row[:31], row[31:]
        base = "visionpe/" if left.startswith("  ") else ""
        names = left.split()
        if names:
            paths += [base + name for name in names]
            folder = base + names[0] if names[0].endswith("/") else None
        if folder:
            paths += [folder + name for name in re.findall(r"\b\w+\.py\b", words)]
    return paths


def test_the_architecture_tree_names_existing_paths():
    """CONTRIBUTING.md's tree and its "where a new piece goes" table name files, folders and registries that exist."""
    import importlib

    page = ROOT / "CONTRIBUTING.md"
    paths = tree_paths(page)
    assert len(paths) > 40 and "visionpe/backbones/adapter.py" in paths
    assert not [path for path in paths if not (ROOT / path).exists()]
    table = page.read_text().split("**Where a new piece goes**")[1].split("\n\n")[1]
    registries = re.findall(r"`((?:[a-z_]+/)*[a-z_]+)\.([A-Z_]+)`", table)  # `registry.ENCODINGS`, `cli/commands.COMMANDS`
    assert len(registries) >= 4
    for module, name in registries:
        assert hasattr(importlib.import_module("visionpe." + module.replace("/", ".")), name), (module, name)
    files = re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", table)  # `presets/catalog.py`, `train/train_vit.py`
    assert files and not [f for f in files if not (ROOT / "visionpe" / f).exists()]
