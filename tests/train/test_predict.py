"""``visionpe predict RUN IMAGE...``: a folder run names its outputs by its class folders (issue 43). Oracles: timm's
own eval transform built in the test, torchvision's ImageFolder class order, and the run's own validation top-1
(results.json), which the printed top-1 names must reproduce on the validation images."""
from __future__ import annotations

import json

import pytest
import torch
import torchvision
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from trainutil import run_script, train_main, write_jpeg_folder

from visionpe.train import restore

NAMES = {"c0": "zebra", "c1": "ant", "c2": "moth"}  # class folders whose sorted order is not the colour order


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    folder = write_jpeg_folder(root / "jpegs")
    for split in ("train", "val"):
        for old, new in NAMES.items():
            (folder / split / old).rename(folder / split / new)
    train_main(["--data", "imagefolder", "--data-dir", folder, "--epochs", "2", "--batch-size", "6", "--img-size",
                "16", "--patch-size", "4", "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--lr", "1e-2",
                "--warmup-epochs", "0", "--eval-res", "16", "--no-progress", "--threads", "1",
                "--output", root / "run"])
    return root / "run", folder


def timm_probs(model, path, size) -> torch.Tensor:
    """The class probabilities of ``path`` through timm's eval transform of the run's protocol (resize: squash the
    whole image to ``size``, bicubic, ImageNet mean and std), built here."""
    transform = create_transform(size, is_training=False, crop_pct=1.0, crop_mode="squash", interpolation="bicubic",
                                 mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
    with torch.no_grad():
        return model(transform(Image.open(path).convert("RGB"))[None]).softmax(-1)[0]


@pytest.mark.parametrize("size", [None, (24, 32)])
def test_predictions_are_timms_transform_and_the_runs_class_names(folder_run, capsys, size):
    run, folder = folder_run
    images = sorted((folder / "val").glob("*/*.jpg"))
    flags = [] if size is None else ["--img-size", f"{size[0]}x{size[1]}"]
    found = run_script("predict", [run, *images, "--top-k", "3", *flags])
    lines = capsys.readouterr().out.splitlines()
    classes = torchvision.datasets.ImageFolder(folder / "train").classes
    assert classes == ["ant", "moth", "zebra"]
    model, _ = restore.load_model(run)
    for path, line, result in zip(images, lines, found):
        probs = timm_probs(model, path, size or (16, 16))
        order = probs.argsort(descending=True).tolist()
        assert [i for _, i, _ in result["top"]] == order
        assert [name for name, _, _ in result["top"]] == [classes[i] for i in order]
        assert [p for _, _, p in result["top"]] == pytest.approx(probs[order].tolist(), abs=1e-6)
        assert line == f"{path}: " + ", ".join(f"{classes[i]} {100 * float(probs[i]):.1f}%" for i in order)
    if size is None:  # the printed top-1 names score the validation images as the run scored them
        right = [r["top"][0][0] == p.parent.name for p, r in zip(images, found)]
        best = json.loads((run / "results.json").read_text())["results"]["best"]["16"]["acc"]
        assert 100 * sum(right) / len(right) == pytest.approx(best)
