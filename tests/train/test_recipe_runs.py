"""train_vit.py with timm's recipe features, end to end on tiny runs: exact resume with every stateful feature at
once (EMA, accumulation, repeated augmentation, mid-epoch commits), the EMA weights exported, evaluated and swept,
accumulation against a larger batch, layer-wise decay groups, channels-last, torch.compile, pretrained weights from
a local file (never a download), and a torchrun run killed within an epoch."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file, save_file
from timm.optim import create_optimizer_v2
from trainutil import ROOT, TINY, run_script, train_main

import visionpe
from visionpe.backbones.adapter import PositionalModel
from visionpe.train import loop, models, restore, rundir, settings

STATEFUL = ["--pe", "rope_mixed+learned", "--model-ema", "--model-ema-decay", "0.8", "--model-ema-warmup",
            "--grad-accum-steps", "3", "--aug-repeats", "2", "--bce-loss", "--mixup", "0.4", "--drop-path", "0.1",
            "--layer-decay", "0.8", "--channels-last", "--checkpoint-every-steps", "1", "--batch-size", "8",
            "--eval-res", "12", "24"]


def records(path, kind):
    return [r for r in map(json.loads, (Path(path) / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def timeless(rows):
    return [{k: v for k, v in r.items() if k not in ("img_per_s", "epoch_time_s")} for r in rows]


def same_weights(a, b) -> bool:
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def stateful_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("recipe") / "full"
    summary = train_main(TINY + STATEFUL + ["--output", str(out)])
    return out, summary


def test_resume_is_exact_with_ema_accumulation_repeats_and_mid_epoch_commits(stateful_run, tmp_path, capsys):
    full, _ = stateful_run
    part = tmp_path / "part"
    assert train_main(TINY + STATEFUL + ["--output", str(part), "--stop-after", "1"]) == {"stopped": 1}
    train_main(["--resume", str(part), "--checkpoint-every-steps", "2"])  # how often to commit may change
    assert "checkpoint_every_steps changed from 1 to 2 (applied)" in capsys.readouterr().out
    for kind in ("epoch", "eval_res"):
        assert timeless(records(part, kind)) == timeless(records(full, kind))
    for name in ("last.safetensors", "best.safetensors", "ema.safetensors"):
        assert same_weights(part / name, full / name), name
    epochs = records(full, "epoch")
    assert all("ema_val_acc" in e and "ema_val_loss" in e for e in epochs)
    assert epochs[0]["train_loss"] != epochs[1]["train_loss"]  # two different epochs: the comparison is not vacuous
    # 64 images, 2 views each in timm's epoch length (64 views), 8 a batch: 8 batches, 3 a step: 3 steps an epoch
    state = torch.load(full / "state.pt", weights_only=True)
    assert {float(s["step"]) for s in state["optimizer"]["state"].values()} == {6.0}
    assert "progress" not in state and set(state) >= {"ema", "model", "optimizer"}


def test_ema_weights_are_exported_evaluated_and_swept(stateful_run, tmp_path):
    out, summary = stateful_run
    state = torch.load(out / "state.pt", weights_only=True)
    ema = load_file(out / "ema.safetensors")
    assert ema.keys() == state["ema"].keys() and all(torch.equal(ema[k], state["ema"][k]) for k in ema)
    assert rundir.weights_epoch(out / "ema.safetensors") == 2
    last = load_file(out / "last.safetensors")
    assert any(not torch.equal(ema[k], last[k]) for k in ema)  # an average, not the last weights
    results = json.loads((out / "results.json").read_text())["results"]
    assert set(results) == {"last", "best", "ema"} and set(results["ema"]) == {"12", "16", "24"}
    assert results["ema"]["16"]["acc"] == pytest.approx(records(out, "epoch")[-1]["ema_val_acc"])
    evals = [r for r in records(out, "eval_res") if r["model"] == "ema"]
    assert sorted(r["res"] for r in evals) == [12, 16, 24]
    rows = run_script("resolution_sweep", [str(out), "--res", "12", "24", "--weights", "ema", "--out",
                                           str(tmp_path / "sweep")])
    swept = {r["res"]: r["acc"] for r in rows}
    assert swept == pytest.approx({12: results["ema"]["12"]["acc"], 24: results["ema"]["24"]["acc"]})
    assert all(r["weights"] == "ema" for r in rows)
    picture = tmp_path / "ema.png"
    run_script("visualize", ["--run", str(out), "--which", "ema", "--kind", "similarity", "--out", str(picture)])
    assert picture.stat().st_size > 1000
    model, _ = restore.load_model(out, "ema")
    assert all(torch.equal(v, ema[k]) for k, v in model.state_dict().items())


def test_accumulated_steps_train_as_one_larger_batch(tmp_path):
    base = TINY + ["--pe", "rope_axial", "--label-smoothing", "0", "--epochs", "1", "--warmup-epochs", "0.5"]
    train_main(base + ["--batch-size", "16", "--output", str(tmp_path / "big")])
    train_main(base + ["--batch-size", "8", "--grad-accum-steps", "2", "--output", str(tmp_path / "accum")])
    big, accum = load_file(tmp_path / "big" / "last.safetensors"), load_file(tmp_path / "accum" / "last.safetensors")
    for key in big:
        torch.testing.assert_close(accum[key], big[key], rtol=1e-4, atol=1e-5)
    one, two = records(tmp_path / "big", "epoch")[0], records(tmp_path / "accum", "epoch")[0]
    assert one["lr"] == pytest.approx(two["lr"])  # the schedule counts optimizer steps: 4 in both
    assert one["train_loss"] == pytest.approx(two["train_loss"], rel=1e-4)


def tiny_cfg(**changes) -> dict:
    cfg = settings.resolve({"embed_dim": 16, "depth": 3, "num_heads": 2, "img_size": 16, "patch_size": 4, **changes})
    return cfg


@pytest.mark.parametrize("pe", ["rope_mixed+learned", "rel_bias", "cpb", "peg"])
def test_layer_decay_groups_are_timms_and_keep_position_parameters_undecayed(pe):
    model = models.build_model(tiny_cfg(pe=pe))
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    undecayed = lambda opt: {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    plain = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    assert undecayed(optimizer) == undecayed(plain)  # layer decay scales learning rates, never who decays
    encodings = {names[id(p)] for family in visionpe.encodings_of(model).values() for m in family
                 for p in m.parameters()}
    excluded = encodings & model.no_weight_decay()  # every encoding's own but PEG's (a convolution CPVT decays)
    assert excluded == (set() if pe == "peg" else encodings) and excluded <= undecayed(optimizer)
    depth = 3
    for name, param in model.named_parameters():
        group = group_of[id(param)]
        if name.startswith("blocks."):
            layer = int(name.split(".")[1]) + 1
        elif name.startswith(("cls_token", "patch_embed", "pe_tokens", "pos_embed")):
            layer = 0  # the stem, a tokens encoding included
        elif name.startswith("norm."):
            layer = depth  # timm groups the final norm with the last block
        else:
            layer = depth + 1  # the head
        assert group["lr_scale"] == pytest.approx(0.5 ** (depth + 1 - layer)), name
    assert any(g["weight_decay"] == 0.05 for g in optimizer.param_groups)


def test_layer_decay_run_scales_each_group(tmp_path):
    out = tmp_path / "run"
    train_main(TINY + ["--pe", "rope_mixed", "--layer-decay", "0.5", "--epochs", "1", "--output", str(out)])
    groups = torch.load(out / "state.pt", weights_only=True)["optimizer"]["param_groups"]
    top = max(g["lr"] for g in groups)
    assert {round(g["lr"] / top, 6) for g in groups} == {1.0, 0.5, 0.25}  # head, the block, the stem
    assert records(out, "epoch")[0]["lr"] == pytest.approx(top)


def test_channels_last_trains_the_same_model(tmp_path, monkeypatch):
    formats = []
    to_format = loop.to_memory_format
    monkeypatch.setattr(loop, "to_memory_format", lambda x, cl: formats.append(
        to_format(x, cl).is_contiguous(memory_format=torch.channels_last) and cl) or to_format(x, cl))
    base = TINY + ["--pe", "learned", "--epochs", "1"]
    train_main(base + ["--channels-last", "--output", str(tmp_path / "cl")])
    assert formats and all(formats)
    train_main(base + ["--output", str(tmp_path / "plain")])
    a, b = load_file(tmp_path / "cl" / "last.safetensors"), load_file(tmp_path / "plain" / "last.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
    probe = loop.channels_last_(models.build_model(tiny_cfg(pe="peg")))
    assert probe.patch_embed.proj.weight.is_contiguous(memory_format=torch.channels_last)
    assert probe.pe_tokens.proj.weight.is_contiguous(memory_format=torch.channels_last)
    model, _ = restore.load_model(tmp_path / "cl", "last")  # saved contiguous, loads into a plain model
    assert model.patch_embed.proj.weight.is_contiguous()


def test_compiled_run_trains_and_its_checkpoint_loads_into_an_eager_model(tmp_path, monkeypatch):
    compiled_modules, compile = [], torch.compile

    def aot_eager(model, **kwargs):  # dynamo and AOTAutograd as --compile runs them, without inductor's codegen
        compiled_modules.append(model)
        return compile(model, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", aot_eager)
    base = TINY + ["--pe", "rope_axial", "--epochs", "1", "--train-samples", "32", "--val-samples", "16"]
    compiled = train_main(base + ["--compile", "--output", str(tmp_path / "compiled")])
    assert len(compiled_modules) == 1 and isinstance(compiled_modules[0], PositionalModel)
    train_main(base + ["--output", str(tmp_path / "eager")])
    a, b = load_file(tmp_path / "compiled" / "last.safetensors"), load_file(tmp_path / "eager" / "last.safetensors")
    assert a.keys() == b.keys()  # no _orig_mod. prefix: the eager module's names
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4)
    # the eager model rebuilt from the checkpoint gives the logits the run measured (its loss at the training size)
    rows = run_script("resolution_sweep", [str(tmp_path / "compiled"), "--res", "16", "--out", str(tmp_path / "sw")])
    assert rows[0]["loss"] == compiled["results"]["last"]["16"]["loss"]
    assert rows[0]["acc"] == compiled["results"]["last"]["16"]["acc"]
    epochs = records(tmp_path / "compiled", "epoch")
    assert epochs[0]["val_loss"] == pytest.approx(compiled["results"]["last"]["16"]["loss"], rel=1e-4)


class NetworkUsed(AssertionError):
    """A test tried to reach the network."""


@pytest.fixture
def no_network(monkeypatch):
    """Every way timm could fetch weights raises (and is recorded): the socket itself and timm's hub helpers."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args[:2])
        raise NetworkUsed(f"network access attempted: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    import timm.models._builder as builder
    import timm.models._hub as hub
    for module, name in ((builder, "load_state_dict_from_url"), (builder, "load_state_dict_from_hf"),
                         (builder, "download_cached_file"), (hub, "hf_hub_download"),
                         (torch.hub, "download_url_to_file"), (torch.hub, "load_state_dict_from_url")):
        monkeypatch.setattr(module, name, refuse)
    return attempts


SIZES = ["--img-size", "16", "--patch-size", "4", "--embed-dim", "16", "--depth", "2", "--num-heads", "2"]


def saved_timm_vit(path: Path, num_classes: int = 7) -> dict:
    torch.manual_seed(3)
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, embed_dim=16,
                               depth=2, num_heads=2, num_classes=num_classes)
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, path)
    return state


def test_pretrained_weights_from_a_local_file_convert_and_never_download(tmp_path, no_network):
    path = tmp_path / "vit_tiny.safetensors"
    source = saved_timm_vit(path)
    cfg = tiny_cfg(model="vit_tiny_patch16_224", pe="rope_mixed+learned", pretrained=True, pretrained_path=str(path),
                   depth=2)
    model = models.build_model(cfg)
    record = restore.pretrained_weights(model, cfg, models.pretrained_source(cfg, models.model_plan(cfg)))
    weights = model.state_dict()
    assert record["source"] == f"timm:vit_tiny_patch16_224 from {path}" and record["head_reset"]
    assert "pos_embed -> pe_tokens.table" in record["converted"]
    torch.testing.assert_close(weights["pe_tokens.table"].flatten(), source["pos_embed"][:, 1:].flatten())
    for key in ("blocks.1.attn.qkv.weight", "patch_embed.proj.weight", "cls_token", "norm.weight"):
        assert torch.equal(weights[key], source[key]), key
    assert not torch.equal(weights["head.weight"][:1], source["head.weight"][:1])  # timm's train.py: a new head
    assert any("rotary.freqs" in k for k in record["new"])  # RoPE-Mixed starts fresh
    out = tmp_path / "run"
    train_main(TINY + SIZES + ["--pe", "rope_mixed+learned", "--pretrained", "--pretrained-path", str(path),
                               "--epochs", "1", "--output", str(out)])
    init = next(r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "init")
    assert init["source"].startswith("timm:vit_tiny_patch16_224") and init["source_pe"] == "timm"
    assert yaml.safe_load((out / "config.yaml").read_text())["pretrained_path"] == str(path)
    assert no_network == []


def test_pretrained_from_the_hub_offline_is_one_line(tmp_path, no_network, capsys):
    with pytest.raises(SystemExit):
        train_main(TINY + SIZES + ["--pretrained", "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "timm could not load its weights from the Hugging Face hub" in err, err
    # it tried, and the guard caught it; unless timm cannot import the installed huggingface_hub at all (timm 1.0.19
    # imports repo_type_and_id_from_hf_id, which huggingface_hub 2.4 no longer has): then timm refuses before any
    # network access, as a hub that is not installed, and the error is still that one line
    from timm.models._hub import _has_hf_hub
    assert no_network or (not _has_hf_hub and "huggingface_hub" in err), err


def test_pretrained_without_sizes_keeps_the_models_own():
    cfg = settings.resolve({"model": "vit_small_patch16_224", "pretrained": True})
    assert "embed_dim" not in cfg["model_kwargs"] and models.model_kwargs(cfg)["img_size"] == 32


KILLER = '''
import os
from visionpe.train import rundir

_save = rundir.save_checkpoint


def save(*args, progress=None, **kwargs):  # rank 0 dies right after its first commit within an epoch
    _save(*args, progress=progress, **kwargs)
    if progress is not None and os.environ.get("VISIONPE_TEST_KILL") == "1":
        os._exit(9)


rundir.save_checkpoint = save
'''


def torchrun(args, env_extra=None, expect_ok=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train_vit.py"), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=240)
    assert (proc.returncode == 0) == expect_ok, proc.stderr[-3000:]
    return proc


def test_torchrun_run_killed_within_an_epoch_resumes_exactly(tmp_path, capsys):
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    args = TINY + ["--pe", "rope_mixed", "--model-ema", "--grad-accum-steps", "2", "--batch-size", "8",
                   "--checkpoint-every-minutes", "1e-9", "--epochs", "1", "--import", str(killer)]  # rank 0's clock
    torchrun(args + ["--output", str(tmp_path / "full")])
    killed = tmp_path / "killed"
    torchrun(args + ["--output", str(killed)], {"VISIONPE_TEST_KILL": "1"}, expect_ok=False)
    progress = torch.load(killed / "state.pt", weights_only=True)["progress"]
    assert progress["step"] == 2 and len(progress["sums"]) == 2  # after the first step, both processes' sums
    with pytest.raises(SystemExit):
        train_main(["--resume", str(killed)])
    assert "by 2 process(es); resume it with as many" in capsys.readouterr().err
    torchrun(["--resume", str(killed)])
    assert timeless(records(killed, "epoch")) == timeless(records(tmp_path / "full", "epoch"))
    for name in ("last.safetensors", "ema.safetensors"):
        assert same_weights(killed / name, tmp_path / "full" / name), name
