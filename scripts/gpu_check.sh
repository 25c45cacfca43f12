#!/usr/bin/env bash
# One prepared check for a GPU machine that reaches no package registry, in about 8 minutes:
#   1. the CUDA tests: pytest --device cuda tests/cuda (at most TESTS_SECONDS, default 270), FSDP2 with nccl and the
#      bf16 policy included (test_cuda_parallel.py: torchrun on up to 2 GPUs, `visionpe train --parallel fsdp` too);
#   2. the GPU benchmark: visionpe bench-speed --device cuda, the flex-models part first (bf16: eval, training
#      step, memory, compiled, flex vs SDPA at 4097 and 16385 tokens), then forward, train, memory, scale and flex
#      (what time is left, less a margin for the report), its tables also as data: its record (the machine, the
#      versions, the settings and each part's tables and wall time, written after each part) in
#      docs/reports/data/performance/speed/, where `visionpe bench-speed --report-only RECORD` rebuilds its report;
#   2b. the comparison's runs on the GPU (PROTOCOL_SECONDS, default 100; 0 skips it): visionpe benchmark --rows
#      PROTOCOL_ROWS (default bench_rows_comparison) --data PROTOCOL_DATA (default clutter-relation; no download
#      here) with docs/reports/BENCHMARK_COMPARISON.md's seeds, sizes and LookHere's protocol, -- --device cuda. A run whose
#      record under docs/reports/data/ is current is not run again, so each check goes on where the last one (on any
#      machine) stopped; each run it finishes writes its record there, the same records the CPU machines write (the
#      settings hash leaves the device out, so a record made on CUDA is current for the CPU's report too);
#   3. the report: the machine, the test results and the tables, written as the "### CUDA" part of
#      docs/reports/PERFORMANCE.md's GPU section; with $OUT set, copies of everything under $OUT, and the records
#      this check wrote in $OUT/records/data/ (the runs' and the speed record, not the invocation.json of the
#      comparison's records folder, so the committed command stays the report's): `cp -r OUT/records/data
#      docs/reports/`, commit them, and `python -m visionpe.bench.rebuild docs --write` puts the GPU's runs in the
#      comparison's report beside the CPU machines' runs, each machine named.
# It runs under the machine's own python3 (PYTHON=... to choose another) with visionpe from this working tree
# (PYTHONPATH=.), installing nothing. On a machine without CUDA it says so in one line and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg

if ! cuda=$("$PY" -c "import torch; print(torch.cuda.is_available())" 2>/dev/null); then
    echo "gpu_check: $PY cannot import torch; set PYTHON to a python with torch"
    exit 1
fi
if [ "$cuda" != "True" ]; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False under $PY); nothing to check"
    exit 0
fi

BUDGET=${GPU_CHECK_SECONDS:-480}
TESTS_SECONDS=${TESTS_SECONDS:-270}
REPORT_MARGIN=25
start=$SECONDS
work=$(mktemp -d)
# the broad, quick files first; the ones that compile kernels (flex, inductor) last, where the time limit may cut them
tests=(tests/cuda/test_device_parity.py tests/cuda/test_device_training.py tests/cuda/test_device_properties.py
       tests/cuda/test_device_subsets.py tests/cuda/test_device_concurrency.py tests/cuda/test_cuda_parallel.py
       tests/cuda/test_cuda_kernels.py tests/cuda/test_device_compile_ddp.py tests/cuda/test_cuda_recipe.py)
tests_cmd=("$PY" -m pytest --device cuda "${tests[@]}" -q -rfE -p no:cacheprovider --junitxml="$work/cuda_tests.xml")
speed_record="docs/reports/data/performance/speed/cuda_$(date -u +%Y%m%dT%H%M%SZ).json"
bench_cmd=("$PY" -m visionpe bench-speed --device cuda --parts flex-models forward train memory scale flex
           --repeats 3 --slow-repeats 3 --min-run-time 0.1 --record "$speed_record")

{
    if commit=$(git rev-parse --short HEAD 2>/dev/null); then
        echo "gpu_check at commit $commit$(git diff --quiet HEAD 2>/dev/null || echo ' with local changes')"
    else
        echo "gpu_check outside a git checkout"
    fi
    "$PY" - <<'EOF'
import platform, torch, torchvision, timm
props = torch.cuda.get_device_properties(0)
print(f"{torch.cuda.get_device_name(0)}, {props.total_memory / 2**30:.0f} GiB; python {platform.python_version()}, "
      f"torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision {torchvision.__version__}, timm {timm.__version__}")
floor = (1, 0, 15)  # pyproject.toml: timm>=1.0.15
if tuple(int(p) for p in timm.__version__.split(".")[:3] if p.isdigit()) < floor:
    print(f"warning: timm {timm.__version__} is older than the timm>=1.0.15 visionpe declares")
EOF
    echo "tests: ${tests_cmd[*]}"
    echo "benchmark: ${bench_cmd[*]}"
} > "$work/env.txt" 2>&1
cat "$work/env.txt"

echo "gpu_check: CUDA tests (at most ${TESTS_SECONDS} s)"
# SIGINT first: pytest stops as after Ctrl-C and still writes its JUnit file
timeout -s INT -k 20 "$TESTS_SECONDS" "${tests_cmd[@]}" > "$work/cuda_tests.txt" 2>&1
tests_status=$?
tail -n 15 "$work/cuda_tests.txt"

PROTOCOL_SECONDS=${PROTOCOL_SECONDS:-100}
PROTOCOL_ROWS=${PROTOCOL_ROWS:-bench_rows_comparison}
PROTOCOL_DATA=${PROTOCOL_DATA:-clutter-relation}
if [ "$PROTOCOL_SECONDS" -gt 0 ]; then
    echo "gpu_check: the comparison's runs ($PROTOCOL_ROWS on $PROTOCOL_DATA, at most ${PROTOCOL_SECONDS} s)"
    # the records go where the committed report's are (docs/reports/data/benchmark_comparison/<part>, its
    # default), so the runs recorded there are skipped; the report of this part goes to $work, the doc is left alone
    part=$("$PY" -c "import sys; from visionpe.bench.accuracy.rows import read_rows; print(read_rows(sys.argv[1])['part'])" "$PROTOCOL_ROWS")
    timeout -s INT -k 10 "$PROTOCOL_SECONDS" "$PY" -m visionpe benchmark --rows "$PROTOCOL_ROWS" \
        --data $PROTOCOL_DATA --seeds 0 1 2 --res 32 64 128 --tune --holdout 100 --jobs 1 --out "$work/protocol" \
        --doc "$work/BENCHMARK_COMPARISON.md" --records "docs/reports/data/benchmark_comparison/$part" \
        -- --device cuda > "$work/protocol.txt" 2>&1
    echo "gpu_check: comparison exit $?"; tail -n 6 "$work/protocol.txt"
fi

left=$((BUDGET - (SECONDS - start) - REPORT_MARGIN))
echo "gpu_check: benchmark (at most ${left} s)"
if [ "$left" -gt 30 ]; then
    timeout -s INT -k 15 "$left" "${bench_cmd[@]}" > "$work/bench.md" 2> "$work/bench.log"
    bench_status=$?
else
    echo "(no time left for the benchmark)" > "$work/bench.md"
    bench_status=124
fi

"$PY" -m visionpe.bench.speed.gpu --doc docs/reports/PERFORMANCE.md --env "$work/env.txt" --junit "$work/cuda_tests.xml" \
    --bench "$work/bench.md" --tests-status "$tests_status" --bench-status "$bench_status" \
    --seconds "$((SECONDS - start))"
report_status=$?
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && cp "$work"/*.* docs/reports/PERFORMANCE.md "$OUT"/
    # the records this check wrote (newer than its env.txt), as docs/reports/ lays them out
    mkdir -p "$OUT/records" && [ -d docs/reports/data ] && (cd docs/reports && find data -name '*.json' ! -name invocation.json -newer "$work/env.txt" -exec cp --parents {} "$OUT/records" \;)
fi
echo "gpu_check: tests exit $tests_status, benchmark exit $bench_status, report exit $report_status," \
     "$((SECONDS - start)) s; docs/reports/PERFORMANCE.md '### CUDA' written${OUT:+, copies in $OUT}"
[ "$report_status" -ne 0 ] && exit "$report_status"
exit "$tests_status"
