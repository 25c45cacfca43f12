"""When and what a run commits: the check that its weights and losses are finite before a commit (else
:class:`NonFiniteLoss`, and nothing is saved), the clock of the commits within an epoch, and the commit itself: state.pt
by rank 0, or every process's shards of a distributed checkpoint (:mod:`visionpe.train.rundir` writes both).
``train_vit.py`` commits after each epoch, and within one through :func:`commit_within`, the hook the training loop
(:func:`visionpe.train.loop.train_one_epoch`) calls after each optimizer step."""
from __future__ import annotations

import math
import time

import torch

from . import distributed, parallel, rundir
from ..cli import UserError


class NonFiniteLoss(UserError):
    """The training loss, the validation loss or the weights became NaN or infinite: the run stops without saving
    (its last checkpoint stays), so a diverged model is never committed, exported or reported with an accuracy."""


def nonfinite_counts(state: dict) -> dict[str, int]:
    """How many NaN or infinite values each floating-point tensor of ``state`` holds, of those that hold any (name ->
    count). A sharded tensor (FSDP's DTensor) is counted on every process, each its own shard, and the counts summed
    (a tensor every process holds whole, on the first process alone), so every process gets the same answer: a
    collective where any tensor is sharded (every process calls it, with the same names in the same order)."""
    state = {name: t for name, t in state.items() if isinstance(t, torch.Tensor) and torch.is_floating_point(t)}
    sharded = [parallel.is_sharded(t) for t in state.values()]
    counts = [float((~torch.isfinite(t.to_local() if s else t)).sum()) for t, s in zip(state.values(), sharded)]
    if any(sharded):
        device = next(t.to_local().device for t, s in zip(state.values(), sharded) if s)
        counts = distributed.all_sum([c if s or parallel.rank() == 0 else 0.0 for c, s in zip(counts, sharded)],
                                     device)
    return {name: int(count) for name, count in zip(state, counts) if count}


def nonfinite_tensors(module) -> list[str]:
    """The names of ``module``'s floating-point parameters and buffers that hold a NaN or an infinity, the same on
    every process (:func:`nonfinite_counts`: a collective of a sharded module)."""
    return list(nonfinite_counts(module.state_dict()))


def check_finite(model, *, epoch: int, kept_epoch: int, val_loss: float | None = None, ema=None,
                 ema_loss: float | None = None, within: str = "") -> None:
    """Before a commit of ``epoch`` (1-based; ``within``: where in it, for a commit within the epoch): the model's
    (and the EMA's) weights and validation losses are finite, else :class:`NonFiniteLoss` with one line saying what
    diverged and what is kept (``kept_epoch``: the last committed epoch, 0 for none). Every process calls it with the
    same weights and losses (DDP keeps them equal; FSDP's shards are checked together), so every process stops at the
    same point."""
    problems = []
    for what, loss in (("validation loss", val_loss), ("EMA validation loss", ema_loss)):
        if loss is not None and not math.isfinite(loss):
            problems.append(f"non-finite {what} ({loss})")
    for what, module in (("weights", model), ("EMA weights", ema)):
        bad = nonfinite_tensors(module) if module is not None else []
        if bad:
            problems.append(f"non-finite {what} ({len(bad)} tensors, e.g. {bad[0]})")
    if problems:
        kept = f"its checkpoint of epoch {kept_epoch} is kept" if kept_epoch else "no epoch was saved"
        raise NonFiniteLoss(f"{' and '.join(problems)} {within or 'after'} epoch {epoch}: the model diverged; the run "
                            f"stopped without saving ({kept}); lower --lr or check the data")


class CheckpointClock:
    """When to commit a checkpoint within an epoch: every ``every_steps`` optimizer steps of the epoch, and when
    ``every_minutes`` have passed since the last commit. The clock is read on rank 0 and broadcast, so every process
    of a torchrun group commits at the same step (the commit gathers from all of them)."""

    def __init__(self, every_steps: int = 0, every_minutes: float = 0.0, device="cpu"):
        self.every_steps, self.every_seconds, self.device = every_steps, every_minutes * 60, device
        self.last = time.monotonic()

    def due(self, update: int) -> bool:
        """Whether to commit after optimizer step ``update`` (1-based, within the epoch)."""
        by_steps = bool(self.every_steps) and update % self.every_steps == 0
        late = bool(self.every_seconds) and distributed.rank0_flag(time.monotonic() - self.last >= self.every_seconds,
                                                                   self.device)
        return by_steps or late

    def reset(self) -> None:
        """A commit happened: the minutes count from now."""
        self.last = time.monotonic()


def commit_within(out, model, parts, run, epoch: int, clock: CheckpointClock, steps: int, procs):
    """:func:`visionpe.train.loop.train_one_epoch`'s ``on_update`` for ``epoch``: after each optimizer step, commit
    ``out``'s state.pt when the clock says so (not after the last of ``steps`` batches: the epoch's own commit
    follows), with every process's loss sums of the epoch so far (:func:`commit`). ``parts``: the
    :class:`~visionpe.train.optimization.Optimization`, ``run`` its ``Progress``, ``procs`` the
    :class:`~visionpe.train.distributed.Processes`."""
    def on_update(progress: dict) -> None:
        if progress["step"] == steps or not clock.due(progress["update"]):
            return
        check_finite(model, epoch=epoch + 1, kept_epoch=epoch, ema=parts.ema_module,
                     within=f"at step {progress['step']}/{steps} of")  # never commit NaN weights
        commit(out, model, parts, run, procs, progress=progress)
        clock.reset()
    return on_update


def commit(out, model, parts, run, procs, progress: dict | None = None) -> None:
    """Commit the run in ``out`` after ``run.epoch`` epochs (with ``progress``, the training loop's: within the next
    one, see :func:`commit_within`, with every process's loss sums of the epoch so far, gathered here by rank): a
    sharded model (FSDP) as a distributed checkpoint that every process writes
    (:func:`visionpe.train.rundir.save_sharded`), any other as state.pt, written by rank 0
    (:func:`visionpe.train.rundir.save_checkpoint`). Every process calls it. ``parts``: the
    :class:`~visionpe.train.optimization.Optimization`, ``run`` its ``Progress``, ``procs`` the
    :class:`~visionpe.train.distributed.Processes`."""
    within = None
    if progress is not None:
        sums = distributed.all_gather([progress["loss_sum"], progress["seen"]], procs.device)  # by rank
        within = {"step": progress["step"], "sums": sums, "last_finite": progress["last_finite"],
                  "elapsed": progress["elapsed"]}
    fields = dict(epoch=run.epoch, best_acc=run.best_acc, best_epoch=run.best_epoch, history=run.history,
                  config=parts.config, ema=parts.ema_module, progress=within)
    if parallel.is_sharded_model(model):
        rundir.save_sharded(out, model, parts.optimizer, parts.scheduler, **fields)
    elif procs.master:
        rundir.save_checkpoint(out, model, parts.optimizer, parts.scheduler, scaler=parts.scaler, **fields)
