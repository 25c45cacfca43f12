"""Your own data in folders of class folders:

- ``imagefolder``: ``data_dir/train/<class>/*`` and ``data_dir/val/<class>/*`` (torchvision ImageFolder), decoded
  lazily through timm's transforms (:class:`~visionpe.data.transforms.Transforms`): the train split augmented
  (random-resized crop, flip, colour jitter, RandAugment, ... as set), the val split by its resolution protocol.
- ``videofolder``: ``data_dir/train/<class>/<clip>/*.png|jpg`` (and ``val/``): each clip a folder of frames in name
  order, ``T`` frames sampled evenly, resized with antialiasing.

In both, the training split's class folders number the labels of every split, and a val split is mapped by class
name (it may hold a subset of the training classes; a class the training split lacks is an error listing the
classes missing on each side). Images are decoded as 8-bit RGB with 16-bit grayscale scaled, not saturated
(:func:`to_rgb`); a file that cannot be decoded is a :class:`~visionpe.data.DataDamaged` naming it, raised when the
sample is read.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image

from .base import PositionDataset, resize, size_key
from .registry import DataDamaged, DataMissing, register_dataset
from .transforms import TransformedDataset, Transforms

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


HIGH_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # 16-bit grayscale (PNG, TIFF) as Pillow opens it


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB. 16-bit grayscale (Pillow modes ``I;16*``, and ``I`` as Pillow opens a 16-bit PNG) is
    scaled from 0..65535 to 0..255 (``round(v / 257)``) first: ``convert("RGB")`` would saturate it (every value
    above 255 becomes white). Other modes go through ``convert("RGB")``."""
    if image.mode in HIGH_BIT_MODES:
        values = np.asarray(image).astype(np.float64)
        image = Image.fromarray(np.round(np.clip(values, 0, 65535) / 257).astype(np.uint8), mode="L")
    return image if image.mode == "RGB" else image.convert("RGB")


def read_image(path: str) -> Image.Image:
    """The image file ``path`` decoded as 8-bit RGB (:func:`to_rgb`); a file Pillow cannot decode (corrupt,
    truncated, not an image) is a :class:`DataDamaged` naming it, raised when the sample is read."""
    try:
        with Image.open(path) as image:
            image.load()
            return to_rgb(image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:  # PIL's errors for bad files
        raise DataDamaged(f"cannot read the image {path}: {type(err).__name__}: {' '.join(str(err).split())[:160]} "
                          "(remove or replace the file)") from None


def folder_classes(root: str) -> list[str]:
    """The class folder names of ``root`` (sorted, as torchvision's ImageFolder numbers them)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir())


def match_classes(train_classes, classes, train_root: str, root: str, name: str = "imagefolder") -> None:
    """A split's class folders must be among the training split's (which number the labels); a
    :class:`DataDamaged` listing the classes missing on each side otherwise."""
    extra = sorted(set(classes) - set(train_classes))
    if extra:
        lacking = sorted(set(train_classes) - set(classes))
        raise DataDamaged(f"{name}: the class folders of {root} and {train_root} differ: {train_root} lacks "
                          f"{', '.join(extra)}" + (f"; {root} lacks {', '.join(lacking)}" if lacking else "")
                          + " (each class of a split must be one of the training classes, which number the labels)")


class ImageFolderDataset(TransformedDataset):
    """torchvision ImageFolder, decoded lazily (8-bit RGB, :func:`read_image`), through timm's transforms
    (:class:`Transforms`): the training transform when ``augment``, else the eval transform of its protocol, at
    ``img_size`` (int or ``(H, W)``).

    ``classes``: the class names that number the labels, the training split's (default: ``root``'s own class
    folders). A validation split is mapped by class NAME: its ``dog`` folder gets the index of ``dog`` in
    ``classes`` whatever the other folders are, so a val split may hold a subset of the training classes; a class
    folder that is not in ``classes`` is a :class:`DataDamaged`. ``num_classes`` is ``len(classes)``."""

    def __init__(self, root, img_size, augment=False, seed=0, transforms: Transforms | None = None, classes=None):
        import torchvision
        own = folder_classes(root)
        if not own:
            raise FileNotFoundError(f"Couldn't find any class folder in {root}.")  # as torchvision says it
        if classes is not None:
            match_classes(classes, own, "the given classes", root)
        classes = list(own if classes is None else classes)
        index = {c: i for i, c in enumerate(classes)}

        class ByName(torchvision.datasets.ImageFolder):
            def find_classes(self, directory):
                return [c for c in classes if c in own], {c: index[c] for c in own}

        self.folder = ByName(root, loader=read_image)
        self.classes = classes
        transforms = transforms or Transforms()
        transform = (transforms.train(img_size, IMAGENET_MEAN, IMAGENET_STD) if augment else
                     transforms.eval(img_size, IMAGENET_MEAN, IMAGENET_STD))
        super().__init__("imagefolder", len(classes), IMAGENET_MEAN, IMAGENET_STD, transform, seed=seed)
        self.labels = self.folder.targets
        self.img_size, self.augment = img_size, augment

    def image(self, index):
        return self.folder.loader(self.folder.samples[index][0])  # PIL, 8-bit RGB; DataDamaged for a corrupt file


@register_dataset("imagefolder", num_classes=None, mean=IMAGENET_MEAN, std=IMAGENET_STD)
def imagefolder(split: str, img_size, data_dir=None, seed: int = 0, augment=None,
                transforms: Transforms | None = None) -> ImageFolderDataset:
    """``data_dir/train/<class>/`` or ``data_dir/val/<class>/``. The training split's class folders number the labels
    of both splits: val is mapped by class name (a val holding a subset of the training classes is fine, its
    ``dog`` scored as the training ``dog``), and a val class that train lacks is a :class:`DataDamaged` listing the
    classes missing on each side. A val without a train/ beside it numbers its own classes."""
    if data_dir is None:
        raise DataMissing("imagefolder needs --data-dir DIR holding train/<class>/ and val/<class>/ folders")
    root = os.path.join(data_dir, "train" if split == "train" else "val")
    if not os.path.isdir(root):
        raise DataMissing(f"imagefolder: {root!r} does not exist (expected DIR/train/<class>/ and DIR/val/<class>/)")
    train_root = os.path.join(data_dir, "train")
    classes = None
    if split != "train" and os.path.isdir(train_root):
        classes = folder_classes(train_root)  # the training split numbers the labels of every split
        match_classes(classes, folder_classes(root), train_root, root)
    try:
        return ImageFolderDataset(root, size_key(img_size), augment=(split == "train") if augment is None else augment,
                                  seed=seed, transforms=transforms, classes=classes)
    except FileNotFoundError as err:  # torchvision: no class folder, or no image in them
        raise DataMissing(f"imagefolder: {root!r} holds no images in class folders (expected "
                          f"DIR/{os.path.basename(root)}/<class>/*.png|jpg; torchvision: {err})") from None


FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def read_clip_folder(folder: str, num_frames: int, size: int) -> torch.Tensor:
    """The frames of one clip folder (name order), ``num_frames`` sampled evenly: uint8 ``(3, T, size, size)``."""
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(FRAME_SUFFIXES))
    if not names:
        raise DataMissing(f"videofolder: clip folder {folder!r} holds no frames (*.png|jpg)")
    picks = np.linspace(0, len(names) - 1, num_frames).round().astype(int)
    frames = []
    for k in picks:
        frames.append(torch.from_numpy(np.array(read_image(os.path.join(folder, names[k])))).permute(2, 0, 1))
    return resize(torch.stack(frames), size).permute(1, 0, 2, 3)



class ClipFolderDataset(PositionDataset):
    """``root/<class>/<clip>/<frames>``: clips decoded lazily, ``T`` frames sampled evenly, resized. ``classes``: the
    class names that number the labels (the training split's; default ``root``'s own), matched by name as
    :class:`ImageFolderDataset` does. A clip folder without frames is a :class:`DataMissing` naming it (checked
    here, before training starts)."""

    def __init__(self, root: str, img_size: int, num_frames: int, classes=None,
                 classes_from: str = "the given classes"):
        if not os.path.isdir(root):
            raise DataMissing(f"videofolder: {root!r} does not exist (expected DIR/train/<class>/<clip>/ frames)")
        own = folder_classes(root)
        clips = {c: [os.path.join(root, c, clip) for clip in sorted(os.listdir(os.path.join(root, c)))
                     if os.path.isdir(os.path.join(root, c, clip))] for c in own}
        if not any(clips.values()):
            raise DataMissing(f"videofolder: {root!r} holds no clips (expected {root}/<class>/<clip>/ folders of "
                              "frames)")
        if classes is not None:
            match_classes(classes, own, classes_from, root, "videofolder")
        classes = list(own if classes is None else classes)
        self.samples = [(folder, i) for i, c in enumerate(classes) for folder in clips.get(c, ())]
        empty = [folder for folder, _ in self.samples
                 if not any(n.lower().endswith(FRAME_SUFFIXES) for n in os.listdir(folder))]
        if empty:
            more = f" (and {len(empty) - 1} more clip folders)" if len(empty) > 1 else ""
            raise DataMissing(f"videofolder: clip folder {empty[0]!r} holds no frames{more}: each clip is a folder of "
                              f"frames ({', '.join(FRAME_SUFFIXES)}); remove it or add its frames")
        super().__init__("videofolder", len(classes), IMAGENET_MEAN, IMAGENET_STD, sample_dims=3)
        self.classes, self.labels = classes, [label for _, label in self.samples]
        self.img_size, self.num_frames = img_size, num_frames

    def __getitem__(self, index):
        folder, label = self.samples[index]
        return self.normalize(read_clip_folder(folder, self.num_frames, self.img_size)), label


@register_dataset("videofolder", num_classes=None, mean=IMAGENET_MEAN, std=IMAGENET_STD, kind="video")
def videofolder(split: str, img_size: int, num_frames: int, data_dir=None) -> ClipFolderDataset:
    if data_dir is None:
        raise DataMissing("videofolder needs --data-dir DIR holding train/<class>/<clip>/ and val/<class>/<clip>/")
    root, train_root = os.path.join(data_dir, "train" if split == "train" else "val"), os.path.join(data_dir, "train")
    classes = None
    if split != "train" and os.path.isdir(train_root):
        classes = folder_classes(train_root)  # the training split numbers the labels of every split
    return ClipFolderDataset(root, img_size, num_frames, classes=classes, classes_from=train_root)
