"""Built-in synthetic tasks (determinism, native rendering, label semantics) and real-data loading."""
import gzip
import math
import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import SQUARE_TASKS
from visionpe import data


@pytest.mark.parametrize("task", SQUARE_TASKS)
def test_synthetic_is_deterministic_by_seed_and_index(task):
    a = data.build_dataset(task, "train", 24, seed=3, num_samples=12)
    data.scenes._render_split.cache_clear()
    data.clutter._render_split.cache_clear()
    b = data.build_dataset(task, "train", 24, seed=3, num_samples=12)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    c = data.build_dataset(task, "train", 24, seed=4, num_samples=12)
    assert not torch.equal(a.images, c.images)
    val = data.build_dataset(task, "val", 24, seed=3, num_samples=12)
    assert not torch.equal(a.images, val.images)  # splits are different scenes
    # scene i does not depend on how many scenes are drawn
    more = data.build_dataset(task, "train", 24, seed=3, num_samples=20)
    assert torch.equal(more.images[:12], a.images)


@pytest.mark.parametrize("task", SQUARE_TASKS)
def test_native_rendering_same_scene_more_pixels(task):
    n = 16
    sets = {s: data.build_dataset(task, "val", s, seed=0, num_samples=n) for s in (24, 32, 64)}
    for s, ds in sets.items():
        x, y = ds[0]
        assert x.shape == (3, s, s) and x.dtype == torch.float32
        assert torch.equal(ds.labels, sets[32].labels)  # same label at every resolution
    # the 64 px rendering, area-averaged to 32 px, is the 32 px rendering (up to supersampling error) ...
    down = F.avg_pool2d(sets[64].images.float(), 2)
    same = (down - sets[32].images.float()).abs().mean().item()
    # ... and far from a different scene at 32 px
    other = (down - sets[32].images.float().roll(1, 0)).abs().mean().item()
    assert same < 3.0 and other > 10 * same, (same, other)


def test_labels_cover_classes_and_are_balanced():
    for task, k in (("shapes-position", 9), ("shapes-relation", 4), ("clutter-nearest", 4), ("clutter-relation", 4),
                    ("clutter-count", 5)):
        ds = data.build_dataset(task, "train", 8, seed=0, num_samples=900)
        counts = torch.bincount(ds.labels, minlength=k)
        assert len(counts) == k and counts.min() > 900 / k * 0.6, counts
        assert ds.num_classes == k == data.info(task)["num_classes"]


def _warm(colour):
    return colour[0] > max(colour[1], colour[2])  # red is the strongest channel: red, orange, yellow


def test_shapes_position_label_is_the_odd_cell():
    for i in range(50):
        sc = data.scene("shapes-position", 1, i)
        assert len(sc["shapes"]) == 9
        odd = [c for c, s in enumerate(sc["shapes"]) if _warm(s[4])]
        assert odd == [sc["label"]]  # the one warm shape
        kind, cx, cy = sc["shapes"][sc["label"]][:3]
        assert int(cy * 3) * 3 + int(cx * 3) == sc["label"]  # row-major cell of the odd shape


def test_shapes_relation_label_is_direction_of_target():
    names = {0: "left", 1: "right", 2: "above", 3: "below"}
    for i in range(50):
        sc = data.scene("shapes-relation", 1, i)
        (ka, ax, ay, _, ca), (kt, tx, ty, _, ct) = sc["shapes"]
        assert ka == "circle" and _warm(ca) and kt in ("square", "triangle") and not _warm(ct)
        dx, dy = tx - ax, ty - ay
        want = ("left" if dx < 0 else "right") if abs(dx) > abs(dy) else ("above" if dy < 0 else "below")
        assert names[sc["label"]] == want
        assert max(abs(dx), abs(dy)) > 1.5 * min(abs(dx), abs(dy))  # never ambiguous


def test_render_draws_shapes_where_the_scene_says():
    sc = {"label": 0, "background": (0, 0, 0), "shapes": [("square", 0.25, 0.75, 0.1, (255, 255, 255))]}
    img = data.render(sc, 40)
    assert img.shape == (40, 40, 3) and img.dtype == np.uint8
    assert img[30, 10].min() == 255 and img[10, 30].max() == 0  # (x=0.25, y=0.75) -> row 30, col 10
    edge = img[:, :, 0][img[:, :, 0] > 0]
    assert ((edge > 0) & (edge < 255)).any()  # antialiased borders


def _write_idx(path, array):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_idx_files_in_data_dir_are_read_and_resized(tmp_path):
    rng = np.random.default_rng(0)
    for stem, n in (("train", 20), ("t10k", 10)):
        _write_idx(tmp_path / f"{stem}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{stem}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    ds = data.build_dataset("mnist", "val", 32, data_dir=str(tmp_path))
    assert len(ds) == 10 and ds.in_chans == 1 and ds.num_classes == 10
    x, y = ds[3]
    assert x.shape == (1, 32, 32) and y == 3
    native = data.torchvision_sets._native("mnist", "test", str(tmp_path), False)[0]
    assert native.shape == (10, 1, 28, 28)
    small = data.build_dataset("mnist", "val", 14, data_dir=str(tmp_path))
    assert torch.equal(small.images, native)  # kept at native resolution; timm's eval transform resizes each image
    from timm.data import create_transform
    from PIL import Image
    squash = create_transform(14, crop_pct=1.0, crop_mode="squash", interpolation="bicubic", mean=(0.1307,),
                              std=(0.3081,))  # the resize protocol: the whole image at the size
    assert torch.equal(small[3][0], squash(Image.fromarray(native[3, 0].numpy(), "L")))


def _write_idx_raw(path, array, cut=0):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    body = header + array.astype(np.uint8).tobytes()
    path.write_bytes(body[:len(body) - cut])


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_idx_file_is_named_with_its_sizes(tmp_path, gz):
    """Issue 22: a truncated idx file used to fail in numpy's reshape without naming the file."""
    rng = np.random.default_rng(0)
    images = tmp_path / ("t10k-images-idx3-ubyte" + (".gz" if gz else ""))
    if gz:
        _write_idx(images, rng.integers(0, 256, (10, 28, 28)))
        images.write_bytes(images.read_bytes()[:-30])  # a cut gzip stream
    else:
        _write_idx_raw(images, rng.integers(0, 256, (10, 28, 28)), cut=100)
    _write_idx_raw(tmp_path / "t10k-labels-idx1-ubyte", np.arange(10) % 10)
    with pytest.raises(data.DataDamaged, match=str(images)) as err:
        data.build_dataset("mnist", "val", 28, data_dir=str(tmp_path))
    if not gz:
        assert f"{16 + 10 * 28 * 28 - 100} bytes, expected {16 + 10 * 28 * 28}" in str(err.value)


def test_idx_labels_out_of_range_or_miscounted_are_named(tmp_path):
    rng = np.random.default_rng(0)
    _write_idx_raw(tmp_path / "t10k-images-idx3-ubyte", rng.integers(0, 256, (10, 28, 28)))
    labels = tmp_path / "t10k-labels-idx1-ubyte"
    _write_idx_raw(labels, np.array([0, 1, 2, 3, 12, 5, 6, 7, 8, 9]))
    with pytest.raises(data.DataDamaged, match=f"{labels} holds labels out of range \\[0, 10\\): 12 at index 4"):
        data.build_dataset("fashion-mnist", "val", 28, data_dir=str(tmp_path))
    _write_idx_raw(labels, np.arange(9) % 10)
    with pytest.raises(data.DataDamaged, match="9 labels for the 10 images"):
        data.build_dataset("fashion-mnist", "val", 28, data_dir=str(tmp_path))
    labels.write_bytes(b"garbage!")
    with pytest.raises(data.DataDamaged, match=f"{labels} is not an idx file"):
        data.build_dataset("fashion-mnist", "val", 28, data_dir=str(tmp_path))


def test_augmentation_is_a_function_of_seed_epoch_index(tmp_path):
    images = torch.randint(0, 256, (4, 1, 16, 16), dtype=torch.uint8)
    ds = data.ImageTensorDataset(images, torch.arange(4), 4, (0.5,), (0.5,), augment=True, flip=True, seed=1)
    a = torch.stack([ds[i][0] for i in range(4)])
    again = torch.stack([ds[i][0] for i in range(4)])
    ds.set_epoch(1)
    b = torch.stack([ds[i][0] for i in range(4)])
    assert torch.equal(a, again) and not torch.equal(a, b)


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(data.DataMissing, match="--download"):
        data.build_dataset("mnist", "train", 32, data_dir=str(tmp_path))
    with pytest.raises(data.DataMissing, match="--data-dir"):
        data.build_dataset("cifar10", "train", 32)
    with pytest.raises(data.DataMissing, match="train/<class>"):
        data.build_dataset("imagefolder", "train", 32, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="unknown data set"):
        data.build_dataset("imagenet", "train", 32)


@pytest.mark.skipif(not os.path.isdir(data.DEBIAN_FASHION_MNIST), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian_package():
    ds = data.build_dataset("fashion-mnist", "val", 32, num_samples=100)
    assert len(ds) == 100 and ds.in_chans == 1 and ds.images.shape == (100, 1, 28, 28) and ds[0][0].shape == (1, 32, 32)
    assert set(ds.labels.tolist()) <= set(range(10)) and len(set(ds.labels.tolist())) > 5
    assert math.isclose(ds.images.float().mean().item() / 255, 0.286, abs_tol=0.05)


def test_imagefolder(tmp_path):
    from PIL import Image
    for split in ("train", "val"):
        for c in ("cat", "dog"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (20, 30), (i * 100, 50, 200)).save(tmp_path / split / c / f"{i}.png")
    ds = data.build_dataset("imagefolder", "val", 16, data_dir=str(tmp_path))
    assert len(ds) == 4 and ds.num_classes == 2
    x, y = ds[3]
    assert x.shape == (3, 16, 16) and y == 1


def image_folder(root, classes, split, images=1):
    from PIL import Image
    for c in classes:
        (root / split / c).mkdir(parents=True, exist_ok=True)
        for i in range(images):
            Image.new("RGB", (12, 12), (40 * i, 50, 200)).save(root / split / c / f"{i}.png")


def test_imagefolder_val_classes_must_be_train_classes(tmp_path):
    """train/{cat,dog} + val/{dog,zebra}: an error listing the classes missing on each side (it used to score val
    'dog' as class 0, train's 'cat'); a val holding a subset of the train classes is mapped by class name."""
    image_folder(tmp_path, ("cat", "dog"), "train")
    image_folder(tmp_path, ("dog", "zebra"), "val")
    with pytest.raises(data.DataDamaged) as err:
        data.build_dataset("imagefolder", "val", 16, data_dir=str(tmp_path))
    assert f"{tmp_path / 'train'} lacks zebra" in str(err.value) and f"{tmp_path / 'val'} lacks cat" in str(err.value)
    image_folder(tmp_path, ("cat", "dog", "zebra"), "val")  # val has a class more than train: refused too
    with pytest.raises(data.DataDamaged, match="lacks zebra"):
        data.build_dataset("imagefolder", "val", 16, data_dir=str(tmp_path))
    shutil.rmtree(tmp_path / "val")
    image_folder(tmp_path, ("dog",), "val", images=2)  # a subset: by name
    train = data.build_dataset("imagefolder", "train", 16, data_dir=str(tmp_path))
    val = data.build_dataset("imagefolder", "val", 16, data_dir=str(tmp_path))
    assert val.num_classes == train.num_classes == 2 and val.classes == train.classes == ["cat", "dog"]
    assert list(val.labels) == [1, 1] and val[0][1] == 1  # val 'dog' gets train's index for 'dog'


@pytest.mark.parametrize("mode", ["I;16", "I"])
def test_imagefolder_16_bit_png_is_scaled_not_saturated(tmp_path, mode):
    """A 0..65535 gradient PNG becomes 0..255 (v / 257), not 255 wherever v > 255 (PIL's convert('RGB'))."""
    from PIL import Image

    from visionpe.data.folders import read_image, to_rgb
    gradient = (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)  # 0 .. 65520
    image_folder(tmp_path, ("a", "b"), "val")  # a classifier needs 2 classes
    path = tmp_path / "val" / "a" / "gradient.png"
    Image.fromarray(gradient).save(path)
    with Image.open(path) as im:
        assert im.mode in ("I;16", "I")  # a 16-bit PNG reads as I;16 (Pillow 13) or I (Pillow 9.4, the floor)
        assert np.asarray(im).max() == gradient.max()  # either way the file holds the 16-bit values
    rgb = np.asarray(read_image(str(path)) if mode == "I;16" else to_rgb(Image.fromarray(gradient.astype(np.int32))))
    expected = np.round(gradient / 257).astype(np.uint8)
    assert rgb.shape == (64, 64, 3) and rgb.dtype == np.uint8
    assert all(np.array_equal(rgb[..., c], expected) for c in range(3))
    assert (rgb == 255).mean() < 0.01  # was 99.6 %
    ds = data.build_dataset("imagefolder", "val", 64, data_dir=str(tmp_path))
    assert np.array_equal(np.asarray(ds.image(ds.folder.imgs.index((str(path), 0)))), rgb)


def test_corrupt_image_is_an_error_naming_the_file_when_read(tmp_path):
    image_folder(tmp_path, ("a", "b"), "val")
    bad = tmp_path / "val" / "b" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # a PNG signature, then garbage
    ds = data.build_dataset("imagefolder", "val", 16, data_dir=str(tmp_path))  # decided at load time
    assert ds[0][1] == 0
    index = [p for p, _ in ds.folder.samples].index(str(bad))
    with pytest.raises(data.DataDamaged, match=f"cannot read the image {bad}"):
        ds[index]
