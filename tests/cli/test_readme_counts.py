"""The docs state the sizes of the bad-input tables (docs/checks.md's "Reliability"); they must be the tables' sizes.
The statement is looked for on every page a user reads (README.md, CONTRIBUTING.md, docs/*.md), so it follows the
section wherever it moves, and must be made exactly once."""
import re
from pathlib import Path

import test_bad_inputs
import test_cli_errors

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def stated(pattern: str) -> int:
    found = [(page.name, n) for page in PAGES if page.exists() for n in re.findall(pattern, page.read_text())]
    assert len(found) == 1, f"the docs should state {pattern!r} once, found {found}"
    return int(found[0][1])


def test_readme_counts_are_the_tables_sizes():
    assert stated(r"\*\*(\d+) bad API inputs\*\*") == len(test_bad_inputs.ROWS)
    assert stated(r"\*\*(\d+) CLI mistakes\*\*") == len(test_cli_errors.ROWS)
