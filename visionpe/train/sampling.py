"""The run's data: its training and validation sets (:func:`datasets`, :func:`dataset`: built from the settings
through the data set registry, an image folder's classes checked against the run's; :func:`data_notes`: transform
settings a set does not take), the order of the training samples, epoch by epoch, and the loader that reads them: torch's
``DistributedSampler``, or timm's ``RepeatAugSampler`` (repeated augmentation, ``--aug-repeats``), started at any
position of an epoch (a resume from a mid-epoch checkpoint continues with the next batch, without loading the ones
before it); and the sizes (and frame counts) a run is evaluated at in the end (:func:`eval_grid`).

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

from .. import data as vdata
from ..cli import UserError, one_line
from ..data import collate_images
from ..data.transforms import default_protocol
from .models import tubelet
from .settings import DEFAULTS, TRANSFORM_KEYS, TrainSettings, transforms_of


def dataset(settings: TrainSettings, split: str, img_size, num_frames: int | None = None, protocol: str | None = None):
    """The run's data set ``split`` at ``img_size`` pixels (an image run also takes ``(height, width)``; a video
    run's: clips of ``num_frames`` frames, default the run's ``num_frames``), through the run's transforms and
    evaluation protocol (``protocol``: another one); missing or empty data is a :class:`UserError`."""
    num = settings.train_samples if split == "train" else settings.val_samples
    frames = (num_frames or settings.num_frames) if settings.num_frames else None
    options = time_options(settings)
    try:
        ds = vdata.build_dataset(settings.data, split, img_size, data_dir=settings.data_dir, download=settings.download,
                                 seed=settings.seed, num_samples=num, num_frames=frames,
                                 frame_stride=settings.frame_stride, transforms=transforms_of(settings, protocol),
                                 **options)
    except (vdata.DataMissing, ValueError) as err:
        raise UserError(one_line(err)) from None
    if len(ds) == 0:
        raise UserError(f"{settings.data}: the {split} split under {settings.data_dir!r} holds no images")
    check_classes(settings, getattr(ds, "classes", None))
    return ds


def check_classes(settings: TrainSettings, found) -> None:
    """A folder's class names ``found`` (those that number its labels; None for a set without names) are the run's
    own (``settings.classes``, recorded by :func:`datasets` when the run started): a :class:`UserError` naming the
    classes on each side otherwise, since the run's output ``k`` means its ``k``-th class."""
    known = settings.classes
    if known is None or found is None or list(found) == list(known):
        return
    only_run, only_data = [c for c in known if c not in found], [c for c in found if c not in known]
    shown = lambda names: ", ".join(map(str, names[:5])) + (f", ... {len(names) - 5} more" if len(names) > 5 else "")
    what = (f"the run's only: {shown(only_run) or 'none'}; the data's only: {shown(only_data) or 'none'}"
            if only_run or only_data else "the same names in another order")
    raise UserError(f"{settings.data} under {settings.data_dir!r} has {len(found)} classes that are not the {len(known)} "
                    f"the run was trained on ({what}): output k of the run is its k-th class; give the --data-dir it "
                    f"was trained on")


def time_options(settings: TrainSettings) -> dict:
    """The data set options of a run on an absolute time axis (``tokens_per_second``: every sample carries its
    clip's time step between tokens of the tubelet's frames); none for index time."""
    if settings.tokens_per_second is None:
        return {}
    return {"tokens_per_second": settings.tokens_per_second, "tubelet_frames": tubelet(settings)[0]}


def datasets(settings: TrainSettings) -> tuple:
    """``(settings, training set, validation set)``: the run's sets at ``img_size`` (:func:`dataset`); the class
    count of an ImageFolder run is filled into the returned settings once its folders are read, with the class names
    that number its labels (``classes``: config.yaml and results.json keep them, and every later read of the folder
    is checked against them); any other must agree with the data's."""
    train_set, val_set = (dataset(settings, split, settings.img_size) for split in ("train", "val"))
    if settings.num_classes is None:
        classes = getattr(train_set, "classes", None)
        settings = settings.replace(num_classes=train_set.num_classes,
                                    classes=None if classes is None else [str(c) for c in classes])
    elif settings.num_classes != train_set.num_classes:
        raise UserError(f"the {settings.data} data has {train_set.num_classes} classes, the run {settings.num_classes}")
    return settings, train_set, val_set


def data_notes(settings: TrainSettings) -> list[str]:
    """Lines that say which transform settings the run's data set does not take (a built-in task is rendered at each
    size, not augmented: a flip or a crop would change its labels; a set whose builder takes no ``transforms``), and
    a crop fraction that the evaluation protocol does not use: they are ignored, not refused, so one recipe serves
    every data set of a benchmark."""
    spec = vdata.get_spec(settings.data)
    notes = []
    protocol = settings.eval_protocol or default_protocol(settings.max_patches)
    if settings.crop_pct != DEFAULTS["crop_pct"] and protocol != "crop":
        notes.append(f"note: --crop-pct ignored: it is the crop protocol's fraction and the evaluation protocol is "
                     f"{protocol} (--eval-protocol crop to use it)")
    changed = [key for key in TRANSFORM_KEYS if getattr(settings, key) != DEFAULTS[key]
               and not (key == "hflip" and spec.video and vdata.takes_option(spec, "hflip"))]  # video-files flips
    flags = " ".join("--" + key.replace("_", "-") for key in changed)
    if changed and (spec.synthetic or spec.video):
        what = "a built-in task rendered at each size" if spec.synthetic else "a video data set"
        notes.append(f"note: {flags} ignored: {settings.data} is {what}, not images through timm's transforms")
    elif changed and not spec.takes_transforms:
        notes.append(f"note: {flags} ignored: the builder of {settings.data} takes no transforms")
    return notes


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


def size_order(key) -> tuple[int, int]:
    """Sort key of an evaluation key: an image size by ``(height, width)``, an integer ``r`` counting as ``(r, r)``
    (so square and non-square sizes mix); a video key ``(frames, res)`` sorts as itself."""
    return (key, key) if isinstance(key, int) else (int(key[0]), int(key[1]))


def eval_grid(settings: TrainSettings, resolutions=(), frames=()) -> tuple[list, object]:
    """The evaluation keys of a run and its training key: image sizes (image run: integers, or ``(height, width)``
    tuples for non-square sizes; ordered by :func:`size_order`) or ``(frames, res)`` pairs (video run: ``frames`` x
    ``resolutions``, integer resolutions only), the training size and frame count always among them."""
    res = sorted(set(resolutions) | {settings.img_size}, key=size_order)
    if not settings.num_frames:
        return res, settings.img_size
    counts = sorted(set(frames) | {settings.num_frames})
    return [(f, r) for f in counts for r in res], (settings.num_frames, settings.img_size)
