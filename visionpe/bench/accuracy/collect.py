"""The finished runs of a benchmark gathered into one table: each run's sweep (``run/sweep/sweep.csv``) and its
results (through :mod:`visionpe.train.metrics`), keyed by (family, data, encoding or row, adaptation)."""
from __future__ import annotations

import csv
from pathlib import Path

from ...cli import UserError
from ...train import loop, metrics

def finished_runs_or_refuse(runs: list[Path], out: Path, doc: Path) -> list[Path]:
    """The planned runs that are finished and swept; none is a :class:`UserError` that leaves ``doc`` as it is (a
    wrong ``--out``, or every run failed): a report never replaces its tables with empty ones."""
    done = [run for run in runs if (run / "sweep" / "sweep.csv").is_file() and (run / metrics.RESULTS).is_file()]
    if not done:
        raise UserError(f"no finished runs under --out {out} (of {len(runs)} planned, e.g. {runs[0]}); {doc} is left "
                        "as it is (check --out, or the logs of the runs)")
    return done


def collect(runs: list[tuple[str, str, str, int, Path]]) -> dict:
    """{(family, data, pe, adaptation): {'acc': {res: [per seed]}, 'ret': ..., 'params', 'img_s', 'epochs'}}"""
    table = {}
    for family, data, pe, seed, run in runs:
        sweep = run / "sweep" / "sweep.csv"
        if not sweep.is_file():
            continue
        results = metrics.read_results(run)
        with open(sweep) as f:
            for row in csv.DictReader(f):
                key = (family, data, pe, adaptation_key(row))
                video = bool(row.get("frames"))  # a video run: columns are (frames, res)
                col = (int(row["frames"]), int(row["res"])) if video else loop.parse_size(row["res"])
                train = (int(row["train_frames"]), int(row["train_res"])) if video else int(row["train_res"])
                entry = table.setdefault(key, {"acc": {}, "ret": {}, "params": results["params"], "img_s": [],
                                               "train_res": train, "seeds": set()})
                entry["acc"].setdefault(col, []).append(float(row["acc"]))
                entry["ret"].setdefault(col, []).append(float(row["retention"]))
                if seed not in entry["seeds"]:
                    entry["seeds"].add(seed)
                    entry["img_s"].append(results["train_img_per_s"])
    return table


def adaptation_key(row: dict) -> str:
    """A sweep row's adaptation, with its evaluation protocol unless that is ``resize`` (the default, unmarked):
    ``pi``, ``pi/crop``, ``crop`` (the ``default`` adaptation under crop)."""
    protocol = row.get("protocol") or "resize"
    if protocol == "resize":
        return row["adaptation"]
    return protocol if row["adaptation"] == "default" else f"{row['adaptation']}/{protocol}"


def label(pe: str, adaptation: str) -> str:
    return pe if adaptation == "default" else f"{pe} [{adaptation}]"
