"""A run's processes: joining the torchrun group (:func:`start`), the collectives the training loop uses, and leaving
the group.

Every tensor handed to a collective here is a buffer this module keeps for the life of the process (a few scalars
per call site), so a collective's worker thread never drops the last reference to a tensor Python has let go of. At
torch 2.1 the gloo worker that did took the GIL to free the tensor, and if the main thread was destroying the group
at that moment (joining that worker while holding the GIL) the run finished its work and then never exited. The
pattern "collective on a temporary tensor, barrier, ``destroy_process_group``", repeated by 2 processes under load,
hung at torch 2.1.2 (not at 2.14); with kept buffers it did not.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..cli import UserError
from .settings import TrainSettings

_kept: dict[tuple, torch.Tensor] = {}


def _kept_buffer(role: str, like: torch.Tensor) -> torch.Tensor:
    """The kept buffer of ``role`` with ``like``'s shape, dtype and device (its values are stale)."""
    key = (role, tuple(like.shape), like.dtype, like.device)
    if key not in _kept:
        _kept[key] = torch.empty_like(like)
    return _kept[key]


@dataclass(frozen=True)
class Processes:
    """This process among the run's: ``world`` processes (torchrun's ``WORLD_SIZE``, 1 without it), this one's
    ``rank`` and ``local_rank``, and its ``device``."""

    world: int
    rank: int
    local_rank: int
    device: torch.device

    @property
    def master(self) -> bool:
        """Rank 0: the process that writes the run directory and reports."""
        return self.rank == 0


def start(settings: TrainSettings) -> Processes:
    """Join the torchrun group of a run (gloo on the CPU, nccl on CUDA; none for one process), pick this process's
    device (``device``: auto = CUDA when there is one) and set its threads (``threads``, 0 = torch's choice). The
    global ``batch_size`` must split evenly over the processes. ``parallel: fsdp`` on one process is a group of one
    (an in-memory store, or the group already there): the same sharded model and checkpoints as on several."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if settings.batch_size % world:
        raise UserError(f"batch_size {settings.batch_size} must be divisible by the {world} processes")
    use_cuda = settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available())
    if world > 1:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    elif settings.parallel == "fsdp" and not active():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    return Processes(world, dist.get_rank() if world > 1 else 0, local_rank, device)


def active() -> bool:
    """Whether this process is in a torchrun process group."""
    return dist.is_available() and dist.is_initialized()


def sum_over_processes(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the processes of the group: a new tensor of ``t``'s shape (``t`` itself without a
    group); ``t`` is not changed."""
    if not active():
        return t
    buffer = _kept_buffer("sum", t).copy_(t)
    dist.all_reduce(buffer)
    return buffer.clone()


def all_sum(values, device) -> list[float]:
    """The sum of the float ``values`` over the processes of the group (the values themselves without one)."""
    return sum_over_processes(torch.tensor(values, dtype=torch.float64, device=device)).tolist()


def all_gather(values, device) -> list[list[float]]:
    """The float ``values`` of every process of the group, by rank (``[values]`` without one)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if not active():
        return [t.tolist()]
    mine = _kept_buffer("gather", t).copy_(t)
    out = [_kept_buffer(f"gather from {rank}", t) for rank in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [o.tolist() for o in out]


def rank0_value(value):
    """Rank 0's ``value`` (any picklable object: a run folder's name, say) on every process of the group (``value``
    without one)."""
    if not active():
        return value
    shared = [value]
    dist.broadcast_object_list(shared, 0)
    return shared[0]


def rank0_flag(flag: bool, device) -> bool:
    """Rank 0's ``flag`` on every process of the group (``flag`` without one)."""
    if not active():
        return flag
    buffer = _kept_buffer("flag", torch.empty(1, dtype=torch.bool, device=device)).fill_(flag)
    dist.broadcast(buffer, 0)
    return bool(buffer.item())


def leave() -> None:
    """Meet every process of the group, then destroy the group (nothing without one).

    Free a ``DistributedDataParallel`` wrapper before (its reducer holds the group, which would then be destroyed
    whenever the wrapper is collected, not here)."""
    if not active():
        return
    dist.barrier()
    dist.destroy_process_group()
