"""The workbench around the library: training, evaluating and comparing runs from the command line.

Layers, each using only those above it in this list:

- :mod:`~visionpe.train.cli`: one command-line convention (``UserError``: one line on stderr, exit status 2) and
  ``--import`` of user code;
- :mod:`~visionpe.train.models`: the model zoo (which ``--model`` names exist, ``build_model`` from settings);
- :mod:`~visionpe.train.settings`: every setting, defaults < YAML < command line, checks by group, resume rules;
- :mod:`~visionpe.train.rundir`: the run directory's files and their commit protocol;
- :mod:`~visionpe.train.restore`: a run read back (settings, model), ``--resume`` and ``--init-from``;
- :mod:`~visionpe.train.loop`: one epoch of training, evaluation, evaluation across resolutions;
- :mod:`~visionpe.train.report`: the one writer of tables and report documents;
- :mod:`~visionpe.train.sweep`, :mod:`~visionpe.train.benchmark`, :mod:`~visionpe.train.convert_benchmark`,
  :mod:`~visionpe.train.visualize`: what ``scripts/`` run.
"""
from .cli import UserError

__all__ = ["UserError"]
