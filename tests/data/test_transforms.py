"""timm's transforms for real images: parity with timm's own create_transform (eval exactly, train under the same
seed), per-sample seeding (loader workers, DDP ranks, epochs, global RNG states), grayscale sets, and the resolution
protocols' geometry for rendered sets checked against timm's transforms on real images."""
import math
import random

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform
from conftest import requires_that
from torch.utils.data import DataLoader, DistributedSampler

from visionpe import data
from visionpe.data.folders import IMAGENET_MEAN, IMAGENET_STD
from visionpe.data import transforms
from visionpe.data.transforms import Transforms, seeded

SIZES = [(20, 30), (37, 23), (16, 16), (41, 64)]  # (height, width) of the test JPEGs


@pytest.fixture
def folder(tmp_path):
    """An ImageFolder of JPEGs of varied sizes and aspect ratios: 2 classes x 4 images per split."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i, (h, w) in enumerate(SIZES):
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / c / f"{i}.jpg", quality=90)
    return tmp_path


def source(ds, index):
    return Image.open(ds.folder.samples[index][0]).convert("RGB")


@pytest.mark.parametrize("size", [24, (16, 32)])
@pytest.mark.parametrize("protocol", ["resize", "crop", "native"])
def test_eval_transform_equals_timms_create_transform(folder, protocol, size):
    t = Transforms(eval_protocol=protocol, crop_pct=0.8, patch_size=4, interpolation="bicubic")
    ds = data.build_dataset("imagefolder", "val", size, data_dir=folder, transforms=t)
    hw = (size, size) if isinstance(size, int) else size
    common = dict(is_training=False, interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD)
    if protocol == "crop":
        timm_eval = create_transform(size, crop_pct=0.8, **common)
    elif protocol == "resize":
        timm_eval = create_transform(size, crop_pct=1.0, crop_mode="squash", **common)
    else:
        timm_eval = create_transform(size, naflex=True, patch_size=4, max_seq_len=hw[0] * hw[1] // 16, **common)
    for i in range(len(ds)):
        x, _ = ds[i]
        assert torch.equal(x, timm_eval(source(ds, i)))
        if protocol == "native":  # each image at its own aspect ratio, within the budget of the size
            h, w = SIZES[i % 4]
            assert x.shape[1] % 4 == 0 and x.shape[2] % 4 == 0
            assert x.shape[1] * x.shape[2] // 16 <= hw[0] * hw[1] // 16
            assert abs(math.log(x.shape[2] / x.shape[1]) - math.log(w / h)) < 0.45
        else:
            assert x.shape[1:] == hw


def test_native_budget_scales_from_the_training_budget():
    t = Transforms(patch_size=4, max_patches=48, train_size=32)  # 48 of a 32 px square's 64 patches
    assert t.budget(32) == 48 and t.budget(64) == 192 and t.budget((32, 64)) == 96
    assert Transforms(patch_size=4).budget(24) == 36 and Transforms(patch_size=4).budget((16, 24)) == 24


def test_train_transform_is_timms_under_the_samples_seed(folder):
    kw = dict(aa="rand-m9-mstd0.5-inc1", reprob=0.5, color_jitter=0.3, scale=(0.3, 1.0), hflip=0.5)
    ds = data.build_dataset("imagefolder", "train", 24, data_dir=folder, seed=3, transforms=Transforms(**kw))
    timm_train = create_transform(24, is_training=True, auto_augment=kw["aa"], re_prob=0.5, re_mode="pixel",
                                  color_jitter=0.3, scale=(0.3, 1.0), hflip=0.5, interpolation="bicubic",
                                  mean=IMAGENET_MEAN, std=IMAGENET_STD)
    ds.set_epoch(2)
    for i in range(len(ds)):
        with seeded((3, 2, i)):
            want = timm_train(source(ds, i))
        assert torch.equal(ds[i][0], want)


def test_augmentation_depends_on_seed_epoch_index_only(folder):
    t = Transforms(aa="rand-m9-mstd0.5-inc1", reprob=0.5)
    ds = data.build_dataset("imagefolder", "train", 24, data_dir=folder, seed=1, transforms=t)
    first = [ds[i][0] for i in range(len(ds))]
    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # whatever the global streams hold
    backwards = {i: ds[i][0] for i in reversed(range(len(ds)))}
    assert all(torch.equal(first[i], backwards[i]) for i in range(len(ds)))
    ds.set_epoch(1)
    assert not any(torch.equal(first[i], ds[i][0]) for i in range(len(ds)))
    other = data.build_dataset("imagefolder", "train", 24, data_dir=folder, seed=2, transforms=t)
    assert not any(torch.equal(first[i], other[i][0]) for i in range(len(ds)))


def test_seeded_restores_the_global_streams():
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    expected = random.random(), np.random.rand(), torch.rand(1)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    with seeded((0, 1, 2)):
        inside = random.random(), np.random.rand(), torch.rand(1)
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(1), expected[2])
    with seeded((0, 1, 2)):
        assert (random.random(), np.random.rand()) == inside[:2] and torch.equal(torch.rand(1), inside[2])


def epoch_batches(ds, workers, sampler=None):
    loader = DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=data_collate(), sampler=sampler or
                        torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0)))
    return [(x.clone(), y.clone()) for x, y in loader]


def data_collate():
    from visionpe.data import collate_images
    return collate_images


def test_workers_do_not_change_the_samples(folder):
    ds = data.build_dataset("imagefolder", "train", 16, data_dir=folder, transforms=Transforms(reprob=0.5,
                                                                                               aa="3a"))
    ds.set_epoch(4)
    alone, pooled = epoch_batches(ds, 0), epoch_batches(ds, 2)
    assert len(alone) == len(pooled) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                             for a, b in zip(alone, pooled))


def test_each_rank_gets_the_samples_of_its_indices(folder):
    """DDP: ranks read disjoint indices; each sample's stream is its index's, whatever rank reads it."""
    ds = data.build_dataset("imagefolder", "train", 16, data_dir=folder, transforms=Transforms(reprob=0.5))
    single = {i: ds[i][0] for i in range(len(ds))}
    seen = set()
    for rank in (0, 1):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
        indices = list(sampler)
        seen |= set(indices)
        for i in indices:
            assert torch.equal(ds[i][0], single[i])
    assert seen == set(range(len(ds)))


def _write_idx(path, array):
    import gzip
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


@pytest.fixture
def digits(tmp_path):
    rng = np.random.default_rng(1)
    for stem, n in (("train", 12), ("t10k", 6)):
        _write_idx(tmp_path / f"{stem}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{stem}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return tmp_path


@pytest.mark.parametrize("aa", [None, "rand-m9-mstd0.5-inc1", "3a", "augmix-m5-w4-d2", "original"])
def test_grayscale_sets_stay_one_channel_through_timms_transforms(digits, aa):
    t = Transforms(aa=aa, reprob=0.5, remode="pixel", grayscale_prob=0.5, gaussian_blur_prob=0.5)
    ds = data.build_dataset("mnist", "train", 32, data_dir=digits, transforms=t)
    for i in range(len(ds)):
        x, _ = ds[i]
        assert x.shape == (1, 32, 32) and torch.isfinite(x).all()


def test_grayscale_eval_normalises_with_the_sets_one_channel_mean(digits):
    ds = data.build_dataset("mnist", "val", 28, data_dir=digits, transforms=Transforms(eval_protocol="crop",
                                                                                       crop_pct=1.0))
    pixels = ds.images[2, 0].float() / 255  # crop_pct 1 at the native size: no resampling
    assert torch.allclose(ds[2][0][0], (pixels - 0.1307) / 0.3081, atol=1e-6)


def test_mnist_digits_are_not_flipped_by_default(digits):
    """hflip=None takes the set's default: 0 for digits (a flip changes them), 0.5 for the others."""
    t = Transforms(scale=(1.0, 1.0), ratio=(1.0, 1.0), color_jitter=0.0)  # the crop is the whole image
    ds = data.build_dataset("mnist", "train", 28, data_dir=digits, transforms=t)
    for i in range(len(ds)):
        pixels = ds.images[i, 0].float() / 255
        assert torch.allclose(ds[i][0][0], (pixels - 0.1307) / 0.3081, atol=1e-6)
    flipped = data.build_dataset("mnist", "train", 28, data_dir=digits, transforms=t.replace(hflip=1.0))
    assert torch.allclose(flipped[0][0][0], ((ds.images[0, 0].float() / 255 - 0.1307) / 0.3081).flip(-1),
                          atol=1e-6)


def test_a_channel_mismatch_is_an_error_not_a_broadcast():
    """A 1-channel mean/std would broadcast silently over an RGB image in torchvision's Normalize: refused."""
    class RGBSource(data.TransformedDataset):
        labels = (0, 1)

        def image(self, index):
            return Image.new("RGB", (8, 8), (10, 200, 30))

    ds = RGBSource("gray", 2, (0.5,), (0.5,), create_transform(8, mean=(0.5,), std=(0.5,)))
    with pytest.raises(ValueError, match="3 channels.*1"):
        ds[0]


@pytest.mark.parametrize("kwargs, words", [
    (dict(scale=(0.5,)), "scale"), (dict(scale=(0.0, 1.0)), "scale"), (dict(ratio=(2.0, 1.0)), "ratio"),
    (dict(hflip=1.5), "hflip"), (dict(color_jitter=-1), "color_jitter"), (dict(aa="bogus"), "aa 'bogus'"),
    (dict(reprob=2), "reprob"), (dict(remode="foo"), "remode"), (dict(recount=0), "recount"),
    (dict(train_crop_mode="foo"), "train_crop_mode"), (dict(interpolation="cubic"), "interpolation"),
    (dict(grayscale_prob=-0.1), "grayscale_prob"), (dict(gaussian_blur_prob=3), "gaussian_blur_prob"),
    (dict(eval_protocol="squash"), "eval_protocol"), (dict(crop_pct=0.0), "crop_pct"), (dict(crop_pct=1.2), "crop_pct"),
    (dict(max_patches=0), "max_patches"), (dict(patch_size=0), "patch_size"),
    (dict(max_patches=64, train_crop_mode="rkrc"), "train_crop_mode"),
    (dict(color_jitter=1e30), r"color_jitter must be in \[0, 1\]"), (dict(color_jitter=1.5), "saturate"),
    (dict(recount=1_000_000), r"recount must be an integer in \[1, 100\]"),
])
def test_bad_transform_settings_name_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        Transforms(**kwargs)


# -- the protocols' geometry on rendered sets, against timm's transforms on real images -------------------------
@pytest.mark.parametrize("native_hw", [(256, 256), (181, 362), (362, 181), (300, 200), (217, 301)])
@pytest.mark.parametrize("size", [24, 32, (24, 40)])
def test_render_geometry_is_timms(native_hw, size):
    image = Image.new("RGB", native_hw[::-1])
    for protocol in ("crop", "native", "resize"):
        t = Transforms(eval_protocol=protocol, crop_pct=0.875, patch_size=4)
        timm_eval = t.eval(size, IMAGENET_MEAN, IMAGENET_STD)
        render, crop = t.render_size(native_hw, size)
        if protocol == "crop":  # timm resizes (step 0), then centre-crops
            resized = timm_eval.transforms[0](image)
            assert render == (resized.height, resized.width)
            assert crop == ((size, size) if isinstance(size, int) else size)
        else:
            assert crop is None and tuple(timm_eval(image).shape[1:]) == render


@pytest.mark.parametrize("size", [24, 32])
def test_synthetic_crop_renders_larger_and_centre_crops(size):
    t = Transforms(eval_protocol="crop", crop_pct=0.75)
    ds = data.build_dataset("shapes-position", "val", size, num_samples=4, transforms=t)
    big = math.floor(size / 0.75)
    rendered = np.stack([data.render(data.scene("shapes-position", 0, i, "val"), big) for i in range(4)])
    top = int(round((big - size) / 2.0))
    want = torch.from_numpy(rendered[:, top:top + size, top:top + size]).permute(0, 3, 1, 2)
    assert torch.equal(ds.images, want)


def test_synthetic_native_is_the_square_budget_and_training_uses_max_patches():
    t = Transforms(eval_protocol="native", patch_size=4, max_patches=36, train_size=32)
    assert data.build_dataset("shapes-position", "val", 32, num_samples=2, transforms=t).images.shape[-2:] == (24, 24)
    train = data.build_dataset("shapes-position", "train", 32, num_samples=2, transforms=t)
    assert train.images.shape[-2:] == (24, 24)  # 36 patches of 4 px, square scenes


def test_aspect_scenes_keep_their_geometry_natively_and_squash_under_resize():
    sc = data.aspect.aspect_scene(0, 0, "val")
    kw = dict(num_samples=40)
    native = data.build_dataset("shapes-relation-aspect", "val", 32, transforms=Transforms(eval_protocol="native",
                                                                                          patch_size=4), **kw)
    square = data.build_dataset("shapes-relation-aspect", "val", 32, **kw)
    aspects = [data.aspect.aspect_scene(0, i, "val")["aspect"] for i in range(40)]
    assert min(aspects) < 0.7 and max(aspects) > 1.4  # the canvases do vary
    for i in range(40):
        h, w = native[i][0].shape[1:]
        assert h * w <= 64 * 16 and abs(math.log(w / h) - math.log(aspects[i])) < 0.4
        assert square[i][0].shape[1:] == (32, 32)
    assert sc["native_hw"][1] / sc["native_hw"][0] == pytest.approx(sc["aspect"], rel=0.02)


def test_aspect_labels_are_the_direction_in_true_geometry():
    counts = np.zeros(4, int)
    for i in range(400):
        sc = data.aspect.aspect_scene(1, i, "train")
        (_, ax, ay, _, _), (_, tx, ty, _, _) = sc["shapes"]
        width, height = (sc["aspect"], 1.0) if sc["aspect"] >= 1 else (1.0, 1 / sc["aspect"])
        dx, dy = (tx - ax) * width, (ty - ay) * height  # back to true units
        want = (0 if dx < 0 else 1) if abs(dx) > abs(dy) else (2 if dy < 0 else 3)
        assert sc["label"] == want and max(abs(dx), abs(dy)) > 1.5 * min(abs(dx), abs(dy))
        counts[sc["label"]] += 1
    assert counts.min() > 60  # every direction is common
    assert data.aspect.aspect_scene(1, 7, "train") == data.aspect.aspect_scene(1, 7, "train")


def test_native_render_draws_the_anchor_round():
    sc = next(s for s in (data.aspect.aspect_scene(0, i, "val") for i in range(50)) if s["aspect"] > 1.6)
    t = Transforms(eval_protocol="native", patch_size=4)
    for protocol, round_ in (("native", True), ("resize", False)):
        render_hw, _ = t.replace(eval_protocol=protocol).render_size(sc["native_hw"], 96)
        pixels = data.render(sc, render_hw).astype(int)
        red = (pixels[..., 0] > 150) & (pixels[..., 2] < 100)  # the warm anchor
        rows, cols = np.nonzero(red)
        ratio = (cols.max() - cols.min() + 1) / (rows.max() - rows.min() + 1)
        assert (abs(ratio - 1) < 0.15) == round_, (protocol, ratio)


def test_builders_that_take_transforms():
    assert all(data.takes_transforms(n) for n in ("imagefolder", "fashion-mnist", "cifar10", "shapes-position",
                                                  "shapes-relation-aspect"))
    assert not data.takes_transforms("moving-shapes")
    with pytest.raises(TypeError, match="Transforms"):
        data.build_dataset("shapes-position", "val", 16, num_samples=2, transforms={"eval_protocol": "crop"})


@pytest.mark.parametrize("aa", ["rand-m9-mstd0.5-inc1", "v0"])
def test_auto_augment_policies_that_reach_zero_posterize_bits_do_not_crash(aa):
    """timm 1.0.31 asks Pillow to posterize to 0 bits (RandAugment with a magnitude std, AutoAugment v0), which
    Pillow 13 refuses; visionpe's own pipelines posterize 0 bits to a black image, as older Pillow did."""
    from timm.data import auto_augment
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    assert np.asarray(transforms._posterize(image, 0)).max() == 0
    assert np.array_equal(np.asarray(transforms._posterize(image, 4)), np.asarray(auto_augment.posterize(image, 4)))
    t = Transforms(aa=aa, scale=(1.0, 1.0), ratio=(1.0, 1.0)).train(16, IMAGENET_MEAN, IMAGENET_STD)
    ops = [op for stage in t.transforms for op in transforms.augment_ops(stage)]
    assert any(op.name.startswith("Posterize") for op in ops)
    assert all(op.aug_fn is transforms._posterize for op in ops if op.name.startswith("Posterize"))
    for s in range(300):
        with seeded((s,)):
            assert t(image).shape == (3, 16, 16)


TIMM_STATE = """
import sys
from timm.data import auto_augment as aa
def state():
    return (dict(aa.NAME_TO_OP), {c.__name__: dict(vars(c)) for c in (aa.AugMixAugment, aa.RandAugment, aa.AutoAugment,
                                                                      aa.AugmentOp)})
before = state()
from visionpe.data import Transforms
mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
for policy in [None, "rand-m9-mstd0.5-inc1", "3a", "original", "v0", "augmix-m5-w4-d2", "rand-m9-tweights"]:
    for kw in ({}, {"train_crop_mode": "src"}, {"max_patches": 16, "patch_size": 4}):
        t = Transforms(aa=policy, **kw)
        t.train(16, mean, std), t.eval(16, mean, std)
after = state()
assert after == before, [k for k in before[0] if before[0][k] is not after[0].get(k)] or "a class changed"
sys.stdout.write("unchanged")
"""


def test_importing_visionpe_data_and_building_every_transform_leaves_timm_unchanged():
    """visionpe's fixes to timm's augmenters (posterize at 0 bits, AugMix at timm 1.0.19) live on visionpe's own
    pipeline objects: a fresh interpreter sees timm's op table and augmenter classes as they were before importing
    visionpe.data and after building every kind of transform."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", TIMM_STATE], capture_output=True, text=True, timeout=240, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0 and out.stdout == "unchanged", out.stderr[-2000:]


def test_timms_own_pipelines_keep_timms_ops():
    from timm.data import auto_augment
    Transforms(aa="rand-m9-mstd0.5-inc1").train(16, IMAGENET_MEAN, IMAGENET_STD)
    theirs = create_transform(16, is_training=True, auto_augment="rand-m9-mstd0.5-inc1")
    ops = [op for stage in theirs.transforms for op in transforms.augment_ops(stage)]
    assert [op.aug_fn for op in ops if op.name.startswith("Posterize")] == [auto_augment.posterize]


@requires_that(transforms._augmix_class() is __import__("timm").data.auto_augment.AugMixAugment,
               "timm >= 1.0.20, whose AugMixAugment._apply_basic is the oracle of visionpe's 1.0.19 replacement")
@pytest.mark.parametrize("mode, hw", [("L", (12, 20)), ("RGB", (16, 24)), ("RGB", (16, 16))])
def test_augmix_replacement_equals_newer_timms_method(mode, hw):
    """At timm 1.0.19 visionpe's AugMix stages mix with _augmix_basic; it must equal newer timm's own method."""
    from timm.data.auto_augment import augment_and_mix_transform
    fill = (124,) if mode == "L" else (124, 116, 104)  # as timm's create_transform passes the set's mean
    stage = augment_and_mix_transform("augmix-m5-w3-d2", {"translate_const": 8, "img_mean": fill})
    shape = hw if mode == "L" else (*hw, 3)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8), mode)
    weights = np.float32(np.random.default_rng(2).dirichlet([1.0] * 3))
    with seeded((7,)):
        theirs = stage._apply_basic(image, weights, 0.4)
    with seeded((7,)):
        ours = transforms._augmix_basic(stage, image, weights, 0.4)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))


def test_visionpes_augmix_stage_replaces_timms_in_its_own_pipeline_only(monkeypatch):
    """Where visionpe replaces timm's AugMix (timm 1.0.19), the stage of its pipeline is a new object of the replacement
    class with the same ops and settings, and it mixes a grayscale image that is not square."""
    from timm.data.auto_augment import AugMixAugment
    method = AugMixAugment._apply_basic
    replacement = type("AugMixAugment", (AugMixAugment,), {"_apply_basic": transforms._augmix_basic})
    monkeypatch.setattr(transforms, "_augmix_class", lambda: replacement)
    pipeline = Transforms(aa="augmix-m5-w4-d2").train((12, 20), (0.5,), (0.5,))
    stages = [stage for stage in pipeline.transforms if isinstance(stage, AugMixAugment)]
    assert [type(stage) for stage in stages] == [replacement]
    assert (stages[0].width, stages[0].depth, len(stages[0].ops)) == (4, 2, len(
        create_transform(8, is_training=True, auto_augment="augmix-m5-w4-d2", separate=True)[1].transforms[0].ops))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 50), dtype=np.uint8), "L")
    with seeded((1,)):
        assert pipeline(image).shape == (1, 12, 20)
    assert AugMixAugment._apply_basic is method


@pytest.mark.parametrize("aa, words", [
    ("rand-zz", ["aa 'rand-zz'", "'zz'", "timm would skip it"]),
    ("rand-m1000", ["m1000", "0..10", "clamp"]),
    ("augmix-m20", ["m20", "0..10"]),
    ("rand-m9-n2-m5", ["m is given twice"]),
    ("rand-tfoo", ["transform set 'foo'", "weights, 3aw or 3a"]),
    ("rand-p1.5", ["p1.5", "[0, 1]"]),
    ("rand-n20", ["n20", "15 ops"]),
    ("original-zz", ["'zz'"]),
    ("rand-q9", ["not a timm auto-augment policy"]),
])
def test_auto_augment_policies_are_read_strictly(aa, words):
    with pytest.raises(ValueError) as info:
        Transforms(aa=aa)
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("aa", ["rand-m9-mstd0.5-inc1", "rand-m9-n2-mstd0.5", "rand-mmax20-m15", "rand-m0",
                                "rand-m9-tweights", "3a", "original-mstd0.5", "v0", "augmix-m5-w4-d2", "augmix-m10"])
def test_auto_augment_policies_timm_reads_are_accepted(aa):
    Transforms(aa=aa)


def test_transform_settings_are_the_transforms_fields(tmp_path):
    """The training settings of timm's transforms are made from Transforms' fields (defaults, kinds, choices, help,
    YAML keys): each field is a setting or given by the run, each such setting reads back into its field, and no
    augmentation or evaluation setting beside them claims to be one of timm's transforms."""
    import yaml
    from dataclasses import fields

    from visionpe.train import settings
    own = {f.name: f for f in transforms.setting_fields()}
    assert set(own) | {"patch_size", "max_patches", "train_size"} == {f.name for f in fields(Transforms)}
    assert set(own) <= set(settings.SETTINGS) and {"patch_size", "max_patches"} <= set(settings.SETTINGS)
    for name, f in own.items():
        s = settings.SETTINGS[name]
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        assert (s.default, s.help, s.choices, s.metavar) == (default, f.metadata["help"], f.metadata["choices"],
                                                             f.metadata["metavar"]), name
        assert s.group == settings.TRANSFORM_GROUPS[f.metadata["stage"]]
    assert settings.TRANSFORM_KEYS == tuple(n for n, f in own.items() if f.metadata["stage"] != "eval")
    timm_flag = "timm --"  # the help of a setting under one of timm train.py's transform flags names it
    claimed = {k for k, s in settings.SETTINGS.items() if timm_flag in s.help and s.group in (settings.AUG,
                                                                                             settings.EVAL)}
    assert claimed <= set(own), claimed - set(own)
    assert Transforms.from_settings(settings.DEFAULTS) == Transforms(patch_size=settings.DEFAULTS["patch_size"],
                                                                     train_size=settings.DEFAULTS["img_size"])
    given = {"scale": [0.5, 0.9], "ratio": [0.5, 2.0], "hflip": 0.25, "color_jitter": 0.2, "aa": "3a", "reprob": 0.5,
             "remode": "const", "recount": 3, "train_crop_mode": "rkrr", "interpolation": "bilinear",
             "grayscale_prob": 0.1, "gaussian_blur_prob": 0.2, "no_aug": True, "eval_protocol": "crop",
             "crop_pct": 0.8}
    assert set(given) == set(own)  # a new field needs a value here
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(given))
    read = settings.transforms_of(settings.resolve({"config": str(recipe)}))
    assert {name: getattr(read, name) for name in given} == {k: tuple(v) if isinstance(v, list) else v
                                                             for k, v in given.items()}
