#!/usr/bin/env bash
# The oldest releases visionpe claims (.ci/floor-requirements.txt: pyproject.toml's lower bounds), installed from
# PyPI into a throwaway venv, and the whole suite run there on the working tree. A test that needs a newer release
# says so itself and skips there with the reason (tests/conftest.py: requires, requires_that; module-level skips of
# oracles a newer timm has), e.g. torch.compile(fullgraph=True) through a Grid (torch >= 2.4), PyTorch's fused CPU
# attention with a bias gradient (2.3), FlexAttention (2.5), timm's DINOv3 and M-RoPE rotary embeddings.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
python3 -m venv "$work/floor"
"$work/floor/bin/pip" install -q -r .ci/floor-requirements.txt pytest pytest-xdist
"$work/floor/bin/pip" check
floor=$(grep -E '^(torch|torchvision|timm)==' .ci/floor-requirements.txt | paste -sd' ')
echo "check_floor: $floor installed in $((SECONDS - start)) s"
# timm's test_models.py contract runs at the newest timm (make test); at the floor it would add its 5 minutes again
PYTHONPATH=$PWD MPLBACKEND=Agg "$work/floor/bin/python" -m pytest -q -n 2 -p no:cacheprovider tests \
    --ignore=tests/backbones/test_timm_contract.py  # -rs: why skipped
# the hf extra's floor (pyproject.toml: transformers>=4.46), a step of its own: it needs safetensors >= 0.4.1, above the
# core floor's; the Hugging Face tests again, at transformers 4.46 (make test runs them at the newest)
"$work/floor/bin/pip" install -q "transformers==4.46.3"
PYTHONPATH=$PWD MPLBACKEND=Agg "$work/floor/bin/python" -m pytest -q -n 2 -p no:cacheprovider tests/backbones/test_hf.py \
    tests/backbones/test_hf_pretrained.py tests/backbones/test_hf_versions.py tests/backbones/test_meta_init.py \
    tests/backbones/test_hf_contract.py  # this one skips there: its testers are transformers 5's
echo "check_floor: done in $((SECONDS - start)) s"
