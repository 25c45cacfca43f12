"""The processes of tests/train/test_parallel.py, run by ``python -m torch.distributed.run``: tiny ViTs trained with
DDP and with FSDP2 (visionpe.train.parallel) on data drawn per step, so that any run reproduces any other's batches.

    parallel_worker.py equal OUT [--backend gloo|nccl] [--bf16]   FSDP vs DDP weights after a few steps, per encoding
    parallel_worker.py train OUT --steps N [--resume DIR] [--bf16] [--equal]
                                                               FSDP training, a DCP commit after every step
                                                               (--equal: the equal scenario first, one launch)
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import visionpe as vpe
from visionpe.train import distributed, parallel

TINY = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=4, drop_path_rate=0.0)
EQUAL_PES = ["learned", "rope_mixed", "rel_bias", "cpb", "lookhere", "rope_mixed+cpb", "string+learned"]
TRAIN_PE = "rope_mixed+rel_bias+learned"
GLOBAL_BATCH, ACCUM = 8, 2


def build(pe: str, device, meta: bool = False):
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return vpe.create_model("vit_tiny_patch16_224", pe=pe, **TINY)
    return vpe.create_model("vit_tiny_patch16_224", pe=pe, **TINY).to(device)


def batch(step: int, micro: int, world: int, rank: int, device):
    """This rank's share of the global micro-batch ``micro`` of optimizer step ``step`` (the same global batches for
    any world size: rank ``r`` takes rows ``r, r + world, ...``)."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(GLOBAL_BATCH, 3, 16, 16, generator=g)
    y = torch.randint(0, TINY["num_classes"], (GLOBAL_BATCH,), generator=g)
    return x[rank::world].to(device), y[rank::world].to(device)


def train_step(model, optimizer, step: int, device) -> float:
    """One optimizer step of ``ACCUM`` micro-batches (all but the last without gradient sync); the global mean loss."""
    world, rank = parallel.world_size(), parallel.rank()
    total = 0.0
    for micro in range(ACCUM):
        x, y = batch(step, micro, world, rank, device)
        last = micro == ACCUM - 1
        with (parallel.no_gradient_sync(model) if not last else _nothing()):
            loss = F.cross_entropy(model(x).float(), y) / ACCUM
            loss.backward()
        total += float(loss.detach())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return distributed.all_sum([total], device)[0] / world


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def optimizer_for(model, equal: bool = False):
    """SGD with momentum where FSDP meets DDP (float rounding stays rounding; Adam divides tiny gradients by their
    own size and magnifies it), AdamW for training."""
    if equal:
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)


def equal(out: Path, device, bf16: bool) -> None:
    """Per encoding: the same model trained 3 steps (2 micro-batches each) with DDP and with FSDP2; rank 0 writes the
    largest weight difference, and the EMA's."""
    from timm.utils import ModelEmaV3
    report = {}
    for pe in EQUAL_PES:
        ddp, fsdp = build(pe, device), build(pe, device)
        ema_ddp, ema_fsdp = ModelEmaV3(ddp, decay=0.5), ModelEmaV3(fsdp, decay=0.5)  # before sharding, as timm's
        ddp = parallel.parallelize(ddp, "ddp", device, ema=ema_ddp.module)
        fsdp = parallel.parallelize(fsdp, "fsdp", device, ema=ema_fsdp.module)
        opts = optimizer_for(ddp, equal=True), optimizer_for(fsdp, equal=True)
        for step in range(3):
            for model, opt, ema in ((ddp, opts[0], ema_ddp), (fsdp, opts[1], ema_fsdp)):
                train_step(model, opt, step, device)
                ema.update(parallel.unwrap(model), step=step + 1)
        full, full_ema = parallel.gathered_state(fsdp), parallel.gathered_state(ema_fsdp.module)
        if parallel.rank() == 0:
            ref, ref_ema = ddp.module.state_dict(), ema_ddp.module.state_dict()
            moved = max(float((v.cpu() - build(pe, "cpu").state_dict()[k]).abs().max()) for k, v in ref.items()
                        if v.is_floating_point())
            diffs = {k: float((full[k] - v.cpu()).abs().max()) for k, v in ref.items()}
            report[pe] = {"max_diff": max(diffs.values()), "worst": max(diffs, key=diffs.get),
                          "ema_max_diff": max(float((full_ema[k] - v.cpu()).abs().max()) for k, v in ref_ema.items()),
                          "moved": moved, "keys_equal": sorted(full) == sorted(ref),
                          "sharded": all(parallel.is_sharded(p) for p in fsdp.parameters())}
        del ddp
    if bf16:  # the mixed-precision policy: bf16 block weights in the forward, float32 encoding parameters
        seen = {}
        model = parallel.parallelize(build("rope_mixed+learned", device), "fsdp", device,
                                     mixed_precision=torch.bfloat16)

        def note(what: str, tensor):
            def hook(module, args):  # returns None: the call's arguments stay
                seen.setdefault(what, str(tensor(module).dtype))
            return hook
        hooks = [model.blocks[0].attn.qkv.register_forward_pre_hook(note("block", lambda m: m.weight)),
                 model.blocks[0].attn.rotary.register_forward_pre_hook(note("rotary", lambda m: m.freqs)),
                 model.pe_tokens.register_forward_pre_hook(note("tokens", lambda m: m.table))]
        x, y = batch(0, 0, parallel.world_size(), parallel.rank(), device)
        F.cross_entropy(model(x).float(), y).backward()
        for h in hooks:
            h.remove()
        seen["grad"] = str(next(model.parameters()).grad.dtype)
        report["bf16"] = seen
    if parallel.rank() == 0:
        (out / "equal.json").write_text(json.dumps(report))


def train(out: Path, device, steps: int, resume: Path | None, meta: bool, bf16: bool) -> None:
    """FSDP2 training with a timm schedule and EMA; a DCP checkpoint after every step (``committed step k`` on
    stdout), the global loss of each step in ``losses.json``, the final weights exported."""
    from timm.scheduler import CosineLRScheduler
    from timm.utils import ModelEmaV3
    model = build(TRAIN_PE, device, meta=meta)
    ema = ModelEmaV3(model, decay=0.9)
    precision = torch.bfloat16 if bf16 else None
    model = parallel.parallelize(model, "fsdp", device, ema=ema.module, mixed_precision=precision)
    optimizer = optimizer_for(model)
    scheduler = CosineLRScheduler(optimizer, t_initial=8, warmup_t=1, warmup_lr_init=1e-4, t_in_epochs=False)
    start, losses = 0, []
    if resume is not None:
        extra = parallel.load_checkpoint(parallel.latest_checkpoint(resume), model, optimizer, ema=ema.module)
        scheduler.load_state_dict(extra["scheduler"])
        start, losses = extra["step"], extra["losses"]
    for step in range(start, steps):
        losses.append(train_step(model, optimizer, step, device))
        scheduler.step_update(step + 1)
        ema.update(model, step=step + 1)
        parallel.save_checkpoint(out / "checkpoint", model, optimizer, tag=f"step-{step + 1}", ema=ema.module,
                                 extra={"step": step + 1, "scheduler": scheduler.state_dict(), "losses": losses})
        if parallel.rank() == 0:
            print(f"committed step {step + 1}", flush=True)
    parallel.export_weights(model, out / "final.safetensors", {"steps": str(steps)})
    parallel.export_weights(ema.module, out / "ema.safetensors")
    if parallel.rank() == 0:
        (out / "losses.json").write_text(json.dumps(losses))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("equal", "train"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--meta", action="store_true")
    parser.add_argument("--equal", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.scenario == "equal" or args.equal:
        equal(args.out, device, args.bf16)
    if args.scenario == "train":
        train(args.out, device, args.steps, args.resume, args.meta, args.bf16)
    distributed.leave()


if __name__ == "__main__":
    sys.exit(main())
