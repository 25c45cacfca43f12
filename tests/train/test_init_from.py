"""train_vit.py --init-from (issue 12): a trained run converted to another encoding and fine-tuned as a new run.
Tiny runs in this process (trainutil.train_main), as in test_train.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file
from trainutil import train_main

from visionpe.weights.convert import is_positional as _is_positional
from visionpe.resample import resample_grid
from visionpe.train import models, restore

SIZES = ["--img-size", "16", "--patch-size", "4", "--embed-dim", "16", "--depth", "1", "--num-heads", "2"]
RECIPE = ["--train-samples", "64", "--val-samples", "32", "--batch-size", "16", "--epochs", "1",
          "--warmup-epochs", "0.5", "--lr", "3e-3", "--no-progress", "--threads", "1"]


def records(run, kind):
    return [r for r in map(json.loads, (Path(run) / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished learned-APE run (the model to convert)."""
    out = tmp_path_factory.mktemp("init") / "learned"
    train_main(["--data", "shapes-position", "--pe", "learned", *SIZES, *RECIPE, "--output", out])
    return out


def convert(source, out, *args):
    """``--init-from source`` with only the recipe: model and data settings come from the source run."""
    return train_main(["--init-from", source, *RECIPE, *args, "--output", out])


def test_learned_to_rope_mixed(source, tmp_path, capsys):
    out = tmp_path / "rope"
    summary = convert(source, out, "--pe", "rope_mixed")
    printed = capsys.readouterr().out
    assert f"init from {source / 'last.safetensors'} pe=learned epoch 1: 19 kept, 0 converted, 1 new, 2 dropped" \
        in printed
    assert "  new       blocks.0.attn.rotary.freqs" in printed and "  dropped   pe_tokens.table" in printed
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["init_from"] == str(source / "last.safetensors") and cfg["pe"] == "rope_mixed"
    # the source run's model settings were taken (none were given)
    assert (cfg["img_size"], cfg["patch_size"]) == (16, 4)
    assert {k: cfg["model_kwargs"][k] for k in ("embed_dim", "depth", "num_heads")} == \
        {"embed_dim": 16, "depth": 1, "num_heads": 2}
    (init,) = records(out, "init")
    assert init["new"] == ["blocks.0.attn.rotary.freqs"]
    assert sorted(init["dropped"]) == ["pe_tokens.prefix", "pe_tokens.table"] and init["converted"] == []
    assert summary["init_from"] == str(source / "last.safetensors")
    # a new run: its own epochs from 1, a fresh schedule (the optimizer state counts only this run's steps)
    assert [e["epoch"] for e in records(out, "epoch")] == [1]
    state = torch.load(out / "state.pt", weights_only=True)
    assert all(s["step"].item() == 4 for s in state["optimizer"]["state"].values())  # 64 images / 16 per batch

    # at the start, every non-positional weight is the source's: rebuild from config.yaml and initialize again
    src = load_file(source / "last.safetensors")
    model = models.build_model(restore.load_run(out))
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    record = restore.init_weights(model, restore.load_run(out))
    start = model.state_dict()
    assert sorted(record["kept"]) == sorted(k for k in src if not _is_positional(k))
    for key in record["kept"]:
        assert torch.equal(start[key], src[key]), key
    assert torch.equal(start["blocks.0.attn.rotary.freqs"], fresh["blocks.0.attn.rotary.freqs"])  # new: initial
    trained = load_file(out / "last.safetensors")
    assert not torch.equal(trained["blocks.0.attn.qkv.weight"], src["blocks.0.attn.qkv.weight"])  # and it trained


def test_learned_table_kept_or_resampled(source, tmp_path, capsys):
    src = load_file(source / "last.safetensors")
    # same grid: the learned table of rope_mixed+learned is the source's, unchanged
    cfg = restore.new_config({"init_from": str(source), "pe": "rope_mixed+learned"})
    model = models.build_model(cfg)
    record = restore.init_weights(model, cfg)
    assert {"pe_tokens.table", "pe_tokens.prefix"} <= set(record["kept"]) and record["dropped"] == []
    assert record["new"] == ["blocks.0.attn.rotary.freqs"]
    assert torch.equal(model.state_dict()["pe_tokens.table"], src["pe_tokens.table"])
    # another grid (fine-tuning at 24 px): the table is resampled 4x4 -> 6x6 (converted)
    out = tmp_path / "mixed_learned_24"
    convert(source, out, "--pe", "rope_mixed+learned", "--img-size", "24")
    assert "  converted pe_tokens.table -> pe_tokens.table (resampled 4x4 -> 6x6)" in capsys.readouterr().out
    (init,) = records(out, "init")
    assert init["converted"] == ["pe_tokens.table -> pe_tokens.table (resampled 4x4 -> 6x6)"]
    cfg = restore.load_run(out)
    model = models.build_model(cfg)
    restore.init_weights(model, cfg)
    tokens = model.pe_tokens
    expected = resample_grid(src["pe_tokens.table"], (6, 6), tokens.interpolation, tokens.antialias)
    torch.testing.assert_close(model.state_dict()["pe_tokens.table"], expected)


def timm_checkpoint(path, num_classes=9):
    """A plain timm ViT (timm's own ``pos_embed``) of the tiny sizes, saved as a training checkpoint."""
    torch.manual_seed(1)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, embed_dim=16, depth=1,
                            num_heads=2, num_classes=num_classes).eval()
    torch.nn.init.normal_(vit.pos_embed, std=0.5)  # non-trivial positions, so the logits depend on them
    torch.save({"model": vit.state_dict(), "epoch": 7}, path)
    return vit


def test_timm_pos_embed_into_learned(tmp_path):
    vit = timm_checkpoint(tmp_path / "vit.pth")
    cfg = restore.new_config({"init_from": str(tmp_path / "vit.pth"), "pe": "learned", "img_size": 16, "patch_size": 4,
                             "model_kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2}})
    model = models.build_model(cfg).eval()
    record = restore.init_weights(model, cfg)
    assert sorted(record["converted"]) == ["pos_embed -> pe_tokens.prefix", "pos_embed -> pe_tokens.table"]
    assert record["new"] == [] and record["dropped"] == [] and record["source_pe"] is None
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), vit(x), atol=1e-5, rtol=1e-5)
    # the same through the command line, into rope_mixed (pos_embed has no place there: dropped)
    summary = train_main(["--init-from", tmp_path / "vit.pth", "--pe", "rope_mixed", *SIZES, *RECIPE,
                          "--output", tmp_path / "rope"])
    assert summary["init_from"] == str(tmp_path / "vit.pth")
    (init,) = records(tmp_path / "rope", "init")
    assert init["dropped"] == ["pos_embed"] and init["new"] == ["blocks.0.attn.rotary.freqs"]


def test_an_ambiguous_grid_is_said_and_init_grid_gives_it(tmp_path, capsys):
    """A timm checkpoint of a 16x4 grid holds 64 positions, which also fit 8x8: into a 32x32 px model (8x8 patches)
    --init-from reads it as the model's grid and prints that assumption and --init-grid; ``--init-grid 16 4`` reads
    it as timm's own grid: the table is timm's resample_abs_pos_embed from (16, 4) (its closed form: bicubic with
    antialias), and nothing is assumed."""
    torch.manual_seed(1)
    vit = timm.create_model("vit_tiny_patch16_224", img_size=(64, 16), patch_size=4, embed_dim=16, depth=1, num_heads=2,
                            num_classes=9)
    torch.nn.init.normal_(vit.pos_embed, std=0.5)
    torch.save(vit.state_dict(), tmp_path / "tall.pth")
    argv = ["--init-from", tmp_path / "tall.pth", "--pe", "learned", "--img-size", "32", "--patch-size", "4",
            "--embed-dim", "16", "--depth", "1", "--num-heads", "2", *RECIPE]
    train_main([*argv, "--output", tmp_path / "guess"])
    printed = capsys.readouterr().out
    assert ("  assumed   pos_embed: 64 patch positions read as the grid 8x8 (the model's grid; a checkpoint stores no "
            "grid, and 64 also fits 16x4, 4x16, 32x2, 2x32): give --init-grid H W if it was another") in printed
    (init,) = records(tmp_path / "guess", "init")
    assert len(init["assumed"]) == 1 and "--init-grid H W" in init["assumed"][0]
    train_main([*argv, "--init-grid", "16", "4", "--output", tmp_path / "given"])
    assert "assumed" not in capsys.readouterr().out and records(tmp_path / "given", "init")[0]["assumed"] == []
    cfg = restore.load_run(tmp_path / "given")
    assert cfg["init_grid"] == [16, 4]
    model = models.build_model(cfg)
    restore.init_weights(model, cfg)
    grid = vit.pos_embed[:, 1:].detach().reshape(1, 16, 4, -1).permute(0, 3, 1, 2)
    expected = torch.nn.functional.interpolate(grid, size=(8, 8), mode="bicubic", antialias=True, align_corners=False)
    torch.testing.assert_close(model.pe_tokens.table, expected[0].permute(1, 2, 0), atol=1e-5, rtol=1e-5)
    err = error_line(capsys, [*argv, "--init-grid", "8", "4", "--output", tmp_path / "wrong"])
    assert "source_grid=(8, 4) has 32 patches but pos_embed of shape (1, 65, 16) holds 64" in err
    err = error_line(capsys, [*argv[2:], "--init-grid", "8", "8", "--output", tmp_path / "alone"])
    assert "--init-grid needs --init-from PATH" in err
    err = error_line(capsys, [*argv, "--init-grid", "8", "--output", tmp_path / "one"])
    assert "init_grid must be 2 integers >= 1 (height width, in patches), got 8" in err


def test_a_source_runs_grid_is_known(tmp_path, capsys):
    """From a run of timm's own model (``--pe timm_unpatched``: its flat ``pos_embed``), the grid is the run's (config.yaml):
    nothing is assumed, into a model of another size too."""
    source = tmp_path / "timm"
    train_main(["--data", "shapes-position", "--pe", "timm_unpatched", *SIZES, *RECIPE, "--output", source])
    capsys.readouterr()
    train_main(["--init-from", source, "--pe", "learned", "--img-size", "24", *RECIPE,
                "--output", tmp_path / "bigger"])
    (init,) = records(tmp_path / "bigger", "init")
    assert init["assumed"] == [] and "pos_embed -> pe_tokens.table" in init["converted"]
    assert "assumed" not in capsys.readouterr().out


def test_head_reset(source, tmp_path, capsys):
    out = tmp_path / "relation"
    convert(source, out, "--pe", "rope_mixed", "--data", "shapes-relation", "--init-head-reset")
    assert "(classifier head reset)" in capsys.readouterr().out
    (init,) = records(out, "init")
    assert {"head.weight", "head.bias"} <= set(init["new"]) and init["head_reset"]
    assert not any(k.startswith("head.") for k in init["kept"] + init["dropped"])
    assert yaml.safe_load((out / "config.yaml").read_text())["num_classes"] == 4


def test_resume_before_the_first_epoch_initializes_again(source, tmp_path, capsys):
    out = tmp_path / "rope"
    convert(source, out, "--pe", "rope_mixed")
    for name in ("results.json", "state.pt", "last.safetensors", "best.safetensors", "metrics.jsonl"):
        (out / name).unlink()  # as if killed after config.yaml was written, before epoch 1 was saved
    capsys.readouterr()
    train_main(["--resume", out])
    assert "init from" in capsys.readouterr().out
    assert len(records(out, "init")) == 1 and len(records(out, "epoch")) == 1


def error_line(capsys, argv):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("visionpe train: error: ")
    return err


@pytest.mark.parametrize("case, words", [
    ("missing", ["--init-from", "no such run directory or weights file"]),
    ("not_a_run", ["--init-from", "not a run directory"]),
    ("unfinished", ["last.safetensors not found", "finished no epoch"]),
    ("bad_suffix", ["expected a run directory or a .safetensors"]),
    ("garbage", ["--init-from", "not a readable torch checkpoint"]),
    ("embed_dim", ["does not fit the new model", "embed_dim=16", "embed_dim=32",
                   "patch_embed.proj.weight 16x3x4x4 in the source, 32x3x4x4 here"]),
    ("depth", ["does not fit the new model", "blocks.1.attn.qkv.weight only in the new model"]),
    ("head", ["classifier head does not fit", "head.weight 9x16 in the source, 4x16 here", "--init-head-reset"]),
    ("resume", ["--init-from starts a new run", "--resume continues this run"]),
    ("head_reset_alone", ["--init-head-reset needs --init-from"]),
    ("own_output", ["the weights are in the new run's own --output"]),
])
def test_errors(source, tmp_path, capsys, case, words):
    target = source
    args = ["--pe", "rope_mixed"]
    if case == "missing":
        target = tmp_path / "nowhere"
    elif case == "not_a_run":
        target = tmp_path
    elif case == "unfinished":
        target = tmp_path / "unfinished"
        target.mkdir()
        (target / "config.yaml").write_text((source / "config.yaml").read_text())
    elif case == "bad_suffix":
        target = tmp_path / "weights.npz"
        target.write_bytes(b"x")
    elif case == "garbage":
        target = tmp_path / "weights.pth"
        target.write_bytes(b"not a torch file")
    elif case == "embed_dim":
        args += ["--embed-dim", "32"]
    elif case == "depth":
        args += ["--depth", "2"]
    elif case == "head":
        args += ["--data", "shapes-relation"]
    elif case == "resume":
        args += ["--resume", str(source)]
    argv = ["--init-from", target, *args, *RECIPE, "--output", tmp_path / "out"]
    if case == "head_reset_alone":
        argv = ["--init-head-reset", *args, *RECIPE, "--output", tmp_path / "out"]
    elif case == "own_output":
        argv = ["--init-from", source, *args, *RECIPE, "--output", source, "--overwrite"]
    err = error_line(capsys, argv)
    for word in words:
        assert word in err, (word, err)
    assert (source / "results.json").is_file()  # the source run is never touched


def test_benchmark_part_replaced_in_place(tmp_path):
    """The conversion benchmark writes its part between markers: appended once, then replaced; the rest of
    the report is left as it is."""
    from visionpe.bench.accuracy import conversion as bench
    doc = tmp_path / "BENCHMARK.md"
    doc.write_text("# Benchmark\n\ntable\n")
    part = lambda text: f"{bench.BEGIN}\n{bench.TITLE}\n\n{text}\n{bench.END}\n"
    bench.write_part(doc, bench.PART, part("first"))
    bench.write_part(doc, bench.PART, part("second"))
    assert doc.read_text() == "# Benchmark\n\ntable\n\n" + part("second")
