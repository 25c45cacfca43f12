"""Every committed benchmark report rebuilt from its records alone, so that the records and the reports never drift.

    python -m visionpe.bench.rebuild docs            # check: rebuild each in a temporary copy, name those that differ
    python -m visionpe.bench.rebuild docs --write    # rebuild each in place (after copying in a GPU's records)

A records folder of an accuracy benchmark (``visionpe benchmark``, ``visionpe small-folder-benchmark``,
``visionpe convert-benchmark``) is
``<doc's folder>/data/<doc's name, lower case>/<part>/``; beside the runs' records it holds the ``invocation.json``
of the invocation that ran last, whose command made the doc's part. The same command with ``--report-only``, the
doc and the records given there and the runs' folder in a temporary place, rebuilds the part from the records
alone: in a copy of the doc (the check: the part must come out byte for byte as committed) or in place
(``--write``). The part is the doc's marked part ``<!-- BEGIN part -->`` when it has one, else the whole doc (the
whole report of ``visionpe benchmark`` without ``--rows``). The speed report (``visionpe bench-speed``) keeps
its records likewise (``docs/reports/data/performance/speed/``, each record's hand-written reading ``NAME.md``
beside its ``NAME.json``); its invocation is the ``--report-only`` command that made the report from them.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from ..cli import UserError
from ..cli.report import markers

INVOCATION = "invocation.json"  # a records folder's: the command and wall time of the invocation that ran last
PLACED = ("--doc", "--records", "--out")  # where an invocation's doc, records and runs are: given anew on rebuild
SOURCES = ("--report-only", "--collect-only")  # what an invocation read its results from: the records, on rebuild


DOC_FLAG = {"bench-speed": "--out"}  # a command's flag naming its doc, where that is not --doc


def commands() -> dict:
    """``{visionpe command: its main(argv)}`` of the benchmarks whose reports are made from records."""
    from .accuracy import cli, conversion, small_folder
    from .speed import cli as speed
    return {"benchmark": cli.main, "small-folder-benchmark": small_folder.main, "convert-benchmark": conversion.main,
            "bench-speed": speed.main}


def invocations(root: Path) -> list[Path]:
    """The ``invocation.json`` of every records folder under ``root`` (``.../data/<doc>/<part>/``), sorted."""
    return sorted(Path(root).glob(f"**/data/*/*/{INVOCATION}"))


def report_only_argv(command: str, doc: Path, records: Path, out: Path) -> tuple[str, list[str]]:
    """``(visionpe command, its arguments)`` that rebuild the report of ``command`` (an invocation's) from its
    records alone: the same arguments with ``--report-only`` (in place of ``--collect-only``), the doc ``doc``, the
    records ``records`` and the runs' folder ``out`` (those of the command dropped); the training arguments after
    ``--`` kept. A speed report's command (``bench-speed --report-only RECORD... --out DOC``) names its records: the
    same names in ``records``, the doc ``doc``."""
    words = shlex.split(command)
    if words[:1] != ["visionpe"] or len(words) < 2 or words[1] not in commands():
        raise UserError(f"invocation command {command!r} is not one of visionpe {', '.join(commands())}")
    argv = words[2:]
    if words[1] == "bench-speed":
        named = argv[argv.index("--report-only") + 1:] if "--report-only" in argv else []
        named = named[:next((i for i, word in enumerate(named) if word.startswith("--")), len(named))]
        if not named:
            raise UserError(f"invocation command {command!r} names no speed record after --report-only")
        return words[1], ["--report-only", *(str(records / Path(name).name) for name in named), "--out", str(doc)]
    cut = argv.index("--") if "--" in argv else len(argv)
    kept, skip = [], False
    for word in argv[:cut]:
        if skip:
            skip = False
        elif word in PLACED:
            skip = True
        elif word not in SOURCES and not word.startswith(tuple(f"{flag}=" for flag in PLACED)):
            kept.append(word)
    return words[1], [*kept, "--report-only", "--doc", str(doc), "--records", str(records), "--out", str(out),
                      *argv[cut:]]


def doc_of(invocation: Path) -> Path:
    """The doc a records folder belongs to: the ``--doc`` (:data:`DOC_FLAG`) of its invocation's command, in the
    folder above ``data/`` (``docs/reports/data/benchmark/wave/invocation.json``: ``docs/reports/BENCHMARK.md``)."""
    words = shlex.split(json.loads(invocation.read_text())["command"])
    flag = DOC_FLAG.get(words[1] if len(words) > 1 else "", "--doc")
    named = [b for a, b in zip(words, words[1:]) if a == flag] + \
        [w.partition("=")[2] for w in words if w.startswith(f"{flag}=")]
    if not named:
        raise UserError(f"{invocation}: its command gives no {flag}, so no committed report is made from these "
                        "records")
    return invocation.parents[3] / Path(named[-1]).name


def part_text(text: str, part: str) -> str:
    """The marked part ``part`` of a doc's ``text`` when it has one, else the whole text."""
    begin, end = markers(part)
    if begin not in text:
        return text
    return text[text.index(begin):text.index(end, text.index(begin)) + len(end)]


def rebuild(invocation: Path, doc: Path, records: Path, out: Path) -> None:
    """Rebuild ``doc``'s part from ``records`` (a copy of ``invocation``'s folder, or that folder), the runs'
    folder ``out`` (temporary: nothing is run)."""
    name, argv = report_only_argv(json.loads(invocation.read_text())["command"], doc, records, out)
    commands()[name](argv)


def check(invocation: Path, tmp: Path) -> tuple[str, str]:
    """``(committed, rebuilt)``: the part of the doc of ``invocation``'s records as committed, and as rebuilt from a
    copy of the records in ``tmp`` (the doc copied there too, so the committed one is left as it is)."""
    doc, records = doc_of(invocation), invocation.parent
    copy = tmp / "data" / records.parent.name / records.name
    shutil.copytree(records, copy)
    shutil.copy(doc, tmp / doc.name)
    rebuild(invocation, tmp / doc.name, copy, tmp / "runs")
    return tuple(part_text(path.read_text(), records.name) for path in (doc, tmp / doc.name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m visionpe.bench.rebuild", description=__doc__.partition("\n\n")[0])
    p.add_argument("root", type=Path, help="folder searched for records folders (e.g. docs)")
    p.add_argument("--write", action="store_true", help="rebuild each report in place instead of checking it")
    args = p.parse_args(argv)
    found, differ = invocations(args.root), []
    for invocation in found:
        with tempfile.TemporaryDirectory() as tmp:
            if args.write:
                rebuild(invocation, doc_of(invocation), invocation.parent, Path(tmp) / "runs")
                continue
            committed, rebuilt = check(invocation, Path(tmp))
            if committed != rebuilt:
                differ.append(invocation.parent)
    for folder in differ:
        print(f"{folder}: its report is not what its records rebuild", file=sys.stderr)
    print(f"{len(found)} records folders under {args.root}, {len(differ)} whose report differs"
          + (" (rebuilt in place)" if args.write else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
