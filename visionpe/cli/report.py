"""The one writer of result tables, figures and report documents: markdown and plain-text tables, the accuracy vs
resolution figure, marked parts of a document, mean ± std over seeds and the seed-spread rule, shared by training,
the sweep, the accuracy benchmarks and the speed benchmark.

A document part written by a command sits between ``<!-- BEGIN name -->`` and ``<!-- END name -->``; writing a
part replaces only that part (or appends it), so several commands share one document. Every write is atomic
(:func:`visionpe.weights.write_text`).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..weights import write_text


def markdown_table(header: list[str], rows: list) -> str:
    """A markdown table: ``| a | b |``, a separator line, one line per row (cells as ``str``)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def text_table(rows: list[list], header: list[str]) -> str:
    """A plain-text table for a terminal: right-aligned columns under a dashed rule."""
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))
    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation of the values that are not None (NaN, NaN for none; std 0 for one)."""
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def spread_text(values, digits: int = 1) -> str:
    """``"mean ± std"`` of the values that are not None (:func:`mean_std`), the spread ``n/a`` over fewer than two:
    one seed has no spread, and ``± 0.0`` would claim one."""
    mean, std = mean_std(values)
    known = sum(v is not None for v in values)
    return f"{mean:.{digits}f} ± " + (f"{std:.{digits}f}" if known > 1 else "n/a")


ONE_SEED = "one seed"  # spread_gap's word when a sample has no spread: neither within nor beyond it


def spread_gap(a, b) -> tuple[float, str]:
    """``(mean_a - mean_b, word)`` of two samples (values over seeds; None left out): ``"beyond"`` the seed spread
    when ``|gap| > std_a + std_b``, ``"within"`` it otherwise, :data:`ONE_SEED` when either sample has fewer than two
    values (no spread to compare with: a gap over one seed is never called beyond it)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    if min(sum(v is not None for v in a), sum(v is not None for v in b)) < 2:
        return ma - mb, ONE_SEED
    return ma - mb, "beyond" if abs(ma - mb) > sa + sb else "within"


def markers(name: str) -> tuple[str, str]:
    """The lines that open and close the part ``name`` of a document."""
    if not re.fullmatch(r"[\w.-]+", str(name)):
        raise ValueError(f"part name must be letters, digits, '_', '.', '-', got {name!r}")
    return f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"


def write_part(doc: Path, name: str, text: str) -> None:
    """Put ``text`` (which starts with ``<!-- BEGIN name -->`` and ends with ``<!-- END name -->``) in place of that
    marked part of ``doc``, or append it when absent; the rest of the file is left as it is."""
    begin, end = markers(name)
    if not (text.startswith(begin) and text.rstrip("\n").endswith(end)):
        raise ValueError(f"part text must start with {begin!r} and end with {end!r}")
    doc = Path(doc)
    old = doc.read_text() if doc.is_file() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    new = pattern.sub(lambda _: text.rstrip("\n") + "\n", old, count=1) if pattern.search(old) else \
        old.rstrip("\n") + ("\n\n" if old else "") + text.rstrip("\n") + "\n"
    write_text(doc, new)


def marked_parts(doc: Path) -> list[str]:
    """Every marked part of ``doc`` (with its markers), in order; none when the file does not exist."""
    doc = Path(doc)
    if not doc.is_file():
        return []
    return [m.group(0) for m in re.finditer(r"<!-- BEGIN ([\w.-]+) -->.*?<!-- END \1 -->\n?", doc.read_text(), re.S)]


def write_document(doc: Path, text: str) -> None:
    """Write ``text`` as ``doc``, keeping the marked parts that other commands wrote into the old file (at the
    end, in their order)."""
    kept = marked_parts(doc)
    for block in kept:
        text = text.rstrip("\n") + "\n\n" + block.rstrip("\n") + "\n"
    write_text(doc, text)


def keep_hand_written(doc: Path, text: str, heading: str) -> None:
    """Write ``text`` as ``doc``, keeping the hand-written part of the old file from the line ``heading`` on."""
    doc = Path(doc)
    if doc.is_file() and heading in (old := doc.read_text()):
        text = text.rstrip("\n") + "\n\n" + old[old.index(heading):]
    write_text(doc, text)


@dataclass(frozen=True)
class Curve:
    """One line of :func:`accuracy_plot`: top-1 (%) per square test size (pixels), one value per seed, and the
    retention acc(size) / acc(training size) likewise (empty: the figure has no retention panel). Curves of one
    ``group`` share a colour (e.g. an encoding, a run); ``style`` picks the line and marker (a RoPE adaptation:
    ``none``, ``pi``, ``ntk``, ``yarn``; anything else a solid line)."""

    label: str
    acc: dict
    retention: dict = field(default_factory=dict)
    group: str = ""
    style: str = "default"


LINES = {"none": ("-", "o"), "pi": ("--", "s"), "ntk": ("-.", "^"), "yarn": (":", "D")}


MAX_CURVES = 8  # per panel: more are split over further rows of panels, a group's curves kept together


def panels_of(curves: list[Curve], most: int = MAX_CURVES) -> list[list[Curve]]:
    """The curves in rows of at most ``most``, in order, the curves of a group in one row where they fit."""
    rows, groups = [[]], list(dict.fromkeys(c.group for c in curves))
    for group in groups:
        members = [c for c in curves if c.group == group]
        for at in range(0, len(members), most):
            part = members[at:at + most]
            if len(rows[-1]) + len(part) > most:
                rows.append([])
            rows[-1] += part
    return rows


def off_axis(curves: list[Curve]) -> list[str]:
    """The sizes of ``curves`` that :func:`accuracy_plot` cannot draw (non-square: not an ``int``), as text
    (``"32x48"``: a ``(height, width)`` key or the text a CSV row holds)."""
    return sorted({"x".join(map(str, r)) if isinstance(r, tuple) else str(r)
                   for c in curves for r in c.acc if not isinstance(r, int)})


def accuracy_plot(curves: list[Curve], path: Path, *, train_sizes, title: str) -> bool:
    """Accuracy vs test resolution, the one figure of the sweep and the accuracy benchmarks: top-1 (and, when the
    curves carry it, retention beside it), mean ± std over the values of each size, a dotted line at each training
    size (labelled in the legend). At most :data:`MAX_CURVES` curves a panel: more go to further rows of panels (same
    axes, same colours), each row's legend outside the data, on its right. Non-square sizes (anything but an ``int``)
    have no place on the axis: they are left out, and a line under the figure names them (:func:`off_axis`).
    Returns False (and writes nothing) when there is no curve."""
    if not curves:
        return False
    left_out = off_axis(curves)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("acc", "top-1 (%)")] + ([("retention", "retention acc(res) / acc(train res)")]
                                       if any(c.retention for c in curves) else [])
    parts = panels_of(curves)
    fig, axes = plt.subplots(len(parts), len(panels), figsize=(6.2 * len(panels), 4.6 * len(parts)), squeeze=False,
                             sharex=True, sharey="col")
    groups = list(dict.fromkeys(c.group for c in curves))
    cmap, n = (plt.get_cmap("tab10"), 10) if len(groups) <= 10 else (plt.get_cmap("tab20"), 20)
    colour = {g: cmap(i % n) for i, g in enumerate(groups)}
    sizes = sorted({r for c in curves for r in c.acc if isinstance(r, int)})
    for row, part in zip(axes, parts):
        for ax, (key, ylabel) in zip(row, panels):
            for c in part:
                values = getattr(c, key)
                xs = [r for r in sizes if values.get(r)]
                stats = [mean_std(values[r]) for r in xs]
                linestyle, marker = LINES.get(c.style.split("/")[0], ("-", "o"))
                ax.plot(xs, [m for m, _ in stats], label=c.label, color=colour[c.group], linestyle=linestyle,
                        marker=marker, markersize=4)
                if any(s > 0 for _, s in stats):
                    ax.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], fmt="none", capsize=3,
                                color=colour[c.group])
            for i, size in enumerate(sorted(set(train_sizes))):
                ax.axvline(size, color="grey", linestyle=":", linewidth=1, label=None if i else "training size")
            ax.set_xlabel("test resolution (px)")
            ax.set_ylabel(ylabel)
            ax.set_xticks(sizes)
            ax.tick_params(labelbottom=True)
            ax.grid(alpha=0.3)
        row[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    for i, row in enumerate(axes):
        row[0].set_title(title + (f" ({i + 1}/{len(parts)})" if len(parts) > 1 else ""))
    if left_out:
        fig.text(0.01, 0.0, f"not drawn (non-square, no place on the axis; in the table): {', '.join(left_out)}",
                 fontsize=8, va="top")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True
