"""configs/deit3_small_rope_imagenet.yaml (RoPE-ViT's DeiT-III-S ImageNet recipe) end to end on a tiny JPEG
ImageFolder written here (images of varied sizes and aspect ratios), shrunk only in size and length: the run
finishes, results.json holds finite numbers, and the resolved config.yaml keeps the recipe's loss, augmentation,
layer scale, encoding and evaluation protocol."""
import json
import math

import pytest
import yaml
from trainutil import ROOT, train_main, write_jpeg_folder

RECIPE = ROOT / "configs" / "deit3_small_rope_imagenet.yaml"
# what makes the recipe DeiT-III's (and RoPE-ViT's), which the shrinking overrides below must leave alone
KEPT = {"pe": "rope_mixed", "pe_kwargs": {"theta": 10.0, "scaling": "none"}, "aa": "3a", "color_jitter": 0.3,
        "train_crop_mode": "rrc", "reprob": 0.0, "bce_loss": True, "bce_target_thresh": 0.0, "label_smoothing": 0.0,
        "mixup": 0.8, "cutmix": 1.0, "aug_repeats": 3, "model_ema": False, "opt": "lamb", "lr": 4e-3,
        "weight_decay": 0.03, "min_lr": 1e-5, "clip_grad": 0.0, "drop_path": 0.0, "eval_protocol": "crop",
        "crop_pct": 1.0, "interpolation": "bicubic", "data": "imagefolder"}


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return write_jpeg_folder(tmp_path_factory.mktemp("deit3_jpegs"))


def test_recipe_file_is_deit3s():
    recipe = yaml.safe_load(RECIPE.read_text())
    assert {k: recipe[k] for k in KEPT} == KEPT
    assert recipe["model_kwargs"] == {"embed_dim": 384, "depth": 12, "num_heads": 6, "init_values": 1e-4,
                                      "no_embed_class": True}
    assert (recipe["model"], recipe["img_size"], recipe["patch_size"]) == ("vit_small_patch16_224", 224, 16)
    assert (recipe["epochs"], recipe["batch_size"], recipe["warmup_epochs"]) == (400, 2048, 5)


def test_recipe_runs_end_to_end_on_a_tiny_jpeg_folder(jpegs, tmp_path):
    out = tmp_path / "run"
    argv = ["--config", RECIPE, "--data-dir", jpegs, "--output", out,
            # smaller and shorter only: sizes, resolutions, length, batch, machine
            "--embed-dim", "32", "--depth", "1", "--num-heads", "2", "--img-size", "32",
            "--eval-res", "32", "48", "--epochs", "1", "--warmup-epochs", "0.5", "--train-samples", "12",
            "--batch-size", "4", "--eval-batch-size", "6", "--device", "cpu", "--workers", "0", "--threads", "1",
            "--no-progress"]
    summary = train_main(argv)
    results = json.loads((out / "results.json").read_text())
    assert results["eval_protocol"] == "crop" and results["crop_pct"] == 1.0 and results["epochs"] == 1
    assert math.isfinite(results["final_train_loss"]) and results["final_train_loss"] > 0
    table = results["results"]["last"]
    assert set(table) == {"32", "48"}
    numbers = [v for row in table.values() for v in row.values() if isinstance(v, (int, float))]
    assert numbers and all(math.isfinite(v) for v in numbers)
    assert all(0.0 <= row["acc"] <= 100.0 for row in table.values())
    assert summary["results"] == results["results"]
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert {k: cfg[k] for k in KEPT} == KEPT  # the recipe's loss and augmentation survived the overrides
    kw = cfg["model_kwargs"]
    assert (kw["init_values"], kw["no_embed_class"]) == (1e-4, True)  # layer scale kept with --embed-dim etc.
    assert (kw["embed_dim"], kw["depth"], kw["num_heads"], cfg["img_size"]) == (32, 1, 2, 32)
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in epochs if r["kind"] == "epoch"] == [1]
    # binary cross-entropy trained it: about ln 2 per class at the near-zero logits of a fresh layer-scaled model
    # (softmax cross-entropy would start near ln 3 = 1.10 with 3 classes)
    assert abs(results["final_train_loss"] - math.log(2)) < 0.15
