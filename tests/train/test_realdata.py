"""train_vit.py on real images through timm's transforms (exact resume, loader workers), the evaluation protocols
in results.json, the table and the sweep, and --max-patches (native aspect ratios through forward_batch) for every
family, also under torchrun."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from trainutil import ROOT, run_script, train_main

from visionpe.backbones.vit import VisionTransformerPE
from visionpe.train import sampling, settings

SMALL = ["--epochs", "2", "--img-size", "16", "--patch-size", "4", "--embed-dim", "16", "--depth", "1",
         "--num-heads", "2", "--warmup-epochs", "0.5", "--lr", "3e-3", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    """A tiny ImageFolder of JPEGs of varied sizes and aspect ratios, 3 classes (a colour each)."""
    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("val", 4)):
        for c in range(3):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(count):
                h, w = (int(v) for v in rng.integers(18, 48, 2))
                pixels = rng.integers(0, 90, (h, w, 3), dtype=np.uint8)
                pixels[..., c] += 150
                Image.fromarray(pixels).save(root / split / f"c{c}" / f"{i}.jpg", quality=90)
    return root


REAL = ["--data", "imagefolder", "--batch-size", "6", "--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25",
        "--drop-path", "0.2", "--mixup", "0.4", "--eval-protocol", "crop", "--crop-pct", "0.8", "--eval-res", "24"]
DEEPER = ["--depth", "2"]  # drop path draws from torch's stream in block 2 (block 1's rate is 0), mixup from NumPy's


def weights(run):
    return load_file(run / "last.safetensors")


def epochs(run):
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("img_per_s", "epoch_time_s")} for r in lines
            if r["kind"] == "epoch"]


@pytest.fixture(scope="module")
def real_run(jpeg_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "a"
    train_main(REAL + SMALL + DEEPER + ["--data-dir", str(jpeg_folder), "--output", str(out)])
    return out


def test_resume_and_workers_give_the_same_run_bit_for_bit(real_run, jpeg_folder, tmp_path):
    """timm's RandAugment, random erasing, drop path and mixup: a resumed run and a run loading with 2 workers equal
    the uninterrupted one exactly (the data draws from (seed, epoch, index); the training's streams are untouched)."""
    args = REAL + SMALL + DEEPER + ["--data-dir", str(jpeg_folder)]
    assert train_main(args + ["--output", str(tmp_path / "b"), "--stop-after", "1"]) == {"stopped": 1}
    train_main(["--resume", str(tmp_path / "b"), "--no-progress"])
    train_main(args + ["--output", str(tmp_path / "c"), "--workers", "2"])
    a = weights(real_run)
    for other in ("b", "c"):
        b = weights(tmp_path / other)
        assert all(torch.equal(a[k], b[k]) for k in a), other
        assert epochs(tmp_path / other) == epochs(real_run)
    first, second = epochs(real_run)
    assert first["train_loss"] != second["train_loss"]  # two different epochs: the comparison is not vacuous


def test_another_seed_augments_differently(real_run, jpeg_folder, tmp_path):
    train_main(REAL + SMALL + DEEPER + ["--data-dir", str(jpeg_folder), "--output", str(tmp_path / "s1"),
                                        "--seed", "1"])
    assert epochs(tmp_path / "s1")[0]["train_loss"] != epochs(real_run)[0]["train_loss"]


def test_results_and_table_name_the_protocol(real_run):
    results = json.loads((real_run / "results.json").read_text())
    assert results["eval_protocol"] == "crop" and results["crop_pct"] == 0.8
    assert set(results["results"]["last"]) == {"16", "24"}
    import yaml
    assert yaml.safe_load((real_run / "config.yaml").read_text())["eval_protocol"] == "crop"


def test_sweep_compares_protocols_on_the_same_weights(real_run, tmp_path):
    rows = run_script("resolution_sweep", [str(real_run), "--res", "16", "24", "--eval-protocol", "resize", "crop",
                                           "--out", str(tmp_path / "sw")])
    with open(tmp_path / "sw" / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert {r["protocol"] for r in table} == {"resize", "crop"} and len(rows) == 4
    crop16 = next(r for r in rows if r["protocol"] == "crop" and r["res"] == 16)
    results = json.loads((real_run / "results.json").read_text())["results"]["last"]
    assert crop16["acc"] == pytest.approx(results["16"]["acc"], abs=1e-3)  # the run's own protocol, same images
    default = run_script("resolution_sweep", [str(real_run), "--res", "24", "--out", str(tmp_path / "sw2")])
    assert {r["protocol"] for r in default} == {"crop"}  # default: the run's own


def test_a_folder_run_keeps_its_class_names_and_refuses_other_ones(real_run, jpeg_folder, tmp_path, capsys):
    """config.yaml and results.json hold the class names that number a folder run's outputs (torchvision's
    ImageFolder order); a sweep or a resume on a folder whose classes differ is one line naming them (issue 43: only
    num_classes was kept, so a renamed class was scored under another's output)."""
    import shutil
    import yaml
    assert yaml.safe_load((real_run / "config.yaml").read_text())["classes"] == ["c0", "c1", "c2"]
    assert json.loads((real_run / "results.json").read_text())["classes"] == ["c0", "c1", "c2"]
    other = tmp_path / "other"
    shutil.copytree(jpeg_folder, other)
    for split in ("train", "val"):
        (other / split / "c0").rename(other / split / "c9")  # same count, another class
    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "data_dir": str(other)}))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run_script("resolution_sweep", [str(run), "--res", "16", "--out", str(tmp_path / "sw")])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 3 classes that are not the 3 the run was trained on (the run's only: c0; " \
        "the data's only: c9)" in err, err
    stopped = tmp_path / "stopped"
    args = REAL + SMALL + ["--data-dir", str(other), "--output", str(stopped), "--stop-after", "1"]
    assert train_main(args) == {"stopped": 1}
    for split in ("train", "val"):
        (other / split / "c9").rename(other / split / "a0")  # renamed between the epochs
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_main(["--resume", str(stopped), "--no-progress"])
    err = capsys.readouterr().err
    assert "(the run's only: c9; the data's only: a0)" in err and "give the --data-dir it was trained on" in err, err


def test_transform_settings_on_a_built_in_task_are_ignored_with_a_note():
    cfg = settings.resolve({"aa": "3a", "hflip": 0.0})
    notes = sampling.data_notes(cfg)
    assert len(notes) == 1 and "--hflip --aa" in notes[0] and "built-in task" in notes[0]
    assert sampling.data_notes(settings.resolve({"data": "fashion-mnist", "aa": "3a"})) == []
    assert sampling.data_notes(settings.resolve({})) == []


@pytest.mark.parametrize("protocol", [None, "resize", "native"])
def test_a_crop_fraction_without_the_crop_protocol_is_told(protocol):
    """``--crop-pct`` is the crop protocol's: under another (the default resize) it would be silently unused."""
    args = {"data": "fashion-mnist", "crop_pct": 0.9, **({"eval_protocol": protocol} if protocol else {})}
    if protocol == "native":
        args["max_patches"] = 16
    notes = sampling.data_notes(settings.resolve(args))
    assert len(notes) == 1 and "--crop-pct ignored" in notes[0] and (protocol or "resize") in notes[0]
    assert sampling.data_notes(settings.resolve({**args, "eval_protocol": "crop"})) == []


def test_a_registered_set_without_transforms_is_told(monkeypatch):
    from visionpe import data
    data.register_dataset("plain-user-set", num_classes=2)(lambda split, img_size: None)
    notes = sampling.data_notes(settings.resolve({"data": "plain-user-set", "reprob": 0.5}))
    assert notes and "--reprob" in notes[0] and "takes no transforms" in notes[0]


ASPECT = ["--data", "shapes-relation-aspect", "--train-samples", "48", "--val-samples", "24", "--batch-size", "12",
          "--max-patches", "16", "--eval-res", "24"]


@pytest.mark.parametrize("pe", ["learned", "rope_mixed", "alibi"])  # tokens, rotary, bias
def test_max_patches_trains_mixed_grids_for_every_family(pe, tmp_path, monkeypatch):
    grids_per_batch = []
    original = VisionTransformerPE.forward_batch

    def spy(self, images):
        grids_per_batch.append((self.training, len({tuple(x.shape[1:]) for x in images})))
        return original(self, images)

    monkeypatch.setattr(VisionTransformerPE, "forward_batch", spy)
    summary = train_main(ASPECT + SMALL + ["--pe", pe, "--epochs", "1", "--output", str(tmp_path / "run")])
    training = [n for train, n in grids_per_batch if train]
    assert len(training) == 4 and all(n > 1 for n in training)  # 48 / 12 steps, each a batch of mixed grids
    assert any(not train and n > 1 for train, n in grids_per_batch)  # native evaluation, mixed grids too
    assert summary["eval_protocol"] == "native" and summary["max_patches"] == 16
    assert all(np.isfinite(m["loss"]) for m in summary["results"]["last"].values())


def test_max_patches_under_torchrun_matches_one_process(tmp_path):
    args = ASPECT + SMALL + ["--pe", "rope_axial", "--epochs", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train_vit.py"), *args, "--output", str(tmp_path / "ddp")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    train_main(args + ["--output", str(tmp_path / "one")])
    ddp, one = (epochs(tmp_path / d)[0] for d in ("ddp", "one"))
    assert ddp["train_loss"] == pytest.approx(one["train_loss"], rel=1e-4)  # gradients averaged over the ranks
    wa, wb = weights(tmp_path / "ddp"), weights(tmp_path / "one")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)
