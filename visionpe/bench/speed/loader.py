"""Part ``data`` (opt-in): the training loader of real images, visionpe's against timm's, on one JPEG folder.

The benchmark writes its own folder of JPEGs (varied sizes and aspect ratios around ImageNet's 500 x 375, two
classes) in a temporary directory, then times, side by side in interleaved rounds, one pass over it by

- visionpe's loader: ``ImageFolderDataset`` with timm's training transform (:class:`visionpe.data.Transforms`), each
  sample seeded by ``(seed, epoch, index)``, in a ``DataLoader`` (``collate_images``), as ``train_vit.py`` builds it;
- timm's ``create_loader`` on timm's ``ImageDataset`` of the same folder, with the same transform settings
  (random-resized crop at 224 px, flip, RandAugment ``rand-m9-mstd0.5-inc1``, random erasing 0.25, bicubic), the same
  batch and workers, ``use_prefetcher=False`` (both normalise on the CPU in the workers);

and, for native aspect ratios (``--max-patches``), visionpe's loader with timm's NaFlex training transform and a list
collate (``forward_batch``) against timm's ``create_naflex_loader`` (same budget, one sequence length). Each pass
starts a fresh iterator (its workers' start-up included); visionpe's round ``r`` reads epoch ``r`` (its draws
change per round, as timm's do: RandAugment's cost depends on the ops drawn). Reported: images/s and the ratio visionpe / timm (the
target is >= 1.00), and the share of a training step (a ViT-Ti/16 at 224 px on the same loader) spent waiting for
data.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import visionpe as vpe
from ...data import Transforms, collate_images
from ...data.folders import IMAGENET_MEAN, IMAGENET_STD, ImageFolderDataset
from ...data.transforms import fix_augmenters
from .tables import Table
from .timing import Run

AUGMENT = dict(aa="rand-m9-mstd0.5-inc1", reprob=0.25, interpolation="bicubic")  # DeiT's training transform
SIZE, PATCH = 224, 16


def write_jpeg_folder(root: Path, num_images: int, seed: int = 0) -> Path:
    """``root/train/<class>/*.jpg``: ``num_images`` JPEGs of smooth random colour fields with noise, sides of
    300-500 px (aspect ratios 0.6-1.67), quality 90. Returns the ``train`` folder."""
    rng = np.random.default_rng(seed)
    train = Path(root) / "train"
    for i in range(num_images):
        height, width = (int(v) for v in rng.integers(300, 501, 2))
        coarse = rng.integers(0, 256, (4, 4, 3)).astype(np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.int16)
        pixels = np.clip(field + rng.integers(-20, 21, field.shape), 0, 255).astype(np.uint8)
        folder = train / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)
    return train


def ours(train: Path, batch: int, workers: int, max_patches: int | None = None,
         epoch: int = 0) -> torch.utils.data.DataLoader:
    """visionpe's training loader as ``train_vit.py`` builds it for ``epoch`` (``max_patches``: native aspect
    ratios)."""
    transforms = Transforms(**AUGMENT, patch_size=PATCH, max_patches=max_patches, train_size=SIZE)
    dataset = ImageFolderDataset(train, SIZE, augment=True, transforms=transforms)
    dataset.set_epoch(epoch)
    sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers,
                                       drop_last=True, collate_fn=collate_images)


def timms(train: Path, batch: int, workers: int, max_patches: int | None = None):
    """timm's loader of the same folder and transform settings (``max_patches``: ``create_naflex_loader``)."""
    from timm.data import ImageDataset, create_loader, create_naflex_loader

    # persistent_workers only with workers: timm 1.0.19 passes its default (True) to the DataLoader even with
    # num_workers=0, which the DataLoader refuses
    common = dict(batch_size=batch, is_training=True, auto_augment=AUGMENT["aa"], re_prob=AUGMENT["reprob"],
                  re_mode="pixel", interpolation=AUGMENT["interpolation"], mean=IMAGENET_MEAN, std=IMAGENET_STD,
                  num_workers=workers, persistent_workers=workers > 0, use_prefetcher=False, pin_memory=False)
    if max_patches is not None:
        loader = create_naflex_loader(ImageDataset(str(train)), patch_size=PATCH, train_seq_lens=(max_patches,),
                                      max_seq_len=max_patches, device=torch.device("cpu"), **common)
    else:
        loader = create_loader(ImageDataset(str(train)), input_size=(3, SIZE, SIZE), device=torch.device("cpu"),
                               **common)
    for transform in [getattr(loader.dataset, "transform", None), *getattr(loader.dataset, "transforms", {}).values()]:
        fix_augmenters(transform)  # the fixes visionpe's own pipelines have (Pillow 13's posterize), on these objects
    return loader


def images_per_second(make_loader) -> float:
    """A fresh loader and iterator, one pass: images delivered (labels counted) / seconds."""
    start, images = time.perf_counter(), 0
    for _, labels in make_loader():
        images += len(labels)
    return images / (time.perf_counter() - start)


def waiting_share(loader, steps: int, quick: bool) -> tuple[float, float]:
    """``(share of wall time spent waiting for the next batch, seconds per step)`` over ``steps`` training steps
    of a ViT-Ti/16 at 224 px (quick: a 2-block 48-dim one) on ``loader``; the first step is left out."""
    kwargs = dict(embed_dim=48, depth=2, num_heads=2) if quick else {}
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed", num_classes=2, **kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    wait = total = 0.0
    it = iter(loader)
    for step in range(steps + 1):
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x) if isinstance(x, torch.Tensor) else model.forward_batch(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step:
            wait, total = wait + t1 - t0, total + time.perf_counter() - t0
    return wait / total, total / steps


def data_loader(run: Run) -> list[Table]:
    """Images/s of visionpe's loader vs timm's on the same JPEG folder (square and native aspect), and the share of a
    training step spent waiting for data."""
    quick = run.plan.vit.size != (SIZE, SIZE)  # --quick: the plan's tiny models, a tiny folder
    num_images, batch, workers, rounds = (16, 4, 0, 1) if quick else (256, 32, 2, max(3, run.repeats))
    budget = 196  # 14 x 14 patches of 16 px: the token count of a 224 px square
    with tempfile.TemporaryDirectory(prefix="visionpe-bench-data-") as tmp:
        train = write_jpeg_folder(Path(tmp), num_images)
        images = num_images // batch * batch
        cases = {"square 224 px": None, f"native aspect, {budget} patches": budget}
        rows, ratios = [], {}
        for name, max_patches in cases.items():
            rates = {"visionpe": [], "timm": []}
            for epoch in range(rounds):  # interleaved: one pass of each per round; ours draws each epoch's stream
                rates["visionpe"].append(images_per_second(lambda: ours(train, batch, workers, max_patches, epoch)))
                rates["timm"].append(images_per_second(lambda: timms(train, batch, workers, max_patches)))
            mine, theirs = statistics.median(rates["visionpe"]), statistics.median(rates["timm"])
            ratios[name] = mine / theirs
            rows.append((name, f"{mine:.1f}", f"{theirs:.1f}", f"{mine / theirs:.2f}x",
                         "met" if mine / theirs >= 1.0 else "NOT met (>= 1.00x)"))
        share, step = waiting_share(ours(train, batch, workers), max(1, images // batch - 1), quick)
    loaders = Table(f"Training loader: images/s over one pass of a folder of {num_images} JPEGs (300-500 px), batch {batch}, "
                    f"{workers} workers, median of {rounds} interleaved rounds",
                    ["case", "visionpe img/s", "timm img/s", "visionpe / timm", "target"], rows,
                    note="Same transforms: random-resized crop to 224 px (native aspect: timm's "
                         "RandomResizedCropToSequence within the budget), flip, RandAugment rand-m9-mstd0.5-inc1, "
                         "random erasing 0.25, bicubic; both on the CPU (timm: create_loader / create_naflex_loader with "
                         "use_prefetcher=False). Each pass starts a fresh iterator, so worker start-up is counted for "
                         "both; timm's NaFlex loader patchifies and pads its batches, visionpe's hands forward_batch a "
                         "list of images.")
    wait = Table("Training step on visionpe's loader: time waiting for data",
                 ["model", "seconds per step", "waiting for data"],
                 [("ViT-Ti/16 rope_mixed, 224 px" if not quick else "quick ViT, 224 px", f"{step:.2f}",
                   f"{100 * share:.0f} %")],
                 note=f"Batch {batch}, {workers} workers sharing the machine with the training step "
                      f"({torch.get_num_threads()} torch threads); the first step is left out.")
    return [loaders, wait]
