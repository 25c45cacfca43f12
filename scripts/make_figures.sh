#!/usr/bin/env bash
# Render the docs figures of fresh encodings into docs/figures/ (small PNGs, dpi 90).
# Usage, from the repository root:  bash scripts/make_figures.sh  [PYTHON]   (default .venv/bin/python)
# Every figure is one `visionpe visualize` command (PYTHON -m visionpe visualize); figures of a trained run
# (--run runs/NAME) go at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=docs/figures
export MPLBACKEND=Agg
viz() { "$PY" -m visionpe visualize --dpi 90 "$@"; }

# similarity grids (ViT paper figure), 14x14 patches as ViT-B/16 at 224 px; ViT-S sizes (dim 384, 6 heads of 64)
viz --pe sincos     --grid 14 14 --kind similarity --out $OUT/similarity_sincos.png
viz --pe rope_axial --grid 14 14 --kind similarity --out $OUT/similarity_rope_axial.png
viz --pe rope_mixed --grid 14 14 --kind similarity --out $OUT/similarity_rope_mixed.png
viz --pe rope_mixed --grid 14 14 --kind similarity --head 2 --out $OUT/similarity_rope_mixed_head2.png
viz --pe alibi      --grid 14 14 --kind similarity --out $OUT/similarity_alibi.png
# position x channel table, RoPE-Mixed's initial frequencies, a resolution change, a video strip
viz --pe sincos     --grid 14 14 --kind heatmap --out $OUT/heatmap_sincos.png
viz --pe rope_mixed --grid 14 14 --kind freqs --out $OUT/freqs_rope_mixed.png
viz --pe rope_axial --grid 8 8 --new-grid 16 16 --kind resolution --scaling pi --out $OUT/resolution_rope_axial_pi.png
viz --pe rope_mixed --grid 8 14 14 --kind video --query 4 7 7 --out $OUT/video_rope_mixed.png

# the built-in clutter tasks (docs/benchmarking.md): scene 0 of the val split, at the training size and at 4x
"$PY" - <<'PY'
from PIL import Image
from visionpe.data import clutter
for task in clutter.CLUTTER:
    sc = clutter.clutter_scene(task, 0, 0, "val")
    for size in (32, 128):  # shown at 256 px, nearest-neighbour, so each pixel stays visible
        img = Image.fromarray(clutter.render_clutter(sc, size)).resize((256, 256), Image.NEAREST)
        img.save(f"docs/figures/task_{task}_{size}px.png", optimize=True)
PY

# figures of trained runs: the runs of docs/reports/BENCHMARK_8EPOCHS.md (its command makes runs/benchmark_8ep first)
RUNS=runs/benchmark_8ep/vit/shapes-position
if [ -d $RUNS/learned/s0 ] && [ -d $RUNS/rope_mixed/s0 ]; then
    viz --run $RUNS/learned/s0 --kind similarity --out $OUT/trained_similarity_learned.png
    viz --run $RUNS/learned/s0 --kind resolution --out $OUT/trained_resolution_learned.png
    viz --run $RUNS/rope_mixed/s0 --layer 0 --kind freqs --out $OUT/trained_freqs_rope_mixed.png
    viz --run $RUNS/rope_mixed/s0 --layer 0 --kind similarity --out $OUT/trained_similarity_rope_mixed.png
    viz --run $RUNS/rope_mixed/s0 --layer 0 --kind resolution --scaling pi --out $OUT/trained_resolution_rope_mixed_pi.png
else
    echo "skipping trained-run figures: run the command in docs/reports/BENCHMARK_8EPOCHS.md first" >&2
fi
VIDEO_RUN=runs/bench_video/vit/moving-shapes/rope_mixed/s0
if [ -f "$VIDEO_RUN/config.yaml" ]; then  # the video section of docs/reports/BENCHMARK.md
    viz --run $VIDEO_RUN --pe rope_mixed --layer 0 --kind video --out $OUT/trained_video_rope_mixed.png
else
    echo "skipping the trained video figure: run the video command in docs/reports/BENCHMARK.md first" >&2
fi
ls -l $OUT
