#!/usr/bin/env bash
# The oldest releases visionpe claims (.ci/floor-requirements.txt: pyproject.toml's lower bounds), installed from
# PyPI into a throwaway venv, and the suite run there on the working tree, less what needs newer releases:
# - tests whose oracle is a newer timm (its DINOv3 and M-RoPE rotary embeddings, RotaryEmbeddingCat(rotate_half=),
#   Eva(rope_type=)) or a newer torch (torch.unravel_index: 2.2), and scripts/bench_speed.py's (FlexAttention: 2.5);
# - torch.compile(fullgraph=True) (torch >= 2.4: before it dynamo breaks the graph where a Grid is built; compiling
#   without fullgraph works, with graph breaks);
# - the fused CPU attention with a bias gradient (PyTorch's fused CPU kernel: torch >= 2.3; before it SDPA's math
#   path gives the same results) and a query row with every key masked (zeros from torch 2.5, NaN before, as
#   PyTorch's own SDPA).
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
PYTHONPATH=$PWD MPLBACKEND=Agg "$work/floor/bin/python" -m pytest -q -n 2 -p no:cacheprovider tests \
    --ignore=tests/test_coords.py --ignore=tests/test_mrope.py --ignore=tests/test_bench_speed.py \
    --ignore=tests/test_compile.py \
    --deselect=tests/test_rotary.py::test_axial_matches_timm_rotary_cat \
    --deselect=tests/test_grid.py::test_coords_row_major_last_axis_fastest \
    --deselect=tests/test_rows_benchmark.py::test_committed_rows_file_builds_every_model_at_every_test_size \
    --deselect=tests/test_attention.py::test_fused_bias_attention_gradients_match_sdpa_math \
    --deselect=tests/test_attention.py::test_fused_bias_attention_half_precision_and_fallbacks \
    --deselect=tests/test_attention.py::test_models_train_the_same_through_the_fused_bias_path
echo "check_floor: done in $((SECONDS - start)) s"
