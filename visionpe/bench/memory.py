"""Section ``memory``: peak memory of the training step per encoding vs none."""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from .tables import Table, megabytes, versus
from .timing import Run


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensor storages that operators allocate while the mode is on and that are still alive, and
    their peak. Views and in-place results share their input's storage and are not counted again; a storage is
    forgotten when it is freed. Buffers a kernel allocates internally and frees before returning are not seen."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._known = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage.data_ptr() not in inputs and storage not in self._known:
                    self._allocated(storage)
        return out

    def _allocated(self, storage) -> None:
        nbytes = storage.nbytes()
        self._known[storage] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, nbytes)

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


def step_peak_bytes(step, device: torch.device) -> int:
    """Peak bytes allocated during one call of ``step`` above what was allocated before it: on CUDA from the
    caching allocator's statistics, on CPU from :class:`LiveTensorBytes`."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
    with LiveTensorBytes() as tracker:
        step()
    return tracker.peak


def memory_cost(run: Run) -> list[Table]:
    """Peak memory of a training step (after a warm-up step that creates the optimizer state) vs none."""
    if run.device.type == "cuda":
        what = ("`torch.cuda.max_memory_allocated` during one step minus `memory_allocated` before it (after "
                "`reset_peak_memory_stats`)")
    else:
        what = ("the peak, during one step, of the bytes of tensor storages that operators allocated in that step and "
                "that were still alive (a `TorchDispatchMode` over every operator, forward, backward and optimizer; "
                "views and in-place results not counted twice; exact and deterministic, but scratch buffers that a "
                "kernel frees before returning are not seen)")
    tables = []
    for setup in (run.plan.vit, run.plan.tiny):
        peaks, held = {}, {}
        for pe, step in run.train_steps(setup).items():
            if not step.optimizer.state:  # a first step (none if the train section ran): the optimizer state exists
                step()
            peaks[pe] = step_peak_bytes(step, run.device)
            held[pe] = (megabytes(step.held_bytes()),)
        tables.append(versus(f"Training step peak memory: {setup.label}, batch {setup.batch}", peaks, "none",
                             "step peak MB", megabytes, lambda pe: 1.05, extra=(["held MB"], held),
                             note=f"Step peak: {what}. Held: parameters, buffers, AdamW state and the batch, held "
                                  f"before and after the step (not in the step peak)."))
    return tables


