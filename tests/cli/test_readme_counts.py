"""The README's reliability section states the sizes of the bad-input tables; they must be the tables' sizes."""
import re
from pathlib import Path

import test_bad_inputs
import test_cli_errors

README = Path(__file__).resolve().parents[2] / "README.md"


def stated(pattern: str) -> int:
    found = re.findall(pattern, README.read_text())
    assert len(found) == 1, f"README.md should state {pattern!r} once, found {found}"
    return int(found[0])


def test_readme_counts_are_the_tables_sizes():
    assert stated(r"\*\*(\d+) bad API inputs\*\*") == len(test_bad_inputs.ROWS)
    assert stated(r"\*\*(\d+) CLI mistakes\*\*") == len(test_cli_errors.ROWS)
