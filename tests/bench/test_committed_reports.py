"""The committed benchmark reports and their committed records never drift: every report under docs/ that has a
records folder (``docs/**/data/<doc>/<part>/`` with the ``invocation.json`` of the invocation that made it) is
rebuilt byte for byte by ``--report-only`` from a copy of its records (:mod:`visionpe.bench.rebuild`; how the check
tells a drift is tests/bench/test_benchmark_records.py's), the speed report (docs/reports/PERFORMANCE.md, from
``data/performance/speed/``, the records' readings included) among them. A checkout with no records folder yet has
nothing to check here."""
from __future__ import annotations

from pathlib import Path

import pytest

from visionpe.bench import rebuild

ROOT = Path(__file__).resolve().parents[2]
FOUND = rebuild.invocations(ROOT / "docs")


@pytest.mark.parametrize("invocation", FOUND, ids=[str(p.parent.relative_to(ROOT)) for p in FOUND])
def test_a_committed_report_is_what_its_records_rebuild(invocation, tmp_path):
    committed, rebuilt = rebuild.check(invocation, tmp_path)
    assert rebuilt == committed, (f"{rebuild.doc_of(invocation).relative_to(ROOT)}: its part {invocation.parent.name} "
                                  f"is not what its records rebuild (python -m visionpe.bench.rebuild docs --write "
                                  "rebuilds it; a stale record is named in the rebuilt part)")
