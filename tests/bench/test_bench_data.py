"""The speed benchmark's opt-in ``data`` part: visionpe's training loader and timm's read the same JPEG folder with
the same transforms and deliver the same images per pass; a ``--quick`` run writes both tables with finite ratios."""
from __future__ import annotations

import math

import torch

from visionpe.bench.speed import cli, loader


def test_both_loaders_read_the_folder_the_benchmark_writes(tmp_path):
    train = loader.write_jpeg_folder(tmp_path, 8)
    assert len(list(train.rglob("*.jpg"))) == 8
    for max_patches in (None, 49):
        ours = [(x, y) for x, y in loader.ours(train, 4, 0, max_patches)]
        timms = list(loader.timms(train, 4, 0, max_patches))
        assert sum(len(y) for _, y in ours) == sum(len(y) for _, y in timms) == 8
    square = next(iter(loader.ours(train, 4, 0)))[0]
    assert isinstance(square, torch.Tensor) and square.shape == (4, 3, 224, 224)
    native = next(iter(loader.ours(train, 4, 0, 49)))[0]  # 7 x 7 patches of 16 px at most, each at its aspect
    assert isinstance(native, (list, torch.Tensor))
    assert all(x.shape[1] * x.shape[2] <= 49 * 256 and x.shape[1] % 16 == x.shape[2] % 16 == 0 for x in native)


def test_quick_data_part_writes_its_tables(tmp_path):
    out = tmp_path / "perf.md"
    report = cli.main(["--quick", "--parts", "data", "--out", str(out)])
    assert "**Training loader: images/s" in report and "**Training step on visionpe's loader" in report
    rows = [line for line in report.splitlines() if line.startswith("| square") or line.startswith("| native")]
    assert len(rows) == 2
    for row in rows:
        ratio = float(row.split("|")[4].strip().rstrip("x"))
        assert math.isfinite(ratio) and ratio > 0
    assert out.read_text().startswith("# Performance")
