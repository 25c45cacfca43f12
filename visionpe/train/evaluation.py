"""Evaluation of a model: top-1, mean cross-entropy and the image count over a set, on one process or several (an
FSDP model's shards gathered in every forward), and over every size of a sweep (used by ``train_vit.py``,
:mod:`visionpe.train.sweep`, :mod:`visionpe.train.tuning` and :mod:`visionpe.train.predict`); the sets are
:mod:`visionpe.train.sampling`'s, their batches read as the training loop reads them."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

from .. import data as vdata
from . import distributed, parallel
from .loop import forward, read_samples, to_device, unpack
from .metrics import Evaluation
from .sampling import size_order


def logits_of(model, x, time_spacing=None):
    """Logits of a batch: ``model(x)`` (with the clips' ``time_spacing``, when given) for a stacked batch, the
    underlying model's ``forward_batch`` for a list (evaluation only: no gradient goes through a DDP wrapper here)."""
    if isinstance(x, torch.Tensor):
        return forward(model, x, time_spacing)
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    inner = inner.model if isinstance(inner, parallel.MixedSizes) else inner
    return inner.forward_batch(x)


@torch.no_grad()
def evaluate(model, dataset, *, batch_size: int, device, autocast, workers: int = 0, rank: int = 0,
             world: int = 1) -> Evaluation:
    """Top-1 (%), mean cross-entropy and the image count over the whole set; each process takes every world-th image.
    Images of different sizes (the native protocol) go through the model's ``forward_batch`` as batches of mixed
    grids. A sharded model (FSDP) gathers its parameters in every forward, on every process together: a process with
    fewer batches than rank 0 runs as many forwards again on one of its images, uncounted."""
    model.eval()
    mine = range(rank, len(dataset), world)
    loader = DataLoader(Subset(dataset, mine), batch_size=batch_size, num_workers=workers,
                        collate_fn=vdata.collate_images)
    correct = loss = count = 0.0
    spare = None  # a batch for the uncounted forwards, with its clips' time steps
    for batch in read_samples(loader):
        x, y, time_spacing = unpack(batch)
        x, y = to_device(x, device), y.to(device)
        with autocast():
            logits = logits_of(model, x, time_spacing)
        loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += len(y)
        spare = (x, time_spacing)
    if parallel.is_sharded_model(model):
        missing = math.ceil(len(range(0, len(dataset), world)) / batch_size) - math.ceil(len(mine) / batch_size)
        for _ in range(missing):
            if spare is None:
                x, _, time_spacing = unpack(vdata.collate_images([dataset[0]]))
                spare = (to_device(x, device), time_spacing)
            with autocast():
                logits_of(model, *spare)
    correct, loss, count = distributed.all_sum([correct, loss, count], device)
    return Evaluation(acc=100.0 * correct / count, loss=loss / count if count else math.nan, count=int(count))


def evaluate_resolutions(model, sets: dict, known: dict | None = None, **eval_kwargs) -> dict:
    """``{key: Evaluation}`` of ``model`` on every set of ``sets`` (``{key: dataset}``; an image run's keys are
    integers or ``(height, width)`` tuples, a video run's ``(frames, res)``), in
    :func:`visionpe.train.sampling.size_order`. ``known``: ``{key: Evaluation}`` already measured (not evaluated
    again); :func:`visionpe.train.metrics.retention_table` reports them against the training size. Compiled blocks
    (``--compile`` under FSDP) run eagerly here: one pass per size would not repay compiling."""
    known = known or {}
    with parallel.eager():
        return {k: known[k] if k in known else evaluate(model, sets[k], **eval_kwargs)
                for k in sorted(sets, key=size_order)}
