"""The training workbench: a run trained, committed, reported and read back (``visionpe train``, ``python -m
visionpe.train``; the story itself reads top to bottom in :mod:`~visionpe.train.train_vit`).

Layers, each using only those above it in this list (and :mod:`visionpe.cli`, the command line's shared ground):

- :mod:`~visionpe.train.models`: the model zoo (which ``--model`` names exist, ``build_model`` from settings);
- :mod:`~visionpe.train.settings`: every setting, defaults < YAML < command line, checks by group, resume rules;
- :mod:`~visionpe.train.metrics`: what a run reports (evaluations, epoch records, results, the loggers of ``--log``)
  and the one reader of those files;
- :mod:`~visionpe.train.rundir`: the run directory's files and their commit protocol, weights read back into a model;
- :mod:`~visionpe.train.restore`: a run read back (settings, model), ``--resume``, ``--init-from`` and
  ``--pretrained``;
- :mod:`~visionpe.train.distributed`: the run's processes (torchrun) and their collectives;
- :mod:`~visionpe.train.commits`: when and what a run commits (its weights and losses checked finite first);
- :mod:`~visionpe.train.loop`: the precision of the steps, the module that trains, one epoch of training;
- :mod:`~visionpe.train.sampling`: the run's data sets from its settings, the order of the training samples
  (repeated augmentation), resumable within an epoch, the loader that reads them, and the sizes a run is evaluated
  at;
- :mod:`~visionpe.train.evaluation`: a model evaluated on a set, and across resolutions;
- :mod:`~visionpe.train.optimization`: optimizer, schedule, loss, mixup, EMA and scaler as timm builds them, and where a run
  stands;
- :mod:`~visionpe.train.train_vit`: the training story; :mod:`~visionpe.train.sweep`: ``visionpe sweep``;
  :mod:`~visionpe.train.visualize`: ``visionpe visualize`` (:mod:`visionpe.viz` of a fresh encoding or of a run).
"""
from ..cli import UserError

__all__ = ["UserError"]
