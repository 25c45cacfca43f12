"""Data sets for training and resolution benchmarks, by name from one registry.

``build_dataset(name, split, img_size, ...)`` returns a :class:`~visionpe.data.base.PositionDataset` of
``(sample, label)``: images ``(C, H, W)`` normalised float tensors (``img_size`` an integer, or ``(height, width)``),
or for video sets (``num_frames=T``) clips ``(C, T, H, W)``. Every data set has ``num_classes``, ``in_chans``,
``mean``, ``std`` and ``set_epoch(epoch)`` (augmentation is a function of ``(seed, epoch, index)`` only, so runs
are reproducible and resumable whatever the loader does).

One module a kind: :mod:`.scenes` (built-in image tasks rendered at any size), :mod:`.aspect` (a built-in task at
random aspect ratios), :mod:`.clutter` (cluttered built-in tasks whose detail resolves only at larger sizes), :mod:`.clips` (built-in video tasks), :mod:`.torchvision_sets` (Fashion-MNIST, MNIST, CIFAR),
:mod:`.folders` (ImageFolder, folders of frames), :mod:`.video_files` (folders of video files), :mod:`.budget`
(native aspect ratios within a token budget), :mod:`.batching` (batches of mixed sizes); :mod:`.transforms` (timm's image transforms seeded per sample, and the
resolution protocols ``resize``, ``crop``, ``native``); :mod:`.registry` holds the table and :mod:`.base` the shared
base class. A new data set is one function decorated with :func:`register_dataset` (from a user's module too:
``train_vit.py --import my_data.py --data my-set``); a builder that names a ``transforms`` parameter takes timm's
transforms and the protocol (:class:`~visionpe.data.transforms.Transforms`).
"""
from __future__ import annotations

from . import scenes, aspect, clutter, torchvision_sets, folders, clips, video_files  # noqa: F401, I001  (each registers its data sets, in this order)
from .base import (ClipTensorDataset, ImageListDataset, ImageTensorDataset, PositionDataset, fixed_subset, image_hw,
                   resize, resize_bicubic, size_key)
from .batching import collate_images
from .budget import native_aspect_size, resize_to_budget
from .clips import clip_scene, render_clip
from .folders import ClipFolderDataset, ImageFolderDataset
from .registry import (DATASETS, SPLITS, DataDamaged, DataMissing, DatasetSpec, call_builder, get_spec, names,
                       register_dataset, takes_option, unregister_dataset)
from .scenes import render, scene
from .torchvision_sets import DEBIAN_FASHION_MNIST
from .transforms import PROTOCOLS, TransformedDataset, Transforms, seeded

__all__ = ["DATASETS", "DEBIAN_FASHION_MNIST", "PROTOCOLS", "SPLITS", "ClipFolderDataset", "ClipTensorDataset",
           "DataDamaged", "DataMissing", "DatasetSpec", "ImageFolderDataset", "ImageListDataset", "ImageTensorDataset",
           "PositionDataset", "TransformedDataset", "Transforms", "build_dataset", "clip_scene", "collate_images", "fixed_subset",
           "get_spec", "image_hw", "info", "names", "native_aspect_size", "register_dataset", "render", "render_clip",
           "resize", "resize_bicubic", "resize_to_budget", "scene", "seeded", "size_key", "takes_option",
           "takes_transforms", "unregister_dataset"]


def info(name: str) -> dict:
    """``{'num_classes', 'in_chans', 'synthetic', 'video'}`` for a named data set, without loading it (a folder's
    class count is only known once loaded: ``num_classes=None``)."""
    spec = get_spec(name)
    return {"num_classes": spec.num_classes, "in_chans": spec.in_chans, "synthetic": spec.synthetic,
            "video": spec.video}


def takes_transforms(name: str) -> bool:
    """Whether the builder of ``name`` takes ``transforms`` (timm's transforms and the resolution protocol): its
    signature names the parameter (:attr:`DatasetSpec.takes_transforms`)."""
    return get_spec(name).takes_transforms


def build_dataset(name: str, split: str, img_size, data_dir=None, download: bool = False, seed: int = 0,
                  num_samples=None, augment=None, num_frames: int | None = None,
                  frame_stride: int | None = None, transforms: Transforms | None = None,
                  first: int = 0, tokens_per_second: float | None = None,
                  tubelet_frames: int = 1) -> PositionDataset:
    """The data set ``name`` at ``img_size`` pixels (a square integer; an image set also takes ``(height, width)``,
    a square pair being the integer).

    ``num_samples``: synthetic tasks render that many scenes (default 10000 train / 2000 val); real sets use a fixed
    random subset of that size (default all). ``augment``: default True for real train splits, never for synthetic
    tasks (a flip or shift would change their labels). ``seed``: synthetic scenes and the augmentation stream; real
    subsets do not depend on it. ``num_frames``: clips of that many frames; required by video sets, refused by image
    ones. ``frame_stride``: video sets that take it sample frames that far apart (given only to those).
    ``tokens_per_second``: video sets that take it (video-files: the container's frame rate) yield ``(clip, label,
    time_step)``, the step between temporal tokens of ``tubelet_frames`` frames on an axis of that many positions per
    second (Qwen2.5-VL's absolute time; a model's ``time_spacing=``).
    ``transforms``: timm's transforms and the resolution protocol (default :class:`Transforms` ``()``: timm's
    training defaults, the ``resize`` protocol), passed to builders that take them (:func:`takes_transforms`); a
    builder that takes no transforms but an ``hflip`` (video-files) gets their ``hflip`` when it is set. ``first``:
    a built-in task that takes it renders scenes ``first ..`` (images held out after a training set of ``first``;
    any other set refuses a nonzero one). A set of
    fewer than 2 classes is a :class:`DataDamaged` (a classifier needs 2).
    """
    spec = get_spec(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from: {', '.join(SPLITS)}")
    if spec.video and (isinstance(img_size, bool) or not isinstance(img_size, int) or img_size < 4):
        raise ValueError(f"img_size must be an integer >= 4 for the video data set {name} (clips are square), "
                         f"got {img_size!r}")
    size = size_key(img_size)  # a video set's: the integer itself
    if spec.video != (num_frames is not None):
        raise ValueError(f"{name} is {'a video' if spec.video else 'an image'} data set: "
                         f"{'give' if spec.video else 'do not give'} num_frames (clips of T frames)")
    if num_frames is not None and (isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1):
        raise ValueError(f"num_frames must be a positive integer, got {num_frames!r}")
    if transforms is not None and not isinstance(transforms, Transforms):
        raise TypeError(f"transforms must be a visionpe.data.Transforms, got {type(transforms).__name__}")
    options = dict(data_dir=data_dir, download=download, seed=seed, num_samples=num_samples, augment=augment)
    if first:
        if isinstance(first, bool) or not isinstance(first, int) or first < 0 or not takes_option(spec, "first"):
            raise ValueError(f"first={first!r}: a non-negative integer, for the built-in tasks that take it "
                             f"({', '.join(s.name for s in DATASETS.values() if takes_option(s, 'first'))})")
        options["first"] = first
    if transforms is not None and spec.takes_transforms:
        options["transforms"] = transforms
    elif transforms is not None and transforms.hflip is not None and takes_option(spec, "hflip"):
        options["hflip"] = transforms.hflip  # a set that flips without timm's transforms (video-files' clips)
    if spec.video:
        options["num_frames"] = num_frames
    if frame_stride is not None:
        if not takes_option(spec, "frame_stride"):
            raise ValueError(f"{name} does not take frame_stride (frames are sampled by the data set itself)")
        options["frame_stride"] = frame_stride
    if tokens_per_second is not None:
        if not takes_option(spec, "tokens_per_second"):
            raise ValueError(f"{name} does not take tokens_per_second (its clips state no frame rate)")
        options.update(tokens_per_second=tokens_per_second, tubelet_frames=tubelet_frames)
    dataset = call_builder(spec, split, size, options)
    if not isinstance(dataset, PositionDataset):
        raise TypeError(f"the builder of data set {name!r} returned {type(dataset).__name__}, not a "
                        "visionpe.data.PositionDataset")
    if dataset.num_classes < 2:
        classes = getattr(dataset, "classes", None)
        raise DataDamaged(f"{name}: {dataset.num_classes} class{'' if dataset.num_classes == 1 else 'es'}"
                          f"{f' ({classes[0]})' if classes else ''}{f' under {str(data_dir)!r}' if data_dir else ''}; "
                          "a classifier needs at least 2 (a folder of each class in train/)")
    return dataset
