"""The GPU check's report (``scripts/gpu_check.sh``): the machine, the CUDA test results and the benchmark tables,
written as the ``### CUDA`` part of docs/reports/PERFORMANCE.md's GPU section (the rest of the file is left as it is).

    python3 -m visionpe.bench.speed.gpu --doc docs/reports/PERFORMANCE.md --env ENV.txt --junit TESTS.xml --bench BENCH.md \\
        [--tests-status N] [--bench-status N] [--seconds S]

A status of 124 is a step that ``timeout`` stopped: its partial results are reported as partial.
"""
from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path

GPU_HEADING = "## GPU"
CUDA_HEADING = "### CUDA"
TIMED_OUT = 124
KERNEL_TESTS = ("take_flash_or_cudnn", "memory_efficient_attention")  # tests/cuda/test_cuda_kernels.py


def test_results(junit: Path) -> tuple[dict[str, int], list[tuple[str, str, str]]]:
    """Counts (tests, failures, errors, skipped) of a pytest JUnit XML file, and ``(test, outcome, message)`` for
    every test that did not pass plus the kernel-choice tests (which pass when the preferred kernel ran)."""
    if not junit.is_file():
        return {}, []
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    listed = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            if any(key in name for key in KERNEL_TESTS):
                listed.append((name, "passed", ""))
            continue
        message = (outcome.get("message") or outcome.text or "").strip().splitlines()
        listed.append((name, outcome.tag, (message[0] if message else "")[:160].replace("|", "/")))
    return counts, listed


def tests_part(junit: Path, status: int | None) -> list[str]:
    counts, listed = test_results(junit)
    if not counts:
        return [f"The CUDA tests left no results (pytest exit status {status})."]
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    lines = [f"`pytest --device cuda tests/cuda`: {passed} passed, {counts['failures']} failed, {counts['errors']} "
             f"errors, {counts['skipped']} skipped"
             + (" (stopped by the time limit: the tests after the last one listed did not run)."
                if status == TIMED_OUT else f" (exit status {status}).")]
    if listed:
        lines += ["", "| test | outcome | message |", "|---|---|---|"]
        lines += [f"| `{name}` | {outcome} | {message} |" for name, outcome, message in listed]
    return lines


def cuda_part(env: str, junit: Path, bench: str, tests_status: int | None, bench_status: int | None,
              seconds: float | None) -> str:
    lines = [CUDA_HEADING, "", "Written by `scripts/gpu_check.sh`"
             + (f" in {seconds:.0f} s" if seconds is not None else "") + ".", "", "```", env.strip(), "```", ""]
    lines += tests_part(junit, tests_status) + [""]
    if bench_status == TIMED_OUT:
        lines += ["The benchmark was stopped by the time limit: the tables below are the parts it finished.", ""]
    elif bench_status:
        lines += [f"The benchmark exited with status {bench_status}: the tables below are what it printed.", ""]
    lines += [bench.strip() or "(no benchmark tables)", ""]
    return "\n".join(lines)


def replace_cuda_part(doc_text: str, part: str) -> str:
    """``doc_text`` with its ``### CUDA`` part (up to the next ``## `` heading or the end) replaced by ``part``;
    appended under a new ``## GPU`` section when there is none."""
    if CUDA_HEADING not in doc_text:
        if GPU_HEADING + "\n" not in doc_text:
            doc_text = doc_text.rstrip("\n") + f"\n\n{GPU_HEADING}\n"
        return doc_text.rstrip("\n") + "\n\n" + part.rstrip("\n") + "\n"
    start = doc_text.index(CUDA_HEADING)
    end = doc_text.find("\n## ", start)
    rest = "" if end < 0 else doc_text[end:]
    return doc_text[:start] + part.rstrip("\n") + "\n" + rest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="visionpe.bench.speed.gpu", description=__doc__.partition("\n\n")[0])
    p.add_argument("--doc", type=Path, required=True)
    p.add_argument("--env", type=Path, required=True)
    p.add_argument("--junit", type=Path, required=True)
    p.add_argument("--bench", type=Path, required=True)
    p.add_argument("--tests-status", type=int)
    p.add_argument("--bench-status", type=int)
    p.add_argument("--seconds", type=float)
    args = p.parse_args(argv)
    read = lambda path: path.read_text() if path.is_file() else ""  # noqa: E731
    part = cuda_part(read(args.env), args.junit, read(args.bench), args.tests_status, args.bench_status,
                     args.seconds)
    args.doc.write_text(replace_cuda_part(read(args.doc), part))


if __name__ == "__main__":
    main()
