"""The order of the training samples, epoch by epoch, and the loader that reads them: torch's
``DistributedSampler``, or timm's ``RepeatAugSampler`` (repeated augmentation, ``--aug-repeats``), started at any
position of an epoch (a resume from a mid-epoch checkpoint continues with the next batch, without loading the ones
before it).

Repeated augmentation shows each chosen image ``R`` times in an epoch, each time augmented anew. A visionpe data set
augments sample ``i`` as a function of ``(seed, epoch, index)`` only (:class:`visionpe.data.PositionDataset`), so
the ``R`` views of ``i`` would be ``R`` copies of one view; the sampler therefore numbers them: it yields
``r * len(dataset) + i`` for the ``r``-th view, and :class:`RepeatViews` reads that as sample ``i`` augmented as in
epoch ``epoch * R + r``.
"""
from __future__ import annotations

import itertools
import math

from timm.data.distributed_sampler import RepeatAugSampler as TimmRepeatAugSampler
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from ..cli import UserError
from ..data import collate_images
from .settings import TrainSettings


class RepeatAugSampler(TimmRepeatAugSampler):
    """timm's ``RepeatAugSampler`` (its epoch length: about ``len(dataset) / world`` samples per process, so about
    ``1/R`` of the images each epoch; the ``R`` views of an image go to consecutive processes), with the order of
    epoch ``e`` drawn from ``seed + e`` (torch's ``DistributedSampler`` rule; timm's draws from ``e`` alone) and
    each view numbered (see the module docstring). ``sample % len(dataset)`` of what it yields is exactly what timm's
    sampler yields for epoch ``seed + e``.

    A set of fewer than 256 images (timm's ``selected_round``) gets ``ceil(len(dataset) / world)`` samples per process
    whatever timm is installed: the newer timm releases' rule; timm 1.0.19 rounds the count down to a multiple of 256
    images there, an epoch of none."""

    def __init__(self, dataset, num_replicas: int, rank: int, num_repeats: int, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, num_repeats=num_repeats)
        if len(dataset) < 256:
            self.num_selected_samples = min(math.ceil(len(dataset) / num_replicas), self.num_samples)
        self.seed = seed

    def set_epoch(self, epoch: int) -> None:
        self.epoch = self.seed + epoch

    def __iter__(self):
        n, repeats = len(self.dataset), int(self.num_repeats)
        # timm lays the epoch out as each shuffled index repeated R times in a row, and gives process `rank` the
        # positions rank, rank + world, ... (wrapping around): position q holds view q % R of its sample
        positions = range(self.rank, self.total_size, self.num_replicas)[:self.num_selected_samples]
        for index, position in zip(super().__iter__(), positions):
            yield (position % (n * repeats)) % repeats * n + index


class RepeatViews(Dataset):
    """The views a :class:`RepeatAugSampler` numbers: view ``r * len(dataset) + i`` is ``dataset[i]`` augmented as in
    epoch ``epoch * repeats + r``."""

    def __init__(self, dataset, repeats: int):
        self.dataset, self.repeats, self.epoch = dataset, repeats, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset) * self.repeats

    def __getitem__(self, view: int):
        repeat, index = divmod(view, len(self.dataset))
        self.dataset.set_epoch(self.epoch * self.repeats + repeat)
        return self.dataset[index]


class EpochOrder(Sampler):
    """One epoch of ``base`` (a sampler with ``set_epoch``) from position ``skip`` on."""

    def __init__(self, base):
        self.base, self.skip = base, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Epoch ``epoch``, its first ``skip`` samples left out (those a resumed epoch has trained on)."""
        self.base.set_epoch(epoch)
        self.skip = skip

    def __iter__(self):
        return itertools.islice(iter(self.base), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.base) - self.skip, 0)


def training_order(dataset, *, world: int, rank: int, seed: int, repeats: int = 0) -> tuple[object, EpochOrder]:
    """``(what the loader reads, its sampler)`` for one process of ``world``: the data set in ``DistributedSampler``
    order (``repeats=0``), or its :class:`RepeatViews` in :class:`RepeatAugSampler` order. Call
    ``set_epoch(epoch)`` on both before each epoch (``sampler.set_epoch(epoch, skip)`` to resume within it)."""
    if repeats:
        return RepeatViews(dataset, repeats), EpochOrder(RepeatAugSampler(dataset, world, rank, repeats, seed))
    return dataset, EpochOrder(DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed,
                                                  drop_last=True))


def training_loader(dataset, settings: TrainSettings, *, world: int, rank: int, pin_memory: bool = False):
    """``(loader, what it reads, its sampler)`` of one process's training batches: ``batch_size / world`` samples a
    batch in :func:`training_order`, whole batches only; lists of images of mixed sizes with ``--max-patches``
    (:func:`visionpe.data.collate_images`). A training set smaller than one global batch is a :class:`UserError`."""
    loader_set, sampler = training_order(dataset, world=world, rank=rank, seed=settings.seed,
                                         repeats=settings.aug_repeats)
    loader = DataLoader(loader_set, batch_size=settings.batch_size // world, sampler=sampler,
                        num_workers=settings.workers, drop_last=True, pin_memory=pin_memory,
                        collate_fn=collate_images)
    if len(loader) == 0:
        raise UserError(f"batch_size {settings.batch_size} is larger than the training set ({len(dataset)} images)")
    return loader, loader_set, sampler
