"""Training support for ``train_vit.py`` and the scripts: the pieces, each in one place.

- :mod:`~visionpe.train.config`: the recipe (every setting, its help, defaults < YAML < command line, checks);
- :mod:`~visionpe.train.rundir`: the run directory (``load_run``, ``build_model``, ``load_model``, checkpoints);
- :mod:`~visionpe.train.loop`: one epoch of training, evaluation, evaluation across resolutions;
- :mod:`~visionpe.train.cli`: one command-line convention (``UserError``: one line on stderr, exit status 2).
"""
from .cli import UserError

__all__ = ["UserError"]
