#!/usr/bin/env python
"""Train a vision transformer with any positional encoding, then measure how accuracy holds when the
test resolution changes.

    python train_vit.py --data shapes-position --pe rope_mixed --epochs 2 --eval-res 32 48 64
    python train_vit.py --config configs/shapes_tiny.yaml --pe rope_mixed+learned --pe-kwargs theta=10
    torchrun --nproc_per_node 2 train_vit.py --config configs/shapes_tiny.yaml      # DDP (gloo on CPU, nccl on GPU)
    python train_vit.py --data moving-shapes --num-frames 8 --pe rope_axial --eval-frames 4 16 --eval-res 24 48
                                                         # video: a tubelet ViT, frames x resolution table
    python train_vit.py --resume runs/NAME                                          # continue exactly
    python train_vit.py --init-from runs/NAME --pe rope_mixed --epochs 2 --output runs/NAME_to_rope
                                                         # convert a trained run to another encoding, fine-tune

--init-from starts a NEW run (fresh optimizer and schedule, epochs from 1) from another model's weights: every
non-positional weight is kept, positional ones are converted where that has a meaning (a learned table resampled
to the new grid; timm's pos_embed into learned) and the rest are dropped or start fresh, with a printed
kept / converted / new / dropped report. The model and data settings default to the source run's.

--pretrained starts a new run from timm's pretrained weights of --model the same way (--pretrained-path FILE: a
local file instead of the Hugging Face hub).

Settings: defaults < YAML recipe (--config) < command line (visionpe/train/settings.py lists every one). The run
directory (--output, default runs/<data>_<pe>_s<seed>) holds config.yaml, state.pt (the checkpoint),
last.safetensors, best.safetensors, ema.safetensors (--model-ema), metrics.jsonl and results.json
(visionpe/train/rundir.py: what each holds, and why a kill at any instant, within an epoch too with
--checkpoint-every-steps, leaves a run that --resume continues exactly).

`batch_size` is the global batch of one loader step: under torchrun each of N processes takes batch_size / N, and
with --grad-accum-steps K an optimizer step sums K of them (batch_size x K images, timm's convention). User mistakes
(unknown names, bad values, missing data, a diverging loss) exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from timm.data import Mixup
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3, NativeScaler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from visionpe.train import cli, distributed, loop, models, report, restore, rundir, sampling, settings
from visionpe.train.cli import UserError


def main(argv: list[str]) -> dict:
    # -- settings ----------------------------------------------------------------------------------------
    head, _, tail = __doc__.partition("\n\n")
    args = settings.parse_args(argv, prog="train_vit", description=head, epilog=tail.split("\n\nSettings")[0])
    resume = bool(args.get("resume"))
    if resume:
        cfg, changed = restore.resume_config(args)  # the run's config.yaml; only safe settings may change
    else:
        cfg, changed = restore.new_config(args), []  # with --init-from: the source run's model settings as defaults
        rundir.check_fresh(Path(cfg["output"]), cfg["overwrite"])
    out = Path(cfg["output"])

    # -- processes and device ------------------------------------------------------------------------------
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg["batch_size"] % world:
        raise UserError(f"batch_size {cfg['batch_size']} must be divisible by the {world} processes")
    use_cuda = cfg["device"] == "cuda" or (cfg["device"] == "auto" and torch.cuda.is_available())
    if world > 1:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    master = rank == 0
    amp_dtype = loop.amp_dtype(cfg["amp"], device)  # fp16 only on CUDA (settings.check_run)
    autocast = loop.autocast_for(device, amp_dtype)
    log = print if master else (lambda *a, **k: None)
    eval_kw = dict(batch_size=cfg["eval_batch_size"], workers=cfg["workers"], device=device, autocast=autocast,
                   rank=rank, world=world)

    # -- data ----------------------------------------------------------------------------------------------
    video = bool(cfg["num_frames"])  # clips (C, T, H, W) and a tubelet video model
    train_set = loop.dataset(cfg, "train", cfg["img_size"])
    val_set = loop.dataset(cfg, "val", cfg["img_size"])
    if cfg["num_classes"] is None:  # imagefolder: the class count is known once the folders are read
        cfg["num_classes"] = train_set.num_classes
    elif cfg["num_classes"] != train_set.num_classes:
        raise UserError(f"the {cfg['data']} data has {train_set.num_classes} classes, the run {cfg['num_classes']}")
    per_rank = cfg["batch_size"] // world
    loader_set, sampler = sampling.training_order(train_set, world=world, rank=rank, seed=cfg["seed"],
                                                  repeats=cfg["aug_repeats"])  # DistributedSampler or RepeatAugSampler
    loader = DataLoader(loader_set, batch_size=per_rank, sampler=sampler, num_workers=cfg["workers"], drop_last=True,
                        pin_memory=use_cuda, collate_fn=loop.collate_images)  # --max-patches: lists of mixed sizes
    steps_per_epoch = len(loader)  # loader batches; an optimizer step every grad_accum_steps of them
    if steps_per_epoch == 0:
        raise UserError(f"batch_size {cfg['batch_size']} is larger than the training set ({len(train_set)} images)")
    updates_per_epoch = math.ceil(steps_per_epoch / cfg["grad_accum_steps"])

    # -- model, optimizer, schedule, loss --------------------------------------------------------------------
    state = rundir.load_checkpoint(out) if resume else None
    torch.manual_seed(cfg["seed"])
    raw_model = models.build_model(cfg)
    init = None
    if state is None and cfg["init_from"]:  # a new run from another model's weights (or one resumed before epoch 1)
        init = restore.init_weights(raw_model, cfg)
    elif state is None and cfg["pretrained"]:  # from timm's pretrained weights
        init = restore.pretrained_weights(raw_model, cfg)
    raw_model = raw_model.to(device)
    if cfg["channels_last"]:
        loop.channels_last_(raw_model)
    ema = ModelEmaV3(raw_model, decay=cfg["model_ema_decay"], use_warmup=cfg["model_ema_warmup"]) \
        if cfg["model_ema"] else None  # after the weights and the device, before compile and DDP (as timm)
    ema_module = ema.module if ema is not None else None  # the averaged model itself (evaluated, saved)
    train_model = torch.compile(raw_model) if cfg["compile"] else raw_model
    net = loop.MixedSizes(train_model) if cfg["max_patches"] else train_model  # takes lists of images of mixed sizes
    model = DDP(net, device_ids=[local_rank] if use_cuda else None) if world > 1 else net
    num_params = sum(p.numel() for p in raw_model.parameters())
    with cli.user_errors(f"opt={cfg['opt']}", (ValueError, TypeError, ImportError)):
        optimizer = create_optimizer_v2(raw_model, opt=cfg["opt"], lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                        layer_decay=cfg["layer_decay"])  # position parameters: no weight decay
    total_steps = cfg["epochs"] * updates_per_epoch  # optimizer steps
    warmup_steps = min(round(cfg["warmup_epochs"] * updates_per_epoch), total_steps - 1)
    scheduler = CosineLRScheduler(optimizer, t_initial=total_steps - warmup_steps, lr_min=cfg["min_lr"],
                                  warmup_t=warmup_steps, warmup_lr_init=cfg["lr"] * 1e-3, warmup_prefix=True,
                                  t_in_epochs=False)  # per step: linear warmup, then cosine down to min_lr
    scaler = NativeScaler(device=device.type) if amp_dtype == torch.float16 else None  # float16 needs loss scaling
    mixup = None
    if cfg["mixup"] > 0 or cfg["cutmix"] > 0:
        mixup = Mixup(mixup_alpha=cfg["mixup"], cutmix_alpha=cfg["cutmix"], label_smoothing=cfg["label_smoothing"],
                      num_classes=cfg["num_classes"])
    criterion = loop.criterion_for(cfg, mixup is not None)  # CE / label smoothing / soft targets / BCE, as timm

    # -- run directory: fresh, or continue from the last commit (the end of an epoch, or within one) -------------
    start_epoch, best_acc, best_epoch, history, within = 0, -1.0, -1, [init] if init else [], None
    if state is not None:
        restore.load_state(raw_model, state["model"], out / rundir.STATE)
        with cli.user_errors(f"{out / rundir.STATE} does not fit the optimizer, schedule, EMA or gradient scaler",
                             (ValueError, TypeError, RuntimeError, KeyError)):
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            if ema is not None:
                ema_module.load_state_dict(state["ema"])
            if scaler is not None:
                scaler.load_state_dict(state["scaler"])
        start_epoch, best_acc, best_epoch, history = (state["epoch"], state["best_acc"], state["best_epoch"],
                                                      state["history"])
        within = state.get("progress")  # committed within epoch start_epoch + 1
        if within is not None and len(within["sums"]) != world:
            raise UserError(f"{out / rundir.STATE} was saved within epoch {start_epoch + 1} by {len(within['sums'])} "
                            f"process(es); resume it with as many (this is {world})")
    if world > 1:
        dist.barrier()  # every process has checked the run directory before rank 0 writes to it
    if master:  # fresh: clear (--overwrite) and write config.yaml; resume: repair the exports, apply changes
        for note in rundir.prepare(out, cfg, resume=resume, state=state, changed=changed):
            log(note)
    if resume:
        log(f"resuming {out} " + (f"at batch {within['step']}/{steps_per_epoch} of epoch {start_epoch + 1}" if within
                                  else f"after epoch {start_epoch}"))
    if init:
        log(restore.init_text(init))
    for note in loop.data_notes(cfg):
        log(note)
    clips = (f" clips of {cfg['num_frames']} frames, tubelet {'x'.join(map(str, models.tubelet(cfg)))}"
             if video else "")
    recipe = "".join([f" | {cfg['grad_accum_steps']} batches a step" if cfg["grad_accum_steps"] > 1 else "",
                      " | EMA" if ema is not None else "", " | compiled" if cfg["compile"] else ""])
    log(f"{cfg['model']} pe={cfg['pe']} {num_params / 1e6:.3f}M params | {cfg['data']} {len(train_set)} train "
        f"{len(val_set)} val at {cfg['img_size']}px{clips} | {world} process(es) on {device.type}"
        f"{'' if amp_dtype is None else ' ' + cfg['amp'].replace('auto', 'bf16')}{recipe} | {out}")

    # -- training --------------------------------------------------------------------------------------------
    clock = loop.CheckpointClock(cfg["checkpoint_every_steps"], cfg["checkpoint_every_minutes"], device)

    def commit_within(epoch: int):
        """After each optimizer step of ``epoch``: commit state.pt when the clock says so (not after the last
        batch: the epoch's own commit follows)."""
        def on_update(progress: dict) -> None:
            if progress["step"] == steps_per_epoch or not clock.due(progress["update"]):
                return
            loop.check_finite(raw_model, epoch=epoch + 1, kept_epoch=epoch, ema=ema_module,
                              within=f"at step {progress['step']}/{steps_per_epoch} of")  # never commit NaN weights
            sums = distributed.all_gather([progress["loss_sum"], progress["seen"]], device)  # every process's, by rank
            if master:
                rundir.save_checkpoint(out, raw_model, optimizer, scheduler, epoch=epoch, best_acc=best_acc,
                                       best_epoch=best_epoch, history=history, ema=ema_module, scaler=scaler,
                                       progress={"step": progress["step"], "sums": sums,
                                                 "last_finite": progress["last_finite"],
                                                 "elapsed": progress["elapsed"]})
            clock.reset()
        return on_update

    last_finite = None
    for epoch in range(start_epoch, cfg["epochs"]):
        loop.seed_everything(cfg["seed"], epoch, rank)
        resumed = None  # the part of this epoch done before a mid-epoch commit
        if within is not None and epoch == start_epoch:
            resumed = {"step": within["step"], "loss_sum": within["sums"][rank][0], "seen": within["sums"][rank][1],
                       "last_finite": within["last_finite"], "elapsed": within["elapsed"]}
        sampler.set_epoch(epoch, skip=resumed["step"] * per_rank if resumed else 0)
        loader_set.set_epoch(epoch)
        stats = loop.train_one_epoch(model, loader, optimizer, scheduler, criterion, epoch=epoch,
                                     epochs=cfg["epochs"], device=device, autocast=autocast, mixup=mixup,
                                     clip_grad=cfg["clip_grad"], world=world, progress=master and cfg["progress"],
                                     last_finite=last_finite, train_res=cfg["train_res"], seed=cfg["seed"], rank=rank,
                                     accum_steps=cfg["grad_accum_steps"], ema=ema, scaler=scaler,
                                     channels_last=cfg["channels_last"], resume=resumed,
                                     on_update=commit_within(epoch))
        last_finite = stats["last_finite"]
        val_acc, val_loss = loop.evaluate(model, val_set, **eval_kw)
        improved = val_acc > best_acc
        if improved:
            best_acc, best_epoch = val_acc, epoch + 1
        ema_metrics = {}
        if ema is not None:  # the EMA weights beside the model's
            ema_acc, ema_loss = loop.evaluate(ema_module, val_set, **eval_kw)
            ema_metrics = {"ema_val_loss": ema_loss, "ema_val_acc": ema_acc}
        loop.check_finite(raw_model, epoch=epoch + 1, kept_epoch=epoch, val_loss=val_loss, ema=ema_module,
                          ema_loss=ema_metrics.get("ema_val_loss"))  # a diverged epoch is neither saved nor reported
        history.append({"kind": "epoch", "epoch": epoch + 1, "train_loss": stats["train_loss"], "val_loss": val_loss,
                        "val_acc": val_acc, **ema_metrics, "lr": max(g["lr"] for g in optimizer.param_groups),
                        "img_per_s": stats["seen"] / stats["elapsed"], "epoch_time_s": stats["elapsed"]})
        if master:
            rundir.save_checkpoint(out, raw_model, optimizer, scheduler, epoch=epoch + 1, best_acc=best_acc,
                                   best_epoch=best_epoch, history=history, ema=ema_module, scaler=scaler)
        clock.reset()
        log(f"epoch {epoch + 1:3d}/{cfg['epochs']}  train loss {stats['train_loss']:.4f}  val loss {val_loss:.4f}  "
            f"val top-1 {val_acc:6.2f}%{' *' if improved else ''}{f'  EMA top-1 {ema_acc:6.2f}%' if ema_metrics else ''}  "
            f"{stats['seen'] / stats['elapsed']:.0f} img/s")
        if cfg["stop_after"] and epoch + 1 - start_epoch >= cfg["stop_after"] and epoch + 1 < cfg["epochs"]:
            log(f"stopping after epoch {epoch + 1} (stop_after); continue with --resume {out}")
            del model  # DDP's reducer freed while the group stands, as at the end of the run
            distributed.leave()
            return {"stopped": epoch + 1}

    # -- resolution evaluation: last, best (and EMA) weights, same scenes at every resolution (and frame count) --
    resolutions = sorted(set(cfg["eval_res"]) | {cfg["img_size"]})
    keys, train_key = loop.eval_grid(cfg, cfg["eval_res"], cfg["eval_frames"])
    eval_sets = {k: (val_set if k == train_key else
                     loop.dataset(cfg, "val", k[1], k[0]) if video else loop.dataset(cfg, "val", k)) for k in keys}
    results, weights = {}, ("last", "best") + (("ema",) if ema is not None else ())
    for which in weights:
        if world > 1:
            dist.barrier()  # rank 0 has finished writing the weights
        path = rundir.weights_file(out, which)
        restore.load_state(raw_model, rundir.read_weights(path, device), path)
        results[which] = loop.evaluate_resolutions(raw_model, eval_sets, train_key, **eval_kw)  # eager: any size
        history += [{"kind": "eval_res", "model": which, **({"res": k[1], "frames": k[0]} if video else {"res": k}),
                     **m} for k, m in results[which].items()]
    epochs_run = [h for h in history if h["kind"] == "epoch"]
    protocol = settings.transforms_of(cfg)
    summary = {"model": cfg["model"], "pe": cfg["pe"], "data": cfg["data"], "seed": cfg["seed"],
               "img_size": cfg["img_size"], "eval_protocol": protocol.eval_protocol,
               **({"crop_pct": protocol.crop_pct} if protocol.eval_protocol == "crop" else {}),
               **({"max_patches": cfg["max_patches"]} if cfg["max_patches"] else {}),
               **({"num_frames": cfg["num_frames"],
                                                "tubelet_size": list(models.tubelet(cfg))} if video else {}),
               "init_from": cfg["init_from"], "params": num_params,
               "epochs": cfg["epochs"], "best_epoch": best_epoch,
               "train_img_per_s": float(np.median([h["img_per_s"] for h in epochs_run])) if epochs_run else None,
               "final_train_loss": epochs_run[-1]["train_loss"] if epochs_run else None,
               "results": {w: {loop.key_text(k): m for k, m in rs.items()} for w, rs in results.items()}}
    if master:
        rundir.finish(out, history, summary)  # metrics.jsonl, then results.json: the run is finished
    rows = []
    for which in weights:
        for f in (sorted({k[0] for k in keys}) if video else [None]):
            at = (lambda r: results[which][(f, r)]) if video else (lambda r: results[which][r])
            name = f"{which} {f} frames" if video else which
            rows.append([f"{name} top-1 %"] + [f"{at(r)['acc']:.2f}" for r in resolutions])
            rows.append([f"{name} retention"] + [f"{at(r)['retention']:.3f}" for r in resolutions])
    trained = f"{cfg['num_frames']} frames at {cfg['img_size']}px" if video else f"{cfg['img_size']}px"
    if cfg["max_patches"]:
        trained += f" (native aspect ratios within {cfg['max_patches']} patches)"
    log(f"\n{cfg['data']}  {cfg['model']}  pe={cfg['pe']}  trained at {trained}, best epoch {best_epoch}, evaluated "
        f"under protocol {protocol.describe()}\n"
        + report.text_table(rows, ["frames x resolution" if video else "resolution"] + [f"{r}px" for r in resolutions]))
    del model  # DDP's reducer holds the process group: freed first, the group is destroyed in leave()
    distributed.leave()
    return summary


if __name__ == "__main__":
    result = cli.run(main, prog="train_vit")  # `result`: what main returned, for callers that use runpy
