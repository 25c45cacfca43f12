"""What trains a model besides its data, built from the settings as timm's train.py builds it: the optimizer
(``create_optimizer_v2``: position parameters without weight decay, layer decay), the schedule (per optimizer step:
linear warmup, then cosine down to ``min_lr``), the float16 gradient scaler, mixup/cutmix, the loss and the EMA
weights; and where a run stands (:class:`Progress`), restored with them from ``state.pt``."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from timm.data import Mixup
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3, NativeScaler

from ..cli import UserError, user_errors
from . import restore


@dataclass
class Recipe:
    optimizer: torch.optim.Optimizer
    scheduler: CosineLRScheduler
    criterion: torch.nn.Module
    mixup: Mixup | None = None
    scaler: NativeScaler | None = None  # float16 only: loss scaling
    ema: ModelEmaV3 | None = None

    @property
    def ema_module(self) -> torch.nn.Module | None:
        """The averaged model itself (evaluated, saved), or None without ``--model-ema``."""
        return self.ema.module if self.ema is not None else None

    @property
    def lr(self) -> float:
        return max(g["lr"] for g in self.optimizer.param_groups)


@dataclass
class Progress:
    """Where a run stands: the last committed ``epoch`` (0 = none), the best validation top-1 so far and its epoch,
    the ``history`` (metrics.jsonl's records) and, after a commit within epoch ``epoch + 1``, how far into it
    (``within``: the state's ``progress``)."""

    epoch: int = 0
    best_acc: float = -1.0
    best_epoch: int = -1
    history: list = field(default_factory=list)
    within: dict | None = None


def build(cfg: dict, model: torch.nn.Module, updates_per_epoch: int, device: torch.device,
          amp_dtype: torch.dtype | None) -> Recipe:
    """The recipe of ``model`` (its weights and device final, before compile and DDP, as timm builds its EMA) for
    ``cfg['epochs']`` epochs of ``updates_per_epoch`` optimizer steps."""
    ema = ModelEmaV3(model, decay=cfg["model_ema_decay"], use_warmup=cfg["model_ema_warmup"]) \
        if cfg["model_ema"] else None
    with user_errors(f"opt={cfg['opt']}", (ValueError, TypeError, ImportError)):
        optimizer = create_optimizer_v2(model, opt=cfg["opt"], lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                        layer_decay=cfg["layer_decay"])  # position parameters: no weight decay
    total_steps = cfg["epochs"] * updates_per_epoch  # optimizer steps
    warmup_steps = min(round(cfg["warmup_epochs"] * updates_per_epoch), total_steps - 1)
    scheduler = CosineLRScheduler(optimizer, t_initial=total_steps - warmup_steps, lr_min=cfg["min_lr"],
                                  warmup_t=warmup_steps, warmup_lr_init=cfg["lr"] * 1e-3, warmup_prefix=True,
                                  t_in_epochs=False)  # per step: linear warmup, then cosine down to min_lr
    mixup = None
    if cfg["mixup"] > 0 or cfg["cutmix"] > 0:
        mixup = Mixup(mixup_alpha=cfg["mixup"], cutmix_alpha=cfg["cutmix"], label_smoothing=cfg["label_smoothing"],
                      num_classes=cfg["num_classes"])
    return Recipe(optimizer, scheduler, criterion_for(cfg, mixup is not None), mixup,
                  NativeScaler(device=device.type) if amp_dtype == torch.float16 else None, ema)


def criterion_for(cfg: dict, mixup: bool) -> torch.nn.Module:
    """The training loss of a run's settings, as timm's train.py combines them: with mixup/cutmix (``mixup``) the
    targets arrive soft and smoothed (timm's ``Mixup``), so the loss is ``SoftTargetCrossEntropy`` or, with
    ``bce_loss``, ``BinaryCrossEntropy(target_threshold)``; without, label smoothing goes to
    ``LabelSmoothingCrossEntropy`` or ``BinaryCrossEntropy(smoothing)``; plain cross-entropy otherwise (BCE stays
    BCE here, where timm's train.py falls back to cross-entropy)."""
    smoothing = cfg["label_smoothing"]
    if cfg["bce_loss"]:
        return BinaryCrossEntropy(smoothing=0.0 if mixup else smoothing, target_threshold=cfg["bce_target_thresh"])
    if mixup:
        return SoftTargetCrossEntropy()
    if smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing=smoothing)
    return torch.nn.CrossEntropyLoss()


def resume(recipe: Recipe, model: torch.nn.Module, state: dict | None, path, world: int, init=None) -> Progress:
    """Where the run stands: fresh (the ``--init-from`` / ``--pretrained`` record first in its history), or continued
    from ``state`` (``path``'s state.pt): the model's weights, the optimizer, schedule, EMA and scaler loaded, and a
    commit within an epoch checked to have been made by as many processes as ``world``."""
    if state is None:
        return Progress(history=[init] if init else [])
    restore.load_state(model, state["model"], path)
    with user_errors(f"{path} does not fit the optimizer, schedule, EMA or gradient scaler",
                     (ValueError, TypeError, RuntimeError, KeyError)):
        recipe.optimizer.load_state_dict(state["optimizer"])
        recipe.scheduler.load_state_dict(state["scheduler"])
        if recipe.ema is not None:
            recipe.ema_module.load_state_dict(state["ema"])
        if recipe.scaler is not None:
            recipe.scaler.load_state_dict(state["scaler"])
    progress = Progress(state["epoch"], state["best_acc"], state["best_epoch"], state["history"],
                        state.get("progress"))
    if progress.within is not None and len(progress.within["sums"]) != world:
        raise UserError(f"{path} was saved within epoch {progress.epoch + 1} by {len(progress.within['sums'])} "
                        f"process(es); resume it with as many (this is {world})")
    return progress
