"""Train a vision transformer with any positional encoding, then measure how accuracy holds when the
test resolution changes.

    visionpe train --data shapes-position --pe rope_mixed --epochs 2 --eval-res 32 48 64
    visionpe train --config shapes_tiny --pe rope_mixed+learned --pe-kwargs theta=10     # a shipped recipe, by name
    torchrun --nproc_per_node 2 -m visionpe.train --config shapes_tiny             # DDP (gloo on CPU, nccl on GPU)
    torchrun --nproc_per_node 2 -m visionpe.train --config shapes_tiny --parallel fsdp  # FSDP2 (docs/scaling.md)
    visionpe train --data moving-shapes --num-frames 8 --pe rope_axial --eval-frames 4 16 --eval-res 24 48
                                                         # video: a tubelet ViT, frames x resolution table
    visionpe train --model vit_small_patch16_224 --data cifar10 --pe rope_mixed       # timm's ViT-S, its own sizes
    visionpe train --resume runs/NAME                                              # continue exactly
    visionpe train --resume runs/NAME --epochs 20                # extend: the schedule continues to 20 epochs
    visionpe train --init-from runs/NAME --pe rope_mixed --epochs 2 --output runs/NAME_to_rope
                                                         # convert a trained run to another encoding, fine-tune
    visionpe train --config shapes_tiny --log tensorboard wandb                    # loggers besides the console

--init-from starts a NEW run (fresh optimizer and schedule, epochs from 1) from another model's weights: every
non-positional weight is kept, positional ones are converted where that has a meaning (a learned table resampled
to the new grid; timm's pos_embed into learned) and the rest are dropped or start fresh, with a printed
kept / converted / new / dropped report. The model and data settings default to the source run's.

--pretrained starts a new run from timm's pretrained weights of --model the same way (--pretrained-path FILE: a
local file instead of the Hugging Face hub).

Settings: defaults < YAML recipe (--config: a file, or a recipe shipped with visionpe by name) < command line
(visionpe/train/settings.py lists every one). The run directory (--output, default
runs/YYYYMMDD-HHMMSS-<data>-<pe>-s<seed>: the start time, then what is trained) holds
config.yaml, state.pt (the checkpoint; under --parallel fsdp checkpoint/, each process's shards), last.safetensors,
best.safetensors, ema.safetensors (--model-ema), metrics.jsonl, summary.csv and results.json
(visionpe/train/rundir.py: what each holds, and why a kill at any instant, within an epoch too with
--checkpoint-every-steps, leaves a run that --resume continues exactly; what a run reports, and the loggers of
--log: visionpe/train/metrics.py).

`batch_size` is the global batch of one loader step: under torchrun each of N processes takes batch_size / N, and
with --grad-accum-steps K an optimizer step sums K of them (batch_size x K images, timm's convention). User mistakes
(unknown names, bad values, missing data, a diverging loss) exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch
import torch.distributed as dist

from . import commits, distributed, evaluation, loop, metrics, models, optimization, restore, rundir, sampling
from .settings import parse_args, run_warnings


def main(argv: list[str]) -> dict:
    # -- parse and settings: defaults < recipe < command line, one typed record; --resume: the run's own config.yaml,
    #    safe changes only --------------------------------------------------------------------------------------------
    head, examples, tail = __doc__.split("\n\n", 2)  # --help: what it does, the examples, then the flags
    args = parse_args(argv, prog="visionpe train", description=f"{head}\n\nexamples:\n{examples}",
                      epilog=tail.split("\n\nSettings")[0])
    resume = bool(args.get("resume"))
    settings, changed = restore.resume_config(args) if resume else (restore.new_config(args), [])

    # -- processes and device: one per torchrun rank; rank 0 names the run folder, writes it and reports -----------
    procs = distributed.start(settings)
    device, world, rank = procs.device, procs.world, procs.rank
    settings = settings.replace(output=distributed.rank0_value(settings.output))  # a default name holds the time
    out = Path(settings.output)
    metrics.check_loggers(settings.log)  # a missing package, before anything is written
    report = metrics.Report(procs.master, video=bool(settings.num_frames))  # rank 0's console, then --log's loggers
    if not resume:
        rundir.check_fresh(out, settings.overwrite)  # an existing run needs --resume or --overwrite
    state = rundir.resume_point(out) if resume else None  # state.pt's contents, or a sharded run's DCP folder

    # -- data: the training and validation sets, one process's share of each batch ----------------------------------
    settings, train_set, val_set = sampling.datasets(settings)  # an image folder's classes, once read
    loader, loader_set, sampler = sampling.training_loader(train_set, settings, world=world, rank=rank,
                                                           pin_memory=device.type == "cuda")
    data_notes = sampling.data_notes(settings)  # transform settings the data set does not take
    steps_per_epoch = len(loader)  # loader batches; an optimizer step every grad_accum_steps of them
    updates_per_epoch = math.ceil(steps_per_epoch / settings.grad_accum_steps)

    # -- model: its weights fresh, converted, pretrained (or resumed below, with the optimization) -------------------
    plan = models.model_plan(settings)  # the constructor and its keywords, resolved once
    torch.manual_seed(settings.seed)
    with torch.device("meta") if settings.meta_init else contextlib.nullcontext():  # --meta-init: FSDP materialises
        raw_model = models.build_model(settings, plan)
    pretrained = models.pretrained_source(settings, plan) if state is None and settings.pretrained else None
    num_params = sum(p.numel() for p in raw_model.parameters())
    init = None
    if state is None and settings.init_from:  # a new run from another model's weights (or one resumed before epoch 1)
        init = restore.init_weights(raw_model, settings)
    elif pretrained is not None:  # from timm's pretrained weights
        init = restore.pretrained_weights(raw_model, settings, pretrained)
    init_note = restore.init_text(init) if init else None  # kept / converted / new / dropped

    # -- optimization and parallel: the precision of the steps; the model on the device; EMA; compile and DDP, or
    #    FSDP2 (sharded in place); the optimizer (timm's order); then the last commit restored into all of them ------
    amp_dtype = loop.amp_dtype(settings.amp, device)  # fp16 only on CUDA (check_run)
    policy = loop.fsdp_precision(settings, amp_dtype, device)  # FSDP2 on CUDA: bf16 parameters in place of autocast
    autocast = loop.autocast_for(device, None if policy else amp_dtype)
    model, ema = loop.trained_module(settings, raw_model, procs, policy)
    parts = optimization.build(settings, raw_model, ema, updates_per_epoch, procs, amp_dtype)
    run = optimization.resume(parts, raw_model, state, out, world, init, steps=steps_per_epoch)  # or fresh
    start_epoch = run.epoch
    extension = optimization.extension_text(run.extended, parts.scheduler) if run.extended else None  # --epochs N

    # -- report the start: the first line, notes and warnings; the run folder (fresh: config.yaml; or its exports
    #    repaired); then the loggers, in line with the history -------------------------------------------------------
    report(metrics.start_line(settings, num_params=num_params, train_size=len(train_set), val_size=len(val_set),
                              world=world, device=device, amp=amp_dtype is not None, out=out))  # the first line
    for note in data_notes:
        report(note)
    for warning in run_warnings(settings, updates_per_epoch * settings.epochs):  # threads, a slow EMA
        report.warn(warning)
    if init_note:
        report(init_note)
    if world > 1:
        dist.barrier()  # every process has checked the run directory before rank 0 writes to it
    if procs.master:
        for note in rundir.prepare(out, settings, resume=resume, state=run.saved, changed=changed):
            report(note)
    try:
        report.open_loggers(out, settings, run.history, resume)
    except BaseException:
        if procs.master and not resume:  # a start that failed: no folder left that refuses the retry
            rundir.undo_start(out)
        raise
    if resume:
        within = run.within
        report(f"resuming {out} " + (f"at batch {within['step']}/{steps_per_epoch} of epoch {start_epoch + 1}"
                                     if within else f"after epoch {start_epoch}"))
    if extension:
        report(extension)  # --resume --epochs N: what changes
    eval_kw = dict(batch_size=settings.eval_batch_size, workers=settings.workers, device=device, autocast=autocast,
                   rank=rank, world=world)

    # -- training: an epoch, its validation, a commit of state.pt (and within the epoch, when the clock says so) ---
    clock = commits.CheckpointClock(settings.checkpoint_every_steps, settings.checkpoint_every_minutes, device)
    last_finite = None
    for epoch in range(start_epoch, settings.epochs):
        loop.seed_everything(settings.seed, epoch, rank)
        resumed = None  # the part of this epoch done before a commit within it
        if run.within is not None and epoch == start_epoch:
            sums = run.within["sums"][rank]
            resumed = {**run.within, "loss_sum": sums[0], "seen": sums[1]}
        sampler.set_epoch(epoch, skip=resumed["step"] * (settings.batch_size // world) if resumed else 0)
        loader_set.set_epoch(epoch)
        stats = loop.train_one_epoch(model, loader, parts, epoch=epoch, epochs=settings.epochs, device=device,
                                     autocast=autocast, clip_grad=settings.clip_grad, world=world,
                                     progress=procs.master and settings.progress, last_finite=last_finite,
                                     train_res=settings.train_res, seed=settings.seed, rank=rank,
                                     accum_steps=settings.grad_accum_steps, channels_last=settings.channels_last,
                                     resume=resumed,
                                     on_update=commits.commit_within(out, raw_model, parts, run, epoch, clock,
                                                                     steps_per_epoch, procs))
        last_finite = stats["last_finite"]
        val = evaluation.evaluate(model, val_set, **eval_kw)
        ema = evaluation.evaluate(parts.ema_module, val_set, **eval_kw) if parts.ema is not None else None
        commits.check_finite(raw_model, epoch=epoch + 1, kept_epoch=epoch, val_loss=val.loss, ema=parts.ema_module,
                             ema_loss=ema.loss if ema else None)  # a diverged epoch is neither saved nor reported
        record = metrics.EpochRecord(epoch + 1, stats["train_loss"], val, parts.lr, stats["seen"] / stats["elapsed"],
                                     stats["elapsed"], ema)
        improved = val.acc > run.best_acc
        if improved:
            run.best_acc, run.best_epoch = val.acc, epoch + 1
        run.history.append(record.row())
        run.epoch, run.within = epoch + 1, None
        commits.commit(out, raw_model, parts, run, procs)  # state.pt by rank 0, or every process's shards (FSDP)
        clock.reset()
        report.epoch(record, settings.epochs, improved)  # committed first: a logger never holds an unsaved epoch
        if settings.stop_after and epoch + 1 - start_epoch >= settings.stop_after and epoch + 1 < settings.epochs:
            report(f"stopping after epoch {epoch + 1} (stop_after); continue with --resume {out}")
            report.close()
            del model  # DDP's reducer freed while the group stands, as at the end of the run
            distributed.leave()
            return {"stopped": epoch + 1}

    # -- resolution evaluation: last, best (and EMA) weights, same scenes at every resolution (and frame count) -----
    video = bool(settings.num_frames)  # keys (frames, res) of clips, else image sizes
    keys, train_key = sampling.eval_grid(settings, settings.eval_res, settings.eval_frames)
    eval_sets = {k: (val_set if k == train_key else sampling.dataset(settings, "val", k[1], k[0]) if video else
                     sampling.dataset(settings, "val", k)) for k in keys}
    results, exported = {}, ("last", "best") + (("ema",) if parts.ema is not None else ())
    for which in exported:
        report(f"evaluating the {which} weights at {' '.join(metrics.key_text(k) for k in keys)}"
               f"{' (frames x px)' if video else ' px'} ...")  # the final table's progress
        if world > 1:
            dist.barrier()  # rank 0 has finished writing the weights
        path = rundir.weights_file(out, which)
        rundir.load_state(raw_model, rundir.read_weights(path, device), path)
        measured = evaluation.evaluate_resolutions(raw_model, eval_sets, **eval_kw)  # eager: any size
        results[which] = metrics.retention_table(measured, train_key)
        run.history += [{"kind": "eval_res", "model": which, **({"res": k[1], "frames": k[0]} if video else {"res": k}),
                         **m} for k, m in results[which].items()]
    summary = metrics.summary(settings, run.history, results, num_params=num_params, best_epoch=run.best_epoch)
    if procs.master:
        rundir.finish(out, run.history, summary)  # metrics.jsonl, summary.csv, then results.json: finished
    report(metrics.resolution_table(settings, results, run.best_epoch))
    note = metrics.learning_note(settings, results, train_key)  # at chance: the benchmark's "not learned" rule
    if note:
        report(note)
    report(rundir.files_line(out, exported))
    report.close()
    del model  # DDP's reducer holds the process group: freed first, the group is destroyed in leave()
    distributed.leave()
    return summary

