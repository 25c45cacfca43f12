"""The finished runs of a benchmark gathered into one table from their records (:mod:`.records`: each run's sweep
table, results and epoch metrics), keyed by (family, data, encoding or row, adaptation); the rows of
LookHere's protocol (``visionpe sweep --tune``) are the adaptations ``untuned`` and ``tuned``, with the knob values
the seeds chose."""
from __future__ import annotations

from ...train import loop, metrics
from .records import machine_of

TUNE = ("untuned", "tuned")  # the adaptations of LookHere's protocol in a sweep.csv


def collect(runs: list[tuple[str, str, str, int, dict]]) -> dict:
    """{(family, data, pe, adaptation): {'acc': {res: [per seed]}, 'ret': ..., 'params', 'img_s', 'train_res',
    'seeds', 'num_classes', 'last_two', 'made_by'}} from the runs' records (:mod:`.records`, one ``(family, data,
    pe, seed, record)`` a run); ``last_two``: per seed, the validation top-1 (training size) after the run's last two
    epochs (:func:`last_two_epochs`); ``made_by``: {seed: (the machine that trained it, the machine that swept it)}
    (:func:`.records.machine_of`); ``wall_s``: {seed: its training and sweep seconds}; an entry of LookHere's
    protocol also has 'knob' (the knob's name, '' for an encoding without one), a tuned one 'choice' ({res: [per
    seed, the value chosen: ``x4`` on the trained value for a number, else the value]})."""
    table = {}
    for family, data, pe, seed, record in runs:
        results, last_two = record["results"], last_two_epochs(record["epochs"])
        rows = record["table"]
        trained = {(row.get("protocol"), row["res"]): row.get("knob_value", "") for row in rows
                   if row["adaptation"] == "untuned"}
        for row in rows:
            key = (family, data, pe, adaptation_key(row))
            video = bool(row.get("frames"))  # a video run: columns are (frames, res)
            col = (int(row["frames"]), int(row["res"])) if video else loop.parse_size(row["res"])
            train = (int(row["train_frames"]), int(row["train_res"])) if video else int(row["train_res"])
            entry = table.setdefault(key, {"acc": {}, "ret": {}, "params": results["params"], "img_s": [],
                                           "train_res": train, "seeds": set(), "num_classes": record["num_classes"],
                                           "last_two": [], "made_by": {}})
            entry["acc"].setdefault(col, []).append(float(row["acc"]))
            if row["adaptation"] in TUNE:
                entry["knob"] = row.get("knob", "")
            if row["adaptation"] == "tuned":
                choice = knob_choice(row.get("knob_value", ""), trained.get((row.get("protocol"), row["res"]), ""))
                entry.setdefault("choice", {}).setdefault(col, []).append(choice)
            entry["ret"].setdefault(col, []).append(metrics.read_retention(row["retention"]))
            if seed not in entry["seeds"]:
                entry["seeds"].add(seed)
                entry["img_s"].append(results["train_img_per_s"])
                entry["made_by"][seed] = (machine_of(record, "train"), machine_of(record, "sweep"))
                entry.setdefault("wall_s", {})[seed] = sum(v or 0.0 for v in (record.get("wall_s") or {}).values())
                if last_two:
                    entry["last_two"].append(last_two)
    return table


def last_two_epochs(epochs: list[dict]) -> tuple[float, float] | None:
    """The validation top-1 (%) at the training size after a run's last two epochs (``epochs``: its epoch metrics,
    :func:`visionpe.train.metrics.epochs`): whether its budget reached a plateau; None for a run of one epoch."""
    return (epochs[-2]["val_acc"], epochs[-1]["val_acc"]) if len(epochs) >= 2 else None


def adaptation_key(row: dict) -> str:
    """A sweep row's adaptation, with its evaluation protocol unless that is ``resize`` (the default, unmarked):
    ``pi``, ``pi/crop``, ``crop`` (the ``default`` adaptation under crop)."""
    protocol = row.get("protocol") or "resize"
    if protocol == "resize":
        return row["adaptation"]
    return protocol if row["adaptation"] == "default" else f"{row['adaptation']}/{protocol}"


def knob_choice(value: str, trained: str) -> str:
    """A chosen knob value as the report shows it: a factor on the trained value for a number (``x4``, ``x1``: the
    trained one), else the value itself (``yarn``)."""
    try:
        factor = float(value) / float(trained)
    except (ValueError, ZeroDivisionError):
        return value
    return f"x{factor:.3g}"


def tune_of(adaptation: str) -> str | None:
    """``untuned`` or ``tuned`` for an adaptation of LookHere's protocol (``tuned``, ``tuned/crop``), else None."""
    part = adaptation.split("/")[0]
    return part if part in TUNE else None


def tune_label(pe: str, adaptation: str) -> str:
    """A row of LookHere's protocol as its table names it: untuned as the run's own (``pe``, ``pe [crop]``), tuned
    marked (``pe [tuned]``, ``pe [tuned/crop]``)."""
    protocol = adaptation.partition("/")[2]
    return label(pe, protocol or "default") if tune_of(adaptation) == "untuned" else f"{pe} [{adaptation}]"


def label(pe: str, adaptation: str) -> str:
    return pe if adaptation == "default" else f"{pe} [{adaptation}]"
