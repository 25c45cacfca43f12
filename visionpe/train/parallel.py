"""Data parallel training beyond one process: DDP (a full copy of the model per rank) or FSDP2 (each rank holds a
shard of every parameter, gradient and optimizer state), with distributed checkpoints and one-file exports.

- :func:`parallelize` wraps a patched model for ``mode="ddp"`` or ``"fsdp"`` under ``torchrun``. FSDP2
  (``torch.distributed.fsdp.fully_shard``, torch >= 2.6) shards per transformer block
  (:func:`visionpe.backbones.repeated_blocks`) and at the root; each encoding with parameters is a unit of its own
  whose parameters stay float32 under a mixed-precision policy (bf16 parameters, float32 gradient reduction): learned
  frequencies, tables and bias MLPs are position parameters, computed in float32 as without FSDP. Activation
  checkpointing (the model's own, which replays coordinate draws) and ``torch.compile`` per block (DINOv3's order:
  checkpointing, compile, shard) come before sharding. A model built on the meta device is sharded first, then
  materialised on ``device`` and initialised (:func:`visionpe.reset_parameters`), so no rank ever holds it whole.
- :class:`MixedSizes`: the module DDP wraps for batches of images of mixed sizes (``--max-patches``).
- :func:`no_gradient_sync`: the micro-steps of gradient accumulation before the last, without gradient
  communication (DDP ``no_sync``; FSDP neither reduces nor reshards between them).
- EMA: timm's ``ModelEmaV3`` copies the model before it is sharded (FSDP modules cannot be deep-copied);
  :func:`parallelize` (``ema=``) then shards that copy like the model, so each rank averages its own shards
  (``update`` pairs the two state dicts' DTensors, whose layouts agree) and evaluates the EMA as an FSDP model.
  :func:`gathered_state` gives any model's whole state dict for evaluation on one rank or an export.
- :func:`save_checkpoint` / :func:`load_checkpoint`: ``torch.distributed.checkpoint`` (DCP) folders, every rank
  writing its own shards, committed atomically (a temporary folder renamed into place, then the ``latest`` file
  replaced: a kill at any instant leaves the previous commit whole); they load bit for bit on the same world size and
  reshard on another one (2 processes -> 1), DDP or no group at all included. :func:`export_weights` writes one
  safetensors file (``visionpe.save_weights``) that ``visionpe.load_weights`` and ``load_timm_checkpoint`` read.
- :func:`memory_per_rank`: what one rank holds (parameters, gradients, optimizer state) and its peak RSS
  (``visionpe scaling-memory`` measures docs/scaling.md's table with it).
"""
from __future__ import annotations

import io
import os
import pickle
import resource
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .._checks import check_choice
from ..backbones.adapter import repeated_blocks
from ..bias import BiasEncoding
from ..cli import one_line
from ..encoding import Encoding
from ..materialize import reset_parameters
from ..sharding import is_sharded
from ..weights import io as weights_io

MODES = ("ddp", "fsdp")
LATEST = "latest"  # the commit point of a checkpoint directory: the name of its newest complete checkpoint
METADATA = ".metadata"  # a DCP folder's index: its pickled torch.distributed.checkpoint.metadata.Metadata
_DCP = "torch.distributed.checkpoint"
_METADATA_CLASSES = ("Metadata", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                     "TensorProperties", "MetadataIndex", "_MEM_FORMAT_ENCODING")
# every global a DCP index may name, read_metadata finds nothing else: those that torch 2.14's index of a visionpe
# commit names (the dataclasses of metadata.py, _StorageInfo, torch.Size, a dtype, a layout by name, the checkpoint's
# path), with every dtype, layout and memory format by name, and the path of either platform (pathlib._local's from
# Python 3.13 on)
METADATA_GLOBALS = frozenset({
    *((f"{_DCP}.metadata", name) for name in _METADATA_CLASSES), (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    *((module, name) for module in ("pathlib", "pathlib._local") for name in ("PosixPath", "WindowsPath")),
    *(("torch", name) for name, value in vars(torch).items()
      if isinstance(value, (torch.dtype, torch.layout, torch.memory_format))),
})
# entry points besides forward that gather the root's parameters (none of them calls forward or another of them: a
# registered method called from inside forward would reshard the root when it returns, before forward reads the head)
FORWARD_METHODS = ("forward_batch", "forward_masked", "forward_intermediates")
ENCODING_METHODS = {BiasEncoding: ("score_mod",)}  # called by attention outside the encoding's forward (flex)


def fsdp_api():
    """``(fully_shard, MixedPrecisionPolicy, register_fsdp_forward_method, FSDPModule)`` from
    ``torch.distributed.fsdp`` (torch >= 2.6), or from ``torch.distributed._composable.fsdp`` (2.4, 2.5); a
    ``RuntimeError`` naming the release before those."""
    try:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import (FSDPModule, MixedPrecisionPolicy, fully_shard,
                                                            register_fsdp_forward_method)
        except ImportError:
            raise RuntimeError(f"FSDP2 (fully_shard, MixedPrecisionPolicy, register_fsdp_forward_method) needs torch "
                               f">= 2.6 (2.4-2.5 where their private module has all three); this is "
                               f"{torch.__version__}: use mode='ddp'") from None
    return fully_shard, MixedPrecisionPolicy, register_fsdp_forward_method, FSDPModule


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def is_fsdp(model: nn.Module) -> bool:
    try:
        return isinstance(model, fsdp_api()[3])
    except RuntimeError:
        return False


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself inside a ``DistributedDataParallel`` wrapper (an FSDP model is its own module)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def parallelize(model: nn.Module, mode: str, device, *, ema: nn.Module | None = None,
                mixed_precision: torch.dtype | None = None, grad_checkpointing: bool = False,
                compile: bool | dict = False, reshard_after_forward: bool = True) -> nn.Module:
    """``model`` ready for data-parallel training on ``device`` in the current process group, and its EMA copy laid
    out alike.

    Args:
        model: a patched model (``visionpe.create_model``, ``apply``, ``create_video_model``), on any device or on
            the meta device (FSDP: sharded, then materialised and initialised on ``device``).
        mode: ``"ddp"`` (returns a ``DistributedDataParallel`` wrapper) or ``"fsdp"`` (returns ``model`` itself, its
            parameters DTensor shards; build the optimizer after this call, from the returned model's parameters).
        ema: the EMA copy of ``model`` (timm ``ModelEmaV3(model).module``), made before this call because FSDP
            modules cannot be deep-copied. It is laid out in place: under FSDP sharded as ``model`` is, so each rank
            averages its own shards (``update`` pairs the two state dicts' DTensors, whose layouts agree) and
            evaluates it as an FSDP model; under DDP on ``device`` and unwrapped (every rank updates its full copy
            identically). Its values are then ``model``'s (a meta-device build is initialised once, in ``model``).
        mixed_precision: FSDP's parameter dtype in the blocks (``torch.bfloat16`` on CUDA); gradients are reduced in
            float32 and the encodings' parameters stay float32. None: float32 throughout (CPU).
        grad_checkpointing: recompute each block's activations in the backward (the model's
            ``set_grad_checkpointing``).
        compile: ``torch.compile`` each block in place before sharding (a dict: ``torch.compile``'s keywords, e.g.
            ``{"backend": "eager"}``).
        reshard_after_forward: FSDP frees each block's gathered parameters after its forward (ZeRO-3; False keeps
            them until the backward: ZeRO-2, more memory, fewer all-gathers). The EMA, which only runs forward,
            always reshards.
    """
    check_choice("mode", mode, MODES)
    device = torch.device(device)
    meta = any(p.is_meta for p in model.parameters())
    modules = (model,) if ema is None else (model, ema)
    blocks = [repeated_blocks(module) for module in modules]  # the units FSDP shards in each
    if grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise ValueError(f"{type(model).__name__} has no set_grad_checkpointing; run without grad_checkpointing")
        model.set_grad_checkpointing(True)
    if compile:
        if not hasattr(nn.Module, "compile"):
            raise RuntimeError(f"compiling each block in place (nn.Module.compile) needs torch >= 2.2, this is "
                               f"{torch.__version__}")
        for block in blocks[0]:  # the model's
            block.compile(**(compile if isinstance(compile, dict) else {}))
    if mode == "fsdp":  # sharded before it is materialised: no rank holds it whole
        fully_shard, MixedPrecisionPolicy, register_forward, _ = fsdp_api()
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (world_size(),))
        policy = MixedPrecisionPolicy(param_dtype=mixed_precision,
                                      reduce_dtype=torch.float32 if mixed_precision else None)
        root = MixedPrecisionPolicy(param_dtype=mixed_precision, reduce_dtype=policy.reduce_dtype,
                                    output_dtype=torch.float32 if mixed_precision else None)  # float32 logits
        position = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                        cast_forward_inputs=False)
        # in each module: each encoding with parameters a unit (its parameters float32), each block, the root
        for module, module_blocks in zip(modules, blocks):
            reshard = reshard_after_forward if module is model else True  # the EMA only runs forward
            for encoding in {id(m): m for m in module.modules() if isinstance(m, Encoding)}.values():
                if any(True for _ in encoding.parameters()):  # shared parameter-free encodings hold buffers only
                    fully_shard(encoding, mesh=mesh, mp_policy=position, reshard_after_forward=reshard)
                    for family, methods in ENCODING_METHODS.items():
                        for method in methods if isinstance(encoding, family) else ():
                            register_forward(encoding, method)
            for block in module_blocks:
                fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
            fully_shard(module, mesh=mesh, mp_policy=root, reshard_after_forward=reshard)
            for method in FORWARD_METHODS:  # the root's entry points besides forward gather its parameters too
                if callable(getattr(module, method, None)):
                    register_forward(module, method)
    if meta:
        reset_parameters(model.to_empty(device=device))
    if ema is not None and any(p.is_meta for p in ema.parameters()):
        ema.to_empty(device=device)  # its values are model's, copied below
    for module in modules if mode == "ddp" else ():  # FSDP shards each module on the device it is given on
        module.to(device)
    if ema is not None:
        with torch.no_grad():
            for ema_value, value in zip(ema.state_dict().values(), model.state_dict().values()):
                ema_value.copy_(value)
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


class MixedSizes(nn.Module):
    """``model`` taking a batch either stacked (``model(x)``) or as a list of images of different sizes
    (``model.forward_batch(images)``): the module DDP wraps for ``--max-patches`` (DDP syncs gradients of what goes
    through its forward). Holds no parameters of its own."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x) if isinstance(x, torch.Tensor) else self.model.forward_batch(x)


@contextmanager
def no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """Around the forward and backward of each micro-step of gradient accumulation but the last: gradients add up
    locally, without communication (DDP's ``no_sync``; FSDP neither reduce-scatters nor reshards until the last
    micro-step, also when ``model`` holds the FSDP root inside a wrapper). The last micro-step runs outside it and
    synchronises the sum; a model of neither kind is left as it is."""
    if callable(getattr(model, "no_sync", None)):  # DistributedDataParallel, or a stand-in with its no_sync
        with model.no_sync():
            yield
        return
    model = next((m for m in model.modules() if is_fsdp(m)), None)  # the outermost FSDP module (the root)
    if model is None:
        yield
        return
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


# -- state: whole, sharded, on disk --------------------------------------------------------------------------------
def _state_dict_api():
    from torch.distributed.checkpoint import state_dict as api
    return api


def gathered_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict of ``model`` (FSDP shards gathered, DDP unwrapped) on the CPU, on rank 0 (other ranks
    get ``{}``); a collective under FSDP: every rank calls it."""
    model = unwrap(model)
    if not any(is_sharded(t) for t in model.state_dict().values()):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()} if rank() == 0 else {}
    api = _state_dict_api()
    options = api.StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = api.get_model_state_dict(model, options=options)
    return state if rank() == 0 else {}


def is_sharded_model(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a DTensor shard (FSDP2; also inside a wrapper)."""
    return any(is_sharded(p) for p in model.parameters())


def load_full_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a whole state dict (as the unsharded model's ``state_dict()`` gives it, e.g. :func:`gathered_state` or an
    export) into ``model`` strictly: a sharded model (FSDP) takes its shards of each whole tensor (every rank calls
    it with the same ``state``), any other one ``load_state_dict``. ``state`` itself is not changed."""
    model = unwrap(model)
    if not is_sharded_model(model):
        model.load_state_dict(state)
        return
    api = _state_dict_api()
    # a copy: set_model_state_dict replaces the entries of the dict it is given with the DTensors it made of them
    api.set_model_state_dict(model, dict(state), options=api.StateDictOptions(full_state_dict=True))


def load_full_optimizer_state(model: nn.Module, optimizer, state: dict) -> None:
    """``optimizer.load_state_dict(state)`` for a ``state`` that an optimizer over the unsharded ``model`` saved
    (``optimizer.state_dict()``: parameters numbered in the order of its groups), also when ``model`` is sharded
    (FSDP: ``optimizer`` has the same groups over the sharded parameters, as one factory builds both; each rank keeps
    its shards of every moment). A group or parameter count that does not fit is a ``ValueError``."""
    if not is_sharded_model(unwrap(model)):
        optimizer.load_state_dict(state)
        return
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]  # number -> parameter name
    saved = [i for group in state["param_groups"] for i in group["params"]]
    if len(state["param_groups"]) != len(optimizer.param_groups) or sorted(saved) != list(range(len(order))):
        raise ValueError(f"the optimizer state has {len(state['param_groups'])} groups of {len(saved)} parameters, "
                         f"the optimizer {len(optimizer.param_groups)} groups of {len(order)}")
    by_name = {"state": {order[i]: dict(values) for i, values in state["state"].items()},
               "param_groups": [{**group, "params": [order[i] for i in group["params"]]}
                                for group in state["param_groups"]]}
    api = _state_dict_api()
    api.set_optimizer_state_dict(unwrap(model), optimizer, by_name, options=api.StateDictOptions(full_state_dict=True))


def eager():
    """A context in which compiled modules run eagerly (``torch.compiler.set_stance("force_eager")``, torch >= 2.6;
    nothing before): an evaluation at many sizes that would recompile at each."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else nullcontext()


def unsupported() -> str | None:
    """Why ``mode="fsdp"`` cannot run with this torch (the release it needs), or None."""
    release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if release < (2, 6):
        return (f"FSDP2 (torch.distributed.fsdp.fully_shard) and DCP's state-dict API need torch >= 2.6; this is "
                f"{torch.__version__}")
    return None


def export_weights(model: nn.Module, path, metadata: dict[str, str] | None = None) -> None:
    """One safetensors file of the whole model (:func:`visionpe.save_weights`, written by rank 0); every rank calls
    it. ``visionpe.load_weights`` and ``visionpe.load_timm_checkpoint`` read it."""
    state = gathered_state(model)
    if rank() == 0:
        weights_io.save_weights(state, path, metadata)
    barrier()


def _state(model: nn.Module, optimizer, ema: nn.Module | None) -> dict:
    """What DCP saves and loads: the model's and optimizer's state keyed by parameter names (so it reshards), the EMA
    model's."""
    api = _state_dict_api()
    model_state, optimizer_state = api.get_state_dict(unwrap(model), optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    if ema is not None:
        state["ema"] = api.get_model_state_dict(unwrap(ema))
    return state


def _blob(value) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def save_checkpoint(directory, model: nn.Module, optimizer, *, tag: str, ema: nn.Module | None = None,
                    extra: dict | None = None) -> Path:
    """Commit a DCP checkpoint ``directory/<tag>`` of the model, optimizer, EMA model and rank 0's ``extra`` (the
    scheduler's state dict, the step, the history: anything ``torch.load(weights_only=True)`` reads back); every rank
    calls it.

    Each rank writes its shards into ``directory/.<tag>.tmp``; then rank 0 renames the folder to ``<tag>``, replaces
    ``directory/latest`` (the commit point, :func:`visionpe.weights.io.write_text`) and removes older checkpoints. A
    kill before the ``latest`` replacement leaves the previous commit in force."""
    import torch.distributed.checkpoint as dcp
    directory = Path(directory)
    final, tmp = directory / tag, directory / f".{tag}.tmp"
    if rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    state = _state(model, optimizer, ema)
    if rank() == 0:  # rank 0's alone (the others may differ, e.g. in their own timings)
        state["extra"] = _blob(extra or {})
    dcp.save(state, checkpoint_id=str(tmp))
    barrier()
    if rank() == 0:
        shutil.rmtree(final, ignore_errors=True)  # a folder of this tag that was never committed
        os.replace(tmp, final)
        _fsync_directory(directory)
        weights_io.write_text(directory / LATEST, tag + "\n")
        for old in directory.iterdir():
            if old.is_dir() and old.name != tag:
                shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_checkpoint(directory) -> Path | None:
    """The committed checkpoint of ``directory`` (``directory/<latest>``), or None when nothing was committed."""
    pointer = Path(directory) / LATEST
    if not pointer.is_file():
        return None
    folder = Path(directory) / pointer.read_text().strip()
    if not (folder / ".metadata").is_file():
        raise ValueError(f"{pointer} names {folder.name}, which holds no complete DCP checkpoint")
    return folder


def load_checkpoint(folder, model: nn.Module, optimizer, *, ema: nn.Module | None = None) -> dict:
    """Load a :func:`save_checkpoint` folder into ``model``, ``optimizer`` (and ``ema``), whatever their sharding and
    world size (DCP reshards: 2 processes -> 1, FSDP -> DDP or a plain model); returns its ``extra``. Every rank
    calls it; the optimizer must have been built from the model's (sharded) parameters.

    Nothing in the folder runs code: its index is read by :func:`read_metadata`, every value that is no tensor (the
    optimizer's hyperparameters, ``extra``) and every tensor with ``torch.load(weights_only=True)``. A file that would
    run code, or is not what DCP writes, is a :class:`RefusedCheckpoint` naming it; a checkpoint that does not fit the
    model or optimizer a ``ValueError``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    folder = Path(folder)
    reason = unsupported()
    if reason is not None:  # DCP before 2.6 unpickles tensors as torch.load's default did then: any pickle runs
        raise RefusedCheckpoint(f"{folder}: a distributed checkpoint is read only where its tensors load without "
                                f"running code: {reason}")
    metadata = read_metadata(folder)
    api = _state_dict_api()
    state = {**_state(model, optimizer, ema), "extra": io.BytesIO()}
    try:
        dcp.load(state, checkpoint_id=str(folder), storage_reader=_checked_reader(folder, metadata),
                 planner=_checked_planner(folder))
    except CheckpointException as err:  # a BaseException, holding each rank's own error and its stack
        error = next(iter(err.failures.values()))[0]
        if isinstance(error, pickle.UnpicklingError):  # a tensor file refused by torch.load(weights_only=True)
            raise RefusedCheckpoint(f"{folder}: a tensor of its data files is refused unread (it would run code, or it "
                                    f"is damaged): {weights_io._load_error(error)}") from None
        if isinstance(error, RefusedCheckpoint):  # a value refused by the planner
            raise error from None
        raise ValueError(f"{folder}: {type(error).__name__}: {one_line(error)[:300]}") from None
    api.set_state_dict(unwrap(model), optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
    if ema is not None:
        api.set_model_state_dict(unwrap(ema), state["ema"])
    return _safe_load(state["extra"].getvalue(), f"{folder}: its extra")


class RefusedCheckpoint(ValueError):
    """A file of a distributed checkpoint that is not loaded: read as DCP reads it, it would run code (a pickle naming
    anything but what DCP writes), or it is not what DCP writes."""


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that finds only :data:`METADATA_GLOBALS` (``path``: the file, for the message)."""

    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) not in METADATA_GLOBALS:
            raise RefusedCheckpoint(f"{self.path} names {module}.{name}, which no DCP index holds: refused unread "
                                    "(nothing of it ran)")
        return super().find_class(module, name)


def read_metadata(folder):
    """The index of the DCP checkpoint ``folder`` (its ``.metadata``: a ``Metadata``), unpickled finding only the
    classes DCP writes there (:data:`METADATA_GLOBALS`), where DCP's own reader calls ``pickle.load``, which runs
    whatever a crafted file names; then checked: tensor and byte entries only, every data file inside ``folder``. A
    :class:`RefusedCheckpoint` naming the file otherwise."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata, MetadataIndex,
                                                       TensorStorageMetadata)
    path = Path(folder) / METADATA
    try:
        with open(path, "rb") as file:
            metadata = _MetadataUnpickler(file, path).load()
    except RefusedCheckpoint:
        raise
    except Exception as err:  # missing, truncated, not a pickle, a class given arguments it does not take, ...
        raise RefusedCheckpoint(f"cannot read {path}: damaged or not a DCP index ({type(err).__name__}: "
                                f"{one_line(err)[:160]})") from None
    entries, storage = getattr(metadata, "state_dict_metadata", None), getattr(metadata, "storage_data", None)
    if not (isinstance(metadata, Metadata) and isinstance(entries, dict) and isinstance(storage, dict)
            and all(isinstance(k, str) and isinstance(v, (TensorStorageMetadata, BytesStorageMetadata))
                    for k, v in entries.items())
            and all(isinstance(k, MetadataIndex) and isinstance(v, _StorageInfo) for k, v in storage.items())):
        raise RefusedCheckpoint(f"{path} is not a DCP index (it holds no Metadata of tensor and byte entries)")
    outside = [v.relative_path for v in storage.values()
               if not isinstance(v.relative_path, str) or Path(v.relative_path).name != v.relative_path
               or v.relative_path in ("", ".", "..")]
    if outside:
        raise RefusedCheckpoint(f"{path} names the data file {outside[0]!r}, which is not in its folder: refused")
    return metadata


def _safe_load(data: bytes, what: str):
    """``torch.load(weights_only=True)`` of ``data``, the in-memory files DCP keeps values in (``io.BytesIO`` among
    the classes it finds); a :class:`RefusedCheckpoint` naming ``what`` for a pickle it refuses."""
    try:
        with torch.serialization.safe_globals([io.BytesIO]):
            return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:  # UnpicklingError (a refused global), a damaged archive
        raise RefusedCheckpoint(f"{what} is refused unread (it would run code, or it is damaged): "
                                f"{weights_io._load_error(err)}") from None


def _checked_reader(folder: Path, metadata):
    """DCP's ``FileSystemReader`` of ``folder`` handing DCP ``metadata``, read by :func:`read_metadata`, where its own
    would unpickle the file."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class CheckedReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            if metadata.storage_meta is None:  # as FileSystemReader.read_metadata does
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return CheckedReader(folder)


def _checked_planner(folder: Path):
    """DCP's ``DefaultLoadPlanner``, with every value that is no tensor (``BYTE_IO``) read by :func:`_safe_load`: its
    own reads them with ``torch.load(weights_only=False)``, which runs any pickle. The value read is handed on to
    DCP's own as a fresh ``torch.save`` of it, so that it unpickles only what was checked."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class CheckedPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            checked = _safe_load(value.getvalue(), f"{folder}: the value of {read_item.dest_index.fqn}")
            super().load_bytes(read_item, _blob(checked))

    return CheckedPlanner()


# -- memory ---------------------------------------------------------------------------------------------------------
def _local_bytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    t = t.to_local() if is_sharded(t) else t
    return t.numel() * t.element_size()


def memory_per_rank(model: nn.Module, optimizer) -> dict[str, int]:
    """Bytes this rank holds: ``parameters``, ``gradients``, ``optimizer`` state (its own shards under FSDP), and its
    process's ``peak_rss`` so far (``getrusage``; the high-water mark of everything, activations included)."""
    params = list(unwrap(model).parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return {"parameters": sum(_local_bytes(p) for p in params), "gradients": sum(_local_bytes(p.grad) for p in params),
            "optimizer": sum(_local_bytes(t) for t in state),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale}


def measure_memory(model_name: str, mode: str, device, *, batch_size: int, img_size: int = 224,
                   pe: str = "learned", **model_kwargs) -> dict[str, int]:
    """:func:`memory_per_rank` after one AdamW training step (forward, backward, step) of ``visionpe.create_model(
    model_name, pe=pe, **model_kwargs)`` on ``batch_size`` random images per rank, in the current process group
    (1000 classes unless ``num_classes`` says otherwise). Under FSDP the model
    is built on the meta device and sharded before it is materialised (no rank holds it whole); under DDP every rank
    builds it. Adds ``rss_before``: the process's RSS before the model is built (imports, the group)."""
    import torch.nn.functional as F
    device = torch.device(device)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    torch.manual_seed(0)
    if mode == "fsdp":
        with torch.device("meta"):
            model = create_model_for_memory(model_name, pe, img_size, model_kwargs)
    else:
        model = create_model_for_memory(model_name, pe, img_size, model_kwargs)
    model = parallelize(model, mode, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch_size, 3, img_size, img_size, device=device)
    y = torch.randint(0, model_kwargs.get("num_classes", 1000), (batch_size,), device=device)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    return {**memory_per_rank(model, optimizer), "rss_before": before}


def create_model_for_memory(model_name: str, pe: str, img_size: int, model_kwargs: dict) -> nn.Module:
    from ..backbones.api import create_model
    return create_model(model_name, pe=pe, img_size=img_size, **{"drop_path_rate": 0.0, **model_kwargs})
