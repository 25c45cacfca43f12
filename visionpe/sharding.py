"""Encodings whose parameters are sharded (FSDP2's ``fully_shard``): what they read outside the shard owner's forward.

Inside the forward of a module that ``fully_shard`` wraps, its parameters are whole tensors (FSDP gathers them first);
everywhere else (an encoding's ``pair_map``, ``position_vectors``, ``frequency_vectors``, ``score_mod`` called by a
parent module, a method called on its own) they are :class:`~torch.distributed.tensor.DTensor` shards, which
``F.interpolate``, ``grid_sample``, ``einsum`` with a plain tensor and a ``Linear`` on a plain input refuse, or
worse, compute on the local shard. Encodings read their parameters through :func:`full_tensor` (a differentiable
all-gather: every rank of the mesh must make the same call) and run their MLPs through :func:`call_gathered`, so a
table is always computed from whole tensors; :class:`~visionpe.cache.TableCache` never keeps a table built from
shards (:func:`any_sharded`), so no cache holds a DTensor or a table that outlives the gathered values it came from.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable

import torch
from torch import nn


def _dtensor_module():
    """PyTorch's DTensor module: ``torch.distributed.tensor`` from torch 2.4 on, ``torch.distributed._tensor`` before
    it; None where torch is built without distributed support."""
    if not torch.distributed.is_available():
        return None
    try:
        import torch.distributed.tensor as module
        module.DTensor  # noqa: B018  (torch < 2.4 has the package without the public names)
    except (ImportError, AttributeError):
        import torch.distributed._tensor as module
    return module


_DTENSOR = _dtensor_module()
DTensor = None if _DTENSOR is None else _DTENSOR.DTensor


def is_sharded(t) -> bool:
    """Whether ``t`` is a DTensor (a parameter as FSDP2 keeps it between forwards)."""
    return DTensor is not None and isinstance(t, DTensor)


def any_sharded(tensors: Iterable) -> bool:
    return any(is_sharded(t) for t in tensors)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a whole plain tensor: a DTensor gathered (differentiable: its gradient goes back to the shards), any
    other tensor as it is."""
    return t.full_tensor() if is_sharded(t) else t


def built_class(module: nn.Module) -> type:
    """The class ``module`` was built as: ``fully_shard`` swaps a module's class for a new subclass of FSDP's
    ``FSDPModule`` and that class (``FSDPVisionTransformerPE``); what an adapter registered is the latter."""
    cls = type(module)
    fsdp_module = _fsdp_module_class()
    if fsdp_module is not None and len(cls.__bases__) == 2 and cls.__bases__[0] is fsdp_module:
        return cls.__bases__[1]
    return cls


def _fsdp_module_class():
    """FSDP2's ``FSDPModule`` where torch has it (public from 2.6, ``torch.distributed._composable.fsdp`` in 2.4-2.5),
    else None."""
    if not torch.distributed.is_available():
        return None
    for path in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        module = sys.modules.get(path)  # never imported here: a model can only be sharded once FSDP is loaded
        if module is not None and hasattr(module, "FSDPModule"):
            return module.FSDPModule
    return None


def call_gathered(module: nn.Module, *args):
    """``module(*args)`` with its sharded parameters gathered for the call (an encoding's MLP or convolution read
    outside its shard owner's forward); a module without sharded parameters is called as it is."""
    sharded = {name: full_tensor(p) for name, p in module.named_parameters() if is_sharded(p)}
    if not sharded:
        return module(*args)
    return torch.func.functional_call(module, sharded, args)


@torch.no_grad()
def assign_(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Write the whole tensor ``value`` into ``param`` in place: into a plain parameter as it is, into a sharded one
    (initialising a model that was sharded on the meta device) its own shard of ``value``, laid out as ``param``'s."""
    if is_sharded(param):  # a collective (the shards are scattered from rank 0's value): every rank calls it
        value = _DTENSOR.distribute_tensor(value.to(param.device, param.dtype), param.device_mesh, param.placements)
        param.to_local().copy_(value.to_local())
        return param
    return param.copy_(value)


def reset_module(module: nn.Module) -> None:
    """``module.reset_parameters()`` (a ``Linear``, ``LayerNorm``, ...) drawn on whole tensors, as on an unsharded
    module, then written into its shards (:func:`assign_`): the values do not depend on how it is sharded."""
    sharded = {name: p for name, p in module.named_parameters(recurse=False) if is_sharded(p)}
    if not sharded:
        module.reset_parameters()
        return
    for name, p in sharded.items():
        module._parameters[name] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=p.to_local().device))
    try:
        module.reset_parameters()
        whole = {name: module._parameters[name] for name in sharded}
    finally:
        module._parameters.update(sharded)
    for name, p in sharded.items():
        assign_(p, whole[name].detach())


def check_unsharded(module: nn.Module, what: str) -> None:
    """``what`` replaces ``module``'s parameters, which FSDP's sharded ones cannot be: a ``ValueError`` saying to do it
    before sharding."""
    if any_sharded(module.parameters()):
        raise ValueError(f"{type(module).__name__}.{what}() replaces parameters, but they are sharded (FSDP): "
                         f"{what} the model before visionpe.train.parallel.parallelize, or the exported weights")
