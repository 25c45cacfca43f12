"""The pieces of the training loop: batches of mixed sizes, RNG streams, the precision of the steps, the module that
trains (on its device, EMA, DDP or FSDP2) and one epoch of training. What an epoch ends with has modules of its own:
:mod:`visionpe.train.evaluation` (also :mod:`visionpe.train.sweep`'s) and :mod:`visionpe.train.commits`; the data
sets they read are :mod:`visionpe.train.sampling`'s."""
from __future__ import annotations

import argparse
import contextlib
import copy
import math
import random
import time

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from timm.utils import ModelEmaV3
from tqdm import tqdm

from .. import data as vdata
from . import distributed, parallel
from .commits import NonFiniteLoss
from .settings import TrainSettings
from ..cli import UserError, one_line, user_errors


def read_samples(batches):
    """The batches of a loader, in order; a sample that cannot be read (:class:`visionpe.data.DataDamaged`: a corrupt
    image or clip, found when it is read) is a :class:`UserError` of one line naming the file, also when a loader
    worker raised it (torch then wraps the worker's traceback in the message: its last line is kept)."""
    batches = iter(batches)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except vdata.DataDamaged as err:
            raise UserError(worker_message(err)) from None
        yield batch


def worker_message(err: BaseException) -> str:
    """The message of an error raised in a DataLoader worker (torch re-raises it in the main process with the worker's
    traceback as its text): the error's own last line without its type; any other error's message unchanged."""
    text = str(err)
    if "Original Traceback" not in text:
        return one_line(text)
    last = [line for line in text.splitlines() if line.strip()][-1]
    return one_line(last.split(": ", 1)[1] if f"{type(err).__name__}: " in last else last)


def unpack(batch) -> tuple:
    """A loader batch -> ``(x, y, time_spacing)``: ``time_spacing`` the clips' ``(B,)`` time steps of a batch on an
    absolute time axis (samples ``(clip, label, time_step)``: ``--tokens-per-second``), else None."""
    x, y, *steps = batch
    return x, y, (steps[0] if steps else None)


def forward(model, x, time_spacing=None):
    """``model(x)``, with the clips' ``time_spacing`` when the batch has one."""
    return model(x) if time_spacing is None else model(x, time_spacing=time_spacing)


def to_device(x, device):
    """A batch of images (a tensor, or a list of tensors of different sizes) on ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    return [t.to(device, non_blocking=True) for t in x]


def parse_size(text: str) -> int | tuple[int, int]:
    """One ``--res`` entry: ``PX`` (square) or ``HxW`` (height x width) -> ``int`` or ``(height, width)``; a square
    ``HxH`` is the integer ``H``. A malformed or non-positive size is an ``argparse.ArgumentTypeError``."""
    parts = text.strip().lower().split("x")
    if len(parts) > 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give PX or HxW (height x width), e.g. 32 or 32x48")
    sides = [int(p) for p in parts]
    if min(sides) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes are positive (PX or HxW with H, W >= 1)")
    if len(sides) == 1 or sides[0] == sides[1]:
        return sides[0]
    return sides[0], sides[1]


def seed_everything(seed: int, epoch: int, rank: int, step: int | None = None) -> None:
    """RNG streams (dropout, drop path, mixup) as a function of (seed, epoch, rank), and of the loader batch ``step``
    when given (:func:`train_one_epoch` reseeds every batch): resume is exact, from the end of an epoch or from
    within one."""
    s = seed * 1_000_003 + epoch * 7_919 + rank * 104_729 + (0 if step is None else (step + 1) * 15_485_863)
    s %= 2**31
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def autocast_for(device: torch.device, dtype: torch.dtype | None):
    """A function returning the autocast context of ``device`` in ``dtype`` (a no-op for ``None``)."""
    return lambda: torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of the ``amp`` setting on ``device``: ``auto`` is bfloat16 on CUDA and none elsewhere."""
    if amp == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[amp]


def fsdp_precision(settings: TrainSettings, amp_dtype: torch.dtype | None, device: torch.device) -> torch.dtype | None:
    """FSDP2's parameter dtype in the blocks (its mixed-precision policy; gradients reduced in float32, encodings'
    parameters float32): bfloat16 under ``parallel: fsdp`` with bf16 amp on CUDA, which then replaces autocast; None
    otherwise (autocast as ``amp`` says)."""
    use = settings.parallel == "fsdp" and amp_dtype == torch.bfloat16 and device.type == "cuda"
    return torch.bfloat16 if use else None


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module itself inside DistributedDataParallel and ``torch.compile`` wrappers."""
    while True:
        ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        inner = getattr(model, "module" if ddp else "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def channels_last_(model: torch.nn.Module) -> torch.nn.Module:
    """``model``'s convolutions (patch embedding, PEG, ...) in channels-last layout, in place: ``channels_last`` for
    2D, ``channels_last_3d`` for 3D ones (``Module.to(memory_format=...)`` would also convert every other tensor of
    4 or 5 dimensions, and refuses a 4D table with the 3D format)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.to(memory_format=torch.channels_last)
        elif isinstance(module, torch.nn.Conv3d):
            module.to(memory_format=torch.channels_last_3d)
    return model


def trained_module(settings: TrainSettings, model: torch.nn.Module, procs,
                   mixed_precision: torch.dtype | None = None) -> tuple[torch.nn.Module, ModelEmaV3 | None]:
    """``model`` (its weights final; built on the meta device with ``meta_init``) made ready to train, in timm's
    order: on this process's device (``procs``: :class:`~visionpe.train.distributed.Processes`), its EMA copy
    (:func:`ema_of`, with ``model_ema``), then the module that trains (:func:`parallel_model`: under FSDP the EMA
    sharded alike). Returns ``(module that trains, EMA or None)``; the optimizer comes after
    (:func:`visionpe.train.optimization.build`). ``mixed_precision``: FSDP's parameter dtype in the blocks (None:
    float32)."""
    if not settings.meta_init:  # a meta-device build is materialised on the device by parallelize
        model.to(procs.device)
    if settings.channels_last and settings.parallel != "fsdp":  # FSDP2 shards contiguous parameters: the batches only
        channels_last_(model)
    ema = ema_of(settings, model, procs.device) if settings.model_ema else None
    return parallel_model(settings, model, procs, mixed_precision, ema), ema


def ema_of(settings: TrainSettings, model: torch.nn.Module, device: torch.device) -> ModelEmaV3:
    """timm's ``ModelEmaV3`` of ``model``: a copy made before the model is sharded or wrapped (FSDP modules cannot be
    copied). Of a meta-device build (``meta_init``) it holds a meta copy, which
    :func:`visionpe.train.parallel.parallelize` materialises; the EMA itself is then made of a stand-in on
    ``device``, as timm makes its rounding generator on the device of the module's parameters."""
    kwargs = dict(decay=settings.model_ema_decay, use_warmup=settings.model_ema_warmup)
    if not settings.meta_init:
        return ModelEmaV3(model, **kwargs)
    ema = ModelEmaV3(torch.nn.Linear(1, 1, device=device), **kwargs)
    ema.module = copy.deepcopy(model).eval()
    return ema


def parallel_model(settings: TrainSettings, model: torch.nn.Module, procs, mixed_precision: torch.dtype | None,
                   ema: ModelEmaV3 | None = None) -> torch.nn.Module:
    """The module that trains ``model``: under ``parallel: fsdp`` the model itself, sharded in place per block and at
    the root (:func:`visionpe.train.parallel.parallelize`: activation checkpointing, compile per block, a meta-device
    build materialised), on any number of processes, and ``ema``'s copy sharded alike in the same call; else (DDP)
    the model, compiled with ``compile``, in a ``DistributedDataParallel`` wrapper under torchrun. With
    ``max_patches`` it takes lists of images of mixed sizes (:class:`visionpe.train.parallel.MixedSizes`)."""
    if settings.parallel == "fsdp":
        with user_errors(f"--parallel fsdp of {settings.model} pe={settings.pe}", (ValueError,)):
            model = parallel.parallelize(model, "fsdp", procs.device, ema=None if ema is None else ema.module,
                                         mixed_precision=mixed_precision,
                                         grad_checkpointing=settings.grad_checkpointing, compile=settings.compile,
                                         reshard_after_forward=settings.fsdp_reshard_after_forward)
        return parallel.MixedSizes(model) if settings.max_patches else model
    if settings.grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise UserError(f"--grad-checkpointing: {type(model).__name__} (--model {settings.model}) has no "
                            "set_grad_checkpointing; run without it")
        model.set_grad_checkpointing(True)
    train_model = torch.compile(model) if settings.compile else model
    net = parallel.MixedSizes(train_model) if settings.max_patches else train_model  # takes lists of images of mixed sizes
    if procs.world == 1:
        return net
    return DDP(net, device_ids=[procs.local_rank] if procs.device.type == "cuda" else None)


def to_memory_format(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``x`` in channels-last layout (``channels_last_3d`` for clips ``(B, C, T, H, W)``) when asked, else as is (a
    list of images of mixed sizes, too)."""
    if not channels_last or not isinstance(x, torch.Tensor):
        return x
    return x.contiguous(memory_format=torch.channels_last if x.ndim == 4 else torch.channels_last_3d)


def step_resolution(train_res, seed: int, epoch: int, step: int) -> int | None:
    """The resolution of one multi-resolution training step: drawn from ``train_res`` by ``(seed, epoch, step)``
    alone, so every process of a DDP run (and a resumed run) draws the same; None without ``train_res``."""
    if not train_res:
        return None
    return train_res[random.Random(f"train_res/{seed}/{epoch}/{step}").randrange(len(train_res))]


def train_one_epoch(model, loader, parts, *, epoch: int, epochs: int, device, autocast,
                    clip_grad: float = 0.0, world: int = 1, progress: bool = False, last_finite: tuple | None = None,
                    train_res=(), seed: int = 0, rank: int = 0, accum_steps: int = 1, channels_last: bool = False,
                    resume: dict | None = None, on_update=None) -> dict:
    """One pass over ``loader`` with ``parts``, the run's :class:`~visionpe.train.optimization.Optimization` (its
    optimizer, schedule, loss, mixup/cutmix, gradient scaler and EMA): an optimizer step every ``accum_steps`` loader
    batches (``parts.backward_and_step``; the last step of the epoch takes what is left), the learning rate set per
    optimizer step (``scheduler.step_update``; ``ceil(batches / accum_steps)`` steps an epoch), the loss of each
    batch divided by the number of batches of its step, and under DDP and FSDP the gradients synchronised on a step's
    last batch only (``no_sync`` on the others). After each optimizer step the EMA (timm ``ModelEmaV3``) is updated
    with the global step count and ``on_update(progress)`` is called (a checkpoint may be committed there: the
    gradients are zero, so a resumed epoch needs only ``progress``).

    The RNG streams are reseeded from ``(seed, epoch, rank, batch)`` before each batch (:func:`seed_everything`).
    ``resume``: the ``progress`` of a mid-epoch checkpoint; ``loader`` then yields only the batches after
    ``resume['step']`` (see :class:`visionpe.train.sampling.EpochOrder`). ``progress`` = ``{'step'`` (batches done),
    ``'update'`` (optimizer steps done in the epoch), ``'loss_sum'``, ``'seen'`` (this process's), ``'last_finite'``,
    ``'elapsed'}``.

    With ``train_res`` each batch's images are resized (bicubic, antialias) to :func:`step_resolution`'s size: the
    steps, and so the schedule, are the same as without it.

    Each batch's loss is summed over the processes before the backward pass, so when it is NaN or infinite on any
    of them every process raises :class:`~visionpe.train.commits.NonFiniteLoss` at the same batch (none waits for
    the others). Returns ``{'train_loss', 'seen', 'elapsed', 'last_finite'}`` (``train_loss`` and ``seen`` over all
    processes, ``last_finite`` = ``(loss, epoch, step)`` of the last finite batch, 1-based)."""
    model.train()
    first = resume["step"] if resume else 0
    steps = first + len(loader)
    updates = math.ceil(steps / accum_steps)
    full = steps // accum_steps * accum_steps  # batches in whole accumulation groups; the rest form the last step
    loss_sum, seen, before = (resume["loss_sum"], resume["seen"], resume["elapsed"]) if resume else (0.0, 0.0, 0.0)
    if resume:
        last_finite = tuple(resume["last_finite"]) if resume["last_finite"] else None
    ema_source, parameters = unwrap(model), [p for p in model.parameters() if p.requires_grad]
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False, dynamic_ncols=True, initial=first,
               total=steps, disable=None if progress else True)  # None: off when not a terminal
    t0 = time.perf_counter()
    parts.optimizer.zero_grad(set_to_none=True)
    for step, batch in enumerate(read_samples(bar), start=first):
        seed_everything(seed, epoch, rank, step)
        x, y, time_spacing = unpack(batch)  # time_spacing: (B,) with --tokens-per-second
        x, y = to_device(x, device), y.to(device, non_blocking=True)  # x: a list of images with --max-patches
        if parts.mixup is not None:
            x, y = parts.mixup(x, y)
        size = step_resolution(train_res, seed, epoch, step)
        if size is not None and x.shape[-1] != size:
            x = vdata.resize_bicubic(x, size)
        x = to_memory_format(x, channels_last)
        update = step // accum_steps  # this batch's optimizer step within the epoch (0-based)
        group = accum_steps if step < full else steps - full  # batches of that step
        is_update = step + 1 == steps or (step + 1) % accum_steps == 0
        if step % accum_steps == 0:
            parts.scheduler.step_update(epoch * updates + update)
        sync = contextlib.nullcontext() if world == 1 or is_update else parallel.no_gradient_sync(model)
        with sync:
            with autocast():
                loss = parts.criterion(forward(model, x, time_spacing), y)
            total = distributed.sum_over_processes(loss.detach().float().reshape(1))
            if not bool(torch.isfinite(total).all()):
                where = f"step {step + 1}/{steps} of epoch {epoch + 1} (global step {epoch * steps + step + 1})"
                before_text = ("no finite loss before it" if last_finite is None else
                               f"last finite loss {last_finite[0]:.6g} at step {last_finite[2]} of epoch "
                               f"{last_finite[1]}")
                kept = f"its checkpoint of epoch {epoch} is kept" if epoch else "no epoch was saved"
                raise NonFiniteLoss(f"non-finite training loss ({total.item() / world}) at {where}; {before_text}; the "
                                    f"run stopped without saving ({kept}); lower --lr or check the data")
            parts.backward_and_step(loss / group, parameters=parameters, clip_grad=clip_grad, update=is_update)
        value = loss.item()
        last_finite = (value, epoch + 1, step + 1)
        loss_sum += value * len(x)
        seen += len(x)
        bar.set_postfix(loss=f"{value:.3f}", img_s=f"{seen * world / (before + time.perf_counter() - t0):.0f}")
        if is_update:
            parts.optimizer.zero_grad(set_to_none=True)
            if parts.ema is not None:
                parts.ema.update(ema_source, step=epoch * updates + update + 1)
            if on_update is not None:
                on_update({"step": step + 1, "update": update + 1, "loss_sum": loss_sum, "seen": seen,
                           "last_finite": list(last_finite), "elapsed": before + time.perf_counter() - t0})
    elapsed = before + time.perf_counter() - t0
    loss_sum, seen = distributed.all_sum([loss_sum, seen], device)
    return {"train_loss": loss_sum / seen, "seen": seen, "elapsed": elapsed, "last_finite": last_finite}
