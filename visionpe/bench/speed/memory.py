"""Part ``memory``: peak memory of the training step per encoding vs none."""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from ..._compat import tree_leaves
from .tables import Table, megabytes, versus
from .timing import Run


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensor storages that operators allocate while the mode is on and that are still alive, and
    their peak. Views and in-place results share their input's storage and are not counted again; a storage is
    forgotten when it is freed. Buffers a kernel allocates internally and frees before returning are not seen.

    A storage's freeing is seen through a C++ weak reference to it, checked before each operator's outputs are
    counted (a peak is only reached at an allocation) and when ``live`` is read: a finalizer on the Python storage
    object would not do, as that object is a fresh one per ``untyped_storage()`` call in torch 2.1 (torch 2.2 made it
    live as long as the storage)."""

    def __init__(self):
        super().__init__()
        self.peak = self._live = 0
        self._known: dict[int, tuple[StorageWeakRef, int]] = {}  # data_ptr: (weak reference, nbytes), not yet freed

    @property
    def live(self) -> int:
        self._forget_freed()
        return self._live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        self._forget_freed()  # before counting: a freed storage's address can be a new one's
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                address, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and address not in inputs and address not in self._known:
                    self._known[address] = (StorageWeakRef(storage), nbytes)
                    self._live += nbytes
                    self.peak = max(self.peak, self._live)
        return out

    def _forget_freed(self) -> None:
        freed = [address for address, (ref, _) in self._known.items() if ref.expired()]
        for address in freed:
            self._live -= self._known.pop(address)[1]


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
            if not step.optimizer.state:  # a first step (none if the train part ran): the optimizer state exists
                step()
            peaks[pe] = step_peak_bytes(step, run.device)
            held[pe] = (megabytes(step.held_bytes()),)
        tables.append(versus(f"Training step peak memory: {setup.label}, batch {setup.batch}", peaks, "none",
                             "step peak MB", megabytes, lambda pe: 1.05, extra=(["held MB"], held),
                             note=f"Step peak: {what}. Held: parameters, buffers, AdamW state and the batch, held "
                                  f"before and after the step (not in the step peak)."))
    return tables


