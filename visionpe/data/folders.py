"""Your own data in folders of class folders:

- ``imagefolder``: ``data_dir/train/<class>/*`` and ``data_dir/val/<class>/*`` (torchvision ImageFolder), decoded
  lazily through timm's transforms (:class:`~visionpe.data.transforms.Transforms`): the train split augmented
  (random-resized crop, flip, colour jitter, RandAugment, ... as set), the val split by its resolution protocol.
- ``videofolder``: ``data_dir/train/<class>/<clip>/*.png|jpg`` (and ``val/``): each clip a folder of frames in name
  order, ``T`` frames sampled evenly, resized with antialiasing.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image

from .base import PositionDataset, resize, size_key
from .registry import DataMissing, register_dataset
from .transforms import TransformedDataset, Transforms

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ImageFolderDataset(TransformedDataset):
    """torchvision ImageFolder, decoded lazily (RGB), through timm's transforms (:class:`Transforms`): the training
    transform when ``augment``, else the eval transform of its protocol, at ``img_size`` (int or ``(H, W)``)."""

    def __init__(self, root, img_size, augment=False, seed=0, transforms: Transforms | None = None):
        import torchvision
        self.folder = torchvision.datasets.ImageFolder(root)
        transforms = transforms or Transforms()
        transform = (transforms.train(img_size, IMAGENET_MEAN, IMAGENET_STD) if augment else
                     transforms.eval(img_size, IMAGENET_MEAN, IMAGENET_STD))
        super().__init__("imagefolder", len(self.folder.classes), IMAGENET_MEAN, IMAGENET_STD, transform, seed=seed)
        self.labels = self.folder.targets
        self.img_size, self.augment = img_size, augment

    def image(self, index):
        return self.folder.loader(self.folder.samples[index][0])  # PIL, converted to RGB


@register_dataset("imagefolder", num_classes=None, mean=IMAGENET_MEAN, std=IMAGENET_STD)
def imagefolder(split: str, img_size, data_dir=None, seed: int = 0, augment=None,
                transforms: Transforms | None = None) -> ImageFolderDataset:
    if data_dir is None:
        raise DataMissing("imagefolder needs --data-dir DIR holding train/<class>/ and val/<class>/ folders")
    root = os.path.join(data_dir, "train" if split == "train" else "val")
    if not os.path.isdir(root):
        raise DataMissing(f"imagefolder: {root!r} does not exist (expected DIR/train/<class>/ and DIR/val/<class>/)")
    try:
        return ImageFolderDataset(root, size_key(img_size), augment=(split == "train") if augment is None else augment,
                                  seed=seed, transforms=transforms)
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
        with Image.open(os.path.join(folder, names[k])) as im:
            frames.append(torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1))
    return resize(torch.stack(frames), size).permute(1, 0, 2, 3)



class ClipFolderDataset(PositionDataset):
    """``root/<class>/<clip>/<frames>``: clips decoded lazily, ``T`` frames sampled evenly, resized."""

    def __init__(self, root: str, img_size: int, num_frames: int):
        if not os.path.isdir(root):
            raise DataMissing(f"videofolder: {root!r} does not exist (expected DIR/train/<class>/<clip>/ frames)")
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, clip), i) for i, c in enumerate(classes)
                        for clip in sorted(os.listdir(os.path.join(root, c)))
                        if os.path.isdir(os.path.join(root, c, clip))]
        if not self.samples:
            raise DataMissing(f"videofolder: {root!r} holds no clips (expected {root}/<class>/<clip>/ folders of "
                              "frames)")
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
    return ClipFolderDataset(os.path.join(data_dir, "train" if split == "train" else "val"), img_size, num_frames)
