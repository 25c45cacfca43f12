"""Part ``scale``: large grids at batch 1: forward time and the position tables each encoding uses per forward."""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

import visionpe as vpe
from ...cache import TableCache
from .tables import Table, megabytes, ms, versus
from .plan import Setup, defined_on
from .timing import CONTROL, Run


@dataclass
class ForwardTables:
    """The position tables of one forward: ``tables`` maps a table's identity (its cache and key, or the bias
    module that built it uncached) to ``(bytes, shape)``."""

    calls: int = 0
    built: int = 0
    tables: dict = field(default_factory=dict)
    returned: list = field(default_factory=list)  # storages of the cached tables handed out, in order


class TableCensus:
    """Counts the position tables that a model's encodings use, one forward at a time.

    A table is what an encoding gets from its :class:`~visionpe.cache.TableCache` (position vectors, rotations,
    biases, bias indices; ``built`` when the cache had to compute it) or a bias encoding's ``(heads, T, T)`` output
    computed without a cache (built at every call). A table is identified by its cache and key (or its bias
    module), so a table shared by all blocks counts once and one rebuilt per block counts once per build.
    """

    def __init__(self):
        self.forwards: dict[str, list[ForwardTables]] = {}
        self._current: ForwardTables | None = None
        self._starts: dict[int, int] = {}  # encoding module -> tables handed out before its call

    @contextmanager
    def installed(self, models: dict[str, torch.nn.Module]):
        """Hooks on every encoding of ``models`` and a counting ``TableCache.get`` while the block runs."""
        original = TableCache.get
        census = self

        def get(cache, key, build, params=()):
            fresh = []
            table = original(cache, key, lambda: fresh.append(True) or build(), params)
            census._table(("cache", id(cache), key), table, built=bool(fresh))
            return table

        handles = []
        for model in models.values():
            for module in model.modules():
                if isinstance(module, vpe.Encoding):
                    handles.append(module.register_forward_pre_hook(self._enter))
                if isinstance(module, vpe.BiasEncoding):
                    handles.append(module.register_forward_hook(self._bias_output))
        TableCache.get = get
        try:
            yield self
        finally:
            TableCache.get = original
            for handle in handles:
                handle.remove()

    def run(self, name: str, model: torch.nn.Module, x: torch.Tensor):
        """``model(x)`` with its tables counted under ``name``."""
        self._current = ForwardTables()
        self.forwards.setdefault(name, []).append(self._current)
        try:
            return model(x)
        finally:
            self._current = None

    def _enter(self, module, args) -> None:
        if self._current is not None:
            self._current.calls += 1
            self._starts[id(module)] = len(self._current.returned)

    def _bias_output(self, module, args, output) -> None:
        if self._current is None:
            return
        start = self._starts.pop(id(module), 0)
        if output.untyped_storage().data_ptr() not in self._current.returned[start:]:
            self._table(("bias", id(module)), output, built=True)

    def _table(self, identity, table: torch.Tensor, built: bool) -> None:
        record = self._current
        if record is None:
            return
        record.returned.append(table.untyped_storage().data_ptr())
        record.tables[identity] = (table.untyped_storage().nbytes(), tuple(table.shape))
        record.built += built


def scale_cost(run: Run) -> list[Table]:
    """Forward time (inference, batch 1) and position tables per encoding on the plan's large grids."""
    return [scale_table(run, setup) for setup in run.plan.large]


def scale_table(run: Run, setup: Setup) -> Table:
    """One model at a time (the cached (heads, T, T) tables of several models at 4096 tokens would not fit in memory
    together): a first forward, then ``scale_repeats`` timed ones; ``none (control)`` runs last, so its gap to
    ``none`` shows the drift over the part."""
    x = setup.input(run.device)
    census, times, tokens = TableCensus(), {}, 0
    pes = [pe for pe in run.pes if defined_on(pe, len(setup.size))]  # a video grid has no row of an image-only one
    for name in ["none", *pes, "none" + CONTROL]:
        model = setup.create(name.removesuffix(CONTROL), run.device).eval()
        tokens = setup.tokens(model)
        times[name] = scale_time(run, census, name, model, x)
        del model  # frees its cached tables before the next model
    order = ["none", "none" + CONTROL, *pes]
    cells = {pe: table_cells(census.forwards[pe]) for pe in order}
    return versus(f"Large grid: {setup.label}, {tokens} tokens, batch 1, inference", {pe: times[pe] for pe in order},
                  "none", "ms", ms, extra=(["encoding calls", "tables (1st / next forward)", "built (1st / next)",
                                            "tables MB (1st / next)", "largest", "built once"], cells),
                  note=f"One model after the other, {run.scale_repeats} timed forward(s) after a first one; the "
                       "control runs last. Tables: the distinct position tables the encodings use in the first and in "
                       "a later forward (a cached table is identified by its cache and key, so a table shared by all "
                       "blocks counts once; a learned table at its native size is the parameter itself and is not "
                       "counted), their total size and the largest shape; built: how many of them were computed in "
                       "that forward. Built once (the target): no table is built more than once per forward "
                       "(built <= tables in both forwards).")


def scale_time(run: Run, census: TableCensus, name: str, model: torch.nn.Module, x: torch.Tensor) -> float:
    """Median seconds of the forwards after the first, each one's tables counted under ``name``."""
    with census.installed({name: model}), torch.no_grad():
        return run.side_by_side({name: lambda: census.run(name, model, x)}, run.scale_repeats)[name]


def table_cells(forwards: list[ForwardTables]) -> tuple:
    """Encoding calls, distinct tables, builds and megabytes in the first and the last forward, the largest shape,
    and whether every table was built at most once per forward."""
    first, last = forwards[0], forwards[-1]

    def size(record):
        return megabytes(sum(nbytes for nbytes, _ in record.tables.values()))

    shapes = [shape for _, shape in [*first.tables.values(), *last.tables.values()]]
    largest = "x".join(map(str, max(shapes, key=math.prod))) if shapes else "-"
    once = all(record.built <= len(record.tables) for record in (first, last))
    return (last.calls, f"{len(first.tables)} / {len(last.tables)}", f"{first.built} / {last.built}",
            f"{size(first)} / {size(last)}", largest, "met" if once else "NOT met")


