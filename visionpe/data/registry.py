"""The data sets by name: one :class:`DatasetSpec` each, added with :func:`register_dataset` (built-in ones and a
user's alike), so ``train_vit.py --data NAME``, the sweep and the benchmarks know every set from one table."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

SPLITS = ("train", "val", "test")
KINDS = ("image", "video")


class DataMissing(FileNotFoundError):
    """The data set is not on this machine; the message says how to get it."""


class DataDamaged(ValueError):
    """A data file that is there but cannot be used (truncated, corrupt, labels out of range, class folders that do
    not match); the message names the file or folder. Raised when the data set is built, or, for one sample (a
    corrupt image or clip), when that sample is read."""


@dataclass(frozen=True)
class DatasetSpec:
    """What is known of a data set before it is loaded, and how to build it.

    Args:
        name: the ``--data`` name.
        num_classes: number of classes, or None when only the data knows it (a folder of class folders).
        in_chans: image channels (1 for grayscale sets, kept as one channel).
        mean, std: per-channel normalisation of pixel values in [0, 1].
        kind: ``"image"`` (samples ``(C, H, W)``) or ``"video"`` (clips ``(C, T, H, W)``; built with ``num_frames``).
        synthetic: rendered at any size from a seed (no download; a resolution change is the same scene with more
            pixels); real sets are resized.
        build: ``build(split, img_size, **options)`` -> a :class:`visionpe.data.base.PositionDataset`; it is called
            with the options its signature names (or all of them with ``**kwargs``), of ``data_dir``, ``download``,
            ``seed``, ``num_samples``, ``augment``, ``num_frames`` and (video, when given) ``frame_stride``,
            ``tokens_per_second`` and ``tubelet_frames``.
    """

    name: str
    num_classes: int | None
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    kind: str
    synthetic: bool
    build: Callable

    @property
    def video(self) -> bool:
        return self.kind == "video"

    @property
    def takes_transforms(self) -> bool:
        """Whether the builder takes ``transforms`` (timm's transforms and the resolution protocol): its signature
        names the parameter (``**kwargs`` is not enough)."""
        return "transforms" in inspect.signature(self.build).parameters


DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(name: str, *, num_classes: int | None, in_chans: int = 3, mean=(0.5, 0.5, 0.5),
                     std=(0.5, 0.5, 0.5), kind: str = "image", synthetic: bool = False, overwrite: bool = False):
    """Decorator: the function below builds the data set ``name`` (see :class:`DatasetSpec` for the fields).

    >>> @register_dataset("stripes", num_classes=2)
    ... def stripes(split, img_size, seed=0, num_samples=None):
    ...     return ImageTensorDataset(images, labels, 2, (0.5,) * 3, (0.5,) * 3, name="stripes")
    """
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"name={name!r} must be a non-empty name of letters, digits, '-' and '_'")
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                    or num_classes < 1):
        raise ValueError(f"num_classes must be an integer >= 1 or None, got {num_classes!r}")
    if isinstance(in_chans, bool) or not isinstance(in_chans, int) or in_chans < 1:
        raise ValueError(f"in_chans must be an integer >= 1, got {in_chans!r}")
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not supported; allowed values: {', '.join(KINDS)}")
    mean, std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    if len(mean) != in_chans or len(std) != in_chans or min(std) <= 0:
        raise ValueError(f"mean and std must have in_chans={in_chans} values each (std > 0), got {mean}, {std}")

    def add(build: Callable) -> Callable:
        if not callable(build):
            raise TypeError(f"register_dataset({name!r}) decorates a function, got {type(build).__name__}")
        if name in DATASETS and DATASETS[name].build is not build and not overwrite:
            raise ValueError(f"data set {name!r} is already registered; pass overwrite=True to replace it")
        DATASETS[name] = DatasetSpec(name, num_classes, in_chans, mean, std, kind, synthetic, build)
        return build
    return add


def unregister_dataset(name: str) -> None:
    """Remove a registered data set (a user's; tests)."""
    get_spec(name)
    DATASETS.pop(name)


def get_spec(name: str) -> DatasetSpec:
    """The spec of ``name``, or a ValueError listing the registered names."""
    if not isinstance(name, str) or name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose from: {', '.join(DATASETS)}")
    return DATASETS[name]


def names(kind: str | None = None, synthetic: bool | None = None) -> tuple[str, ...]:
    """Registered data set names, optionally of one kind and synthetic or real."""
    return tuple(n for n, s in DATASETS.items()
                 if (kind is None or s.kind == kind) and (synthetic is None or s.synthetic == synthetic))


def takes_option(spec: DatasetSpec, option: str) -> bool:
    """Whether ``spec``'s builder takes the option ``option`` (names it, or takes ``**kwargs``)."""
    params = inspect.signature(spec.build).parameters
    return option in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def call_builder(spec: DatasetSpec, split: str, img_size, options: dict):
    """``spec.build(split, img_size, ...)`` with the options its signature takes."""
    params = inspect.signature(spec.build).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return spec.build(split, img_size, **options)
    return spec.build(split, img_size, **{k: v for k, v in options.items() if k in params})
