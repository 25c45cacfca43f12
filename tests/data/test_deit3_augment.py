"""DeiT-III's training transform (Touvron et al. 2022): 3-Augment is timm's ``aa="3a"`` (one of grayscale,
solarization at 128 and a Gaussian blur of radius in [0.1, 2] per image, then colour jitter), and its simple random
crop is ``train_crop_mode="src"`` (shorter side to the size, a random crop from the image padded by 4 px, reflect,
then the flip): each op checked against its definition, the output shapes, and the per-sample seed."""
import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter, ImageOps
from timm.data.auto_augment import AutoAugment
from torchvision import transforms as T

from visionpe import data
from visionpe.data.transforms import Transforms, seeded

ZERO, ONE = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # no normalisation: the output is the image's pixels / 255


def picture(h: int, w: int, seed: int = 0) -> Image.Image:
    """A colour image with smooth gradients and edges (so blur, grayscale and solarization all change it)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    b = np.where((x // 4 + y // 4) % 2 == 0, 230, 20) + rng.integers(-15, 16, (h, w))
    return Image.fromarray(np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8), "RGB")


def pixels(x: torch.Tensor) -> np.ndarray:
    """A transform's output (C, H, W) in [0, 1] (mean 0, std 1) back to uint8 (H, W, C)."""
    return (x.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def variation(a: np.ndarray) -> float:
    a = a.astype(np.float64)
    return float(np.abs(np.diff(a, axis=0)).sum() + np.abs(np.diff(a, axis=1)).sum())


def test_3a_draws_each_of_grayscale_solarize_blur_as_deit3_defines_them():
    img = picture(32, 32)
    keep = dict(color_jitter=0.0, hflip=0.0, scale=(1.0, 1.0), ratio=(1.0, 1.0))  # the crop keeps the image whole
    identity = Transforms(**keep).train(32, ZERO, ONE)
    with seeded((0, 0, 0)):
        assert np.array_equal(pixels(identity(img)), np.asarray(img))  # so what changes below is 3-Augment's
    three = Transforms(aa="3a", **keep).train(32, ZERO, ONE)
    gray = np.asarray(img.convert("L").convert("RGB"))  # DeiT-III's gray_scale: torchvision Grayscale(3)
    solar = np.asarray(ImageOps.solarize(img, 128))  # DeiT-III's Solarization: ImageOps.solarize, threshold 128
    least = variation(np.asarray(img.filter(ImageFilter.GaussianBlur(2.0))))  # DeiT-III's blur: radius in [0.1, 2]
    drawn = {"gray": 0, "solarize": 0, "blur": 0}
    for index in range(60):
        with seeded((0, 0, index)):
            out = pixels(three(img))
        if np.array_equal(out, gray):
            drawn["gray"] += 1
        elif np.array_equal(out, solar):
            drawn["solarize"] += 1
        else:  # a Gaussian blur: colour kept, smoother than the image, no smoother than radius 2
            assert not np.array_equal(out[..., 0], out[..., 1])
            assert least - 1e-6 <= variation(out) <= variation(np.asarray(img))
            drawn["blur"] += 1
    assert all(n >= 10 for n in drawn.values()), drawn  # one of three, each about a third of the time


def test_3a_keeps_colour_jitter_after_the_choice():
    stages = Transforms(aa="3a", color_jitter=0.3).train(24, ZERO, ONE).transforms
    kinds = [type(t) for t in stages]
    assert AutoAugment in kinds and T.ColorJitter in kinds
    assert kinds.index(AutoAugment) < kinds.index(T.ColorJitter)  # DeiT-III: 3-Augment, then colour jitter
    jitter = stages[kinds.index(T.ColorJitter)]
    assert jitter.brightness == jitter.contrast == jitter.saturation == (0.7, 1.3) and jitter.hue is None
    choice = stages[kinds.index(AutoAugment)]
    assert [[op.name for op in sub] for sub in choice.policy] == [["Solarize"], ["Desaturate"], ["GaussianBlurRand"]]
    assert all(op.prob == 1.0 for sub in choice.policy for op in sub)
    # RandAugment turns colour jitter off (timm's rule); 3a is the exception
    kinds = [type(t) for t in Transforms(aa="rand-m9-mstd0.5-inc1", color_jitter=0.3).train(24, ZERO, ONE).transforms]
    assert T.ColorJitter not in kinds


@pytest.mark.parametrize("hw", [(20, 30), (45, 18), (16, 16)])
def test_simple_random_crop_is_deit3s_src_under_the_same_seed(hw):
    """Bit for bit DeiT-III's ``--src`` pipeline written with torchvision (Resize, RandomCrop padding 4 reflect,
    flip, colour jitter, to tensor, normalise), for images wider, taller and square."""
    img = picture(*hw, seed=1)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ours = Transforms(train_crop_mode="src", color_jitter=0.3, hflip=0.5).train(16, mean, std)
    deit3 = T.Compose([T.Resize(16, interpolation=T.InterpolationMode.BICUBIC),
                       T.RandomCrop(16, padding=4, padding_mode="reflect"), T.RandomHorizontalFlip(),
                       T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(), T.Normalize(torch.tensor(mean), torch.tensor(std))])
    outs = []
    for index in range(12):
        with seeded((5, 1, index)):
            x = ours(img)
        with seeded((5, 1, index)):
            want = deit3(img)
        assert x.shape == (3, 16, 16) and torch.equal(x, want)
        outs.append(x)
    assert len({o.numpy().tobytes() for o in outs}) > 1  # the crop, flip and jitter are drawn per sample


def test_simple_random_crop_windows_come_from_the_padded_resized_image():
    img = picture(20, 30, seed=2)
    crop = Transforms(train_crop_mode="src", color_jitter=0.0, hflip=0.5).train(16, ZERO, ONE)
    resized = img.resize((24, 16), Image.BICUBIC)  # the shorter side 20 -> 16, the longer 30 -> 24
    padded = np.pad(np.asarray(resized), ((4, 4), (4, 4), (0, 0)), mode="reflect")  # 24 x 32
    windows = {(i, j): padded[i:i + 16, j:j + 16] for i in range(9) for j in range(17)}
    seen, flipped = set(), 0
    for index in range(30):
        with seeded((0, 0, index)):
            out = pixels(crop(img))
        plain = [k for k, w in windows.items() if np.array_equal(out, w)]
        mirrored = [k for k, w in windows.items() if np.array_equal(out[:, ::-1], w)]
        assert plain or mirrored, f"sample {index} is no window of the padded image"
        seen.update(plain or mirrored)
        flipped += not plain
    assert len(seen) > 5 and 0 < flipped < 30  # random offsets (padding included), flips drawn


def test_simple_random_crop_shapes_and_scale_ratio_unused():
    img = picture(37, 23)
    t = Transforms(train_crop_mode="src", scale=(0.5, 0.6), ratio=(0.5, 2.0))
    assert t.train(24, ZERO, ONE)(img).shape == (3, 24, 24)
    assert t.train((16, 24), ZERO, ONE)(img).shape == (3, 16, 24)  # a non-square size: cover it, aspect kept
    names = [type(s).__name__ for s in t.train(24, ZERO, ONE).transforms]
    assert names[:3] == ["Resize", "RandomCrop", "RandomHorizontalFlip"]
    assert "RandomResizedCropAndInterpolation" not in names
    assert t.replace(no_aug=True).train(24, ZERO, ONE)(img).shape == (3, 24, 24)  # no_aug: timm's resize + crop
    with pytest.raises(ValueError, match="train_crop_mode"):
        Transforms(train_crop_mode="src", max_patches=16)


def test_deit3_augment_depends_on_the_samples_seed_only(tmp_path):
    """An ImageFolder of varied sizes through 3-Augment + the simple random crop: a sample is a function of
    (seed, epoch, index), whatever the global random streams hold."""
    for c in ("a", "b"):
        (tmp_path / "train" / c).mkdir(parents=True)
        for i, hw in enumerate([(20, 30), (37, 23), (16, 16)]):
            picture(*hw, seed=i).save(tmp_path / "train" / c / f"{i}.jpg", quality=90)
    t = Transforms(aa="3a", color_jitter=0.3, train_crop_mode="src")
    ds = data.build_dataset("imagefolder", "train", 16, data_dir=tmp_path, seed=4, transforms=t)
    first = [ds[i][0] for i in range(len(ds))]
    assert all(x.shape == (3, 16, 16) for x in first)
    torch.manual_seed(123), np.random.seed(123)
    assert all(torch.equal(first[i], ds[i][0]) for i in reversed(range(len(ds))))
    ds.set_epoch(1)
    assert sum(torch.equal(first[i], ds[i][0]) for i in range(len(ds))) < len(ds)
