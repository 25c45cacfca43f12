"""scripts/gpu_check.sh: on a machine without CUDA one line and exit 0; its report writer (visionpe.bench.speed.gpu) reads
pytest's JUnit XML and puts the CUDA part into docs/reports/PERFORMANCE.md's GPU section, leaving the rest of the file."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from visionpe.bench.speed import gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_without_cuda_one_line_and_exit_0():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 0, done
    assert lines == [f"gpu_check: no CUDA device here (torch.cuda.is_available() is False under {sys.executable}); "
                     f"nothing to check"]


def test_without_torch_one_line_and_exit_1(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT)], env=dict(os.environ, PYTHON=str(fake)), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout.strip() == f"gpu_check: {fake} cannot import torch; set PYTHON to a python with torch"


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5" time="12.5">
<testcase classname="tests.cuda.test_cuda_kernels" name="test_unmasked_families_take_flash_or_cudnn[vit-none]"/>
<testcase classname="tests.cuda.test_device_parity" name="test_outputs[vit-none-float32]"/>
<testcase classname="tests.cuda.test_device_parity" name="test_outputs[vit-alibi-bfloat16]">
  <failure message="AssertionError: Tensor-likes are not close! | x">long traceback</failure></testcase>
<testcase classname="tests.cuda.test_device_training" name="test_step[swin-cpb]"><error message="RuntimeError: boom"/></testcase>
<testcase classname="tests.cuda.test_device_properties" name="test_sync[vit-none]"><skipped message="needs CUDA"/></testcase>
</testsuite></testsuites>"""


def test_report_counts_and_lists_what_did_not_pass(tmp_path):
    junit = tmp_path / "t.xml"
    junit.write_text(JUNIT)
    counts, listed = gpu.test_results(junit)
    assert counts == {"tests": 5, "failures": 1, "errors": 1, "skipped": 1}
    assert [(name.split("::")[0], outcome) for name, outcome, _ in listed] == [
        ("test_cuda_kernels", "passed"), ("test_device_parity", "failure"), ("test_device_training", "error"),
        ("test_device_properties", "skipped")]
    assert listed[1][2] == "AssertionError: Tensor-likes are not close! / x"  # one line, no table-breaking "|"
    lines = gpu.tests_part(junit, 124)
    assert lines[0].startswith("`pytest --device cuda tests/cuda`: 2 passed, 1 failed, 1 errors, 1 skipped (stopped")
    assert gpu.tests_part(tmp_path / "missing.xml", 2) == ["The CUDA tests left no results (pytest exit status 2)."]


def test_report_replaces_only_the_cuda_part(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\ntables\n\n## Reading these numbers\n\nprose\n")
    args = ["--doc", str(doc), "--env", str(tmp_path / "env.txt"), "--junit", str(tmp_path / "none.xml"),
            "--bench", str(tmp_path / "bench.md"), "--tests-status", "0", "--bench-status", "0", "--seconds", "7"]
    (tmp_path / "env.txt").write_text("H200, 139 GiB; torch 2.11\n")
    (tmp_path / "bench.md").write_text("**first table**\n\n| a |\n|---|\n| 1 |\n")
    gpu.main(args)
    first = doc.read_text()
    assert first.startswith("# Performance\n\ntables\n\n## Reading these numbers\n\nprose\n\n## GPU\n\n### CUDA\n")
    assert "in 7 s" in first and "H200, 139 GiB" in first and "**first table**" in first
    doc.write_text(first.replace("## GPU\n", "## GPU\n\nhand-written intro\n") + "\n## Later section\n\nkept\n")
    (tmp_path / "bench.md").write_text("**second table**\n")
    gpu.main(args[:-6] + ["--tests-status", "0", "--bench-status", "124"])
    second = doc.read_text()
    assert "**second table**" in second and "**first table**" not in second
    assert "hand-written intro" in second and second.endswith("## Later section\n\nkept\n")
    assert second.count("### CUDA") == 1 and "stopped by the time limit" in second


def test_the_check_runs_every_file_of_tests_cuda():
    listed = re.search(r"^tests=\((.*?)\)$", SCRIPT.read_text(), re.S | re.M).group(1).split()
    assert sorted(listed) == sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "cuda").glob("test_*.py"))


def test_the_comparison_step_writes_the_committed_reports_records():
    """The GPU's runs join the committed comparison: the check's benchmark command asks for the report's seeds, sizes
    and tuning (so its records' hashes are the ones the report asks for) and writes them where the report's records
    live (the default beside docs/reports/BENCHMARK_COMPARISON.md for the rows file's part)."""
    from visionpe.bench.accuracy.benchmark import default_records
    from visionpe.bench.accuracy.rows import read_rows

    text = SCRIPT.read_text()
    step = re.search(r'"\$PY" -m visionpe benchmark (.*?)> "\$work/protocol.txt"', text, re.S).group(1)
    committed = re.search(r"^visionpe benchmark --rows bench_rows_comparison (.*)$",
                          (ROOT / "docs" / "reports" / "BENCHMARK_COMPARISON.md").read_text(), re.M).group(1)
    flags = lambda line: re.search(r"(--seeds .*?) --jobs", line).group(1)
    assert flags(" ".join(step.split())) == flags(committed) == "--seeds 0 1 2 --res 32 64 128 --tune --holdout 100"
    assert re.search(r"PROTOCOL_ROWS=\$\{PROTOCOL_ROWS:-bench_rows_comparison\}", text)
    part = read_rows("bench_rows_comparison")["part"]
    records = re.search(r'--records "(.*?)"', step).group(1).replace("$part", part)
    assert Path(records) == default_records(Path("docs/reports/BENCHMARK_COMPARISON.md"), part)
    assert "-- --device cuda" in step


def test_the_check_hands_back_the_records_it_wrote_and_no_invocation(tmp_path):
    """$OUT/records/data/ holds the records this check wrote (newer than its env.txt), laid out as
    docs/reports/data/, so `cp -r OUT/records/data docs/reports/` joins them to the committed ones; the committed
    records and the comparison's invocation.json (whose command the committed report keeps) stay out."""
    line = next(line.strip() for line in SCRIPT.read_text().splitlines() if "find data" in line)
    data, work, out = tmp_path / "docs" / "reports" / "data", tmp_path / "work", tmp_path / "out"
    old = [data / "benchmark_comparison" / "comparison" / "clutter-relation" / "learned" / "s0.json"]
    new = [data / "benchmark_comparison" / "comparison" / "clutter-relation" / "rope_mixed" / "s0.json",
           data / "performance" / "speed" / "cuda_20261207T010000Z.json"]
    invocation = data / "benchmark_comparison" / "comparison" / "invocation.json"
    for path in old + new + [invocation]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(path.name)
    work.mkdir()
    (work / "env.txt").write_text("machine")
    for path, age in [*((p, -100) for p in old), *((p, 100) for p in [*new, invocation])]:
        os.utime(path, (time.time() + age, time.time() + age))
    done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=dict(os.environ, OUT=str(out), work=str(work)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    assert sorted(p.relative_to(out / "records") for p in out.rglob("*.json")) == sorted(
        p.relative_to(tmp_path / "docs" / "reports") for p in new)


def test_the_speed_record_goes_where_the_performance_reports_records_live():
    from visionpe.bench.speed.cli import default_record

    path = re.search(r'^speed_record="(.*?)"$', SCRIPT.read_text(), re.M).group(1)
    assert Path(path).parent == default_record(Path("docs/reports/PERFORMANCE.md")).parent
    assert '--record "$speed_record"' in SCRIPT.read_text()
