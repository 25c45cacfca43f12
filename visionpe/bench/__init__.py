"""The benchmarks, two rooms and what they share:

- :mod:`.speed`: speed and memory of the encodings as ratios measured side by side (``visionpe bench-speed``;
  docs/reports/PERFORMANCE.md);
- :mod:`.accuracy`: accuracy under resolution change, every encoding trained with one recipe over seeds and swept
  over test sizes (``visionpe benchmark``, ``visionpe convert-benchmark``, ``visionpe small-folder-benchmark``;
  docs/reports/BENCHMARK.md);
- :mod:`.image_folders`: small image folders to measure training recipes on (``visionpe make-image-folders``);
- :mod:`.scaling_memory`: memory per rank of data-parallel training (``visionpe scaling-memory``);
- :mod:`.rebuild`: every committed report checked against (or rebuilt from) its records alone
  (``python -m visionpe.bench.rebuild docs``);
- ``configs/``: the benchmark's own recipes and rows files (package data, found by name: ``--rows
  bench_rows_resolution``), apart from the user recipes of ``visionpe/configs/``.

Both rooms use the library, the training workbench's public modules and :mod:`visionpe.cli`; neither imports the
other. Both name the machine their results come from through :mod:`.machine`, and write their results as
records that the reports are made from.
"""
