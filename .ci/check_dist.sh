#!/usr/bin/env bash
# Build the sdist and the wheel (python -m build: the wheel is built from the sdist), check them (twine check --strict
# and tests/packaging/test_wheel.py on these files), then install the wheel into a clean venv and import it there.
# The clean venv borrows the project venv's packages through a .pth file (as --system-site-packages would), so no
# second torch is downloaded; the wheel goes in with --no-deps and `pip check` verifies its requirements against them.
# Last, from a working directory outside the checkout, the wheel's `visionpe` command: every subcommand's --help, a
# tiny training (by a shipped recipe's name), a sweep of it and a two-row accuracy benchmark, each writing there.
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT_PY=${PROJECT_PY:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the build tools: pyproject.toml's `release` extra, in a throwaway venv
mapfile -t tools < <("$PROJECT_PY" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["release"]))')
python3 -m venv "$work/tools"
"$work/tools/bin/pip" install -q "${tools[@]}"
"$work/tools/bin/python" -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/tools/bin/twine" check --strict "$work"/dist/*
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)
VISIONPE_WHEEL=$wheel VISIONPE_SDIST=$sdist "$PROJECT_PY" -m pytest -q -p no:cacheprovider tests/packaging/test_wheel.py

# a clean venv with the wheel, importing it away from the source tree
python3 -m venv "$work/clean"
clean_site=$("$work/clean/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PROJECT_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$clean_site/project-venv-packages.pth"
# the old setuptools a Python 3.11 venv comes with would shadow the project venv's (torch requires a newer one)
"$work/clean/bin/pip" uninstall -q -y setuptools 2>/dev/null || true
"$work/clean/bin/pip" install -q --no-deps "$wheel"
"$work/clean/bin/pip" check
cd "$work"
"$work/clean/bin/python" - "$clean_site" <<'PY'
import importlib.metadata
import pathlib
import sys

import visionpe

site = pathlib.Path(sys.argv[1])
where = pathlib.Path(visionpe.__file__).parent
assert where == site / "visionpe", f"visionpe imported from {where}, not from the wheel in {site}"
assert importlib.metadata.version("visionpe") == visionpe.__version__
assert (where / "py.typed").is_file()
rope = visionpe.build("rope_mixed", head_dim=8, num_heads=2, ndim=2)
import timm  # the installed package registers its timm models too
assert timm.is_model("vpe_vit_small_patch16_224")
print(f"check_dist: visionpe {visionpe.__version__} from the wheel imports in a clean venv ({type(rope).__name__})")
PY

# the wheel's console command, from a folder outside the checkout: every subcommand answers --help, then a tiny
# training (a shipped recipe by name), its sweep and a two-row accuracy benchmark write their results here
mkdir "$work/use"
cd "$work/use"
visionpe="$work/clean/bin/visionpe"
commands=$("$work/clean/bin/python" -c 'from visionpe.cli.commands import COMMANDS; print(" ".join(COMMANDS))')
"$visionpe" --help > help.txt
for command in $commands; do
    grep -q "^  $command " help.txt || { echo "check_dist: visionpe --help does not list $command"; exit 1; }
    "$visionpe" "$command" --help > "help_$command.txt"
    grep -q "^usage: visionpe $command " "help_$command.txt" || { echo "check_dist: visionpe $command --help"; exit 1; }
done
tiny=(--data shapes-position --train-samples 32 --val-samples 16 --batch-size 16 --epochs 1 --img-size 16
      --patch-size 4 --warmup-epochs 0 --no-progress --threads 1)
"$visionpe" train --config shapes_tiny "${tiny[@]}" --embed-dim 16 --depth 1 --num-heads 2 --output runs/tiny \
    --eval-res 24 > train.log
"$visionpe" sweep runs/tiny --res 16 24 --scaling none --out runs/sweep > sweep.log
printf '%s\n' "data: shapes-position" "img_size: 16" "patch_size: 4" "epochs: 1" "batch_size: 16" \
    "train_samples: 32" "val_samples: 16" "warmup_epochs: 0" "model_kwargs: {embed_dim: 16, depth: 1, num_heads: 2}" \
    > recipe.yaml
"$visionpe" benchmark --config recipe.yaml --data shapes-position --pe learned rope_axial --scaling none --seeds 0 \
    --res 16 24 --jobs 1 > benchmark.log
for file in runs/tiny/results.json runs/tiny/summary.csv runs/sweep/sweep.csv runs/benchmark/BENCHMARK.md \
        runs/benchmark/vit/shapes-position/learned/s0/sweep/sweep.csv \
        runs/benchmark/vit/shapes-position/rope_axial/s0/sweep/sweep.csv; do
    [ -s "$file" ] || { echo "check_dist: $file was not written in $work/use"; exit 1; }
done
grep -q "^| learned |" runs/benchmark/BENCHMARK.md && grep -q "^| rope_axial \[none\] |" runs/benchmark/BENCHMARK.md \
    || { echo "check_dist: runs/benchmark/BENCHMARK.md lacks a row"; cat runs/benchmark/BENCHMARK.md; exit 1; }
echo "check_dist: the wheel's visionpe command answers --help for $commands; trained, swept and benchmarked in $PWD"
