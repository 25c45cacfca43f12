"""train_vit.py end to end on tiny runs: run directory, exact resume, 2-process DDP, CLI errors, resolution sweep."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import visionpe
from trainutil import ROOT, children_of, run_script, train_main
from visionpe.train import models, restore, sweep


TINY = ["--data", "shapes-position", "--train-samples", "64", "--val-samples", "32", "--batch-size", "16",
        "--epochs", "2", "--img-size", "16", "--patch-size", "4", "--embed-dim", "16", "--depth", "1",
        "--num-heads", "2", "--warmup-epochs", "0.5", "--lr", "3e-3", "--no-progress", "--threads", "1"]


def run(*args, out):
    return train_main(TINY + list(args) + ["--output", str(out)])


def records(path, kind):
    return [r for r in map(json.loads, Path(path).read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "rope"
    summary = run("--pe", "rope_mixed", "--eval-res", "12", "24", out=out)
    return out, summary


def test_run_directory_layout(rope_run):
    out, summary = rope_run
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    for key in ("model", "pe", "img_size", "patch_size", "num_classes", "model_kwargs", "pe_kwargs"):
        assert key in cfg
    assert cfg["pe"] == "rope_mixed" and cfg["num_classes"] == 9 and cfg["img_size"] == 16
    # the config alone rebuilds the model; the weights load strictly
    model = visionpe.create_model(cfg["model"], pe=cfg["pe"], pe_kwargs=cfg["pe_kwargs"], **cfg["model_kwargs"])
    for name in ("last", "best"):
        model.load_state_dict(load_file(out / f"{name}.safetensors"))
    state = torch.load(out / "state.pt", weights_only=True)
    assert state["epoch"] == 2 and set(state) >= {"optimizer", "scheduler", "best_acc", "best_epoch"}
    epochs = records(out / "metrics.jsonl", "epoch")
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert all(e["train_loss"] > 0 and 0 <= e["val_acc"] <= 100 and e["img_per_s"] > 0 for e in epochs)
    evals = records(out / "metrics.jsonl", "eval_res")
    assert sorted((e["model"], e["res"]) for e in evals) == sorted((m, r) for m in ("last", "best") for r in (12, 16, 24))
    at_train = [e for e in evals if e["res"] == 16]
    assert all(e["retention"] == 1.0 for e in at_train)
    best = next(e for e in at_train if e["model"] == "best")
    assert best["acc"] == pytest.approx(max(e["val_acc"] for e in epochs))
    last = next(e for e in at_train if e["model"] == "last")
    assert last["acc"] == pytest.approx(epochs[-1]["val_acc"])
    results = json.loads((out / "results.json").read_text())
    assert results["results"]["last"]["24"]["acc"] == summary["results"]["last"]["24"]["acc"]
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*tmp"))  # atomic writes leave nothing behind


def test_position_parameters_have_no_weight_decay(rope_run):
    out, _ = rope_run
    state = torch.load(out / "state.pt", weights_only=True)
    model = models.build_model(restore.load_run(out))
    params = [n for g in timm_groups(model) for n in g]
    no_decay = {n for g, wd in zip(timm_groups(model), [g["weight_decay"] for g in state["optimizer"]["param_groups"]])
                if wd == 0 for n in g}
    assert any("freqs" in n for n in params)
    assert all(n in no_decay for n in params if "freqs" in n)
    assert any(n not in no_decay for n in params if n.endswith("qkv.weight"))


def timm_groups(model):
    """Parameter names per optimizer group, in the order timm's factory builds them."""
    from timm.optim import create_optimizer_v2
    opt = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in g["params"]] for g in opt.param_groups]


def test_resume_is_exact(tmp_path):
    extra = ["--pe", "learned", "--mixup", "0.4", "--drop-path", "0.1"]  # exercises every RNG stream
    run(*extra, out=tmp_path / "a")
    stopped = run(*extra, "--stop-after", "1", out=tmp_path / "b")
    assert stopped == {"stopped": 1}
    assert len(records(tmp_path / "b" / "metrics.jsonl", "epoch")) == 1
    train_main(["--resume", str(tmp_path / "b"), "--no-progress"])
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("img_per_s", "epoch_time_s")} for r in rs]
    for kind in ("epoch", "eval_res"):
        assert strip(records(tmp_path / "a" / "metrics.jsonl", kind)) == strip(records(tmp_path / "b" / "metrics.jsonl", kind))
    wa, wb = load_file(tmp_path / "a" / "last.safetensors"), load_file(tmp_path / "b" / "last.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # the epochs differ, so the comparison is not vacuous
    first, second = records(tmp_path / "a" / "metrics.jsonl", "epoch")
    assert first["train_loss"] != second["train_loss"] and first["lr"] != second["lr"]


def test_torchrun_two_processes_match_one(tmp_path):
    args = TINY + ["--pe", "rope_axial", "--epochs", "1"]
    env, timeout = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}, 120
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(ROOT / "train_vit.py"), *args, "--output", str(tmp_path / "ddp")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for worker in children_of(proc.pid):  # each in a session of its own: signalled one by one
            os.kill(worker, signal.SIGABRT)  # faulthandler prints where it stands, then it ends
            time.sleep(1)  # one process's stacks at a time
        proc.terminate()
        stdout, stderr = proc.communicate()
        finished = (tmp_path / "ddp" / "results.json").exists()
        pytest.fail(f"torchrun did not exit within {timeout} s; finished: {finished}; the processes' stacks:\n"
                    f"{stderr[-8000:]}")
    assert proc.returncode == 0, stderr[-2000:]
    assert "2 process(es)" in stdout
    train_main(args + ["--output", str(tmp_path / "one")])
    ddp, one = (records(tmp_path / d / "metrics.jsonl", "epoch")[0] for d in ("ddp", "one"))
    # same global batches (DistributedSampler shards one permutation), gradients averaged over ranks
    assert ddp["train_loss"] == pytest.approx(one["train_loss"], rel=1e-4)
    assert ddp["val_loss"] == pytest.approx(one["val_loss"], rel=1e-3)
    assert ddp["val_acc"] == pytest.approx(one["val_acc"], abs=100 / 32 + 1e-6)  # at most one image flips


@pytest.mark.parametrize("args", [
    ["--pe", "rope_bogus"],
    ["--data", "imagenet-1k"],
    ["--model", "vit_nonexistent_224"],
    ["--epochs", "0"],
    ["--epochs", "two"],
    ["--img-size", "18"],
    ["--eval-res", "30"],
    ["--label-smoothing", "1.5"],
    ["--pe-kwargs", "bogus_keyword=3"],
    ["--data", "mnist", "--data-dir", "{tmp}"],
    ["--config", "{tmp}/missing.yaml"],
    ["--unknown-flag"],
    ["--resume", "{tmp}/nothing-here"],
])
def test_user_errors_exit_2_with_one_line(args, tmp_path, capsys):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    with pytest.raises(SystemExit) as exc:
        train_main(TINY + ["--output", str(tmp_path / "run")] + args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("visionpe train: error: "), err


def test_user_error_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "train_vit.py"), "--data", "cifar10", "--output",
                           str(tmp_path / "r")], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--data-dir" in proc.stderr and "Traceback" not in proc.stderr


def test_existing_run_needs_resume_or_overwrite(rope_run, capsys):
    out, _ = rope_run
    with pytest.raises(SystemExit):
        train_main(TINY + ["--output", str(out)])
    assert "--resume" in capsys.readouterr().err


def test_resolution_sweep_writes_csv_and_png(rope_run, tmp_path):
    out, _ = rope_run
    rows = run_script("resolution_sweep", [str(out), "--res", "12", "16", "24", "--scaling", "none", "pi", "yarn",
                                  "--out", str(tmp_path)])
    with open(tmp_path / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) == 9
    assert {r["adaptation"] for r in table} == {"none", "pi", "yarn"}
    at = {(r["adaptation"], int(r["res"])): r for r in table}
    # at the training size every adaptation is the trained model; elsewhere they differ
    assert len({at[(a, 16)]["loss"] for a in ("none", "pi", "yarn")}) == 1  # the identity there: see the next tests
    assert all(float(at[(a, 16)]["retention"]) == 1.0 for a in ("none", "pi", "yarn"))
    # elsewhere each adaptation is its own model: the rotations at 24 px differ (the tiny run is at chance and its
    # attention nearly uniform, so its losses at 24 px agree to float rounding and cannot show it)
    cfg = restore.load_run(out)
    grid = visionpe.Grid((6, 6), prefix=1)
    cis = {a: visionpe.encodings_of(models.build_model(cfg.replace(pe_kwargs=kw)))["rotary"][0].cis(grid)
           for a, kw in sweep.adaptations(cfg["pe"], ["none", "pi", "yarn"], [])}
    assert not torch.allclose(cis["none"], cis["pi"]) and not torch.allclose(cis["pi"], cis["yarn"])
    # the unadapted model reproduces train_vit's own evaluation of the last weights
    last24 = next(e for e in records(out / "metrics.jsonl", "eval_res") if e["model"] == "last" and e["res"] == 24)
    assert float(at[("none", 24)]["acc"]) == pytest.approx(last24["acc"], abs=1e-3)
    png = tmp_path / "sweep.png"
    assert png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_adaptations_per_encoding():
    assert [a for a, _ in sweep.adaptations("learned", ["none", "pi"], [])] == ["default"]
    assert [a for a, _ in sweep.adaptations("rope_axial", ["none", "ntk"], [])] == ["none", "ntk"]
    # every rotary encoding with a scaling option is swept with the scalings it takes (STRING: none and pi)
    assert [a for a, _ in sweep.adaptations("string", ["none", "pi", "ntk"], [])] == ["none", "pi"]
    assert [a for a, _ in sweep.adaptations("videorope", ["none", "yarn"], [])] == ["none", "yarn"]
    # on normalised coordinates (ComRoPE's and LieRE's default) no scaling applies: the run is swept as trained
    assert [a for a, _ in sweep.adaptations("comrope", ["none", "pi"], [])] == ["default"]
    assert [a for a, _ in sweep.adaptations("rope_mixed", ["none", "pi"], [], {"coords": "normalized"})] == \
        ["default"]
    assert [a for a, _ in sweep.adaptations("liere", ["none", "pi"], [], {"coords": "index"})] == ["none", "pi"]
    got = sweep.adaptations("rope_mixed+learned", ["pi"], ["bicubic", "bilinear"])
    assert got == [("pi/bicubic", {"scaling": "pi", "interpolation": "bicubic"}),
                   ("pi/bilinear", {"scaling": "pi", "interpolation": "bilinear"})]


def test_sweep_defaults_to_the_runs_own_scaling(rope_run, tmp_path, capsys):
    """Without --scaling the sweep measures what the run measured: its model's own scaling (RoPE in a model: pi),
    named in the table and the CSV; an explicit --scaling still chooses (issue 43: the sweep extrapolated)."""
    out, _ = rope_run
    rows = run_script("resolution_sweep", [str(out), "--res", "16", "24", "--out", str(tmp_path / "own")])
    assert {r["adaptation"] for r in rows} == {"pi"}
    assert " pi " in capsys.readouterr().out
    last24 = next(e for e in records(out / "metrics.jsonl", "eval_res") if e["model"] == "last" and e["res"] == 24)
    assert next(r for r in rows if r["res"] == 24)["loss"] == pytest.approx(last24["loss"], rel=1e-5)
    rows = run_script("resolution_sweep", [str(out), "--res", "24", "--scaling", "none", "--out", str(tmp_path)])
    assert {r["adaptation"] for r in rows} == {"none"}
    cfg = restore.load_run(out)
    assert sweep.own_scalings(cfg.replace(pe_kwargs={"scaling": "ntk"})) == ["ntk"]
    assert sweep.own_scalings(cfg.replace(pe="learned")) == []


def test_adaptations_are_the_identity_at_the_training_size(rope_run):
    """resolution_sweep evaluates the training size once for all adaptations; that is only right if they agree."""
    out, _ = rope_run
    cfg = restore.load_run(out)
    state = load_file(out / "last.safetensors")
    x = torch.randn(4, 3, 16, 16)
    big = torch.randn(4, 3, 24, 24)
    logits = {}
    for scaling in ("none", "pi", "ntk", "yarn"):
        model = models.build_model(cfg.replace(pe_kwargs={"scaling": scaling}))
        model.load_state_dict(state)
        with torch.no_grad():
            logits[scaling] = model.eval()(x), model(big)
    for scaling in ("pi", "ntk", "yarn"):
        torch.testing.assert_close(logits[scaling][0], logits["none"][0])
        assert not torch.allclose(logits[scaling][1], logits["none"][1])


def test_an_adaptation_that_is_not_the_trained_model_at_the_training_size_is_measured_there(tmp_path, capsys):
    """A RoPE whose reference grid is not the training grid (a preset's fixed ref_shape, as SAM 3's 24x24) is not
    the trained model under another scaling even at the training size: the sweep measures that size per such
    adaptation (never reuses the trained model's number for it), names it, and every retention is against the model
    as trained (the run's own scaling, whose training-size row reproduces the run's own evaluation)."""
    out = tmp_path / "run"
    run("--pe", "rope_axial", "--pe-kwargs", "ref_shape=[2,2]", "scaling=pi", out=out)
    capsys.readouterr()
    rows = run_script("resolution_sweep", [str(out), "--res", "16", "24", "--scaling", "none", "pi",
                                           "--out", str(tmp_path / "sweep")])
    at = {(r["adaptation"], r["res"]): r for r in rows}
    last16 = next(e for e in records(out / "metrics.jsonl", "eval_res") if e["model"] == "last" and e["res"] == 16)
    assert at[("pi", 16)]["loss"] == pytest.approx(last16["loss"], rel=1e-5) and at[("pi", 16)]["retention"] == 1.0
    assert at[("none", 16)]["loss"] != at[("pi", 16)]["loss"]  # measured there: another model (tiny, near chance)
    trained = at[("pi", 16)]["acc"]
    assert at[("none", 16)]["retention"] == pytest.approx(at[("none", 16)]["acc"] / trained, abs=1e-4)
    assert "none is not the model as trained at the training size" in capsys.readouterr().out


def test_visualize_reads_a_real_run_directory(rope_run, tmp_path):
    """visionpe visualize and visionpe.viz rebuild the model from the config.yaml train_vit.py writes."""
    from visionpe import viz
    out, _ = rope_run
    model, cfg = restore.load_model(out)
    assert torch.equal(viz.pick_encoding(model, "rope_mixed", layer=0).freqs,
                       load_file(out / "best.safetensors")["blocks.0.attn.rotary.freqs"])
    png = tmp_path / "freqs.png"
    result = subprocess.run([sys.executable, "-m", "visionpe", "visualize", "--run", str(out),
                             "--kind", "freqs", "--out", str(png)], capture_output=True, text=True,
                            env={**os.environ, "MPLBACKEND": "Agg"}, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("pe", ["rope_mixed", "timm_unpatched"])
def test_deit_models_train(tmp_path, pe):
    """timm's DeiT models (timm.models.deit) train with a visionpe encoding and natively (--pe timm_unpatched): the config
    names the DeiT model and the exported weights load into it."""
    out = tmp_path / pe
    summary = run("--model", "deit_tiny_patch16_224", "--pe", pe, "--epochs", "1", out=out)
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["model"] == "deit_tiny_patch16_224" and cfg["pe"] == pe
    assert 0 <= summary["results"]["last"]["16"]["acc"] <= 100
    model = models.build_model(restore.load_run(out))
    model.load_state_dict(load_file(out / "last.safetensors"))
