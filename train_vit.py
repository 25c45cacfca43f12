#!/usr/bin/env python
"""Train a vision transformer with any positional encoding, then measure how accuracy holds when the
test resolution changes.

    python train_vit.py --data shapes-position --pe rope_mixed --epochs 2 --eval-res 32 48 64
    python train_vit.py --config configs/shapes_tiny.yaml --pe rope_mixed+learned --pe-kwargs theta=10
    torchrun --nproc_per_node 2 train_vit.py --config configs/shapes_tiny.yaml      # DDP (gloo on CPU, nccl on GPU)
    python train_vit.py --resume runs/NAME                                          # continue exactly

Settings come from DEFAULTS below, overridden by a YAML recipe (--config), overridden by the command line.
The run directory (--output, default runs/<data>_<pe>_s<seed>) holds:

    config.yaml         the resolved settings (model, pe, pe_kwargs, img_size, patch_size, num_classes,
                        model_kwargs: everything visionpe.create_model(model, pe, pe_kwargs=..., **model_kwargs) needs)
    last.safetensors    model weights after the latest epoch   (written atomically every epoch)
    best.safetensors    weights of the epoch with the best validation top-1 at the training resolution
    state.pt            optimizer, scheduler, epoch, best, history (torch.load(..., weights_only=True))
    metrics.jsonl       one JSON object per line: {"kind": "epoch", ...} and {"kind": "eval_res", ...}
    results.json        the final resolution table (last and best model), params, images/s

`batch_size` is the global batch: under torchrun each of N processes takes batch_size / N.
User mistakes (unknown names, bad values, missing data) exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from safetensors.torch import load_file
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset
from tqdm import tqdm

import visionpe
from visionpe.backbones import parse_pe
from visionpe import data as vdata
from visionpe.checkpoint import atomic_write, save_weights, weights_metadata

# -----------------------------------------------------------------------------------------------------
# default recipe: every key can be set in a YAML file (--config) and on the command line (--key value)
DEFAULTS = dict(
    # model: a timm ViT/DeiT/Swin name; size overrides go to timm through model_kwargs
    model="vit_tiny_patch16_224",
    pe="learned",                 # any of visionpe.available(), a combination "rope_mixed+learned", or "none"
    pe_kwargs={},                 # encoding keywords, e.g. {theta: 100, scaling: pi}
    img_size=32,                  # training resolution (pixels, square)
    patch_size=4,
    model_kwargs={"embed_dim": 64, "depth": 4, "num_heads": 4},  # any timm keyword (mlp_ratio, global_pool, ...)
    drop_path=0.0,
    # data
    data="shapes-position",       # visionpe.data.DATASETS
    data_dir=None,
    download=False,
    train_samples=None,           # synthetic: scenes rendered (default 10000); real: fixed random subset (default all)
    val_samples=None,             # synthetic default 2000; real default all
    workers=0,
    # optimization
    epochs=10,
    batch_size=128,               # global, over all processes
    opt="adamw",
    lr=1e-3,
    weight_decay=0.05,            # never applied to position parameters (model.no_weight_decay())
    warmup_epochs=1.0,
    min_lr=1e-5,
    label_smoothing=0.1,
    mixup=0.0,                    # timm Mixup alpha (0 = off)
    cutmix=0.0,                   # timm CutMix alpha (0 = off)
    clip_grad=1.0,                # max gradient norm (0 = off)
    amp="auto",                   # auto: bf16 autocast on CUDA, none on CPU; or bf16 / none
    # evaluation: after training, the last and the best model at each resolution (train res always included)
    eval_res=[],
    eval_batch_size=256,
    # run
    seed=0,
    device="auto",                # auto / cpu / cuda
    threads=0,                    # torch.set_num_threads (0 = leave torch's default)
    output=None,                  # run directory (default runs/<data>_<pe>_s<seed>)
    overwrite=False,              # start afresh in an existing run directory
    stop_after=0,                 # stop after this many epochs as if interrupted (0 = never); --resume continues
    progress=True,                # tqdm bar per epoch
)
HELP = {"config": "YAML recipe", "resume": "continue the run in this directory (or --output) exactly",
        "pe_kwargs": "encoding keywords as key=value", "model_kwargs": "timm keywords as key=value",
        "embed_dim": "model_kwargs.embed_dim", "depth": "model_kwargs.depth", "num_heads": "model_kwargs.num_heads"}
AMP = ("auto", "bf16", "none")
SIZE_KEYS = ("embed_dim", "depth", "num_heads")  # command-line shortcuts into model_kwargs


class UserError(Exception):
    """A mistake in the settings or the environment: reported on one line, exit status 2."""


# -----------------------------------------------------------------------------------------------------
# settings: defaults < YAML < command line
class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(message)


def _kv(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    return key, yaml.safe_load(value)


def parse_args(argv):
    p = OneLineParser(prog="train_vit", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help=HELP["config"])
    p.add_argument("--resume", nargs="?", const=True, help=HELP["resume"])
    for key, default in DEFAULTS.items():
        flag = "--" + key.replace("_", "-")
        if key in ("pe_kwargs", "model_kwargs"):
            p.add_argument(flag, nargs="*", type=_kv, metavar="KEY=VALUE", help=HELP[key])
        elif isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=f"(default {default})")
        elif isinstance(default, list):
            p.add_argument(flag, nargs="*", type=int, help=f"(default {default})")
        else:
            kind = type(default) if default is not None else (int if key.endswith("_samples") else str)
            p.add_argument(flag, type=kind, help=f"(default {default})")
    for key in SIZE_KEYS:
        p.add_argument("--" + key.replace("_", "-"), type=int, help=HELP[key])
    args = vars(p.parse_args(argv))
    for key in ("pe_kwargs", "model_kwargs"):
        if key in args:
            args[key] = dict(args[key])
    return args


def read_yaml(path) -> dict:
    try:
        with open(path) as f:
            cfg = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise UserError(f"config file {str(path)!r} does not exist") from None
    except yaml.YAMLError as err:
        raise UserError(f"config file {str(path)!r} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"config file {str(path)!r} must hold a mapping of settings")
    return cfg


def resolve(args: dict, base: dict | None = None) -> dict:
    """Merge defaults, a YAML recipe (or a resumed run's config) and command-line values; check every value."""
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in DEFAULTS.items()}
    if base is not None:
        cfg.update(base)
    if "config" in args:
        cfg.update(read_yaml(args["config"]))
    cfg.update({k: v for k, v in args.items() if k in DEFAULTS})
    cfg["model_kwargs"] = dict(cfg.get("model_kwargs") or {})
    for key in SIZE_KEYS:
        if key in args:
            cfg["model_kwargs"][key] = args[key]
    for key in ("num_classes", "in_chans"):  # derived, recomputed below
        cfg.pop(key, None)
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise UserError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    check(cfg)
    info = vdata.info(cfg["data"])
    cfg["num_classes"], cfg["in_chans"] = info["num_classes"], info["in_chans"]
    if cfg["output"] is None:
        cfg["output"] = f"runs/{cfg['data']}_{cfg['pe'].replace('+', '-')}_s{cfg['seed']}"
    return cfg


def check(cfg: dict) -> None:
    def need(ok, message):
        if not ok:
            raise UserError(message)

    def number(key, kind=(int, float)):
        need(isinstance(cfg[key], kind) and not isinstance(cfg[key], bool), f"{key} must be a number, got {cfg[key]!r}")

    for key in ("epochs", "batch_size", "img_size", "patch_size", "eval_batch_size", "seed", "workers", "threads",
                "stop_after"):
        number(key, int)
    for key in ("lr", "weight_decay", "warmup_epochs", "min_lr", "label_smoothing", "mixup", "cutmix", "clip_grad",
                "drop_path"):
        number(key)
    need(cfg["epochs"] >= 1, f"epochs must be >= 1, got {cfg['epochs']}")
    need(cfg["batch_size"] >= 1 and cfg["eval_batch_size"] >= 1, "batch_size and eval_batch_size must be >= 1")
    need(cfg["lr"] > 0, f"lr must be > 0, got {cfg['lr']}")
    need(cfg["weight_decay"] >= 0 and cfg["min_lr"] >= 0 and cfg["clip_grad"] >= 0, "weight_decay, min_lr, clip_grad must be >= 0")
    need(0 <= cfg["warmup_epochs"] <= cfg["epochs"], f"warmup_epochs must be in [0, epochs], got {cfg['warmup_epochs']}")
    need(0 <= cfg["label_smoothing"] < 1, f"label_smoothing must be in [0, 1), got {cfg['label_smoothing']}")
    need(cfg["mixup"] >= 0 and cfg["cutmix"] >= 0, "mixup and cutmix must be >= 0")
    need(0 <= cfg["drop_path"] < 1, f"drop_path must be in [0, 1), got {cfg['drop_path']}")
    need(cfg["workers"] >= 0 and cfg["threads"] >= 0 and cfg["stop_after"] >= 0, "workers, threads, stop_after must be >= 0")
    need(cfg["patch_size"] >= 1, f"patch_size must be >= 1, got {cfg['patch_size']}")
    need(cfg["img_size"] >= cfg["patch_size"] and cfg["img_size"] % cfg["patch_size"] == 0,
         f"img_size {cfg['img_size']} must be a multiple of patch_size {cfg['patch_size']}")
    need(isinstance(cfg["eval_res"], list), f"eval_res must be a list of sizes, got {cfg['eval_res']!r}")
    for res in cfg["eval_res"]:
        need(isinstance(res, int) and res >= cfg["patch_size"] and res % cfg["patch_size"] == 0,
             f"eval resolution {res!r} must be a positive multiple of patch_size {cfg['patch_size']}")
    need(cfg["amp"] in AMP, f"amp must be one of {', '.join(AMP)}, got {cfg['amp']!r}")
    need(cfg["device"] in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, got {cfg['device']!r}")
    need(cfg["device"] != "cuda" or torch.cuda.is_available(), "device=cuda but no CUDA device is available")
    need(cfg["data"] in vdata.DATASETS, f"unknown data set {cfg['data']!r}; choose from: {', '.join(vdata.DATASETS)}")
    need(isinstance(cfg["pe_kwargs"], dict), f"pe_kwargs must be a mapping, got {cfg['pe_kwargs']!r}")
    need(isinstance(cfg["pe"], str), f"pe must be a name, got {cfg['pe']!r}")
    try:
        parse_pe(cfg["pe"])
    except ValueError as err:
        raise UserError(f"{err} (or 'none')") from None
    import timm
    need(timm.is_model(cfg["model"]), f"unknown timm model {cfg['model']!r}; try e.g. vit_tiny_patch16_224, "
                                      f"deit_small_patch16_224, swin_tiny_patch4_window7_224")
    if cfg["mixup"] > 0 or cfg["cutmix"] > 0:
        need(cfg["batch_size"] % 2 == 0, "mixup/cutmix need an even batch_size")


def model_kwargs(cfg: dict) -> dict:
    """Everything timm needs besides the name: size overrides, resolution, classes, channels."""
    kw = dict(cfg["model_kwargs"])
    kw.update(img_size=cfg["img_size"], patch_size=cfg["patch_size"], num_classes=cfg["num_classes"],
              in_chans=cfg["in_chans"])
    if cfg["drop_path"]:
        kw["drop_path_rate"] = cfg["drop_path"]
    return kw


def build_model(cfg: dict) -> torch.nn.Module:
    """The one place a model is made (the resolution sweep and the viz CLI rebuild it the same way)."""
    try:
        return visionpe.create_model(cfg["model"], pe=cfg["pe"], pe_kwargs=cfg["pe_kwargs"], **model_kwargs(cfg))
    except (ValueError, TypeError, AssertionError) as err:
        raise UserError(f"cannot build {cfg['model']} with pe={cfg['pe']}: {' '.join(str(err).split())}") from None


def build_data(cfg: dict, split: str, img_size: int):
    try:
        num = cfg["train_samples"] if split == "train" else cfg["val_samples"]
        return vdata.build_dataset(cfg["data"], split, img_size, data_dir=cfg["data_dir"], download=cfg["download"],
                                   seed=cfg["seed"], num_samples=num)
    except (vdata.DataMissing, ValueError) as err:
        raise UserError(" ".join(str(err).split())) from None


# -----------------------------------------------------------------------------------------------------
# small helpers: checkpoints, RNG, distributed reduction
def weights_epoch(path: Path) -> int:
    return int(weights_metadata(path).get("epoch", -1))


def write_text(path: Path, text: str) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def seed_everything(seed: int, epoch: int, rank: int) -> None:
    """RNG streams (dropout, drop path, mixup) as a function of (seed, epoch, rank): resume is exact."""
    s = (seed * 1_000_003 + epoch * 7_919 + rank * 104_729) % 2**31
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def all_sum(values, device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate(model, dataset, cfg, device, autocast, rank, world):
    """Top-1 (%) and mean cross-entropy over the whole set; each process takes every world-th image."""
    model.eval()
    loader = DataLoader(Subset(dataset, range(rank, len(dataset), world)), batch_size=cfg["eval_batch_size"],
                        num_workers=cfg["workers"])
    correct = loss = count = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with autocast():
            logits = model(x)
        loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += len(y)
    correct, loss, count = all_sum([correct, loss, count], device)
    return 100.0 * correct / count, loss / count


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))
    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


# -----------------------------------------------------------------------------------------------------
def main(argv=None) -> dict:
    # -- settings --------------------------------------------------------------------------------------
    args = parse_args(sys.argv[1:] if argv is None else argv)
    resume = args.pop("resume", None)
    if resume:
        out = Path(resume if isinstance(resume, str) else args.get("output") or "")
        if not (out / "state.pt").is_file() or not (out / "config.yaml").is_file():
            raise UserError(f"--resume: no run to continue in {str(out)!r} (needs config.yaml and state.pt)")
        cfg = resolve({**args, "output": str(out)}, base=read_yaml(out / "config.yaml"))
    else:
        cfg = resolve(args)
        out = Path(cfg["output"])
        if (out / "state.pt").exists() and not cfg["overwrite"]:
            raise UserError(f"run directory {str(out)!r} already holds a run; pass --resume to continue it "
                            f"or --overwrite to start again")

    # -- processes and device --------------------------------------------------------------------------
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
    use_bf16 = cfg["amp"] == "bf16" or (cfg["amp"] == "auto" and use_cuda)
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16)
    log = print if master else (lambda *a, **k: None)

    # -- data --------------------------------------------------------------------------------------------
    train_set = build_data(cfg, "train", cfg["img_size"])
    val_set = build_data(cfg, "val", cfg["img_size"])
    if cfg["num_classes"] is None:  # imagefolder
        cfg["num_classes"] = train_set.num_classes
    per_rank = cfg["batch_size"] // world
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=cfg["seed"],
                                 drop_last=True)
    loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, num_workers=cfg["workers"], drop_last=True,
                        pin_memory=use_cuda)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise UserError(f"batch_size {cfg['batch_size']} is larger than the training set ({len(train_set)} images)")

    # -- model, optimizer, schedule, loss ----------------------------------------------------------------
    torch.manual_seed(cfg["seed"])
    raw_model = build_model(cfg).to(device)
    model = DDP(raw_model, device_ids=[local_rank] if use_cuda else None) if world > 1 else raw_model
    num_params = sum(p.numel() for p in raw_model.parameters())
    optimizer = create_optimizer_v2(raw_model, opt=cfg["opt"], lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    total_steps = cfg["epochs"] * steps_per_epoch
    warmup_steps = min(round(cfg["warmup_epochs"] * steps_per_epoch), total_steps - 1)
    scheduler = CosineLRScheduler(optimizer, t_initial=total_steps - warmup_steps, lr_min=cfg["min_lr"],
                                  warmup_t=warmup_steps, warmup_lr_init=cfg["lr"] * 1e-3, warmup_prefix=True,
                                  t_in_epochs=False)  # per step: linear warmup, then cosine down to min_lr
    mixup = None
    if cfg["mixup"] > 0 or cfg["cutmix"] > 0:
        mixup = Mixup(mixup_alpha=cfg["mixup"], cutmix_alpha=cfg["cutmix"], label_smoothing=cfg["label_smoothing"],
                      num_classes=cfg["num_classes"])
        criterion = SoftTargetCrossEntropy()
    elif cfg["label_smoothing"] > 0:
        criterion = LabelSmoothingCrossEntropy(smoothing=cfg["label_smoothing"])
    else:
        criterion = torch.nn.CrossEntropyLoss()

    # -- run directory: fresh, or continue from the last completed epoch ---------------------------------
    start_epoch, best_acc, best_epoch, history = 0, -1.0, -1, []
    if resume:
        state = torch.load(out / "state.pt", map_location="cpu", weights_only=True)
        if weights_epoch(out / "last.safetensors") != state["epoch"]:
            raise UserError(f"{out}/last.safetensors and state.pt are from different epochs; cannot resume exactly")
        raw_model.load_state_dict(load_file(out / "last.safetensors", device=str(device)))
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch, best_acc, best_epoch = state["epoch"], state["best_acc"], state["best_epoch"]
        history = json.loads(state["history"])
        log(f"resuming {out} after epoch {start_epoch}")
    if master:
        out.mkdir(parents=True, exist_ok=True)
        saved = {k: v for k, v in cfg.items() if k not in ("overwrite", "stop_after")}
        saved["model_kwargs"] = model_kwargs(cfg)
        write_text(out / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
    log(f"{cfg['model']} pe={cfg['pe']} {num_params / 1e6:.3f}M params | {cfg['data']} {len(train_set)} train "
        f"{len(val_set)} val at {cfg['img_size']}px | {world} process(es) on {device.type}"
        f"{' bf16' if use_bf16 else ''} | {out}")

    def save_checkpoint(epoch: int, improved: bool) -> None:
        save_weights(raw_model, out / "last.safetensors", {"epoch": str(epoch)})
        if improved:
            save_weights(raw_model, out / "best.safetensors", {"epoch": str(epoch)})
        state = {"epoch": epoch, "best_acc": best_acc, "best_epoch": best_epoch, "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "history": json.dumps(history),
                 "rng_torch": torch.get_rng_state()}
        atomic_write(out / "state.pt", lambda tmp: torch.save(state, tmp))
        write_text(out / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in history))

    # -- training ----------------------------------------------------------------------------------------
    for epoch in range(start_epoch, cfg["epochs"]):
        seed_everything(cfg["seed"], epoch, rank)
        sampler.set_epoch(epoch)
        train_set.set_epoch(epoch)
        model.train()
        loss_sum = seen = 0.0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{cfg['epochs']}", leave=False, dynamic_ncols=True,
                   disable=None if master and cfg["progress"] else True)  # None: off when not a terminal
        t0 = time.perf_counter()
        for step, (x, y) in enumerate(bar):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if mixup is not None:
                x, y = mixup(x, y)
            scheduler.step_update(epoch * steps_per_epoch + step)
            with autocast():
                loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg["clip_grad"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip_grad"])
            optimizer.step()
            loss_sum += loss.item() * len(x)
            seen += len(x)
            bar.set_postfix(loss=f"{loss.item():.3f}", img_s=f"{seen * world / (time.perf_counter() - t0):.0f}")
        elapsed = time.perf_counter() - t0
        loss_sum, seen = all_sum([loss_sum, seen], device)
        val_acc, val_loss = evaluate(model, val_set, cfg, device, autocast, rank, world)
        improved = val_acc > best_acc
        if improved:
            best_acc, best_epoch = val_acc, epoch + 1
        history.append({"kind": "epoch", "epoch": epoch + 1, "train_loss": loss_sum / seen, "val_loss": val_loss,
                        "val_acc": val_acc, "lr": optimizer.param_groups[0]["lr"], "img_per_s": seen / elapsed,
                        "epoch_time_s": elapsed})
        if master:
            save_checkpoint(epoch + 1, improved)
        log(f"epoch {epoch + 1:3d}/{cfg['epochs']}  train loss {loss_sum / seen:.4f}  val loss {val_loss:.4f}  "
            f"val top-1 {val_acc:6.2f}%{' *' if improved else ''}  {seen / elapsed:.0f} img/s")
        if cfg["stop_after"] and epoch + 1 - start_epoch >= cfg["stop_after"] and epoch + 1 < cfg["epochs"]:
            log(f"stopping after epoch {epoch + 1} (stop_after); continue with --resume {out}")
            if world > 1:
                dist.barrier()
                dist.destroy_process_group()
            return {"stopped": epoch + 1}

    # -- resolution evaluation: last and best model, same scenes at every resolution ---------------------
    resolutions = sorted(set(cfg["eval_res"]) | {cfg["img_size"]})
    eval_sets = {r: (val_set if r == cfg["img_size"] else build_data(cfg, "val", r)) for r in resolutions}
    results = {}
    history = [h for h in history if h["kind"] == "epoch"]
    for which in ("last", "best"):
        if world > 1:
            dist.barrier()  # rank 0 has finished writing the weights
        raw_model.load_state_dict(load_file(out / f"{which}.safetensors", device=str(device)))
        accs = {r: evaluate(model, eval_sets[r], cfg, device, autocast, rank, world) for r in resolutions}
        base = accs[cfg["img_size"]][0]
        results[which] = {r: {"acc": a, "loss": l, "retention": a / base if base > 0 else 0.0}
                          for r, (a, l) in accs.items()}
        for r, m in results[which].items():
            history.append({"kind": "eval_res", "model": which, "res": r, "acc": m["acc"], "loss": m["loss"],
                            "retention": m["retention"]})
    epochs_run = [h for h in history if h["kind"] == "epoch"]
    summary = {"model": cfg["model"], "pe": cfg["pe"], "data": cfg["data"], "seed": cfg["seed"],
               "img_size": cfg["img_size"], "params": num_params, "epochs": cfg["epochs"], "best_epoch": best_epoch,
               "train_img_per_s": float(np.median([h["img_per_s"] for h in epochs_run])) if epochs_run else None,
               "final_train_loss": epochs_run[-1]["train_loss"] if epochs_run else None,
               "results": {w: {str(r): m for r, m in rs.items()} for w, rs in results.items()}}
    if master:
        write_text(out / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in history))
        write_text(out / "results.json", json.dumps(summary, indent=1))
    rows = []
    for which in ("last", "best"):
        rows.append([f"{which} top-1 %"] + [f"{results[which][r]['acc']:.2f}" for r in resolutions])
        rows.append([f"{which} retention"] + [f"{results[which][r]['retention']:.3f}" for r in resolutions])
    log(f"\n{cfg['data']}  {cfg['model']}  pe={cfg['pe']}  trained at {cfg['img_size']}px, best epoch {best_epoch}\n"
        + table(rows, ["resolution"] + [f"{r}px" for r in resolutions]))
    if world > 1:
        dist.destroy_process_group()
    return summary


def cli(argv=None) -> None:
    """Console entry point: user mistakes -> one line on stderr, exit status 2."""
    try:
        main(argv)
    except UserError as err:
        if int(os.environ.get("RANK", "0")) == 0:  # under torchrun: one line, not one per process
            print(f"train_vit: error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
