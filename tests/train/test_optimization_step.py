"""The training step of timm's recipe features, against independent float64 references: gradient accumulation (the
last step's share, the schedule in optimizer steps, DDP no_sync), the EMA (timm ModelEmaV3 with and without warmup,
the global step count), the float16 gradient scaler, BCE as timm combines it, the checkpoint clock, and the
training order (timm's RepeatAugSampler, resumed within an epoch)."""
from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import requires_that
from timm.data import Mixup
from timm.data.distributed_sampler import RepeatAugSampler as TimmRepeatAugSampler
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3, NativeScaler

from visionpe import data as vdata
from visionpe.train import commits, loop, optimization, sampling, settings


def batches(count: int, size: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 5, generator=g), torch.randint(0, 4, (size,), generator=g)) for _ in range(count)]


class Schedule:
    """Records the optimizer steps the loop asks a timm scheduler for."""

    def __init__(self):
        self.calls = []

    def step_update(self, num_updates):
        self.calls.append(num_updates)


def linear(seed: int = 1) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(5, 4)


def epoch(model, data, accum, lr=0.5, epoch_index=0, ema=None, **kw):
    schedule = Schedule()
    parts = optimization.Optimization(torch.optim.SGD(model.parameters(), lr=lr), schedule,
                                      torch.nn.CrossEntropyLoss(), ema=ema)
    stats = loop.train_one_epoch(model, data, parts, epoch=epoch_index, epochs=epoch_index + 1,
                                 device=torch.device("cpu"), autocast=contextlib.nullcontext, accum_steps=accum, **kw)
    return stats, schedule


def reference_sgd(model, data, accum, lr=0.5):
    """float64: each optimizer step takes the mean of its batches' mean losses (the last step what is left)."""
    w, b = (p.detach().double().clone().requires_grad_() for p in (model.weight, model.bias))
    snapshots = []
    for start in range(0, len(data), accum):
        group = data[start:start + accum]
        loss = sum(F.cross_entropy(x.double() @ w.T + b, y) for x, y in group) / len(group)
        gw, gb = torch.autograd.grad(loss, (w, b))
        with torch.no_grad():
            w -= lr * gw
            b -= lr * gb
        snapshots.append((w.detach().clone(), b.detach().clone()))
    return snapshots


@pytest.mark.parametrize("steps, accum", [(5, 2), (6, 3), (4, 1), (3, 5)])
def test_accumulation_steps_the_mean_of_each_group_and_schedules_optimizer_steps(steps, accum):
    data, model = batches(steps), linear()
    expected = reference_sgd(model, data, accum)
    _, schedule = epoch(model, data, accum, epoch_index=2)
    torch.testing.assert_close(model.weight.detach().double(), expected[-1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.bias.detach().double(), expected[-1][1], rtol=1e-5, atol=1e-6)
    updates = math.ceil(steps / accum)
    assert schedule.calls == [2 * updates + u for u in range(updates)]  # epoch 2, in optimizer steps


@pytest.mark.parametrize("warmup", [False, True])
@pytest.mark.parametrize("epoch_index", [0, 1])
def test_ema_follows_timm_formula_with_the_global_step(warmup, epoch_index):
    data, model = batches(6), linear()
    decay = 0.9
    ema = ModelEmaV3(model, decay=decay, use_warmup=warmup)
    average = {k: v.double() for k, v in model.state_dict().items()}  # the EMA starts as a copy of the model
    seen = []
    epoch(model, data, 2, epoch_index=epoch_index, ema=ema,
          on_update=lambda p: seen.append((p["update"], copy.deepcopy(model.state_dict()))))
    assert [u for u, _ in seen] == [1, 2, 3]

    def factor(step):  # timm's ModelEmaV3.get_decay, written out: the first global step copies the model
        if step <= 1:
            return 0.0
        return min(decay, 1 - step ** (-2 / 3)) if warmup else decay

    for update, weights in seen:
        d = factor(epoch_index * 3 + update)  # 3 optimizer steps an epoch: global steps 1-3 or 4-6
        average = {k: d * average[k] + (1 - d) * weights[k].double() for k in weights}
    for key, value in ema.module.state_dict().items():
        torch.testing.assert_close(value.double(), average[key], rtol=1e-6, atol=1e-7)
    last = {k: v.double() for k, v in seen[-1][1].items()}
    assert not torch.allclose(ema.module.weight.double(), last["weight"])  # an average, not the model


class SyncRecorder(torch.nn.Module):
    """A DDP stand-in: records, per forward, whether it ran inside ``no_sync``."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.synced, self.inside = inner, [], False

    @contextlib.contextmanager
    def no_sync(self):
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def forward(self, x):
        self.synced.append(not self.inside)
        return self.inner(x)


def test_ddp_gradients_synchronise_only_on_the_last_batch_of_each_step(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = SyncRecorder(linear())
        epoch(model, batches(5), 2, world=2)
    finally:
        dist.destroy_process_group()
    assert model.synced == [False, True, False, True, True]


def stepping(model, scaler) -> optimization.Optimization:
    """An optimization of ``model`` by SGD (lr 0.5) with ``scaler``, for its ``backward_and_step`` alone."""
    return optimization.Optimization(torch.optim.SGD(model.parameters(), lr=0.5), Schedule(),
                                     torch.nn.CrossEntropyLoss(), scaler=scaler)


@requires_that(hasattr(torch.amp, "GradScaler"), "a CPU gradient scaler, torch.amp.GradScaler(device='cpu') (torch "
               ">= 2.3): before it timm's NativeScaler(device='cpu') takes torch.cuda.amp.GradScaler, disabled without "
               "CUDA; the recipe's fp16 is CUDA-only, checked on CUDA in tests/cuda")
def test_fp16_scaler_unscales_before_clipping_and_skips_overflowing_steps():
    """timm's NativeScaler through the loop's step (GradScaler on the CPU here; CUDA: tests/cuda)."""
    x, y = batches(1)[0]
    plain, scaled = linear(), linear()
    for model, scaler in ((plain, None), (scaled, NativeScaler(device="cpu"))):
        parts = stepping(model, scaler)
        loss = F.cross_entropy(model(x), y)
        parts.backward_and_step(loss, parameters=list(model.parameters()), clip_grad=0.05, update=True)
    # the loss is scaled by 2^16 and unscaled before clipping: the same step (powers of two are exact)
    torch.testing.assert_close(scaled.weight, plain.weight, rtol=1e-6, atol=0)
    scaler, before = NativeScaler(device="cpu"), scaled.weight.detach().clone()
    loss = (scaled.weight * 1e36).sum()  # finite loss, gradients overflow once scaled
    stepping(scaled, scaler).backward_and_step(loss, parameters=list(scaled.parameters()), clip_grad=0.0, update=True)
    assert torch.equal(scaled.weight, before) and scaler.state_dict()["scale"] == 2.0 ** 15  # skipped, backed off


@pytest.mark.parametrize("mixup, smoothing, bce, thresh", [
    (False, 0.0, False, None), (False, 0.1, False, None), (True, 0.1, False, None),
    (False, 0.0, True, None), (False, 0.1, True, 0.2), (True, 0.1, True, 0.0), (True, 0.1, True, None)])
def test_loss_combines_mixup_smoothing_and_bce_as_timm(mixup, smoothing, bce, thresh):
    cfg = settings.TrainSettings(label_smoothing=smoothing, bce_loss=bce, bce_target_thresh=thresh)
    criterion = optimization.criterion_for(cfg, mixup)
    expected = (BinaryCrossEntropy if bce else SoftTargetCrossEntropy if mixup else
                LabelSmoothingCrossEntropy if smoothing else torch.nn.CrossEntropyLoss)
    assert type(criterion) is expected
    g = torch.Generator().manual_seed(0)
    logits, labels, classes = torch.randn(6, 5, generator=g), torch.tensor([0, 1, 2, 3, 4, 0]), 5
    if mixup:  # timm's Mixup: smoothed, mixed soft targets
        mix = Mixup(mixup_alpha=0.8, label_smoothing=smoothing, num_classes=classes)
        _, targets = mix(torch.randn(6, 3, 4, 4), labels)
    else:
        targets = labels
    value = criterion(logits, targets)
    if not bce:
        return
    # float64 reference: one-hot smoothed as timm's BinaryCrossEntropy (off = s / C, on = 1 - s + off)
    if mixup:
        dense = targets.double()
    else:
        off = smoothing / classes
        dense = torch.full((6, classes), off, dtype=torch.float64)
        dense[torch.arange(6), labels] = 1 - smoothing + off
    if thresh is not None:
        dense = (dense > thresh).double()
    z = logits.double()
    reference = (torch.clamp(z, min=0) - z * dense + torch.log1p(torch.exp(-z.abs()))).mean()
    torch.testing.assert_close(value.double(), reference, rtol=1e-6, atol=1e-7)


def test_checkpoint_clock_counts_steps_and_minutes(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(commits.time, "monotonic", lambda: now[0])
    steps = commits.CheckpointClock(every_steps=3)
    assert [u for u in range(1, 10) if steps.due(u)] == [3, 6, 9]
    minutes = commits.CheckpointClock(every_minutes=2)
    now[0] += 119
    assert not minutes.due(1)
    now[0] += 2
    assert minutes.due(2)
    minutes.reset()
    assert not minutes.due(3)
    assert not any(commits.CheckpointClock().due(u) for u in range(1, 5))


@pytest.mark.parametrize("world, repeats", [(1, 3), (2, 3), (3, 2), (4, 3)])
def test_repeat_sampler_is_timms_order_with_numbered_views(world, repeats):
    dataset = list(range(23))
    seed, ep = 5, 2
    views = []
    for rank in range(world):
        ours = sampling.RepeatAugSampler(dataset, world, rank, repeats, seed=seed)
        ours.set_epoch(ep)
        # selected_round=0: the count newer timm releases select for a set of under 256 images, ceil(23 / world)
        # (timm 1.0.19 selects none there; visionpe's sampler takes the newer rule at any timm)
        timms = TimmRepeatAugSampler(dataset, num_replicas=world, rank=rank, num_repeats=repeats, selected_round=0)
        timms.set_epoch(seed + ep)  # our epoch e is timm's seed + e (torch's DistributedSampler rule)
        got = list(ours)
        assert [v % len(dataset) for v in got] == list(timms) and len(got) == len(timms)
        views += got
    by_sample = {}
    for v in views:
        by_sample.setdefault(v % len(dataset), []).append(v // len(dataset))
    # the epoch's first positions hold whole groups of R views, each numbered 0..R-1, on different processes
    complete = [r for r in by_sample.values() if len(r) == repeats]
    assert complete and all(sorted(r) == list(range(repeats)) for r in complete)
    assert all(len(set(r)) == len(r) for r in by_sample.values())


def test_repeated_views_are_augmented_apart():
    images = torch.arange(4 * 3 * 16 * 16, dtype=torch.float32).reshape(4, 3, 16, 16).remainder(251).to(torch.uint8)
    ds = vdata.ImageTensorDataset(images, torch.arange(4), 4, (0.5,) * 3, (0.5,) * 3, augment=True, flip=True, seed=1)
    views = sampling.RepeatViews(ds, 3)
    views.set_epoch(2)
    first = [views[r * 4 + 1][0] for r in range(3)]  # the three views of sample 1 in epoch 2
    assert not torch.equal(first[0], first[1]) or not torch.equal(first[1], first[2])
    ds.set_epoch(2 * 3 + 1)
    assert torch.equal(first[1], ds[1][0])  # view r of epoch e = the sample augmented as in epoch e * R + r
    assert [views[r * 4 + 1][1] for r in range(3)] == [1, 1, 1]


def test_epoch_order_resumes_at_any_position():
    base = torch.utils.data.DistributedSampler(list(range(20)), num_replicas=2, rank=1, shuffle=True, seed=3,
                                               drop_last=True)
    order = sampling.EpochOrder(base)
    order.set_epoch(4)
    full = list(order)
    order.set_epoch(4, skip=6)
    assert list(order) == full[6:] and len(order) == len(full) - 6
    order.set_epoch(5)
    assert len(order) == len(full) and list(order) != full
