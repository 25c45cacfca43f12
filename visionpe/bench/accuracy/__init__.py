"""The accuracy benchmarks: every encoding (or every labelled row) trained with one recipe over seeds, swept over
test resolutions and reported (``visionpe benchmark``; the repository's report is docs/reports/BENCHMARK.md), a trained
learned-APE model converted to RoPE against RoPE from scratch (``visionpe convert-benchmark``), and the small-folder
recipe against timm's augmentation (``visionpe small-folder-benchmark``).

One module a step, each using only those before it:

- :mod:`.staleness`: whether a finished run is the one asked for now, whether its sweep was made from it, and
  whether a run's record holds the settings asked for now (its settings hash);
- :mod:`.records`: a run as data, one small JSON record each (settings and their hash, machine and versions,
  per-epoch metrics, the sweep's table, wall time), kept in the repository and read back by the report;
- :mod:`.jobs`: a run's processes (``python -m visionpe train`` then ``python -m visionpe sweep``, through the
  installed package, never a checkout's path), one thread each, logged, the machine of each step noted;
- :mod:`.rows`: a rows file (``--rows``: labelled rows, each with its own training arguments);
- :mod:`.collect`: the current records gathered into one table;
- :mod:`.verdicts`: plain statements on that table, every gap against the seed spread;
- :mod:`.parts`: the report's tables and marked document parts;
- :mod:`.benchmark` and :mod:`.cli`: the accuracy benchmark's plan and its command line;
- :mod:`.conversion`: the conversion benchmark (``visionpe convert-benchmark``), command line included;
- :mod:`.small_folder`: the small-folder comparison, on the same jobs, staleness, collection, verdicts and table
  cells, command line included.
"""
