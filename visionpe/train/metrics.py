"""What a run reports, in one place: the records, the files that hold them, the one reader of those files, and the
loggers.

- :class:`Evaluation`: a model evaluated on a data set (:func:`visionpe.train.evaluation.evaluate` returns it);
- :class:`EpochRecord`: one epoch, the one record behind the console line, a line of ``metrics.jsonl`` (its
  :meth:`~EpochRecord.row`), a row of ``summary.csv`` and each logger's entry;
- :func:`summary` (``results.json``) and :func:`resolution_table` (the console's last table) of a finished run;
- the texts of ``metrics.jsonl`` and ``summary.csv``, written by :mod:`visionpe.train.rundir` as exports of the
  checkpoint's history (atomically, repaired on resume), and :func:`read_results` / :func:`read_history`, through
  which the sweep and the benchmarks read a run;
- :class:`Report`: the console (rank 0 only) and the loggers chosen with ``--log``
  (:data:`~visionpe.train.settings.LOGGERS`): TensorBoard through ``torch.utils.tensorboard``, Weights & Biases
  through ``wandb``. A logger is an export too: at every start it is brought in line with the checkpoint's history
  (TensorBoard's event files rewritten from it; W&B continued with the same run id after the last epoch it was
  sent), and an epoch reaches it only after ``state.pt`` holds it, so a resumed run, one killed within an epoch too,
  shows each epoch once.

The loggers get the epoch records only: the resolution table is in ``results.json``.
"""
from __future__ import annotations

import csv
import importlib
import io as text_io
import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..cli import UserError, one_line
from ..cli.report import text_table
from ..weights import io
from . import models
from .settings import AUG, LOGGERS, SETTINGS, TrainSettings, saved_form, transforms_of

METRICS, SUMMARY, RESULTS = "metrics.jsonl", "summary.csv", "results.json"
TENSORBOARD = "tensorboard"  # the folder of TensorBoard's event files in the run directory
WANDB_STATE = "wandb.json"  # the W&B run id and the last epoch sent to it


@dataclass(frozen=True)
class Evaluation:
    """A model evaluated on a data set: ``acc`` top-1 (%), ``loss`` mean cross-entropy, ``count`` images seen (every
    process's)."""

    acc: float
    loss: float
    count: int


@dataclass(frozen=True)
class EpochRecord:
    """One epoch of training: the mean training loss, the validation of the model (and of its EMA weights), the
    learning rate at the end of the epoch, the throughput and the time it took."""

    epoch: int  # 1-based
    train_loss: float
    val: Evaluation
    lr: float
    img_per_s: float
    epoch_time_s: float
    ema: Evaluation | None = None

    def row(self) -> dict:
        """The record as ``metrics.jsonl`` holds it (and the checkpoint's history)."""
        ema = {} if self.ema is None else {"ema_val_loss": self.ema.loss, "ema_val_acc": self.ema.acc}
        return {"kind": "epoch", "epoch": self.epoch, "train_loss": self.train_loss, "val_loss": self.val.loss,
                "val_acc": self.val.acc, **ema, "lr": self.lr, "img_per_s": self.img_per_s,
                "epoch_time_s": self.epoch_time_s}

    def line(self, epochs: int, improved: bool, unit: str = "img/s") -> str:
        """The console line (``*``: the best validation top-1 so far; ``unit`` of the throughput, ``clips/s`` for a
        video run, whose ``img_per_s`` counts clips)."""
        ema = f"  EMA top-1 {self.ema.acc:6.2f}%" if self.ema is not None else ""
        return (f"epoch {self.epoch:3d}/{epochs}  train loss {self.train_loss:.4f}  val loss {self.val.loss:.4f}  "
                f"val top-1 {self.val.acc:6.2f}%{' *' if improved else ''}{ema}  {self.img_per_s:.0f} {unit}")


def key_text(key) -> str:
    """An evaluation key as text (results.json, tables, logs): ``"32"`` for a square image size, ``"AxB"`` for a
    pair, which reads right both as an image ``(height, width)`` and as a video ``(frames, res)``."""
    return f"{key[0]}x{key[1]}" if isinstance(key, tuple) else str(key)


def retention_table(measured: dict, train_key, trained=None) -> dict:
    """``{key: {'acc', 'loss', 'retention'}}`` of ``{key: Evaluation}`` (the form of results.json, the history's
    ``eval_res`` lines and the sweep's rows): retention = acc(key) / acc(train_key), or against ``trained`` (an
    Evaluation of the model as trained at the training size) when given; undefined (None) when that accuracy is 0
    (nothing to retain: 0/0 is no retention of 0)."""
    base = (trained or measured[train_key]).acc
    return {k: {"acc": m.acc, "loss": m.loss, "retention": m.acc / base if base > 0 else None}
            for k, m in measured.items()}


def read_retention(cell: str) -> float | None:
    """A retention cell of a CSV row (sweep.csv): a number, or None where it is undefined (an empty cell)."""
    return float(cell) if cell not in ("", None) else None


def retention_text(value: float | None) -> str:
    """A retention for a table: ``0.987``, or ``n/a`` where it is undefined (the training-size accuracy is 0)."""
    return "n/a" if value is None else f"{value:.3f}"


def epochs(history: list[dict]) -> list[dict]:
    """The epoch rows of a history (``metrics.jsonl``'s ``kind: epoch`` lines), in order."""
    return [h for h in history if h["kind"] == "epoch"]


# -----------------------------------------------------------------------------------------------------
# the files
def metrics_text(history: list[dict]) -> str:
    """``metrics.jsonl``: one JSON object a line."""
    return "".join(json.dumps(h) + "\n" for h in history)


def summary_text(history: list[dict]) -> str:
    """``summary.csv``: one row per epoch (as timm's train.py writes it), the epoch rows' columns without ``kind``;
    only the header line before the first epoch."""
    rows = [{k: v for k, v in h.items() if k != "kind"} for h in epochs(history)]
    fields = list(rows[0]) if rows else ["epoch", "train_loss", "val_loss", "val_acc", "lr", "img_per_s",
                                         "epoch_time_s"]
    buffer = text_io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def read_results(run) -> dict:
    """``results.json`` of a finished run, or a :class:`UserError`."""
    path = Path(run) / RESULTS
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} not found: the run has not finished") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path}: {one_line(err)}") from None


def read_history(run) -> list[dict]:
    """``metrics.jsonl`` of a run: every record, in order; a missing or damaged file is a :class:`UserError`."""
    path = Path(run) / METRICS
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        raise UserError(f"{path} not found: the run has saved no epoch") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path}: {one_line(err)}") from None


def logger_files(out: Path) -> list[Path]:
    """What the loggers leave in a run directory besides their own folders' other files: TensorBoard's event files
    and the W&B state (deleted with the run's files by ``--overwrite``)."""
    out = Path(out)
    return sorted((out / TENSORBOARD).glob("events.out.tfevents.*")) + \
        ([out / WANDB_STATE] if (out / WANDB_STATE).is_file() else [])


# -----------------------------------------------------------------------------------------------------
# a finished run
def summary(settings: TrainSettings, history: list[dict], results: dict, *, num_params: int, best_epoch: int) -> dict:
    """``results.json``: what the run is, how it trained and ``results`` (``{weights: {key: {'acc', 'loss',
    'retention'}}}``, keys as :func:`key_text`)."""
    trained = epochs(history)
    protocol = transforms_of(settings)
    video = {"num_frames": settings.num_frames, "tubelet_size": list(models.tubelet(settings))} if settings.num_frames else {}
    if settings.tokens_per_second is not None:
        video["tokens_per_second"] = settings.tokens_per_second  # absolute time: positions per second of each clip
    return {"model": settings.model, "pe": settings.pe, "data": settings.data, "seed": settings.seed,
            "img_size": settings.img_size, "eval_protocol": protocol.eval_protocol,
            **({"crop_pct": protocol.crop_pct} if protocol.eval_protocol == "crop" else {}),
            **({"max_patches": settings.max_patches} if settings.max_patches else {}), **video,
            **({"classes": settings.classes} if settings.classes else {}),  # a folder run: output k is classes[k]
            "init_from": settings.init_from, "params": num_params, "epochs": settings.epochs, "best_epoch": best_epoch,
            "train_img_per_s": float(np.median([h["img_per_s"] for h in trained])) if trained else None,
            "final_train_loss": trained[-1]["train_loss"] if trained else None,
            "results": {w: {key_text(k): m for k, m in rs.items()} for w, rs in results.items()}}


def setup_text(settings: TrainSettings) -> str:
    """What tells a run apart from another of the same model, encoding and data, for the first line and the final
    table: the encoding's keywords, the training resolutions, the augmentation and regularization settings that are
    not the defaults (:data:`visionpe.train.settings.AUG`)."""
    changed = [f"{key}={getattr(settings, key)}" for key, s in SETTINGS.items()
               if s.group == AUG and key != "train_res" and getattr(settings, key) != s.default]
    words = [f"pe_kwargs {models.sizes_text(settings.pe_kwargs)}"] if settings.pe_kwargs else []
    if settings.train_res:
        words.append(f"train_res {' '.join(map(str, settings.train_res))} px")
    return ", ".join(words + [f"augmentation {' '.join(changed) if changed else 'as the defaults'}"])


def start_line(settings: TrainSettings, *, num_params: int, train_size: int, val_size: int, world: int, device,
               amp: bool, out: Path) -> str:
    """The console line a run starts with: model, encoding, size and where its sizes came from, what tells the run
    apart (:func:`setup_text`), data and evaluation protocol, processes, precision, recipe, folder."""
    clips = (f" clips of {settings.num_frames} frames, tubelet {'x'.join(map(str, models.tubelet(settings)))}"
             if settings.num_frames else "")
    if settings.tokens_per_second is not None:
        clips += f", time {settings.tokens_per_second:g} positions/s at each clip's frame rate"
    recipe = "".join([f" | {settings.grad_accum_steps} batches a step" if settings.grad_accum_steps > 1 else "",
                      " | EMA" if settings.model_ema else "", " | compiled" if settings.compile else ""])
    sizes = f" (sizes: {settings.sizes_from})" if settings.sizes_from else ""
    return (f"{settings.model} pe={settings.pe} {num_params / 1e6:.3f}M params{sizes} | {setup_text(settings)} | "
            f"{settings.data} {train_size} train {val_size} val at {settings.img_size}px{clips}, evaluated under protocol "
            f"{transforms_of(settings).eval_protocol} | {world} process(es) on {device.type}"
            f"{' ' + settings.amp.replace('auto', 'bf16') if amp else ''}{recipe} | {out}")


LEARNED_MARGIN = 5.0  # points above chance (100 / classes) that a top-1 at the training size must reach


def did_not_learn(acc: float, num_classes: int) -> bool:
    """A top-1 ``acc`` (%) at the training size below chance (``100 / num_classes``) + :data:`LEARNED_MARGIN`
    points: the model did not learn its task. The one rule of ``visionpe train``'s note and the benchmark's "not
    learned" rows."""
    return acc < 100.0 / num_classes + LEARNED_MARGIN


def learning_note(settings: TrainSettings, results: dict, train_key) -> str | None:
    """The note under the final table when the last weights did not learn (:func:`did_not_learn` at the training
    size), else None."""
    acc = results["last"][train_key]["acc"]
    if not did_not_learn(acc, settings.num_classes):
        return None
    return (f"note: not learned: the last weights' top-1 at the training size, {acc:.2f} %, is below chance "
            f"({100 / settings.num_classes:.1f} %, {settings.num_classes} classes) + {LEARNED_MARGIN:.0f} points, so the "
            f"table above says nothing about positions (the benchmark leaves such a row out); train longer or with "
            f"another --lr")


def resolution_table(settings: TrainSettings, results: dict, best_epoch: int) -> str:
    """The console's last table: top-1 and retention of each weights at every test size (and frame count)."""
    video = bool(settings.num_frames)
    resolutions = sorted(set(settings.eval_res) | {settings.img_size})
    rows = []
    for which, measured in results.items():
        for frames in (sorted({k[0] for k in measured}) if video else [None]):
            at = (lambda r: measured[(frames, r)]) if video else (lambda r: measured[r])
            name = f"{which} {frames} frames" if video else which
            rows.append([f"{name} top-1 %"] + [f"{at(r)['acc']:.2f}" for r in resolutions])
            rows.append([f"{name} retention"] + [retention_text(at(r)["retention"]) for r in resolutions])
    trained = f"{settings.num_frames} frames at {settings.img_size}px" if video else f"{settings.img_size}px"
    if settings.max_patches:
        trained += f" (native aspect ratios within {settings.max_patches} patches)"
    return (f"\n{settings.data}  {settings.model}  pe={settings.pe}  trained at {trained}, {setup_text(settings)}, "
            f"best epoch {best_epoch}, evaluated under protocol {transforms_of(settings).describe()}\n"
            + text_table(rows, ["frames x resolution" if video else "resolution"] + [f"{r}px" for r in resolutions]))


# -----------------------------------------------------------------------------------------------------
# the console and the loggers
def _needs(module: str, extra: str):
    """``module`` imported for ``--log extra``, or a :class:`UserError` naming the package that is missing (the
    import's own missing name: ``tensorboard`` for ``torch.utils.tensorboard``)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing = getattr(err, "name", None) or module.split(".")[0]
        raise UserError(f"--log {extra} needs the package {missing}, which cannot be imported ({one_line(err)}); "
                        f"install it with pip install 'visionpe[{extra}]'") from None


def check_loggers(names) -> None:
    """The packages of the ``--log`` loggers ``names`` import (checked before the run directory is written, so a
    missing one leaves nothing behind)."""
    for name in names:
        _needs(LOGGER_CLASSES[name].module, name)


class TensorBoardLogger:
    """Scalars in ``run/tensorboard/`` (``torch.utils.tensorboard.SummaryWriter``): each number of an epoch row under
    its ``metrics.jsonl`` name, at step = epoch. The event files are rewritten from the history at every start."""

    module = "torch.utils.tensorboard"  # what it imports

    def __init__(self, out: Path, settings: TrainSettings, history: list[dict], resume: bool):
        writer = _needs(self.module, "tensorboard").SummaryWriter
        for path in sorted((Path(out) / TENSORBOARD).glob("events.out.tfevents.*")):
            path.unlink()
        self.writer = writer(log_dir=str(Path(out) / TENSORBOARD))
        self.write(epochs(history))

    def write(self, rows: list[dict]) -> None:
        for row in rows:
            for key, value in row.items():
                if key not in ("kind", "epoch"):
                    self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run (``wandb.init``: project ``$WANDB_PROJECT`` or ``visionpe``, named after the run
    directory, its files under ``run/wandb/``; ``WANDB_MODE=offline`` works without an account), each epoch row
    logged at step = epoch. ``run/wandb.json`` keeps the run id and the last epoch sent, so a resumed run continues the
    same W&B run with the epochs it has not seen."""

    active = None  # this process's last W&B run, finished before the next starts (one left open by an error)
    module = "wandb"  # what it imports

    def __init__(self, out: Path, settings: TrainSettings, history: list[dict], resume: bool):
        wandb = _needs(self.module, "wandb")
        if WandbLogger.active is not None:
            WandbLogger.active.finish()
        self.state = Path(out) / WANDB_STATE
        known = json.loads(self.state.read_text()) if resume and self.state.is_file() else None
        self.id = known["id"] if known else uuid.uuid4().hex[:12]  # a new W&B run
        self.sent = known["epochs"] if known else 0
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "visionpe"), name=Path(out).name, id=self.id,
                              resume="allow", dir=str(out), config=saved_form(settings))
        WandbLogger.active = self.run
        self.write(epochs(history))

    def write(self, rows: list[dict]) -> None:
        for row in rows:
            if row["epoch"] > self.sent:
                self.run.log({k: v for k, v in row.items() if k != "kind"}, step=row["epoch"])
                self.sent = row["epoch"]
                io.write_text(self.state, json.dumps({"id": self.id, "epochs": self.sent}))

    def close(self) -> None:
        self.run.finish()
        WandbLogger.active = None


LOGGER_CLASSES = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger}  # by the names of LOGGERS


class Report:
    """What a run reports as it goes: lines on the console and epoch records to the loggers, from rank 0 only (the
    other processes are silent)."""

    def __init__(self, master: bool, video: bool = False):
        self.master, self.loggers = master, []
        self.unit = "clips/s" if video else "img/s"  # what the throughput counts

    def __call__(self, text: str) -> None:
        if self.master:
            print(text, flush=True)

    def warn(self, text: str) -> None:
        """One line ``visionpe train: warning: ...`` on stderr: a setting the run takes but that likely defeats its
        purpose."""
        if self.master:
            print(f"visionpe train: warning: {text}", file=sys.stderr, flush=True)

    def open_loggers(self, out: Path, settings: TrainSettings, history: list[dict], resume: bool) -> None:
        """Start the loggers of ``settings.log``, brought in line with ``history`` (rank 0)."""
        if self.master:
            self.loggers = [LOGGER_CLASSES[name](out, settings, history, resume) for name in settings.log]

    def epoch(self, record: EpochRecord, epochs: int, improved: bool) -> None:
        """An epoch committed to ``state.pt``: its console line and its entry in every logger."""
        self(record.line(epochs, improved, self.unit))
        for logger in self.loggers:
            logger.write([record.row()])

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
        self.loggers = []
