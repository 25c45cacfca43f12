"""Timing side by side: interleaved rounds of calls, medians, compiled first calls, error cells."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .plan import Plan, Setup

CONTROL = " (control)"


@dataclass
class Run:
    """What every part needs: the device, the timing settings, the sizes and the encodings to compare."""

    device: torch.device
    repeats: int
    min_run_time: float
    plan: Plan
    pes: list[str]
    scale_repeats: int = 1
    compile_pairs: tuple[str, ...] = ("learned", "swin_bias")
    slow_repeats: int = 5
    steps: dict = field(default_factory=dict)  # setup label -> the training steps shared by train and memory

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def side_by_side(self, fns: dict, repeats: int | None = None) -> dict[str, float]:
        """Median seconds per call of each function, measured round-robin ``repeats`` times after one warm-up
        call each (caches, allocator, compilation)."""
        times = {name: [] for name in fns}
        for fn in fns.values():
            fn(), self.sync()
        for _ in range(repeats or self.repeats):
            for name, fn in fns.items():
                times[name].append(self.time_per_call(fn))
        return {name: statistics.median(t) for name, t in times.items()}

    def time_per_call(self, fn) -> float:
        """Mean seconds per call of a block of calls lasting at least ``min_run_time`` (at least one call)."""
        calls, start = 0, time.perf_counter()
        while True:
            fn(), self.sync()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= self.min_run_time:
                return elapsed / calls

    def rounds(self, setup: Setup) -> int:
        """``slow_repeats`` for a slow setup (ViT-S/16 and the ViT-S/16 video: a call lasts longer than
        ``min_run_time``, so a round is one call), ``repeats`` otherwise."""
        return self.slow_repeats if setup.slow else self.repeats

    def models(self, setup: Setup, pes: list[str] | None = None) -> dict[str, torch.nn.Module]:
        """``none``, ``none (control)`` (a second, identical model) and each encoding of ``pes`` (default
        ``--pes``)."""
        names = ["none", "none" + CONTROL, *(self.pes if pes is None else pes)]
        return {name: setup.create(name.removesuffix(CONTROL), self.device) for name in names}

    def train_steps(self, setup: Setup) -> dict[str, TrainStep]:
        """A :class:`TrainStep` per model of :meth:`models`, made once and shared by the train and memory parts
        (after the train part's steps, the memory part needs no warm-up step)."""
        if setup.label not in self.steps:
            x, y = setup.input(self.device), setup.labels(self.device)
            self.steps[setup.label] = {pe: TrainStep(m, x, y) for pe, m in self.models(setup).items()}
        return self.steps[setup.label]


def timed_or_error(run: Run, fns: dict, repeats: int | None = None) -> dict:
    """Times the callable entries side by side; error strings are kept as they are."""
    callables = {k: f for k, f in fns.items() if callable(f)}
    times = run.side_by_side(callables, repeats) if callables else {}
    return {k: times.get(k, f) for k, f in fns.items()}


def allow_recompiles(limit: int = 64) -> None:
    """One compiled graph per model on the same ``forward``: raise dynamo's recompile limit (default 8) so that no
    model falls back to eager."""
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def compiled(fn, *inputs):
    """``(call, seconds)``: ``torch.compile(fn, fullgraph=True, dynamic=False)`` compiled by a first call on
    ``inputs`` (the seconds it took) and ``call()`` running it again, both without gradients; ``(error text,
    seconds)`` when compiling fails."""
    compiled_fn = torch.compile(fn, fullgraph=True, dynamic=False)

    def call():
        with torch.no_grad():  # always: a call with gradients on would compile a second graph
            return compiled_fn(*inputs)

    return first_call(call)


def first_call(call) -> tuple:
    """``(call, seconds)`` after calling ``call()`` once (for a compiled function: compilation and one call), or
    ``(error text, seconds)`` when that first call raises."""
    start = time.perf_counter()
    try:
        call()
    except Exception as error:  # a failing encoding is a row of the table, not the end of the run
        return error_text(error), time.perf_counter() - start
    return call, time.perf_counter() - start


def error_text(error: Exception) -> str:
    """``error: Type: first line of the message`` (120 characters at most), fit for a table cell."""
    first = (str(error).strip().splitlines() or [""])[0][:120].replace("|", "/")
    return f"error: {type(error).__name__}: {first}"



class TrainStep:
    """One training step of ``model`` on a fixed batch: forward, cross-entropy, backward, AdamW step, gradients
    set to None (so gradients are not held between steps)."""

    def __init__(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
        self.model, self.x, self.y = model.train(), x, y
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def __call__(self) -> None:
        F.cross_entropy(self.model(self.x), self.y).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def held_bytes(self) -> int:
        """Bytes held between steps: parameters, buffers, optimizer state and the batch (distinct storages)."""
        tensors = [*self.model.parameters(), *self.model.buffers(), self.x, self.y]
        tensors += [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())


