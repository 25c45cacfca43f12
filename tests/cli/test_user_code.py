"""User code reaches every command line: a data set, an encoding and a backbone, each one file and one registration
outside the package, imported with --import; a run records the import, so --resume, the sweep and visualization
import it again (in fresh processes here, where nothing is registered unless the run's config says so)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import yaml
from trainutil import ROOT, run_script, train_main
from usercode import BACKBONE, DATASET, ENCODING, write

import visionpe as vpe
from visionpe import cli

SMALL = ["--train-samples", "32", "--val-samples", "16", "--batch-size", "16", "--epochs", "2", "--img-size", "16",
         "--patch-size", "4", "--warmup-epochs", "0", "--no-progress", "--threads", "1"]
TINY_VIT = ["--embed-dim", "16", "--depth", "1", "--num-heads", "2"]


def python(*args, cwd=ROOT):
    """A fresh ``python`` process (nothing the tests registered in this one); returns the completed process."""
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_a_user_data_set_and_encoding_train_resume_sweep_and_draw(tmp_path):
    enc, data = write(tmp_path, "my_encoding", ENCODING), write(tmp_path, "my_data", DATASET)
    out = tmp_path / "run"
    train_main(["--import", enc, "--import", data, "--data", "bright-half", "--pe", "rope_axial+checker",
                *SMALL, *TINY_VIT, "--stop-after", "1", "--output", out])
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["imports"] == [str(enc), str(data)] and config["data"] == "bright-half" and config["in_chans"] == 1
    # a fresh process knows neither name: the run's config.yaml brings them back
    resumed = python("train_vit.py", "--resume", out, "--no-progress")
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stderr
    swept = python("-m", "visionpe", "sweep", out, "--res", "16", "24", "--out", tmp_path / "sweep")
    assert swept.returncode == 0 and (tmp_path / "sweep" / "sweep.csv").is_file(), swept.stderr
    drawn = python("-m", "visionpe", "visualize", "--run", out, "--pe", "checker", "--out", tmp_path / "c.png")
    assert drawn.returncode == 0 and (tmp_path / "c.png").stat().st_size > 0, drawn.stderr
    fresh = python("-m", "visionpe", "visualize", "--import", enc, "--pe", "checker", "--grid", "6", "6", "--out",
                   tmp_path / "f.png")
    assert fresh.returncode == 0 and (tmp_path / "f.png").is_file(), fresh.stderr


def test_a_user_backbone_is_one_file_and_one_registration(tmp_path):
    backbone = write(tmp_path, "my_backbone", BACKBONE)
    cli.import_user_code([backbone])
    model = vpe.backbones.named_constructor("toy_vit")[1](num_classes=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    vpe.apply(model, "rope_mixed+alibi")
    assert type(model).__name__ == "ToyViTPE"
    assert len(vpe.encodings_of(model)["rotary"]) == len(vpe.encodings_of(model)["bias"]) == 1
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # weights kept
    assert any("rotary.freqs" in name for name in model.no_weight_decay())
    assert model(torch.randn(2, 3, 16, 24)).shape == (2, 3)  # any size
    with pytest.raises(ValueError, match="each side must be a positive multiple"):
        model(torch.randn(1, 3, 15, 16))
    # and from the command line, by its registered name
    summary = train_main(["--import", backbone, "--model", "toy_vit", "--pe", "rope_axial", "--data",
                          "shapes-position", "--model-kwargs", "embed_dim=16", "depth=1", "num_heads=2", *SMALL,
                          "--epochs", "1", "--eval-res", "24", "--output", tmp_path / "run"])
    assert set(summary["results"]["last"]) == {"16", "24"}


def test_user_code_in_a_benchmark_reaches_every_run(tmp_path):
    enc = write(tmp_path, "my_encoding", ENCODING)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"data": "shapes-position", "img_size": 16, "patch_size": 4, "epochs": 1,
                                      "batch_size": 16, "train_samples": 32, "val_samples": 16, "warmup_epochs": 0,
                                      "model_kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2}}))
    doc = tmp_path / "B.md"
    assert run_script("benchmark", ["--import", enc, "--config", recipe, "--data", "shapes-position", "--pe",
                                    "checker", "--seeds", "0", "--res", "16", "--jobs", "1", "--out",
                                    tmp_path / "bench", "--doc", doc]) == 0
    run = tmp_path / "bench" / "vit" / "shapes-position" / "checker" / "s0"
    assert yaml.safe_load((run / "config.yaml").read_text())["imports"] == [str(enc)]
    assert (run / "sweep" / "sweep.csv").is_file() and "| checker |" in doc.read_text()
