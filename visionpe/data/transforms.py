"""Real images through timm's transforms (``timm.data.create_transform``), seeded per sample, and the resolution
protocols that say how a validation image is shown to a model at a test size.

:class:`Transforms` holds timm's training flags under timm's ``train.py`` names (``scale``, ``ratio``, ``hflip``,
``color_jitter``, ``aa``, ``reprob``/``remode``/``recount``, ``train_crop_mode``, ``interpolation``,
``grayscale_prob``, ``gaussian_blur_prob``, ``no_aug``), the evaluation protocol and, for native aspect ratios, the
patch size and token budget. It builds timm's own pipelines; nothing here re-implements a transform.

DeiT-III (Touvron et al. 2022) trains with 3-Augment: after the crop and flip, one of grayscale, solarization
(threshold 128) or a Gaussian blur (radius uniform in [0.1, 2]), each with probability 1, then colour jitter 0.3. That
is timm's ``aa="3a"`` policy (``auto_augment_policy_3a``; colour jitter stays on with it), so ``aa="3a",
color_jitter=0.3`` is DeiT-III's training transform. Its simple random crop (``--src``, used for ImageNet-21k) is
``train_crop_mode="src"``: the shorter side resized to the size, a random crop of the size from the image padded
by 4 pixels (reflect), then the flip; timm has no such crop mode, so it replaces the crop stage of timm's pipeline
with torchvision's ``Resize`` and ``RandomCrop`` and keeps timm's other stages.

Protocols (:data:`PROTOCOLS`) of a test size ``S`` (or ``H x W``):

- ``resize``: the whole image at ``S`` (squashed to its shape: timm's eval transform with ``crop_mode="squash"`` and
  ``crop_pct=1``); a built-in task renders the same scene with more pixels.
- ``crop``: timm's eval transform at ``S``: the shorter side to ``S / crop_pct``, a centre crop of ``S`` (RoPE-ViT's,
  FixRes's and DeiT's protocol); a built-in task renders at that larger size and is centre-cropped the same way.
- ``native``: each image at its own aspect ratio within a token budget (NaFlex's way: timm's ``ResizeToSequence``):
  the budget at ``S`` is the training budget times ``(S / img_size)^2``, i.e. ``(S / patch)^2`` patches when the run
  trained on squares, so ``S`` still reads as a linear resolution.

Randomness: timm's transforms draw from Python's ``random``, NumPy's global RNG and torch's CPU generator. Each
sample's transform runs under :func:`seeded` with a key of ``(seed, epoch, index)``, and the three global states are
restored afterwards (in the main process: a DataLoader worker has no other use for them), so a sample's augmentation
depends on nothing else: not on the loader's workers, the process (DDP ranks read disjoint indices, each drawing its
own stream), nor on a resume, and the training loop's own RNG streams are left as they were when the data is loaded
in the main process (``workers=0``).
"""
from __future__ import annotations

import math
import random
import re
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from functools import lru_cache

import numpy as np
import torch

from .._checks import check_number
from .base import PositionDataset, image_hw

PROTOCOLS = ("resize", "crop", "native")
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "box", "hamming", "lanczos")
TRAIN_CROP_MODES = ("rrc", "rkrc", "rkrr", "src")
RE_MODES = ("pixel", "rand", "const")
AA_EXAMPLES = "rand-m9-mstd0.5-inc1, 3a (DeiT-III's 3-Augment), original, augmix-m5-w4-d2"
MAX_COLOR_JITTER = 1.0  # factors in [0, 2] at 1; above it the lower factor stays 0 and only the upper one grows
MAX_RECOUNT = 100  # timm shares 2-33 % of the image among the regions: at 100 they are 0.2-3 pixels of a 32 px image
MAX_RATIO = 100.0  # a crop 100 times wider than tall (or the reverse) is a line of pixels; beyond it timm's
# RandomResizedCrop finds no crop in 10 tries and falls back to a centre crop of height or width round(side / ratio)


def _posterize(img, bits_to_keep, **__):
    """timm's ``posterize`` op, where keeping 0 bits gives a black image, as Pillow did until it refused bits < 1:
    timm 1.0.31's RandAugment with a magnitude std (``rand-m9-mstd0.5-inc1``) and AutoAugment ``v0`` reach 0 bits
    (``PosterizeIncreasing`` at magnitude 10), and Pillow 13 raises there, stopping a training run at random."""
    from PIL import Image, ImageOps
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)  # every bit masked off: black
    return ImageOps.posterize(img, bits_to_keep)


def _augmix_basic(self, img, mixing_weights, m):
    """timm's ``AugMixAugment._apply_basic`` as timm's newer releases have it: the mix accumulates in an array of
    the image's own shape (timm 1.0.19 allocates ``(width, height, bands)``, which an ``L`` image or one that is not
    square does not broadcast to: ``--aa augmix-...`` on MNIST raised)."""
    from PIL import Image
    mixed = np.zeros_like(np.asarray(img), dtype=np.float32)
    for mw in mixing_weights:
        depth = self.depth if self.depth > 0 else np.random.randint(1, 4)
        ops = np.random.choice(self.ops, depth, replace=True)
        img_aug = img
        for op in ops:
            img_aug = op(img_aug)
        mixed += mw * np.asarray(img_aug, dtype=np.float32)
    np.clip(mixed, 0, 255., out=mixed)
    return Image.blend(img, Image.fromarray(mixed.astype(np.uint8)), m)


@lru_cache(maxsize=None)
def _augmix_class():
    """The AugMix class visionpe's pipelines use: timm's own, or at timm 1.0.19 (whose ``_apply_basic`` reads
    ``img.size``) a subclass with :func:`_augmix_basic`; timm's class itself is never changed."""
    import inspect

    from timm.data.auto_augment import AugMixAugment
    try:
        old = "img.size[0], img.size[1]" in inspect.getsource(AugMixAugment._apply_basic)
    except (OSError, TypeError):  # no source to read: timm's method
        old = False
    return type("AugMixAugment", (AugMixAugment,), {"_apply_basic": _augmix_basic, "__module__": __name__}) \
        if old else AugMixAugment


def augment_ops(stage) -> list:
    """The ops (timm's ``AugmentOp``) of one of timm's auto-augment stages: a RandAugment's or an AugMix's, every op
    of an AutoAugment's sub-policies; ``[]`` for any other stage."""
    from timm.data.auto_augment import AugMixAugment, AutoAugment, RandAugment
    if isinstance(stage, AutoAugment):
        return [op for sub in stage.policy for op in sub]
    return list(stage.ops) if isinstance(stage, (RandAugment, AugMixAugment)) else []


def fix_augmenters(transform):
    """visionpe's fixes to timm's auto-augment stages inside ``transform`` (a pipeline of ``create_transform``, a
    tuple of them, or a torchvision ``Compose``), made to these objects only: timm's own tables and classes are left
    as they are. Each op of timm's ``posterize`` posterizes with :func:`_posterize`; at timm 1.0.19 an AugMix stage
    is replaced by one of :func:`_augmix_class`. Returns ``transform``."""
    from timm.data.auto_augment import AugMixAugment, posterize
    if isinstance(transform, tuple):  # create_transform(separate=True)
        for part in transform:
            fix_augmenters(part)
        return transform
    stages = getattr(transform, "transforms", None)
    for i, stage in enumerate(stages if isinstance(stages, list) else ()):
        if isinstance(stage, AugMixAugment) and type(stage) is not _augmix_class():
            stage = stages[i] = _augmix_class()(stage.ops, alpha=stage.alpha, width=stage.width, depth=stage.depth,
                                                blended=stage.blended)
        for op in augment_ops(stage):
            if op.aug_fn is posterize:
                op.aug_fn = _posterize
        fix_augmenters(stage)
    return transform


def check_auto_augment(aa: str) -> None:
    """A timm auto-augment policy read strictly: timm's own parser builds it (an unknown policy, key or value is an
    error there), every ``-``-part after the policy name must be one timm reads (timm skips a part without a number
    without a word: ``rand-zz`` is timm's default RandAugment), no key twice, and the magnitudes, probabilities and
    layer counts of the ops timm built within what timm applies (it clamps a magnitude to ``mmax``, default 10). A
    ValueError naming the policy and the part otherwise."""
    from timm.data import create_transform
    from timm.data.auto_augment import _LEVEL_DENOM, RandAugment, rand_augment_choices
    if not isinstance(aa, str) or not aa:
        raise ValueError(f"aa must be a timm auto-augment policy name, got {aa!r}")
    try:
        stages = create_transform(8, is_training=True, auto_augment=aa, separate=True)[1].transforms
        built = next(t for t in stages if augment_ops(t))
    except (AssertionError, ValueError, KeyError, IndexError) as err:
        raise ValueError(f"aa {aa!r} is not a timm auto-augment policy ({err or 'bad config'}); e.g. "
                         f"{AA_EXAMPLES}") from None
    name, *parts = aa.split("-")
    seen = set()
    for part in parts:
        if name == "rand" and part.startswith("t"):  # timm's transform set: weights, 3aw, 3a
            key = "t"
            if rand_augment_choices(part[1:]) is rand_augment_choices(""):
                raise ValueError(f"aa {aa!r}: timm has no RandAugment transform set {part[1:]!r} (it would take its "
                                 "default set); t takes weights, 3aw or 3a")
        else:
            key = re.split(r"(\d.*)", part)[0]
            if key == part:
                raise ValueError(f"aa {aa!r}: timm does not read the part {part!r} (a part is a key and a number, "
                                 f"e.g. m9, n2, mstd0.5; timm would skip it); e.g. {AA_EXAMPLES}")
        if key in seen:
            raise ValueError(f"aa {aa!r}: {key} is given twice; give each part once")
        seen.add(key)
    ops = augment_ops(built)
    for op in ops:
        most = op.magnitude_max or _LEVEL_DENOM  # timm's AugmentOp clamps the magnitude to this
        if not 0 <= op.magnitude <= most:
            raise ValueError(f"aa {aa!r}: magnitude m{op.magnitude:g} is outside timm's range 0..{most:g} (timm "
                             f"would clamp it to {most:g}{'; mmax raises the bound' if name == 'rand' else ''})")
        if not 0 <= op.prob <= 1:
            raise ValueError(f"aa {aa!r}: probability p{op.prob:g} of each op must be in [0, 1]")
    if isinstance(built, RandAugment) and built.num_layers > len(ops):
        raise ValueError(f"aa {aa!r}: n{built.num_layers} ops per image is more than the {len(ops)} ops of the set "
                         "(timm draws them without repeats when the set is weighted)")


def setting(default, help: str, stage: str = "train", metavar: str | None = None, choices: tuple = ()):
    """A field of :class:`Transforms` that is also a training setting (``--name`` on the command line, ``name:`` in
    YAML), its help text beside it; ``stage``: what reads it (``train``: timm's training transform, ``eval``: the
    evaluation protocol, ``both``). :mod:`visionpe.train.settings` makes its settings from these fields
    (:func:`setting_fields`)."""
    return field(default=default, metadata={"help": help, "stage": stage, "metavar": metavar, "choices": choices})


def setting_fields() -> tuple:
    """The fields of :class:`Transforms` that are training settings (made by :func:`setting`), in their order; the
    others (``patch_size``, ``max_patches``, ``train_size``) are given by the run's model and data settings."""
    return tuple(f for f in fields(Transforms) if "help" in f.metadata)


def default_protocol(max_patches: int | None) -> str:
    """The evaluation protocol when none is given: ``native`` with a token budget (``max_patches``), else ``resize``."""
    return "resize" if max_patches is None else "native"


@contextmanager
def seeded(key):
    """Run the block with Python's ``random``, NumPy's global RNG and torch's CPU generator seeded from ``key`` (a
    tuple of non-negative integers, e.g. ``(seed, epoch, index)``), then restore the three states as they were. In a
    DataLoader worker nothing else draws from them (every sample seeds its own), so there they are not restored:
    saving NumPy's state alone costs about 1 % of a 224 px sample."""
    words = np.random.SeedSequence([int(k) for k in key]).generate_state(2, np.uint32)
    in_worker = torch.utils.data.get_worker_info() is not None
    saved = None if in_worker else (random.getstate(), np.random.get_state(), torch.default_generator.get_state())
    random.seed(int(words[0]) << 32 | int(words[1]))
    np.random.seed(int(words[0]))
    torch.default_generator.manual_seed(int(words[0]) << 32 | int(words[1]))
    try:
        yield
    finally:
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.default_generator.set_state(saved[2])


def _pair(name: str, value, low: float, high: float, why: str) -> tuple[float, float]:
    """``(lo, hi)`` of a range setting with ``low < lo <= hi <= high``, or a ValueError naming ``name`` and ``why``
    the bounds are what they are."""
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value)):
        raise ValueError(f"{name} must be two numbers (low high), got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not low < lo <= hi <= high:
        raise ValueError(f"{name} must be two numbers with {low} < low <= high <= {high:g} ({why}), got {lo:g} {hi:g}")
    return lo, hi


def _probability(name: str, value) -> float:
    return check_number(name, value, 0.0, maximum=1.0)


@dataclass(frozen=True)
class Transforms:
    """timm's image transforms of a real image set and its evaluation protocol (fields: timm's ``train.py`` flags).

    ``hflip=None`` takes the data set's own default (0.5; 0 for digits); ``eval_protocol=None`` is
    :func:`default_protocol`'s. ``max_patches``: train each image at its
    native aspect ratio within that many patches of ``patch_size`` (timm's NaFlex ``RandomResizedCropToSequence``);
    ``train_size`` is the run's ``img_size``, the size whose native budget is the training budget. Bad values are a
    ValueError naming the field and what it takes.
    """

    scale: tuple = setting((0.08, 1.0), "random-resized-crop area range (timm --scale): two numbers 0 < low <= "
                           "high <= 1", metavar="PCT")
    ratio: tuple = setting((3 / 4, 4 / 3), "random-resized-crop aspect-ratio range (timm --ratio): two numbers 0.01 "
                           "< low <= high <= 100", metavar="RATIO")
    hflip: float | None = setting(None, "horizontal flip probability (timm --hflip), in [0, 1] (default: the data "
                                  "set's, 0.5; 0 for MNIST digits; video-files flips every frame of a clip alike, "
                                  "p 0.5). A set where left and right are the labels (Something-Something-style "
                                  "'moving left' / 'moving right') needs --hflip 0, as its recipes train",
                                  metavar="P")
    color_jitter: float = setting(0.4, "colour jitter factor of brightness, contrast and saturation (timm "
                                  "--color-jitter; off when --aa is set, except for 3a): each factor drawn from "
                                  "[max(0, 1 - F), 1 + F]; in [0, 1] (above 1 the lower end stays 0 and images "
                                  "saturate)", metavar="F")
    aa: str | None = setting(None, "timm auto-augment policy (timm --aa), e.g. rand-m9-mstd0.5-inc1 (RandAugment), "
                             "3a (DeiT-III's 3-Augment: one of grayscale, solarize, Gaussian blur per image, colour "
                             "jitter kept on: DeiT-III's --ThreeAugment is --aa 3a --color-jitter 0.3), original, "
                             "augmix-m5-w4-d2; read strictly: every part one timm reads, once, magnitudes within "
                             "timm's 0..10 (or mmax) (default: none)", metavar="NAME")
    reprob: float = setting(0.0, "random erasing probability (timm --reprob); in [0, 1]", metavar="P")
    remode: str = setting("pixel", "random erasing fill (timm --remode)", choices=RE_MODES)
    recount: int = setting(1, f"random erasing regions per image (timm --recount); an integer in [1, {MAX_RECOUNT}] "
                           "(timm shares the erased area among them)", metavar="N")
    train_crop_mode: str = setting("rrc", "training crop (timm --train-crop-mode): rrc random-resized crop, rkrc / "
                                   "rkrr resize keeping the ratio then a centre / random crop, src DeiT-III's simple "
                                   "random crop (the shorter side to img_size, a random crop from the image padded "
                                   "by 4 px, reflect; DeiT-III's --src; --scale and --ratio do not apply)",
                                   choices=TRAIN_CROP_MODES)
    interpolation: str = setting("bicubic", "resampling of timm's transforms (real images), training and evaluation "
                                 "(timm's --interpolation)", stage="both", choices=INTERPOLATIONS)
    grayscale_prob: float = setting(0.0, "probability of a grayscale image (timm --grayscale-prob); in [0, 1]",
                                    metavar="P")
    gaussian_blur_prob: float = setting(0.0, "probability of a Gaussian blur (timm --gaussian-blur-prob); in [0, 1]",
                                        metavar="P")
    no_aug: bool = setting(False, "no training augmentation (timm --no-aug): resize and centre-crop the train split")
    eval_protocol: str | None = setting(
        None, "how a validation image is shown at each test size: resize (the whole image at the size; the built-in "
        "tasks render the same scene with more pixels), crop (timm's eval transform: shorter side to size / "
        "crop_pct, centre crop; RoPE-ViT's and FixRes's protocol), native (each image at its own aspect ratio within "
        "the patch budget of the size: (size / patch_size)^2 patches, scaled from max_patches when given; needs a "
        "ViT with a visionpe encoding); used for the validation of every epoch and the resolution table (default: "
        "native with --max-patches, else resize)", stage="eval", choices=PROTOCOLS)
    crop_pct: float = setting(0.875, "the crop protocol's crop fraction (timm --crop-pct); in (0, 1]", stage="eval",
                              metavar="PCT")
    patch_size: int = 16  # the run's patch_size (a model setting)
    max_patches: int | None = None  # the run's max_patches (a data setting)
    train_size: int | None = None  # the run's img_size

    def __post_init__(self):
        if self.eval_protocol is None:
            object.__setattr__(self, "eval_protocol", default_protocol(self.max_patches))
        object.__setattr__(self, "scale", _pair("scale", self.scale, 0.0, 1.0, "fractions of the image's area; timm's "
                                                "RandomResizedCrop centre-crops when a larger crop does not fit"))
        object.__setattr__(self, "ratio", _pair("ratio", self.ratio, 1 / MAX_RATIO, MAX_RATIO,
                                                "width / height of the crop; beyond it a crop is a line of pixels"))
        for name in ("reprob", "grayscale_prob", "gaussian_blur_prob") + (("hflip",) if self.hflip is not None else ()):
            _probability(name, getattr(self, name))
        if check_number("color_jitter", self.color_jitter, 0.0) > MAX_COLOR_JITTER:
            raise ValueError(f"color_jitter must be in [0, {MAX_COLOR_JITTER:g}], got {self.color_jitter!r}: timm "
                             "draws brightness, contrast and saturation factors from [max(0, 1 - F), 1 + F], so "
                             f"above {MAX_COLOR_JITTER:g} the images saturate")
        check_number("crop_pct", self.crop_pct, 0.0, inclusive=False, maximum=1.0)
        for f in fields(self):
            allowed = f.metadata.get("choices")
            if allowed and getattr(self, f.name) not in allowed:
                raise ValueError(f"{f.name} {getattr(self, f.name)!r} is not one of {', '.join(allowed)}")
        for name in ("recount", "patch_size") + (("max_patches",) if self.max_patches is not None else ()) + \
                (("train_size",) if self.train_size is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.recount > MAX_RECOUNT:
            raise ValueError(f"recount must be an integer in [1, {MAX_RECOUNT}], got {self.recount}: timm shares "
                             f"2-33 % of the image among the regions, so more than {MAX_RECOUNT} are specks that "
                             "cost time")
        if self.max_patches is not None and self.train_crop_mode != "rrc":
            raise ValueError(f"train_crop_mode {self.train_crop_mode!r} does not apply with max_patches (native "
                             "aspect ratios crop with timm's RandomResizedCropToSequence); leave it at rrc")
        if self.aa is not None:
            check_auto_augment(self.aa)

    @classmethod
    def from_settings(cls, cfg: dict) -> Transforms:
        """The transforms of a run's settings (a dict holding every field's key; ``img_size`` is ``train_size``)."""
        values = {f.name: cfg[f.name] for f in fields(cls) if f.name in cfg and f.name != "train_size"}
        for name in ("scale", "ratio"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        return cls(**values, train_size=cfg.get("img_size"))

    def replace(self, **changes) -> Transforms:
        return type(self)(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

    # -- timm's pipelines -------------------------------------------------------------------------------------
    def train(self, size, mean, std, hflip: float = 0.5):
        """timm's training transform (PIL image -> normalised ``(C, H, W)``) at ``size`` (int or ``(H, W)``), or
        at the image's own aspect ratio within ``max_patches`` patches; ``hflip`` is the data set's default."""
        from timm.data import create_transform
        native = self.max_patches is not None
        flip = hflip if self.hflip is None else self.hflip
        src = self.train_crop_mode == "src" and not self.no_aug
        built = create_transform(
            image_hw(size, "size", 1), is_training=True, no_aug=self.no_aug,
            train_crop_mode="rrc" if src else self.train_crop_mode, scale=self.scale, ratio=self.ratio, hflip=flip,
            color_jitter=self.color_jitter, grayscale_prob=self.grayscale_prob,
            gaussian_blur_prob=self.gaussian_blur_prob, auto_augment=self.aa, interpolation=self.interpolation,
            mean=tuple(mean), std=tuple(std), re_prob=self.reprob, re_mode=self.remode, re_count=self.recount,
            naflex=native, patch_size=self.patch_size, max_seq_len=self.max_patches or 1, separate=src)
        fix_augmenters(built)
        if not src:
            return built
        from torchvision import transforms as T
        _, secondary, final = built  # timm's colour / auto-augment stage and its tensor / normalise / erase stage
        return T.Compose([*self.simple_random_crop(size, flip), *secondary.transforms, *final.transforms])

    def simple_random_crop(self, size, hflip: float) -> list:
        """DeiT-III's simple random crop (``train_crop_mode="src"``) as torchvision transforms: the image resized to
        cover ``size`` keeping its aspect ratio (a square size: the shorter side to it, torchvision's ``Resize(int)``
        as DeiT-III's code does), a random crop of ``size`` from the image padded by 4 pixels on each side
        (reflect), then a horizontal flip with probability ``hflip``. ``scale`` and ``ratio`` do not apply."""
        from timm.data.transforms import ResizeKeepRatio, str_to_interp_mode
        from torchvision import transforms as T
        height, width = image_hw(size, "size", 1)
        mode = str_to_interp_mode(self.interpolation)
        resize = T.Resize(height, interpolation=mode) if height == width else \
            ResizeKeepRatio((height, width), interpolation=self.interpolation)
        out = [resize, T.RandomCrop((height, width), padding=4, padding_mode="reflect", pad_if_needed=True)]
        return out + ([T.RandomHorizontalFlip(p=hflip)] if hflip > 0 else [])

    def eval(self, size, mean, std):
        """timm's eval transform of the protocol at ``size``: ``resize`` (squash the whole image), ``crop``
        (shorter side to ``size / crop_pct``, centre crop) or ``native`` (:meth:`budget` patches, aspect kept)."""
        from timm.data import create_transform
        common = dict(is_training=False, interpolation=self.interpolation, mean=tuple(mean), std=tuple(std))
        if self.eval_protocol == "native":
            return create_transform(image_hw(size, "size", 1), naflex=True, patch_size=self.patch_size,
                                    max_seq_len=self.budget(size), **common)
        if self.eval_protocol == "crop":
            return create_transform(image_hw(size, "size", 1), crop_pct=self.crop_pct, **common)
        return create_transform(image_hw(size, "size", 1), crop_pct=1.0, crop_mode="squash", **common)

    # -- geometry: what the protocols do to an image of a given size --------------------------------------------
    def budget(self, size) -> int:
        """Patches of the native protocol at ``size``: the training budget (``max_patches``, else the patches of a
        ``train_size`` square) times the area ratio ``H W / train_size^2``; ``(H / p)(W / p)`` without either."""
        height, width = image_hw(size, "size", 1)
        patches = height * width / self.patch_size ** 2
        if self.max_patches is not None and self.train_size is not None:
            patches *= self.max_patches / (self.train_size / self.patch_size) ** 2
        return max(1, int(patches + 1e-9))

    def native_size(self, image_hw_: tuple[int, int], budget: int) -> tuple[int, int]:
        """``(H, W)`` of an image of ``image_hw_`` pixels at its aspect ratio within ``budget`` patches (timm's
        ``get_image_size_for_seq``, as its ``ResizeToSequence`` computes it)."""
        from timm.data.naflex_transforms import get_image_size_for_seq
        return tuple(get_image_size_for_seq(tuple(image_hw_), self.patch_size, budget)[1])

    def render_size(self, image_hw_: tuple[int, int], size, train: bool = False):
        """For a data set rendered at any size (the built-in tasks): ``(render (H, W), centre crop (H, W) or None)``
        of a scene whose native pixel size is ``image_hw_``, shown at ``size``: the geometry of timm's transforms
        (checked against them in the tests), without the resampling. ``train=True``: the training view (native
        within ``max_patches``, else ``size``)."""
        if train:
            return (self.native_size(image_hw_, self.max_patches), None) if self.max_patches else \
                (image_hw(size, "size", 1), None)
        target = image_hw(size, "size", 1)
        if self.eval_protocol == "native":
            return self.native_size(image_hw_, self.budget(size)), None
        if self.eval_protocol == "resize":
            return target, None
        h0, w0 = image_hw_
        scaled = tuple(math.floor(s / self.crop_pct) for s in target)
        if scaled[0] == scaled[1]:  # torchvision Resize(int): the shorter side to the size, the longer in proportion
            short, long = (h0, w0) if h0 <= w0 else (w0, h0)
            sides = (scaled[0], int(scaled[0] * long / short))
            return (sides if h0 <= w0 else sides[::-1]), target
        ratio = min(h0 / scaled[0], w0 / scaled[1])  # timm ResizeKeepRatio: cover the target, aspect kept
        return (round(h0 / ratio), round(w0 / ratio)), target

    def describe(self) -> str:
        """The protocol in words, for tables and logs."""
        if self.eval_protocol == "crop":
            return f"crop (shorter side to size / {self.crop_pct:g}, centre crop)"
        if self.eval_protocol == "native":
            return f"native (aspect kept within the patch budget of each size; patch {self.patch_size})"
        return "resize (the whole image at each size)"


class TransformedDataset(PositionDataset):
    """A set whose samples are ``transform(image(index))`` (a PIL image through timm's transforms, which normalise
    it), run under :func:`seeded` with the key ``(seed, epoch, index)``: the augmentation
    of a sample is a function of those three alone. Subclasses set ``labels`` and implement :meth:`image`."""

    def __init__(self, name: str, num_classes: int, mean, std, transform, seed: int = 0):
        super().__init__(name, num_classes, mean, std, seed=seed)
        self.transform = transform

    def image(self, index: int):
        """The source image of sample ``index`` (a PIL image)."""
        raise NotImplementedError

    def __getitem__(self, index):
        image = self.image(index)
        with seeded((self.seed, self.epoch, index)):
            x = self.transform(image)
        if x.shape[0] != self.in_chans:  # e.g. a 1-channel mean/std broadcast over an RGB image
            raise ValueError(f"{self.name}: the transform gave {x.shape[0]} channels, the data set has "
                             f"{self.in_chans} (mean/std)")
        return x, int(self.labels[index])


def to_pil(image: torch.Tensor):
    """uint8 ``(C, H, W)`` (C = 1 or 3) -> a PIL image (``L`` or ``RGB``): what timm's transforms take."""
    from PIL import Image
    if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"image must be uint8 (1 or 3, H, W), got {image.dtype} {tuple(image.shape)}")
    array = image.permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if image.shape[0] == 1 else array, "L" if image.shape[0] == 1 else "RGB")
