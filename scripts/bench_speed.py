#!/usr/bin/env python
"""Speed and memory of visionpe encodings as ratios measured side by side (``python scripts/bench_speed.py --help``;
the sections and how to read them: :mod:`visionpe.bench` and docs/PERFORMANCE.md)."""
from visionpe.bench.cli import main

if __name__ == "__main__":
    result = main()  # what main returned, for callers that use runpy
