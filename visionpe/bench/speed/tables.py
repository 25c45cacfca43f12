"""The report's tables: one ratio table against a baseline, with the control row's noise and the targets."""
from __future__ import annotations

from dataclasses import dataclass

from ...cli.report import markdown_table
from .timing import CONTROL

MB = 2 ** 20


@dataclass
class Table:
    """One markdown table of the report, with the sentence under it."""

    title: str
    header: list[str]
    rows: list[tuple]
    note: str | None = None

    def markdown(self) -> str:
        table = markdown_table(self.header, self.rows)
        return f"**{self.title}**\n\n{table}" + (f"\n\n{self.note}" if self.note else "")


def encoding_limit(name: str) -> float:
    """The issue's target ratio to ``none``: 1.10 for PEG (a convolution per forward), 1.05 otherwise."""
    return 1.10 if name == "peg" else 1.05


def versus(title: str, values: dict, base: str, unit: str, fmt, limit=None, note: str | None = None,
           extra: tuple[list[str], dict] | None = None, name: str = "pe") -> Table:
    """The shared "ratio table vs baseline": one row per entry of ``values`` (name -> seconds or bytes, or an error
    string) with its value (``fmt``), its ratio to ``values[base]`` and, when ``limit(name)`` gives a target ratio,
    whether it is met. ``extra = (headers, {name: cells})`` adds columns; a ``... (control)`` row adds the noise
    sentence."""
    header = [name, unit, f"vs {base}"] + (["target"] if limit else []) + (extra[0] if extra else [])
    rows = []
    for key, value in values.items():
        ok = not isinstance(value, str) and not isinstance(values[base], str)
        ratio = value / values[base] if ok else None
        row = [key, value if isinstance(value, str) else fmt(value), f"{ratio:.3f}x" if ratio is not None else "-"]
        if limit:
            row.append(target_cell(key, base, ratio, limit))
        rows.append(tuple(row + list(extra[1].get(key, ()) if extra else [])))
    control = base + CONTROL
    if control in values and not isinstance(values[control], str) and not isinstance(values[base], str):
        gap = abs(values[control] / values[base] - 1) * 100
        noise = (f"`{control}` repeats `{base}` with a second, identical model or op: its {gap:.1f} % gap is the "
                 f"noise of this run; smaller differences are within noise.")
        note = noise + (f" {note}" if note else "")
    return Table(title, header, rows, note)


def target_cell(key: str, base: str, ratio: float | None, limit) -> str:
    if key == base:
        return "baseline"
    if key.endswith(CONTROL):
        return "noise"
    if ratio is None:
        return "-"
    bound = limit(key)
    return f"{'met' if ratio <= bound else 'NOT met'} (<= {bound:.2f}x)"


def ms(seconds) -> str:
    return f"{seconds * 1e3:.1f}" if seconds >= 0.01 else f"{seconds * 1e3:.3f}"


def megabytes(nbytes) -> str:
    return f"{nbytes / MB:.1f}"


