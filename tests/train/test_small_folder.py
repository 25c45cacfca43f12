"""The small-folder recipe (visionpe/configs/small_folder.yaml) trains on a tiny folder written by
``visionpe make-image-folders``; the generator is deterministic, writes the sizes and classes it says and holds the
photos' val crops out of the training part; the benchmark's rows are timm's defaults, plain resize + flip and the
recipe, checked against timm's own transforms."""
from __future__ import annotations

import gzip
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import yaml
from PIL import Image
from timm.data import create_transform
from trainutil import run_script, train_main

from visionpe.bench import image_folders
from visionpe.bench.accuracy import small_folder
from visionpe.data.folders import IMAGENET_MEAN, IMAGENET_STD
from visionpe.data.transforms import Transforms, seeded
from visionpe.cli.recipes import recipe_path
from visionpe.train import settings

RECIPE = recipe_path("small_folder")
TINY_SIDES = ("--sides", "20", "40")
FASHION = Path("/usr/share/datasets/fashion-mnist")
gen = vars(image_folders)  # the generator's functions and constants, by name
bench = vars(small_folder)


def files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.jpg"))}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    root = tmp_path_factory.mktemp("objects") / "f"
    run_script("make_image_folders", ["objects", "--out", root, "--train-per-class", "2", "--val-per-class", "1",
                                      *TINY_SIDES])
    return root


@pytest.fixture(scope="module")
def photo_src(tmp_path_factory):
    """Three 'photographs' (smooth random colour fields) of different sizes and orientations."""
    src = tmp_path_factory.mktemp("photo_src")
    rng = np.random.default_rng(0)
    for name, (h, w) in {"alpha": (120, 200), "beta": (210, 130), "gamma": (150, 150)}.items():
        small = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        Image.fromarray(small).resize((w, h), Image.BICUBIC).save(src / f"{name}.png")
    return src


def test_objects_folder_holds_every_class_at_the_sizes_given(objects):
    for split, count in (("train", 2), ("val", 1)):
        assert sorted(p.name for p in (objects / split).iterdir()) == sorted(gen["OBJECTS"])
        for folder in (objects / split).iterdir():
            assert len(list(folder.glob("*.jpg"))) == count
    for path in objects.rglob("*.jpg"):
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert 20 <= max(im.size) <= 40 and 0.5 - 0.05 <= im.size[0] / im.size[1] <= 2 + 0.1


def test_the_same_seed_writes_the_same_files_and_another_seed_others(objects, tmp_path):
    again, other = tmp_path / "again", tmp_path / "other"
    args = ["--train-per-class", "2", "--val-per-class", "1", *TINY_SIDES]
    run_script("make_image_folders", ["objects", "--out", again, *args])
    run_script("make_image_folders", ["objects", "--out", other, "--seed", "1", *args])
    assert files(again) == files(objects)
    assert files(other).keys() == files(objects).keys()
    assert all(files(other)[k] != v for k, v in files(objects).items())


def test_object_masks_cover_what_their_shape_covers():
    """Coverage against closed forms: a disc's area is pi r^2, a square's (circumradius r) 2 r^2, a ring's
    pi (r^2 - r_inner^2) with r_inner drawn in [0.45, 0.65] r."""
    size, r = 200, 60.0
    area = lambda kind: gen["object_mask"](kind, size, size, 100, 100, r, 0.3, np.random.default_rng(0)).sum()
    assert area("circle") == pytest.approx(math.pi * r * r, rel=0.01)
    assert area("square") == pytest.approx(2 * r * r, rel=0.01)
    assert math.pi * r * r * (1 - 0.65 ** 2) * 0.98 < area("ring") < math.pi * r * r * (1 - 0.45 ** 2) * 1.02
    assert len({round(area(k)) for k in gen["OBJECTS"]}) == len(gen["OBJECTS"])


@pytest.mark.parametrize("size", [(200, 120), (130, 210)])
@pytest.mark.parametrize("at_start", [False, True])
def test_photo_parts_split_the_longer_side_with_a_gap(size, at_start):
    parts = gen["photo_parts"](size, at_start)
    long_axis = 0 if size[0] >= size[1] else 1
    train, val = parts["train"], parts["val"]
    spans = {k: (b[long_axis], b[long_axis + 2]) for k, b in parts.items()}
    first, second = (spans["val"], spans["train"]) if at_start else (spans["train"], spans["val"])
    assert second[0] - first[1] == round(max(size) * gen["GAP"])  # disjoint, the gap between them
    assert spans["val"][1] - spans["val"][0] == round(max(size) * gen["HELD_OUT"])
    assert (first[0], second[1]) == (0, max(size))
    assert train[1 - long_axis] == val[1 - long_axis] == 0 and train[3 - long_axis] == size[1 - long_axis]


@pytest.mark.parametrize("at_start", [False, True])
def test_photo_crops_never_read_the_other_part(at_start):
    """A photo of two flat colours, the held-out part 250 and the rest 50: every training crop is 50 throughout
    and every val crop 250 (a crop is cut out before it is resized: the filter reads nothing beyond it)."""
    width, height = 300, 180
    parts = gen["photo_parts"]((width, height), at_start)
    pixels = np.full((height, width, 3), 50, np.uint8)
    left, top, right, bottom = parts["val"]
    pixels[top:bottom, left:right] = 250
    photo = Image.fromarray(pixels)
    for split, value in (("train", 50), ("val", 250)):
        for i in range(25):
            crop = gen["photo_crop"](np.random.default_rng([0, i]), photo, parts[split], sides=(40, 60))
            assert 40 <= max(crop.size) <= 60
            assert np.abs(np.asarray(crop).astype(int) - value).max() <= 1, (split, i)


def test_photos_folder_has_a_class_per_photograph(photo_src, tmp_path):
    out = tmp_path / "photos"
    written = run_script("make_image_folders", ["photos", "--src", photo_src, "--out", out, "--train-per-class", "3",
                                                "--val-per-class", "2", *TINY_SIDES])
    assert written == {"train": 9, "val": 6}
    assert sorted(p.name for p in (out / "val").iterdir()) == ["alpha", "beta", "gamma"]


def idx_images(path):
    """The uint8 arrays of an idx file (LeCun's format, gzipped): the test's own reader, the oracle of the loader's."""
    data = gzip.decompress(path.read_bytes())
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


@pytest.mark.skipif(not FASHION.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_folder_holds_the_split_images_as_they_are(tmp_path):
    """train/ holds images of Fashion-MNIST's training split and val/ of its test split, each in its class's folder,
    pixel for pixel, none twice; the same seed picks the same images and another seed others."""
    written = run_script("make_image_folders", ["fashion-mnist", "--out", tmp_path / "a", "--train-per-class", "2",
                                                "--val-per-class", "1"])
    assert written == {"train": 20, "val": 10}
    for split, stem in (("train", "train"), ("val", "t10k")):
        images = idx_images(FASHION / f"{stem}-images-idx3-ubyte.gz")
        labels = idx_images(FASHION / f"{stem}-labels-idx1-ubyte.gz")
        by_bytes = {image.tobytes(): label for image, label in zip(images, labels)}
        assert sorted(p.name for p in (tmp_path / "a" / split).iterdir()) == sorted(gen["FASHION_CLASSES"])
        seen = set()
        for path in sorted((tmp_path / "a" / split).rglob("*.png")):
            with Image.open(path) as im:
                assert (im.mode, im.size) == ("L", (28, 28))
                pixels = np.asarray(im).tobytes()
            assert gen["FASHION_CLASSES"][by_bytes[pixels]] == path.parent.name and pixels not in seen
            seen.add(pixels)
        assert len(seen) == written[split]
    run_script("make_image_folders", ["fashion-mnist", "--out", tmp_path / "b", "--train-per-class", "2",
                                      "--val-per-class", "1"])
    run_script("make_image_folders", ["fashion-mnist", "--out", tmp_path / "c", "--seed", "1", "--train-per-class",
                                      "2", "--val-per-class", "1"])
    pngs = lambda root: {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.png"))}  # noqa: E731
    assert pngs(tmp_path / "b") == pngs(tmp_path / "a") != pngs(tmp_path / "c")


@pytest.mark.parametrize("argv, message", [
    (["photos", "--out", "{tmp}/x"], "photos needs --src"),
    (["objects", "--out", "{tmp}/x", "--seed", "-1"], "--seed must be"),
    (["objects", "--out", "{tmp}/x", "--sides", "50", "20"], "--sides must be"),
    (["objects", "--out", "{tmp}/x", "--train-per-class", "0"], "--train-per-class must be"),
    (["photos", "--src", "{tmp}/none", "--out", "{tmp}/x"], "is not a folder"),
    (["objects", "--out", "{tmp}"], "is not empty"),
    pytest.param(["fashion-mnist", "--out", "{tmp}/x", "--train-per-class", "6001"], "holds 6000 images of a class",
                 marks=pytest.mark.skipif(not FASHION.is_dir(), reason="no Debian dataset-fashion-mnist")),
])
def test_generator_mistakes_are_one_line(argv, message, tmp_path, capsys):
    (tmp_path / "occupied").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        run_script("make_image_folders", [a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and message in err


def test_recipe_trains_one_step_on_a_generated_folder(objects, tmp_path):
    recipe = yaml.safe_load(RECIPE.read_text())
    out = tmp_path / "run"
    summary = train_main(["--config", "small_folder", "--data-dir", objects, "--output", out, "--epochs", "1",
                          "--batch-size", "16", "--warmup-epochs", "0", "--threads", "1", "--no-progress"])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [1]
    assert summary["final_train_loss"] > 0 and math.isfinite(summary["final_train_loss"])
    assert summary["results"]["last"][str(recipe["img_size"])]["acc"] >= 0
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    kept = {k: v for k, v in recipe.items() if k not in ("epochs", "batch_size", "warmup_epochs", "model_kwargs")}
    assert {k: cfg[k] for k in kept} == kept  # every other setting of the recipe, as written
    assert recipe["model_kwargs"].items() <= cfg["model_kwargs"].items()  # the saved keywords add the image sizes
    # the recipe names its model in full, so it trains timm's architecture at the recipe's sizes whatever the defaults
    timm_model = timm.create_model(recipe["model"], pretrained=False, num_classes=len(gen["OBJECTS"]),
                                   img_size=recipe["img_size"], patch_size=recipe["patch_size"], **recipe["model_kwargs"])
    assert summary["params"] == sum(p.numel() for p in timm_model.parameters())


def test_recipe_is_the_shape_docs_small_folder_measured():
    """The recipe trains the grid and schedule the guide's tables measured (an 8x8 grid or finer: the 4x4 grid of
    8 px patches lost top-1 on every folder and kept 0.4 of it at 2x on Fashion-MNIST), reports the 2x size, and the
    guide's setting table states its values."""
    recipe = yaml.safe_load(RECIPE.read_text())
    assert recipe["img_size"] % recipe["patch_size"] == 0 and recipe["img_size"] // recipe["patch_size"] >= 8
    assert 2 * recipe["img_size"] in recipe["eval_res"]
    guide = (Path(__file__).parents[2] / "docs" / "small_folder.md").read_text()
    stated = {}  # the table's rows "| `key`, `key` | value, value | ...": a value per key, the last takes the rest
    for keys, values in re.findall(r"^\| ((?:`\w+`(?:, )?)+) \| ([^|]+) \|", guide, re.M):
        keys = re.findall(r"`(\w+)`", keys)
        stated.update((k, v.strip(" `")) for k, v in zip(keys, values.split(",", len(keys) - 1)))
    for key in ("img_size", "patch_size", "epochs", "batch_size", "lr", "warmup_epochs"):
        assert float(stated[key]) == float(recipe[key]), (key, stated[key], recipe[key])
    width, depth, heads = (int(n) for n in re.findall(r"\d+", stated["model_kwargs"]))
    assert (stated["model"], recipe["model_kwargs"]) == (recipe["model"], {"embed_dim": width, "depth": depth,
                                                                           "num_heads": heads})


def test_benchmark_rows_are_timm_defaults_resize_flip_and_the_recipe(objects):
    recipe = yaml.safe_load(RECIPE.read_text())
    rows = {row: settings.resolve(bench["row_settings"](recipe, row)) for row in bench["ROWS"]}
    for key in set(settings.DEFAULTS) - set(bench["AUGMENTATION"]):  # only the augmentation differs
        assert rows["timm"][key] == rows["resize+flip"][key] == rows["small_folder"][key], key
    size = recipe["img_size"]
    timm_row = Transforms.from_settings(rows["timm"])
    ours = timm_row.train(size, IMAGENET_MEAN, IMAGENET_STD)
    theirs = create_transform(size, is_training=True, interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD)
    assert repr(ours) == repr(theirs)  # timm's training transform at timm's defaults (bicubic, as timm's ViTs)
    image = Image.open(sorted(objects.rglob("*.jpg"))[0]).convert("RGB")
    with seeded((3, 1, 4)):
        mine = ours(image)
    with seeded((3, 1, 4)):
        torch.testing.assert_close(mine, theirs(image), rtol=0, atol=0)
    assert (timm_row.hflip, timm_row.aa, rows["timm"]["mixup"], rows["timm"]["cutmix"]) == (None, None, 0, 0)
    # resize + flip: without the flip, the training transform is the squashing eval transform of timm's crop, pixel
    # for pixel. The crop at scale 1 is the whole image (its fallback), or one pixel row or column less where a drawn
    # aspect ratio fits after rounding (w = round(sqrt(A r)), h = round(sqrt(A / r)) for an image of aspect <= 3)
    plain = Transforms.from_settings(rows["resize+flip"])
    flips = [t for t in plain.train(size, IMAGENET_MEAN, IMAGENET_STD).transforms
             if type(t).__name__ == "RandomHorizontalFlip"]
    assert [t.p for t in flips] == [0.5]  # an image folder's default flip
    train = plain.replace(hflip=0.0).train(size, IMAGENET_MEAN, IMAGENET_STD)
    crop = train.transforms[0]
    squash = create_transform(size, is_training=False, crop_pct=1.0, crop_mode="squash", interpolation="bicubic",
                              mean=IMAGENET_MEAN, std=IMAGENET_STD)
    lost = set()
    for path in sorted(objects.rglob("*.jpg"))[:6]:
        image = Image.open(path).convert("RGB")
        for seed in range(40):
            with seeded((seed,)):
                top, left, height, width = crop.get_params(image, crop.scale, crop.ratio)
            with seeded((seed,)):
                mine = train(image)
            lost.add(image.height - height + image.width - width)
            torch.testing.assert_close(mine, squash(image.crop((left, top, left + width, top + height))),
                                       rtol=0, atol=0)
    assert lost == {0, 1}  # both happen on these images and seeds, and nothing else


def fabricated(accs: list[float]) -> dict:
    """An accuracy-table entry (:func:`visionpe.bench.accuracy.collect.collect`'s form) of runs at 32 px, tested at
    32 and 48 px (one point lower there), 90 s each."""
    seeds = range(len(accs))
    return {"acc": {32: list(accs), 48: [a - 1 for a in accs]}, "ret": {48: [(a - 1) / a for a in accs]},
            "seeds": set(seeds), "wall_s": {s: 90.0 for s in seeds}, "train_res": 32, "num_classes": None}


def test_benchmark_table_and_verdict_follow_the_seed_spread():
    """A fabricated accuracy table: the section's mean ± std, retention and the verdict by the seed-spread rule."""
    accs = {"timm": [40.0, 42.0], "resize+flip": [50.0, 54.0], "small_folder": [52.0, 53.0]}
    table = {("small_folder", folder, row, "default"): fabricated(values)
             for folder in bench["FOLDERS"] for row, values in accs.items()}
    plan, recipe = {row: [0, 1] for row in accs}, {"img_size": 32, "patch_size": 8, "epochs": 10}
    text = bench["part"](table, plan, [32, 48], recipe, "visionpe x", ["photos/timm_s2"])
    assert "Not finished, so not in the table (1 runs): photos/timm_s2." in text
    retention = statistics.fmean([51 / 52, 52 / 53])
    assert f"| objects | small_folder | 52.5 ± 0.7 | 51.5 ± 0.7 | {retention:.3f} ± 0.000 | 0 1 | 10 | 1.5 |" in text
    # 52.5 - 41 = 11.5 > 1.41 + 0.71 (beyond); 52.5 - 52 = 0.5 < 2.83 + 0.71 (within)
    assert "- photos: `small_folder` − `timm`: 32px +11.5 (beyond); 48px +11.5 (beyond)" in text
    assert "- photos: `small_folder` − `resize+flip`: 32px +0.5 (within); 48px +0.5 (within)" in text
    table["small_folder", "objects", "timm", "default"] = fabricated([41.0])  # one seed has no spread to judge by
    one = bench["part"](table, plan, [32], recipe, "visionpe x")
    assert "- objects: `small_folder` − `timm`: 32px +11.5 (one seed)" in one


def test_collect_only_trains_nothing_and_names_the_runs_not_finished(tmp_path):
    folders, doc = tmp_path / "folders", tmp_path / "doc.md"
    for kind in bench["FOLDERS"]:
        (folders / kind / "val").mkdir(parents=True)  # present, so nothing is generated
    doc.write_text("# t\n")
    table = run_script("small_folder_benchmark", ["--folders", folders, "--out", tmp_path / "runs", "--doc", doc,
                                                  "--seeds", "0", "--collect-only"])
    assert table == {}
    assert not list((tmp_path / "runs" / "objects").iterdir())  # no run started
    text = doc.read_text()
    assert "Not finished, so not in the table (6 runs): objects/timm_s0, objects/resize+flip_s0" in text
    epochs = yaml.safe_load(RECIPE.read_text())["epochs"]
    assert f"| objects | small_folder | - | - | - | - | {epochs} | - |" in text
