"""visionpe/configs/lookhere_vitb16_imagenet.yaml (LookHere's ImageNet extrapolation protocol) end to end on a tiny
JPEG ImageFolder: `visionpe train --config lookhere_vitb16_imagenet` shrunk only in size and length, then
`visionpe sweep --tune` on the training images the run left out, untuned and tuned rows at every test size."""
import math

import yaml
from trainutil import run_script, train_main, write_jpeg_folder
from visionpe.cli.recipes import recipe_path

# what makes the recipe LookHere's protocol, which the shrinking overrides below must leave alone
KEPT = {"pe": "lookhere", "pe_kwargs": {"head_directions": "halves"}, "data": "imagefolder", "aa": "3a",
        "color_jitter": 0.3, "train_crop_mode": "rrc", "eval_protocol": "crop", "crop_pct": 1.0,
        "interpolation": "bicubic", "epochs": 150}


def test_recipe_is_vit_b16_at_224_tested_to_1024_with_one_percent_held_out():
    recipe = yaml.safe_load(recipe_path("lookhere_vitb16_imagenet").read_text())
    assert {k: recipe[k] for k in KEPT} == KEPT
    assert recipe["model_kwargs"] == {"embed_dim": 768, "depth": 12, "num_heads": 12}
    assert (recipe["img_size"], recipe["patch_size"]) == (224, 16)
    assert recipe["eval_res"] == [224, 320, 384, 448, 512, 768, 1024]
    imagenet_train = 1281167
    assert recipe["train_samples"] == imagenet_train - round(imagenet_train / 100)  # the rest is --holdout 12812


def test_recipe_trains_and_sweeps_tuned_on_a_tiny_folder(tmp_path):
    folder = write_jpeg_folder(tmp_path / "jpegs")
    out = tmp_path / "run"
    # smaller and shorter only: sizes, resolutions, length, batch, machine; 8 of the 12 training images, 4 held out
    train_main(["--config", "lookhere_vitb16_imagenet", "--data-dir", folder, "--output", out,
                "--embed-dim", "16", "--depth", "1", "--num-heads", "4", "--img-size", "32", "--patch-size", "8",
                "--eval-res", "32", "--epochs", "1", "--warmup-epochs", "0.5", "--train-samples", "8",
                "--batch-size", "4", "--eval-batch-size", "6", "--device", "cpu", "--workers", "0", "--threads", "1",
                "--no-progress"])
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert {k: cfg[k] for k in KEPT if k != "epochs"} == {k: v for k, v in KEPT.items() if k != "epochs"}
    rows = run_script("resolution_sweep", [out, "--res", "32", "48", "64", "--tune", "--holdout", "4",
                                           "--out", tmp_path / "sweep"])
    tuned = {(r["adaptation"], r["res"]): r for r in rows if r["adaptation"] in ("untuned", "tuned")}
    assert set(tuned) == {(a, s) for a in ("untuned", "tuned") for s in (32, 48, 64)}
    for r in tuned.values():
        assert r["knob"] == "global_slope" and r["protocol"] == "crop"
        assert math.isfinite(r["loss"]) and 0 <= r["acc"] <= 100 and 0 <= r["holdout_acc"] <= 100
    assert (tmp_path / "sweep" / "sweep.csv").exists()


def test_the_protocol_recipes_resolve_as_written():
    """Both recipes of issue 34 pass visionpe train's checks unchanged (the Fashion-MNIST budget keeps its intent:
    no augmentation, a fixed subset)."""
    from visionpe.train import settings

    lookhere = settings.resolve(settings.parse_args(["--config", "lookhere_vitb16_imagenet"]))
    assert (lookhere["pe"], lookhere["model_kwargs"]["embed_dim"], lookhere["eval_res"][-1]) == ("lookhere", 768, 1024)
    fashion = settings.resolve(settings.parse_args(["--config", "bench_fashion_mnist"]))
    assert (fashion["data"], fashion["no_aug"], fashion["train_samples"], fashion["img_size"]) == \
        ("fashion-mnist", True, 20000, 32)
