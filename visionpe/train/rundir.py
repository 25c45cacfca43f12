"""The run directory: the one reader and writer of the files ``train_vit.py`` leaves on disk.

    config.yaml         the resolved settings (model, pe, pe_kwargs, img_size, patch_size, num_classes, in_chans,
                        model_kwargs: everything visionpe.create_model(model, pe, pe_kwargs=..., **model_kwargs)
                        needs; a folder run's classes, the names of its outputs in order), written when the run
                        starts
    state.pt            THE CHECKPOINT: model weights, optimizer, scheduler, epoch, best_acc, best_epoch, history,
                        the settings it was trained with (config, as config.yaml holds them); the EMA weights (ema)
                        and the float16 gradient scaler (scaler) of runs that have them; and in a commit within an
                        epoch, where in it (progress) (torch.load(..., weights_only=True))
    checkpoint/         THE CHECKPOINT of a sharded run (--parallel fsdp) instead of state.pt: a distributed
                        checkpoint (torch.distributed.checkpoint) checkpoint/<tag> of the model's, optimizer's and
                        EMA's shards, each process writing its own, with what else state.pt holds as its extra;
                        checkpoint/latest names the committed tag (visionpe.train.parallel.save_checkpoint)
    last.safetensors    exported weights of the latest epoch   (metadata: epoch)
    best.safetensors    exported weights of the epoch with the best validation top-1 (metadata: epoch)
    ema.safetensors     exported EMA weights of the latest epoch (--model-ema; metadata: epoch)
    metrics.jsonl       one JSON object per line: {"kind": "epoch", ...}, then {"kind": "eval_res", ...}
                        ({"kind": "extend", ...}: where --resume --epochs N gave the run a new length)
    summary.csv         one row per epoch (the epoch lines of metrics.jsonl, as timm's train.py writes it)
    results.json        the final resolution table; written last, so it exists only for a finished run

What these hold is :mod:`visionpe.train.metrics`'s (the records, the texts, the one reader, the loggers of
``--log``: TensorBoard's event files in tensorboard/, W&B's run in wandb/); this module writes them.

This module owns the files and their protocol, and puts weights read back into a model (:func:`load_state`, strict);
:mod:`visionpe.train.restore` reads a run back (its settings, its model, ``--resume``, ``--init-from``) through it.

Checkpoint protocol (a kill at any instant leaves a run that ``--resume`` continues exactly):

1. Every file is written by :func:`visionpe.io.atomic_write`: a temporary file, fsync, ``os.replace``. A
   file is always either its old or its new version, never a mix; a kill leaves at most a stray temporary
   ``.<name>.<random>.tmp``, which the next start deletes (:func:`clean_temp`).
2. ``state.pt`` is the single commit point: it alone holds everything resume needs, the model weights included.
   An epoch is saved when its ``state.pt`` has replaced the previous one; before that instant the run is at the
   previous epoch, after it at the new one.
3. ``last.safetensors``, ``best.safetensors``, ``ema.safetensors``, ``metrics.jsonl`` and ``summary.csv`` are exports of
   ``state.pt``, written after it. On resume :func:`repair` compares them with ``state.pt`` (the ``epoch`` in the
   weights' metadata, the history) and rewrites any that lag behind: ``last`` and ``ema`` from the state's weights;
   ``best`` likewise when the best epoch is the state's epoch (the only case in which ``best`` can lag, since the
   next epoch starts only after the exports are complete).
4. ``config.yaml`` is the first file a run writes (:func:`prepare`), so a kill before it exists leaves at most a
   stray temporary, or, during ``--overwrite``, the remains of the previous run (``config.yaml`` is deleted
   before them): nothing of the new run to continue. ``--resume`` and a fresh start then say so: rerun the same
   command (with ``--overwrite`` where remains are there) (:func:`no_run_message`).
   ``results.json`` is written after everything else. A run without ``state.pt`` has finished no epoch: resume
   starts it at epoch 1 from its ``config.yaml``.
5. A commit within an epoch (``--checkpoint-every-steps`` / ``--checkpoint-every-minutes``) replaces ``state.pt``
   alone, between two optimizer steps (no gradient is pending): its ``progress`` holds the loader batches of epoch
   ``epoch + 1`` trained on, every process's loss sums of that epoch and the time spent. Its exports stay those of
   epoch ``epoch``, complete before the commit was written (the epoch after it starts only then); the state cannot
   rebuild them (its weights are later ones), and a kill never asks it to. Resume continues with the next batch:
   the sampler skips the batches done (:class:`visionpe.train.sampling.EpochOrder`), the RNG streams are reseeded
   per batch from ``(seed, epoch, rank, batch)``, and the optimizer, schedule, EMA and scaler come from ``state.pt``.
6. A sharded run (``--parallel fsdp``) commits ``checkpoint/`` instead of ``state.pt`` (:func:`save_sharded`): every
   process writes its shards into a temporary folder, then rank 0 renames it and replaces ``checkpoint/latest``, the
   commit point; the exports follow from the gathered weights. A run has one commit point: the first commit in one
   format removes the other (``state.pt`` after a sharded commit; ``checkpoint/latest``, then its folder, after a
   ``state.pt`` commit), and after a kill between the two :func:`resume_point` takes the later one (epoch, then
   step), which must be of the kind the run's ``config.yaml`` commits (``parallel``): the other kind later is a file
   planted or left from another run, named and refused. A commit at an epoch's end resumes on any process count
   (DCP reshards, and a DDP run's ``state.pt`` loads into a sharded model); one within an epoch only on as many
   processes as wrote it.
7. ``--overwrite`` deletes the previous run's files (only the names above and their temporaries) before writing
   anything: ``results.json`` first, then ``config.yaml`` (the rest can then no longer be loaded, resumed or
   swept), ``state.pt`` and the exports. A kill part-way leaves some of the old files or only new ones, never
   both, and never the old results.

Resume trusts nothing it reads to be as written (:func:`check_commit`, :func:`check_resume`): a commit's fields out of
range or out of line with its history, a ``config.yaml`` whose settings differ from those the commit records, and
weights that are not finite (:func:`read_weights`) are each one line naming the file; nothing loaded runs code
(``weights_only``, safetensors, YAML safe loading, :func:`visionpe.train.parallel.read_metadata`).
"""
from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
from pathlib import Path

import torch
import yaml

from ..cli import UserError, one_line, user_errors
from ..weights import io
from . import metrics, parallel
from .settings import EXTEND_ON_RESUME, SAFE_ON_RESUME, TrainSettings, changes, read_yaml, saved_form
from .metrics import METRICS, RESULTS, SUMMARY

CONFIG, STATE, LAST, BEST, EMA = ("config.yaml", "state.pt", "last.safetensors", "best.safetensors", "ema.safetensors")
CHECKPOINT = "checkpoint"  # a sharded run's commits: a folder of distributed checkpoints
ARTIFACTS = (RESULTS, CONFIG, STATE, CHECKPOINT, METRICS, SUMMARY, BEST, LAST, EMA)
WEIGHTS = {"last": LAST, "best": BEST, "ema": EMA}  # the exported weights, by the name the scripts give them
STATE_KEYS = ("epoch", "best_acc", "best_epoch", "history", "optimizer", "scheduler")
RESTART = "restart the run with --overwrite"  # what is left to do with a damaged or edited commit
NONFINITE = ("training never commits non-finite values, so the file is damaged or was edited (not a learning rate or "
             "data problem)")  # what a commit holding a NaN or inf is


# -----------------------------------------------------------------------------------------------------
# files
def write_text(path: Path, text: str) -> None:
    io.write_text(path, text)


def _unlink(path: Path) -> None:
    if path.is_dir():  # checkpoint/: its commit point first, so no half-removed folder is ever the commit
        _unlink(path / parallel.LATEST)
        shutil.rmtree(path, ignore_errors=True)
        return
    path.unlink(missing_ok=True)


def temp_files(out: Path) -> list[Path]:
    """Temporaries of an interrupted :func:`~visionpe.io.atomic_write` of one of the run's files."""
    out = Path(out)
    if not out.is_dir():
        return []
    return sorted(p for p in out.glob(".*.tmp") if any(p.name.startswith(f".{name}.") for name in ARTIFACTS))


def clean_temp(out: Path) -> list[Path]:
    stray = temp_files(out)
    for path in stray:
        _unlink(path)
    return stray


def existing(out: Path) -> list[str]:
    """The run files present in ``out``."""
    return [name for name in ARTIFACTS if (Path(out) / name).exists()]


def clear(out: Path, keep: tuple[str, ...] = ()) -> None:
    """Delete the run's files (never anything else in ``out``): results first, then state, then the exports, then what
    the loggers keep (:func:`visionpe.train.metrics.logger_files`)."""
    clean_temp(out)
    for name in ARTIFACTS:
        if name not in keep:
            _unlink(Path(out) / name)
    for path in metrics.logger_files(out):
        _unlink(path)


def check_fresh(out: Path, overwrite: bool) -> None:
    """A new run may only start in a directory without a run, or with ``--overwrite``."""
    if Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"--output {str(out)!r} is not a directory")
    found = existing(out)
    if found and CONFIG not in found and not overwrite:  # a kill during --overwrite's clear: the old run's remains
        raise UserError(f"run directory {str(out)!r} holds the remains of a run without {CONFIG} ({', '.join(found)}; "
                        f"a run killed while --overwrite deleted it), which --resume cannot continue: rerun the same "
                        "command with --overwrite to start again")
    if found and not overwrite:
        raise UserError(f"run directory {str(out)!r} already holds a run ({', '.join(found)}); pass --resume to "
                        "continue it or --overwrite to delete it and start again")


def undo_start(out: Path) -> None:
    """Remove what :func:`prepare` wrote for a new run (config.yaml, and what the loggers began) when its start
    failed before the first epoch, and ``out`` itself when that leaves it empty: the same command can run again."""
    clear(out)
    with contextlib.suppress(OSError):
        Path(out).rmdir()  # only if empty


def no_run_message(out: Path) -> str:
    """Why ``--resume out`` has nothing to continue (no ``config.yaml``), and what to run instead."""
    out = Path(out)
    if not out.is_dir():
        return f"--resume: no run to continue in {str(out)!r} (no such directory)"
    found, stray = existing(out), temp_files(out)
    if found:
        return (f"--resume: no run to continue in {str(out)!r}: no {CONFIG}, only the remains of a run "
                f"({', '.join(found)}; a kill while --overwrite deleted it); rerun the same command without --resume "
                "and with --overwrite to start again")
    killed = f" (a run killed before writing it: {stray[0].name})" if stray else ""
    return (f"--resume: no run to continue in {str(out)!r} (no {CONFIG}{killed}); nothing was trained there: rerun the "
            "same command without --resume to start it")


def read_config(run) -> dict:
    """``run/config.yaml`` as written (a plain mapping), or a :class:`UserError`."""
    run = Path(run)
    path = run / CONFIG
    if not run.is_dir():
        raise UserError(f"run directory {str(run)!r} not found")
    if not path.is_file():
        raise UserError(f"{str(run)!r} is not a run directory: {CONFIG} not found")
    return read_yaml(path, what="run config")


def write_config(out: Path, settings: TrainSettings) -> None:
    write_text(Path(out) / CONFIG, yaml.safe_dump(saved_form(settings), sort_keys=False))


def weights_file(run, which: str) -> Path:
    """The path of the exported weights ``which`` (``last``, ``best`` or ``ema``) of the run in ``run``; ``ema`` of a
    run trained without ``--model-ema`` is a :class:`UserError` saying so."""
    if which not in WEIGHTS:
        raise ValueError(f"which={which!r} is not supported; allowed values: {', '.join(WEIGHTS)}")
    path = Path(run) / WEIGHTS[which]
    if which == "ema" and not path.is_file() and (Path(run) / CONFIG).is_file() and \
            not read_config(run).get("model_ema"):
        raise UserError(f"{run} has no EMA weights ({EMA}): it was trained without --model-ema")
    return path


def read_weights(path: Path, device="cpu") -> dict[str, torch.Tensor]:
    """A safetensors state dict, or a :class:`UserError` naming the file (missing, truncated, not safetensors, or
    holding a NaN or infinite value: no number is ever reported from such weights)."""
    from safetensors.torch import load_file
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file {str(path)!r} not found")
    try:
        state = load_file(str(path), device=str(device))
    except Exception as err:  # safetensors raises its own error type for a damaged file
        raise UserError(f"cannot read {path}: damaged or not a safetensors file ({one_line(err)[:200]})") from None
    with user_errors():
        io.check_finite(state, f"weights file {str(path)!r}")
    return state


# -----------------------------------------------------------------------------------------------------
# checkpoint: state.pt is the commit point, the rest are exports (see the module docstring)
def load_state(model: torch.nn.Module, state: dict, source) -> None:
    """The whole weights ``state`` (read from ``source``) into ``model``, strictly; a sharded model (FSDP) takes its
    shards of them (:func:`visionpe.train.parallel.load_full_state`: every process calls it)."""
    try:
        parallel.load_full_state(model, state)
    except RuntimeError as err:
        raise UserError(f"{source} does not fit the model rebuilt from {CONFIG}: {one_line(err)[:300]}") from None


def weights_epoch(path: Path) -> int:
    """The ``epoch`` stored in a weights file's metadata; -1 if the file is missing or unreadable."""
    try:
        return int(io.weights_metadata(path).get("epoch", -1))
    except Exception:
        return -1


def tensors(module) -> dict[str, torch.Tensor]:
    """A module's state dict on the CPU, contiguous (as safetensors and ``state.pt`` store it)."""
    return {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}


def save_checkpoint(out: Path, model, optimizer, scheduler, *, epoch: int, best_acc: float, best_epoch: int,
                    history: list[dict], config: dict, ema=None, scaler=None, progress: dict | None = None) -> None:
    """Commit ``state.pt``: at the end of epoch ``epoch``, then export last/best/ema weights and metrics from it; or,
    with ``progress`` (see :func:`visionpe.train.loop.train_one_epoch`), within epoch ``epoch + 1``, ``state.pt``
    alone. ``config``: the settings trained with, as config.yaml holds them (:func:`saved_form`), which
    resume checks config.yaml against (:func:`check_resume`); ``ema``: the EMA module (timm ``ModelEmaV3.module``);
    ``scaler``: timm's ``NativeScaler``."""
    bad = [k for k, t in model.state_dict().items() if torch.is_floating_point(t) and not bool(torch.isfinite(t).all())]
    if bad:  # the loop checks first (train_vit.py, visionpe.train.commits.check_finite); this is the last guard
        raise UserError(f"refusing to commit {out / STATE}: the model's weights are not finite ({len(bad)} tensors, "
                        f"e.g. {bad[0]}); the run diverged: lower --lr")
    state = {"format": 3, "epoch": epoch, "best_acc": best_acc, "best_epoch": best_epoch,
             "history": json.dumps(history), "config": json.dumps(config), "model": tensors(model),
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    if ema is not None:
        state["ema"] = tensors(ema)
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    if progress is not None:
        state["progress"] = progress
    io.atomic_write(Path(out) / STATE, lambda tmp: torch.save(state, tmp))
    _unlink(Path(out) / CHECKPOINT)  # one commit point: a sharded run's commits, resumed without sharding
    if progress is None:
        export(out, state, history)


def save_sharded(out: Path, model, optimizer, scheduler, *, epoch: int, best_acc: float, best_epoch: int,
                 history: list[dict], config: dict, ema=None, progress: dict | None = None) -> None:
    """:func:`save_checkpoint` of a sharded model (FSDP), called by every process: commit the distributed checkpoint
    ``checkpoint/epoch-E`` (``epoch-E-step-S`` within epoch E + 1) of the model's, optimizer's and EMA's shards with
    the rest of what state.pt holds as its extra; then rank 0 removes state.pt (a run resumed from it under FSDP)
    and, at the end of an epoch, writes the exports from the gathered weights (every process gathers)."""
    out = Path(out)
    extra = {"format": 3, "epoch": epoch, "best_acc": best_acc, "best_epoch": best_epoch,
             "history": json.dumps(history), "config": json.dumps(config), "scheduler": scheduler.state_dict()}
    if progress is not None:
        extra["progress"] = progress
    tag = f"epoch-{epoch}" + (f"-step-{progress['step']}" if progress is not None else "")
    parallel.save_checkpoint(out / CHECKPOINT, model, optimizer, tag=tag, ema=ema, extra=extra)
    if parallel.rank() == 0:
        _unlink(out / STATE)
    if progress is None:
        state = exported_state(model, ema, extra)
        if parallel.rank() == 0:
            export(out, state, history)


def exported_state(model, ema, extra: dict) -> dict:
    """What :func:`export` and :func:`repair` read of a sharded commit (its ``extra``): the epoch, the best epoch,
    the progress within an epoch, and the model's (and EMA's) gathered weights on rank 0 (``{}`` elsewhere: a
    collective, every process calls it)."""
    state = {k: extra[k] for k in ("epoch", "best_epoch", "progress") if k in extra}
    state["model"] = parallel.gathered_state(model)
    if ema is not None:
        state["ema"] = parallel.gathered_state(ema)
    return state


def export(out: Path, state: dict, history: list[dict], force: bool = True) -> list[str]:
    """Write the exports of ``state`` (all of them, or with ``force=False`` only those that lag behind it);
    returns the names written."""
    out, epoch, written = Path(out), state["epoch"], []
    within = "progress" in state  # committed within epoch + 1: its weights are not those of epoch `epoch`
    weights = [(LAST, state["model"])] + ([(EMA, state["ema"])] if "ema" in state else [])
    for name, values in weights if epoch >= 1 else []:
        if force or weights_epoch(out / name) != epoch:
            if within:
                raise UserError(f"{out / name} is missing or not from epoch {epoch}, and {STATE} (saved within epoch "
                                f"{epoch + 1}) cannot rebuild it; the run can only be restarted with --overwrite")
            io.save_weights(values, out / name, {"epoch": str(epoch)})
            written.append(name)
    best_epoch = state["best_epoch"]
    if best_epoch == epoch and not within and (force or weights_epoch(out / BEST) != epoch):
        io.save_weights(state["model"], out / BEST, {"epoch": str(epoch)})
        written.append(BEST)
    elif best_epoch >= 1 and weights_epoch(out / BEST) != best_epoch:
        raise UserError(f"{out / BEST} is missing or not from the best epoch {best_epoch}, and {STATE} (epoch {epoch}) "
                        "cannot rebuild it; the run can only be restarted with --overwrite")
    for name, text in ((METRICS, metrics.metrics_text(history)), (SUMMARY, metrics.summary_text(history))):
        if force or not (out / name).is_file() or (out / name).read_text() != text:
            write_text(out / name, text)
            written.append(name)
    return written


def load_checkpoint(out: Path) -> dict | None:
    """``state.pt`` of the run in ``out``, checked (:func:`check_commit`), with ``history`` decoded and the model
    weights in ``state['model']``; ``None`` when no epoch was saved yet. A damaged file is a :class:`UserError`."""
    out = Path(out)
    path = out / STATE
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserError(f"cannot read {path}: damaged or not a train_vit.py checkpoint "
                        f"({type(err).__name__}: {one_line(err)[:160]}); restart the run with --overwrite") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise UserError(f"{path} is not a train_vit.py checkpoint (lacks {', '.join(missing)})")
    try:
        state["history"] = json.loads(state["history"])
    except (TypeError, ValueError):
        raise UserError(f"{path} holds a damaged history") from None
    check_commit(state, path)
    check_finite_commit(state, path)
    if "model" not in state:  # written by an older train_vit.py: the weights live in last.safetensors
        if weights_epoch(out / LAST) != state["epoch"]:
            raise UserError(f"{out / LAST} and {STATE} are from different epochs; cannot resume exactly")
        state["model"] = read_weights(out / LAST)
    return state


def sharded_checkpoint(out: Path) -> Path | None:
    """The committed distributed checkpoint of the run in ``out`` (``checkpoint/<latest>``), or None; a ``latest``
    that names no complete checkpoint is a :class:`UserError`."""
    try:
        return parallel.latest_checkpoint(Path(out) / CHECKPOINT)
    except ValueError as err:
        raise UserError(f"{one_line(err)}: restart the run with --overwrite") from None


def commit_order(state: dict | Path) -> tuple[int, int]:
    """``(epoch, step within the next epoch)`` of a commit: state.pt's contents, or a distributed checkpoint's
    folder (its tag)."""
    if isinstance(state, Path):
        found = re.fullmatch(r"epoch-(\d+)(?:-step-(\d+))?", state.name)
        if found is None:
            raise UserError(f"{state} is not a checkpoint of this workbench (its name is no epoch-E or epoch-E-step-S)")
        return int(found[1]), int(found[2] or 0)
    return state["epoch"], (state.get("progress") or {}).get("step", 0)


def resume_point(out: Path) -> dict | Path | None:
    """What ``--resume`` continues: state.pt's contents (:func:`load_checkpoint`), or the folder of a sharded run's
    distributed checkpoint (:func:`sharded_checkpoint`); None when no epoch was saved yet.

    The run's ``config.yaml`` says which kind it commits (``parallel: fsdp``: checkpoint/, else state.pt). The other
    kind is resumed only where a resume changed ``--parallel``: alone (killed before its first commit of the new
    kind), or beside the run's own kind when older (killed between a commit and the removal of the other format).
    Later than the run's own commit, it is a file planted or left from another run: a :class:`UserError` naming it,
    never silently preferred."""
    out = Path(out)
    sharded = read_config(out).get("parallel") == "fsdp"
    state, folder = load_checkpoint(out), sharded_checkpoint(out)
    if state is None or folder is None:
        return folder if state is None else state
    own, other = (folder, state) if sharded else (state, folder)
    if commit_order(own) > commit_order(other):
        return own
    own_name, other_name = (folder, out / STATE) if sharded else (out / STATE, folder)
    raise UserError(f"{other_name} (epoch {commit_order(other)[0]}) is no older than {own_name} (epoch "
                    f"{commit_order(own)[0]}), yet {out / CONFIG} says parallel: {'fsdp' if sharded else 'ddp'}, which "
                    f"commits {CHECKPOINT + '/' if sharded else STATE}: a file planted or left from another run, not resumed; remove it, or "
                    f"{RESTART}")


def check_finite_commit(state: dict, path: Path) -> None:
    """Every tensor of a commit's model, EMA and optimizer state is finite: training never commits a non-finite
    epoch (:func:`visionpe.train.commits.check_finite`), so a NaN or inf there is a damaged or edited file, a
    :class:`UserError` naming it and the tensor (not a divergence blamed on the learning rate or the data)."""
    optimizer = state.get("optimizer")
    slots = optimizer.get("state", {}) if isinstance(optimizer, dict) else {}
    parts = {"model": state.get("model"), "ema": state.get("ema"),
             "optimizer state": {f"{param}.{name}": value for param, entry in slots.items()
                                 if isinstance(entry, dict) for name, value in entry.items()}}
    for part, tensors in parts.items():
        if not isinstance(tensors, dict):
            continue
        tensors = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        try:
            io.check_finite(tensors, f"{path}'s {part}")
        except ValueError as err:
            raise UserError(f"{str(err).split('; a checkpoint')[0]}: {NONFINITE}; {RESTART}") from None


def check_commit(commit: dict, path: Path) -> None:
    """A commit's fields (state.pt's contents with its history decoded, or a distributed checkpoint's extra; ``path``
    names it) of their types, in range and in line with its history: an edited or damaged file is a
    :class:`UserError` naming it and the field, never a run resumed at another epoch than it trained."""
    def integer(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    epoch, best_epoch, within = commit.get("epoch"), commit.get("best_epoch"), commit.get("progress")
    history = commit.get("history")
    done = [r.get("epoch") for r in history if isinstance(r, dict) and r.get("kind") == "epoch"] \
        if isinstance(history, list) else None
    problem = None
    if not integer(epoch) or epoch < (0 if within is not None else 1):
        problem = f"epoch {epoch!r} (an integer >= 1, or 0 in a commit within the first epoch)"
    elif done != list(range(1, epoch + 1)):
        problem = f"epoch {epoch} with a history of the epochs {done!r} (1 to {epoch}, each once)"
    elif not integer(best_epoch) or not (1 <= best_epoch <= epoch or epoch == 0 and best_epoch == -1):
        problem = f"best_epoch {best_epoch!r} (an epoch from 1 to {epoch}, or -1 before the first)"
    elif not isinstance(commit.get("best_acc"), (int, float)) or isinstance(commit.get("best_acc"), bool) \
            or not math.isfinite(commit["best_acc"]):
        problem = f"best_acc {commit.get('best_acc')!r} (a finite number)"
    elif within is not None and (not isinstance(within, dict) or not integer(within.get("step"))
                                 or within["step"] < 1 or not isinstance(within.get("sums"), list)):
        problem = f"progress {within!r} (the batches of the next epoch trained on, step >= 1, and every process's sums)"
    if problem is not None:
        raise UserError(f"{path} is damaged or was edited: it holds {problem}; {RESTART}")


def check_resume(commit: dict, path: Path, out: Path, config: dict, *, steps: int) -> None:
    """The commit resumed (``commit``, ``path``: as in :func:`check_commit`) against the run as resumed: a commit
    within an epoch at a batch before the epoch's last of ``steps``, and ``config`` (the settings resumed:
    ``out``'s config.yaml with the changes ``--resume`` allows, :func:`saved_form`) the settings the commit
    records (``config``), but for those a resume may change. A difference is a :class:`UserError` naming
    config.yaml and the settings (config.yaml edited: the optimizer, schedule and weights of the commit would
    continue under settings they were not made with). A commit of an earlier release records none."""
    within = commit.get("progress")
    if within is not None and within["step"] >= steps:
        raise UserError(f"{path} is damaged or was edited: it holds progress step {within['step']} within an epoch of "
                        f"{steps} batches (at most {steps - 1}); {RESTART}")
    if "config" not in commit:
        return
    try:
        recorded = json.loads(commit["config"])
        differ = [d for d in changes(recorded, config)
                  if d[0] not in SAFE_ON_RESUME + EXTEND_ON_RESUME]
    except (TypeError, ValueError, KeyError, AttributeError):
        raise UserError(f"{path} holds damaged settings (config); {RESTART}") from None
    if differ:
        shown = "; ".join(f"{key} ({old!r} in {path.name}, {new!r} in {CONFIG})" for key, old, new in differ)
        raise UserError(f"{out / CONFIG} differs from the settings {path} was trained with: {shown}; put them back "
                        f"(only {', '.join(SAFE_ON_RESUME + EXTEND_ON_RESUME)} may change on "
                        "--resume), or start a new run with another --output")


def repair(out: Path, state: dict | None) -> list[str]:
    """Bring the exports in line with ``state.pt`` before training continues (see the module docstring); with no
    state (no epoch saved), remove exports left by anything else. Returns what was done, for the log."""
    out = Path(out)
    notes = [f"removed the interrupted write {p.name}" for p in clean_temp(out)]
    if state is None:
        stale = [n for n in existing(out) if n != CONFIG]
        clear(out, keep=(CONFIG,))
        return notes + ([f"removed {', '.join(stale)} (no epoch was saved)"] if stale else [])
    written = export(out, state, state["history"], force=False)
    return notes + ([f"re-exported {', '.join(written)} from {STATE} (epoch {state['epoch']})"] if written else [])


def prepare(out: Path, settings: TrainSettings, *, resume: bool, state: dict | None, changed=()) -> list[str]:
    """Ready the run directory for training (rank 0 only). A new run: delete the previous run's files (only with
    ``--overwrite`` can there be any), then write config.yaml. A resumed run: :func:`repair`, and record the
    settings changed on the command line (``changed``, from :func:`~visionpe.train.restore.resume_config`) in
    config.yaml; a new ``epochs`` (``--resume --epochs N``) first removes ``results.json``, so a kill part-way leaves
    an unfinished run. Returns what was done, for the log."""
    if not resume:
        clear(out)
        write_config(out, settings)
        return []
    if any(key in EXTEND_ON_RESUME for key, _, _ in changed):  # a new length: not finished any more
        _unlink(out / RESULTS)
    notes = [f"resume: {note}" for note in repair(out, state)]
    notes += [f"resume: {key} changed from {old!r} to {new!r} (applied)" for key, old, new in changed]
    if any(key in saved_form(settings) for key, _, _ in changed):
        write_config(out, settings)
        notes.append(f"resume: {CONFIG} updated with the changed settings")
    return notes


def files_line(out: Path, weights: tuple[str, ...]) -> str:
    """The last line of a finished run: its directory and what each result file holds (``weights``: the names of
    :data:`WEIGHTS` it exported)."""
    exported = ", ".join(WEIGHTS[w] for w in weights)
    return (f"run {out}: {RESULTS} (the resolution table), {METRICS} and {SUMMARY} (every epoch), {exported} (weights), "
            f"{CONFIG} (settings), {STATE} (for --resume)")


def finish(out: Path, history: list[dict], summary: dict) -> None:
    """The last writes of a finished run: all metrics, then results.json (whose presence means "finished")."""
    write_text(Path(out) / METRICS, metrics.metrics_text(history))
    write_text(Path(out) / SUMMARY, metrics.summary_text(history))
    write_text(Path(out) / RESULTS, json.dumps(summary, indent=1))
