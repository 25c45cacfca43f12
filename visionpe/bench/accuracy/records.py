"""A benchmark run as data: one small JSON record per run (a few KB, never weights), written when the run is brought
up to date and kept in the repository, so that a report is rebuilt from records alone (``--report-only``) whatever
machine made each, and the next machine goes on where the last one stopped.

A record holds the run's identity (benchmark, part, family, data set, row, seed), its exact settings (as
``config.yaml`` saves them, without the run's folder; the weights it started from, ``init_from``, relative to it)
and the sweep's arguments, their hash (:func:`.staleness.settings_sha256`: a record whose hash is not the one the
rows file asks for now is stale), the
machine and versions that trained and swept it (:func:`visionpe.bench.machine.environment`), their wall times, the
per-epoch metrics, the run's results (parameters, images/s) and the sweep's table (every test size, every
adaptation, untuned and tuned).
The record of the run ``OUT/X/Y/s0`` is ``RECORDS/X/Y/s0.json``.
"""
from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from ...cli import UserError
from ...train import metrics, restore, settings
from ...weights import write_text
from ..machine import environment
from .staleness import run_relative, settings_sha256, sweep_arguments

FORMAT = "visionpe.bench.accuracy.record/1"  # what a record file is, and the version of its layout
IDENTITY_COLUMNS = ("run", "data", "model", "pe", "seed")  # sweep.csv's columns a record holds once, elsewhere
MACHINE = "machine.json"  # in a run's folder: the machine and wall time of its last train and sweep commands


def read_noted(run: Path) -> dict:
    """``run/machine.json``: {step: {'machine', 'device', 'seconds'}}, empty when the run has none."""
    try:
        return json.loads((run / MACHINE).read_text())
    except (OSError, ValueError):
        return {}


def note_machine(run: Path, step: str, device: str, seconds: float | None = None, resumed: bool = False) -> None:
    """This machine (:func:`environment`) and ``device`` (``cpu`` or ``cuda``) in ``run/machine.json`` for ``step``
    (``train`` or ``sweep``) of ``run``: once when the step starts (``seconds`` None), so that a step whose work is
    done but whose caller was killed before it returned (a training that wrote results.json) still names its
    machine, its wall time unknown (None); then again with its wall time when it succeeded. A resumed training adds
    its seconds to those of the attempts before it."""
    noted = read_noted(run)
    entry = noted.get(step, {}) if resumed else {}
    earlier = entry["seconds"] if entry.get("seconds") is not None else entry.get("earlier", 0.0)
    noted[step] = {"machine": environment(), "device": device,
                   **({"seconds": None, "earlier": earlier} if seconds is None else {"seconds": earlier + seconds})}
    write_text(run / MACHINE, json.dumps(noted, indent=1) + "\n")


def record_path(records: Path, out: Path, run: Path) -> Path:
    """Where the record of ``run`` (a folder under ``out``) lives: ``records / run's path under out`` + ``.json``."""
    return records / run.relative_to(out).with_name(run.name + ".json")


def make_record(run: Path, identity: dict, train: list[str], sweep: list[str]) -> dict:
    """The record of the finished, swept ``run``: ``identity`` (benchmark, part, family, data, row, seed) and what
    the run's folder holds, checked against the settings asked for now (``visionpe train TRAIN``, then ``sweep``)."""
    cfg = restore.load_run(run)
    with open(run / "sweep" / "sweep.csv") as f:
        table = [{k: v for k, v in row.items() if k not in IDENTITY_COLUMNS} for row in csv.DictReader(f)]
    noted = read_noted(run)
    results = metrics.read_results(run)
    saved = {k: v for k, v in settings.saved_form(run_relative(cfg)).items() if k != "output"}
    arguments = sweep_arguments(sweep)
    made_by = {step: {**noted[step]["machine"], "device": noted[step]["device"]} if step in noted else None
               for step in ("train", "sweep")}
    return {"format": FORMAT, **identity, "settings": json.loads(json.dumps(saved)), "sweep": arguments,
            "settings_sha256": settings_sha256(cfg, arguments), "made_by": made_by,
            "wall_s": {step: noted.get(step, {}).get("seconds") for step in ("train", "sweep")},
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "num_classes": cfg["num_classes"],
            "results": {k: results.get(k) for k in ("params", "epochs", "best_epoch", "train_img_per_s",
                                                    "final_train_loss")},
            "epochs": metrics.epochs(metrics.read_history(run)), "table": table}


def write_record(path: Path, record: dict) -> None:
    """``record`` written to ``path`` atomically (:func:`record_text`)."""
    write_text(path, record_text(record))


def record_text(record: dict) -> str:
    """A record as JSON for a reviewable diff: one key a line, and one line an element of a list of mappings (an
    epoch's metrics, a row of the sweep's table)."""
    def value(v):
        if isinstance(v, list) and v and all(isinstance(e, dict) for e in v):
            return "[\n" + ",\n".join(f"  {json.dumps(e)}" for e in v) + "\n ]"
        return json.dumps(v)
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in record.items()) + "\n}\n"


def read_record(path: Path) -> dict | None:
    """The record in ``path``; None when there is none; a record that cannot be read is a :class:`UserError` naming
    it (never taken for absent)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise UserError(f"record {path} cannot be read ({err}); remove it to redo its run") from None
    found = record.get("format") if isinstance(record, dict) else None
    if found != FORMAT:
        raise UserError(f"record {path} is not a {FORMAT} record (format {found!r}); remove it to redo its run")
    return record


def machine_of(record: dict, step: str) -> str | None:
    """Who made a record's ``step`` (``train`` or ``sweep``), as a canonical JSON text: the device that ran it (the
    machine's GPU when the step ran on CUDA, else its CPU and cores), the platform and the versions; None when the
    run's folder did not say (a run made before records were)."""
    machine = (record.get("made_by") or {}).get(step)
    if not machine:
        return None
    on_gpu = machine["device"] == "cuda" and machine.get("gpu")
    return json.dumps({"device": machine["gpu"] if on_gpu else f"{machine['cpu']}, {machine['cpu_count']} cores",
                       "platform": machine["platform"], "python": machine["python"],
                       "torch": machine["torch"] + (f" (CUDA {machine['cuda']})" if on_gpu else ""),
                       "timm": machine["timm"], "visionpe": machine["visionpe"]}, sort_keys=True)
