"""The collectives of a torchrun group that the training loop uses, and leaving the group.

Every tensor handed to a collective here is a buffer this module keeps for the life of the process (a few scalars
per call site), so a collective's worker thread never drops the last reference to a tensor Python has let go of. At
torch 2.1 the gloo worker that did took the GIL to free the tensor, and if the main thread was destroying the group
at that moment (joining that worker while holding the GIL) the run finished its work and then never exited. The
pattern "collective on a temporary tensor, barrier, ``destroy_process_group``", repeated by 2 processes under load,
hung at torch 2.1.2 (not at 2.14); with kept buffers it did not.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_kept: dict[tuple, torch.Tensor] = {}


def _kept_buffer(role: str, like: torch.Tensor) -> torch.Tensor:
    """The kept buffer of ``role`` with ``like``'s shape, dtype and device (its values are stale)."""
    key = (role, tuple(like.shape), like.dtype, like.device)
    if key not in _kept:
        _kept[key] = torch.empty_like(like)
    return _kept[key]


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
