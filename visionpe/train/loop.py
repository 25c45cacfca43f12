"""The pieces of the training loop: data sets from settings (timm's transforms and the resolution protocol),
batches of mixed sizes, RNG streams, one epoch of training, evaluation, and evaluation across resolutions (used by
``train_vit.py`` and :mod:`visionpe.train.sweep`)."""
from __future__ import annotations

import argparse
import math
import random
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, default_collate
from tqdm import tqdm

from .. import data as vdata
from . import settings
from .cli import UserError, one_line


class NonFiniteLoss(UserError):
    """The training loss became NaN or infinite: the run stops without saving (its last checkpoint stays)."""


def dataset(cfg: dict, split: str, img_size, num_frames: int | None = None, protocol: str | None = None):
    """The run's data set ``split`` at ``img_size`` pixels (an image run also takes ``(height, width)``; a video
    run's: clips of ``num_frames`` frames, default the run's ``num_frames``), through the run's transforms and
    evaluation protocol (``protocol``: another one); missing or empty data is a :class:`UserError`."""
    num = cfg["train_samples"] if split == "train" else cfg["val_samples"]
    frames = (num_frames or cfg["num_frames"]) if cfg.get("num_frames") else None
    try:
        ds = vdata.build_dataset(cfg["data"], split, img_size, data_dir=cfg["data_dir"], download=cfg["download"],
                                 seed=cfg["seed"], num_samples=num, num_frames=frames,
                                 transforms=settings.transforms_of(cfg, protocol))
    except (vdata.DataMissing, ValueError) as err:
        raise UserError(one_line(err)) from None
    if len(ds) == 0:
        raise UserError(f"{cfg['data']}: the {split} split under {cfg['data_dir']!r} holds no images")
    return ds


def data_notes(cfg: dict) -> list[str]:
    """Lines that say which transform settings the run's data set does not take (a built-in task is rendered at each
    size, not augmented: a flip or a crop would change its labels; a set whose builder takes no ``transforms``):
    they are ignored, not refused, so one recipe serves every data set of a benchmark."""
    changed = [key for key in settings.TRANSFORM_KEYS if cfg.get(key) != settings.DEFAULTS[key]]
    if not changed:
        return []
    flags = " ".join("--" + key.replace("_", "-") for key in changed)
    spec = vdata.get_spec(cfg["data"])
    if spec.synthetic or spec.video:
        what = "a built-in task rendered at each size" if spec.synthetic else "a video data set"
        return [f"note: {flags} ignored: {cfg['data']} is {what}, not images through timm's transforms"]
    if not vdata.takes_transforms(cfg["data"]):
        return [f"note: {flags} ignored: the builder of {cfg['data']} takes no transforms"]
    return []


def collate_images(batch) -> tuple:
    """A batch of ``(image, label)``: images stacked ``(B, C, H, W)`` when they share a size (torch's
    ``default_collate``, which in a loader worker stacks straight into shared memory), else kept as a list of
    ``(C, H_i, W_i)`` (a batch of mixed grids for ``forward_batch``); labels ``(B,)``."""
    images = [b[0] for b in batch]
    if all(x.shape == images[0].shape for x in images):
        return tuple(default_collate(batch))
    return images, torch.tensor([int(b[1]) for b in batch])


class MixedSizes(torch.nn.Module):
    """``model`` taking a batch either stacked (``model(x)``) or as a list of images of different sizes
    (``model.forward_batch(images)``): the module DDP wraps for ``--max-patches`` (DDP syncs gradients of what goes
    through its forward). Holds no parameters of its own."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x) if isinstance(x, torch.Tensor) else self.model.forward_batch(x)


def to_device(x, device):
    """A batch of images (a tensor, or a list of tensors of different sizes) on ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    return [t.to(device, non_blocking=True) for t in x]


def logits_of(model, x):
    """Logits of a batch: ``model(x)`` for a stacked batch, the underlying model's ``forward_batch`` for a list
    (evaluation only: no gradient goes through a DDP wrapper here)."""
    if isinstance(x, torch.Tensor):
        return model(x)
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    inner = inner.model if isinstance(inner, MixedSizes) else inner
    return inner.forward_batch(x)


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


def size_order(key) -> tuple[int, int]:
    """Sort key of an evaluation key: an image size by ``(height, width)``, an integer ``r`` counting as ``(r, r)``
    (so square and non-square sizes mix); a video key ``(frames, res)`` sorts as itself."""
    return (key, key) if isinstance(key, int) else (int(key[0]), int(key[1]))


def eval_grid(cfg: dict, resolutions=(), frames=()) -> tuple[list, object]:
    """The evaluation keys of a run and its training key: image sizes (image run: integers, or ``(height, width)``
    tuples for non-square sizes; ordered by :func:`size_order`) or ``(frames, res)`` pairs (video run: ``frames`` x
    ``resolutions``, integer resolutions only), the training size and frame count always among them."""
    res = sorted(set(resolutions) | {cfg["img_size"]}, key=size_order)
    if not cfg.get("num_frames"):
        return res, cfg["img_size"]
    counts = sorted(set(frames) | {cfg["num_frames"]})
    return [(f, r) for f in counts for r in res], (cfg["num_frames"], cfg["img_size"])


def key_text(key) -> str:
    """An evaluation key as text (results.json, tables, logs): ``"32"`` for a square image size, ``"AxB"`` for a
    pair, which reads right both as an image ``(height, width)`` and as a video ``(frames, res)``."""
    return f"{key[0]}x{key[1]}" if isinstance(key, tuple) else str(key)


def seed_everything(seed: int, epoch: int, rank: int) -> None:
    """RNG streams (dropout, drop path, mixup) as a function of (seed, epoch, rank): resume is exact."""
    s = (seed * 1_000_003 + epoch * 7_919 + rank * 104_729) % 2**31
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def all_sum(values, device) -> list[float]:
    """Sum of ``values`` over the processes of a torchrun group (the values themselves without one)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def autocast_for(device: torch.device, bf16: bool):
    """A function returning the autocast context of ``device`` (a no-op unless ``bf16``)."""
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def step_resolution(train_res, seed: int, epoch: int, step: int) -> int | None:
    """The resolution of one multi-resolution training step: drawn from ``train_res`` by ``(seed, epoch, step)``
    alone, so every process of a DDP run (and a resumed run) draws the same; None without ``train_res``."""
    if not train_res:
        return None
    return train_res[random.Random(f"train_res/{seed}/{epoch}/{step}").randrange(len(train_res))]


def train_one_epoch(model, loader, optimizer, scheduler, criterion, *, epoch: int, epochs: int, device, autocast,
                    mixup=None, clip_grad: float = 0.0, world: int = 1, progress: bool = False,
                    last_finite: tuple | None = None, train_res=(), seed: int = 0) -> dict:
    """One pass over ``loader`` (the learning rate is set per step: ``scheduler.step_update``).

    With ``train_res`` each step's images are resized (bicubic, antialias) to :func:`step_resolution`'s size: the
    steps, and so the schedule, are the same as without it.

    Each step's loss is summed over the processes before the backward pass, so when it is NaN or infinite on any
    of them every process raises :class:`NonFiniteLoss` at the same step (none waits for the others). Returns
    ``{'train_loss', 'seen', 'elapsed', 'last_finite'}`` (``train_loss`` and ``seen`` over all processes,
    ``last_finite`` = ``(loss, epoch, step)`` of the last finite step, 1-based)."""
    model.train()
    steps = len(loader)
    loss_sum = seen = 0.0
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False, dynamic_ncols=True,
               disable=None if progress else True)  # None: off when not a terminal
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(bar):
        x, y = to_device(x, device), y.to(device, non_blocking=True)  # x: a list of images with --max-patches
        if mixup is not None:
            x, y = mixup(x, y)
        size = step_resolution(train_res, seed, epoch, step)
        if size is not None and x.shape[-1] != size:
            x = F.interpolate(x, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
        scheduler.step_update(epoch * steps + step)
        with autocast():
            loss = criterion(model(x), y)
        total = loss.detach().float().reshape(1).clone()
        if world > 1:
            dist.all_reduce(total)
        if not bool(torch.isfinite(total).all()):
            where = f"step {step + 1}/{steps} of epoch {epoch + 1} (global step {epoch * steps + step + 1})"
            before = ("no finite loss before it" if last_finite is None else
                      f"last finite loss {last_finite[0]:.6g} at step {last_finite[2]} of epoch {last_finite[1]}")
            kept = f"its checkpoint of epoch {epoch} is kept" if epoch else "no epoch was saved"
            raise NonFiniteLoss(f"non-finite training loss ({total.item() / world}) at {where}; {before}; the run "
                                f"stopped without saving ({kept}); lower --lr or check the data")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        optimizer.step()
        value = loss.item()
        last_finite = (value, epoch + 1, step + 1)
        loss_sum += value * len(x)
        seen += len(x)
        bar.set_postfix(loss=f"{value:.3f}", img_s=f"{seen * world / (time.perf_counter() - t0):.0f}")
    elapsed = time.perf_counter() - t0
    loss_sum, seen = all_sum([loss_sum, seen], device)
    return {"train_loss": loss_sum / seen, "seen": seen, "elapsed": elapsed, "last_finite": last_finite}


@torch.no_grad()
def evaluate(model, dataset, *, batch_size: int, device, autocast, workers: int = 0, rank: int = 0,
             world: int = 1) -> tuple[float, float]:
    """Top-1 (%) and mean cross-entropy over the whole set; each process takes every world-th image. Images of
    different sizes (the native protocol) go through the model's ``forward_batch`` as batches of mixed grids."""
    model.eval()
    loader = DataLoader(Subset(dataset, range(rank, len(dataset), world)), batch_size=batch_size,
                        num_workers=workers, collate_fn=collate_images)
    correct = loss = count = 0.0
    for x, y in loader:
        x, y = to_device(x, device), y.to(device)
        with autocast():
            logits = logits_of(model, x)
        loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += len(y)
    correct, loss, count = all_sum([correct, loss, count], device)
    return 100.0 * correct / count, (loss / count if count else math.nan)


def evaluate_resolutions(model, sets: dict, train_res, known: dict | None = None, **eval_kwargs) -> dict:
    """``{res: {'acc', 'loss', 'retention'}}`` of ``model`` on ``sets`` (``{res: dataset}``, the training
    resolution among them; an image run's keys are integers or ``(height, width)`` tuples, in :func:`size_order`);
    retention = acc(res) / acc(train_res). ``known``: ``{res: (acc, loss)}`` already measured (not evaluated
    again). A video run's keys are ``(frames, res)``, ``train_res`` the training pair."""
    known = known or {}
    accs = {r: known[r] if r in known else evaluate(model, sets[r], **eval_kwargs)
            for r in sorted(sets, key=size_order)}
    base = accs[train_res][0]
    return {r: {"acc": a, "loss": l, "retention": a / base if base > 0 else 0.0} for r, (a, l) in accs.items()}
