"""What trains a model besides its data, built from the settings as timm's train.py builds it: the optimizer
(``create_optimizer_v2``: position parameters without weight decay, layer decay), the schedule (per optimizer step:
linear warmup, then cosine down to ``min_lr``), the float16 gradient scaler, mixup/cutmix, the loss and the EMA
weights (the module that trains, DDP or FSDP2, comes first: :func:`visionpe.train.loop.trained_module`); and where a
run stands (:class:`Progress`), restored with them from ``state.pt`` or a sharded run's distributed checkpoint."""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from timm.data import Mixup
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3, NativeScaler

from ..cli import UserError, one_line, user_errors
from . import commits, parallel, rundir
from .settings import TrainSettings, saved_form


@dataclass
class Optimization:
    """What trains a model besides its data: the optimizer, its learning-rate schedule and loss, mixup/cutmix, the
    float16 gradient scaler and the EMA weights, built by :func:`build` from the run's settings (``config``: as
    config.yaml holds them, committed with the state). Not a "recipe": that is the YAML file of settings a user
    trains with (``--config``, :mod:`visionpe.cli.recipes`)."""

    optimizer: torch.optim.Optimizer
    scheduler: CosineLRScheduler
    criterion: torch.nn.Module
    mixup: Mixup | None = None
    scaler: NativeScaler | None = None  # float16 only: loss scaling
    ema: ModelEmaV3 | None = None
    epochs: int = 0  # the length the schedule is built for
    config: dict = field(default_factory=dict)  # the settings it was built from, as config.yaml holds them: committed

    @property
    def ema_module(self) -> torch.nn.Module | None:
        """The averaged model itself (evaluated, saved), or None without ``--model-ema``."""
        return self.ema.module if self.ema is not None else None

    @property
    def lr(self) -> float:
        return max(g["lr"] for g in self.optimizer.param_groups)

    def backward_and_step(self, loss: torch.Tensor, *, parameters, clip_grad: float, update: bool) -> None:
        """Backward of ``loss`` (a scalar: one loader batch's share of an optimizer step); with ``update``, clip the
        summed gradients of ``parameters`` to ``clip_grad`` (0 = off) and step the optimizer. With :attr:`scaler`
        (timm's ``NativeScaler``, float16) the loss is scaled, the gradients unscaled before clipping and a step whose
        gradients overflowed skipped."""
        if self.scaler is not None:
            self.scaler(loss, self.optimizer, clip_grad=clip_grad or None, parameters=parameters, need_update=update)
            return
        loss.backward()
        if update:
            if clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self.optimizer.step()


@dataclass
class Progress:
    """Where a run stands: the last committed ``epoch`` (0 = none), the best validation top-1 so far and its epoch,
    the ``history`` (metrics.jsonl's records) and, after a commit within epoch ``epoch + 1``, how far into it
    (``within``: the state's ``progress``)."""

    epoch: int = 0
    best_acc: float = -1.0
    best_epoch: int = -1
    history: list = field(default_factory=list)
    within: dict | None = None
    saved: dict | None = None  # the commit resumed, as rundir.repair reads it (a sharded one's weights on rank 0)
    extended: dict | None = None  # --resume --epochs N: the history's record of the new length (extension_record)


def build(settings: TrainSettings, model: torch.nn.Module, ema: ModelEmaV3 | None, updates_per_epoch: int, procs,
          amp_dtype: torch.dtype | None) -> Optimization:
    """The optimization of ``model`` (on its device, and under FSDP sharded: :func:`visionpe.train.loop.trained_module`
    comes first, as in timm's order) for ``settings.epochs`` epochs of ``updates_per_epoch`` optimizer steps: the
    optimizer over its parameters (FSDP's shards), the schedule, mixup/cutmix, the loss, the float16 gradient scaler
    on ``procs.device`` (:class:`~visionpe.train.distributed.Processes`) and ``ema``, the EMA weights it holds."""
    with user_errors(f"opt={settings.opt}", (ValueError, TypeError, ImportError)):
        optimizer = create_optimizer_v2(model, opt=settings.opt, lr=settings.lr, weight_decay=settings.weight_decay,
                                        layer_decay=settings.layer_decay)  # position parameters: no weight decay
    total_steps = settings.epochs * updates_per_epoch  # optimizer steps
    warmup_steps = min(round(settings.warmup_epochs * updates_per_epoch), total_steps - 1)
    with timm_log_quiet(COSINE_LOG):  # one step after warmup: its "will have no effect" warning is the run asked for
        scheduler = CosineLRScheduler(optimizer, t_initial=total_steps - warmup_steps, lr_min=settings.min_lr,
                                      warmup_t=warmup_steps, warmup_lr_init=settings.lr * 1e-3, warmup_prefix=True,
                                      t_in_epochs=False)  # per step: linear warmup, then cosine down to min_lr
    mixup = None
    if settings.mixup > 0 or settings.cutmix > 0:
        mixup = Mixup(mixup_alpha=settings.mixup, cutmix_alpha=settings.cutmix,
                      label_smoothing=settings.label_smoothing, num_classes=settings.num_classes)
    return Optimization(optimizer, scheduler, criterion_for(settings, mixup is not None), mixup,
                  NativeScaler(device=procs.device.type) if amp_dtype == torch.float16 else None, ema,
                  settings.epochs, saved_form(settings))


COSINE_LOG = "timm.scheduler.cosine_lr"  # the logger of timm's cosine schedule


@contextlib.contextmanager
def timm_log_quiet(name: str):
    """Only errors from the logger ``name`` within the block (its warnings are about settings the run made)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def criterion_for(settings: TrainSettings, mixup: bool) -> torch.nn.Module:
    """The training loss of a run's settings, as timm's train.py combines them: with mixup/cutmix (``mixup``) the
    targets arrive soft and smoothed (timm's ``Mixup``), so the loss is ``SoftTargetCrossEntropy`` or, with
    ``bce_loss``, ``BinaryCrossEntropy(target_threshold)``; without, label smoothing goes to
    ``LabelSmoothingCrossEntropy`` or ``BinaryCrossEntropy(smoothing)``; plain cross-entropy otherwise (BCE stays
    BCE here, where timm's train.py falls back to cross-entropy)."""
    smoothing = settings.label_smoothing
    if settings.bce_loss:
        return BinaryCrossEntropy(smoothing=0.0 if mixup else smoothing, target_threshold=settings.bce_target_thresh)
    if mixup:
        return SoftTargetCrossEntropy()
    if smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing=smoothing)
    return torch.nn.CrossEntropyLoss()


def resume(optimization: Optimization, model: torch.nn.Module, state: dict | Path | None, out, world: int, init=None, *,
           steps: int) -> Progress:
    """Where the run in ``out`` stands: fresh (the ``--init-from`` / ``--pretrained`` record first in its history),
    or continued from ``state`` (:func:`visionpe.train.rundir.resume_point`: state.pt's contents, or the folder of a
    distributed checkpoint): the model's weights, the optimizer, schedule, EMA and scaler loaded, sharded or not
    whatever the commit's sharding and process count; the commit checked against the run of ``steps`` loader
    batches an epoch and its settings (:func:`visionpe.train.rundir.check_resume`), and a commit within an epoch
    to have been made by as many processes as ``world``."""
    if state is None:
        return Progress(history=[init] if init else [])
    if isinstance(state, Path):
        return _resume_sharded(optimization, model, state, world, steps)
    path = Path(out) / rundir.STATE
    rundir.check_resume(state, path, Path(out), optimization.config, steps=steps)
    check_length(optimization, state, path.parent)
    extended = extension_record(optimization, state)
    rundir.load_state(model, state["model"], path)
    with user_errors(f"{path} does not fit the optimizer, schedule, EMA or gradient scaler",
                     (ValueError, TypeError, RuntimeError, KeyError, IndexError)):
        parallel.load_full_optimizer_state(model, optimization.optimizer, state["optimizer"])
        if extended is None:
            optimization.scheduler.load_state_dict(state["scheduler"])
        if optimization.ema is not None:
            parallel.load_full_state(optimization.ema_module, state["ema"])
        if optimization.scaler is not None:
            optimization.scaler.load_state_dict(state["scaler"])
    progress = Progress(state["epoch"], state["best_acc"], state["best_epoch"], state["history"],
                        state.get("progress"), saved=state, extended=extended)
    return _checked_progress(progress, path, world)


def _resume_sharded(optimization: Optimization, model: torch.nn.Module, folder: Path, world: int,
                    steps: int) -> Progress:
    """:func:`resume` from a distributed checkpoint (every process calls it): DCP reshards it into the model, FSDP
    or not, on any process count; its extra holds the rest, checked as state.pt is, and to be of the epoch and step
    its folder's name says."""
    out, order = folder.parent.parent, rundir.commit_order(folder)  # the name checked before anything is read
    with user_errors(f"{folder} does not fit the model, optimizer, schedule or EMA",
                     (ValueError, TypeError, RuntimeError, KeyError)):
        try:
            extra = parallel.load_checkpoint(folder, model, optimization.optimizer, ema=optimization.ema_module)
        except parallel.RefusedCheckpoint as err:  # a file that would run code, or that DCP does not write
            raise UserError(f"{one_line(err)}; {rundir.RESTART}") from None
        if not isinstance(extra, dict) or not isinstance(extra.get("history"), str):
            raise UserError(f"{folder} is damaged or was edited: its extra holds no history; {rundir.RESTART}")
        history = json.loads(extra["history"])
        rundir.check_commit({**extra, "history": history}, folder)
        check_finite_loaded(folder, model, optimization.optimizer, optimization.ema_module)
        if rundir.commit_order(extra) != order:
            raise UserError(f"{folder} is damaged or was edited: it holds epoch {extra['epoch']}, step "
                            f"{rundir.commit_order(extra)[1]}, not what its name says; {rundir.RESTART}")
        rundir.check_resume(extra, folder, out, optimization.config, steps=steps)
        check_length(optimization, extra, out)
        extended = extension_record(optimization, extra)
        if extended is None:
            optimization.scheduler.load_state_dict(extra["scheduler"])
    saved = {**rundir.exported_state(model, optimization.ema_module, extra), "history": history}
    progress = Progress(extra["epoch"], extra["best_acc"], extra["best_epoch"], history, extra.get("progress"), saved,
                        extended)
    return _checked_progress(progress, folder, world)


def check_finite_loaded(folder: Path, model: torch.nn.Module, optimizer, ema: torch.nn.Module | None) -> None:
    """The weights, EMA and optimizer state just loaded from the distributed checkpoint ``folder`` are finite, checked
    as state.pt's are (:func:`visionpe.train.rundir.check_finite_commit`): a NaN or inf is a damaged or edited file,
    a :class:`UserError` naming it and the tensor. Every process calls it and each counts its own shards
    (:func:`visionpe.train.commits.nonfinite_counts`), so every process refuses together."""
    names = {p: n for n, p in parallel.unwrap(model).named_parameters()}
    slots = {f"{names[p]}.{k}": v for p, entry in optimizer.state.items() for k, v in entry.items()}
    parts = {"model": parallel.unwrap(model).state_dict(), "ema": {} if ema is None else ema.state_dict(),
             "optimizer state": dict(sorted(slots.items()))}
    for part, state in parts.items():
        bad = commits.nonfinite_counts(state)
        if bad:
            name, count = next(iter(bad.items()))
            raise UserError(f"{folder}'s {part} holds {count} NaN or infinite value(s) in {name!r} "
                            f"{tuple(state[name].shape)}: {rundir.NONFINITE}; {rundir.RESTART}")


def check_length(optimization: Optimization, state: dict, run) -> None:
    """``--epochs`` of a resumed run (``state``: its commit's ``epoch`` and ``progress``) covers the epochs begun."""
    done = state["epoch"] + (state.get("progress") is not None)  # epochs begun
    if optimization.epochs < done:
        raise UserError(f"--resume {run} --epochs {optimization.epochs}: the run has trained "
                        f"{state['epoch']} epoch(s){' and part of the next' if done > state['epoch'] else ''}; give "
                        f"--epochs >= {done} (the schedule continues to the new length)")


def _checked_progress(progress: Progress, path, world: int) -> Progress:
    """``progress`` checked against the process count (a commit within an epoch resumes on as many processes), with
    its extension (``--resume --epochs N``) recorded in the history."""
    if progress.extended is not None:
        progress.history.append(progress.extended)
    if progress.within is not None and len(progress.within["sums"]) != world:
        raise UserError(f"{path} was saved within epoch {progress.epoch + 1} by {len(progress.within['sums'])} "
                        f"process(es); resume it with as many (this is {world})")
    return progress


def schedule_steps(schedule: dict) -> int:
    """The optimizer steps a schedule (a :class:`CosineLRScheduler`'s ``state_dict``) is built for."""
    return int(schedule["t_initial"]) + int(schedule["warmup_t"])


def extension_record(optimization: Optimization, state: dict) -> dict | None:
    """``--resume DIR --epochs N`` with a new N: the history's record of it (``{'kind': 'extend', 'after_epoch',
    'from_epochs', 'epochs'}``), else None. As timm's train.py does on ``--resume`` with a new ``--epochs``, the
    schedule is the one built for the new length (warmup, then cosine down to ``min_lr`` over all N epochs), read at
    the run's step: the saved schedule (of the old length) is not loaded. The record is made while ``state.pt`` holds
    the old schedule, so a run killed before its next commit records its extension when it resumes again."""
    old, new = schedule_steps(state["scheduler"]), schedule_steps(optimization.scheduler.state_dict())
    if old == new:
        return None
    return {"kind": "extend", "after_epoch": state["epoch"], "from_epochs": old * optimization.epochs // new,
            "epochs": optimization.epochs}


def extension_text(record: dict, scheduler: CosineLRScheduler) -> str:
    """The console line of an extension: what changes, in one line."""
    epochs, after = record["epochs"], record["after_epoch"]
    step = schedule_steps(scheduler.state_dict()) * after // epochs  # the first optimizer step of epoch after + 1
    lr = max(scheduler._get_lr(step))  # timm's value of the schedule at that step
    return (f"resume: {record['from_epochs']} -> {epochs} epochs: training continues from epoch {after + 1} on the "
            f"warmup + cosine schedule of {epochs} epochs (as timm's --resume with a new --epochs; learning rate "
            f"{lr:.3g} as epoch {after + 1} starts); the final evaluation and results.json are redone")
