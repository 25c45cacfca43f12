"""The benchmarks, two rooms:

- :mod:`.speed`: speed and memory of the encodings as ratios measured side by side (``visionpe bench-speed``;
  docs/reports/PERFORMANCE.md);
- :mod:`.accuracy`: accuracy under resolution change, every encoding trained with one recipe over seeds and swept
  over test sizes (``visionpe benchmark``, ``visionpe convert-benchmark``; docs/reports/BENCHMARK.md).

Both use the library, the training workbench's public modules and :mod:`visionpe.cli`; neither imports the other.
Both name the machine their results come from through :mod:`.machine`.
"""
