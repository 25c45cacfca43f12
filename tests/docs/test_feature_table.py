"""docs/features.md, the comparison with timm, transformers, rope-vit, rotary-embedding-torch and torchvision: every
row's visionpe cell links the test that shows it, and every such link names a test function that exists, so the
table cannot rot when a test is renamed or removed."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "features.md"
LIBRARIES = ("visionpe", "timm", "transformers", "rope-vit", "rotary-embedding-torch", "torchvision")
TEST_LINK = re.compile(r"\[`(?P<node>(?P<file>tests/[\w/]+\.py)::(?P<name>\w+))`\]\((?P<target>[^)\s]+)\)")


def defined_tests(file: Path) -> set[str]:
    """The names of the test functions a test file defines, at module level or in a class."""
    tree = ast.parse(file.read_text(), filename=str(file))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def broken_test_links(text: str, page: Path = PAGE) -> list[str]:
    """Every ``[`tests/x.py::test_name`](link)`` of ``text`` whose link is not the file, relative to ``page``, or
    whose file or test function does not exist."""
    broken = []
    for link in TEST_LINK.finditer(text):
        file = ROOT / link["file"]
        if (page.parent / link["target"]).resolve() != file.resolve():
            broken.append(f"{link['node']}: links {link['target']}, not its file")
        elif not file.is_file():
            broken.append(f"{link['node']}: no file {link['file']}")
        elif link["name"] not in defined_tests(file):
            broken.append(f"{link['node']}: {link['file']} defines no {link['name']}")
    return broken


def table_rows(text: str) -> list[list[str]]:
    """The cells of every body row of the page's tables (header and separator rows left out)."""
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| feature |") and not set(line) <= set("|- ")]


def test_every_test_link_names_an_existing_test():
    text = PAGE.read_text()
    assert len(TEST_LINK.findall(text)) >= 25
    assert not broken_test_links(text), "\n".join(broken_test_links(text))


def test_every_row_compares_all_six_and_links_its_visionpe_test():
    text = PAGE.read_text()
    headers = [line for line in text.splitlines() if line.startswith("| feature |")]
    assert headers and all(line == "| feature | " + " | ".join(LIBRARIES) + " |" for line in headers)
    rows = table_rows(text)
    assert len(rows) >= 25
    for row in rows:
        assert len(row) == 1 + len(LIBRARIES), row[0]
        assert row[1].startswith("yes: ") and TEST_LINK.search(row[1]), f"{row[0]}: no test linked"
        assert all(row[2:]), f"{row[0]}: an empty cell"


def test_a_renamed_or_mislinked_test_is_reported():
    """The check fails on the ways a link rots: a test renamed, a file moved, a link to another file."""
    good = ("[`tests/docs/test_feature_table.py::test_every_test_link_names_an_existing_test`]"
            "(../tests/docs/test_feature_table.py)")
    assert not broken_test_links(good)
    renamed = good.replace("::test_every_test_link_names_an_existing_test", "::test_no_such_test")
    assert broken_test_links(renamed) == [
        "tests/docs/test_feature_table.py::test_no_such_test: tests/docs/test_feature_table.py defines no "
        "test_no_such_test"]
    moved = good.replace("tests/docs/", "tests/gone/")
    assert broken_test_links(moved) == ["tests/gone/test_feature_table.py::test_every_test_link_names_an_existing_"
                                        "test: no file tests/gone/test_feature_table.py"]
    elsewhere = good.replace("(../tests/docs/test_feature_table.py)", "(../tests/docs/test_code_blocks.py)")
    assert "not its file" in broken_test_links(elsewhere)[0]
