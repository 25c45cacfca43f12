"""FSDP2 and distributed checkpoints on this CPU (visionpe.train.parallel), in real 2-process gloo groups under torchrun
(tests/train/parallel_worker.py): FSDP2's weights after a few steps equal DDP's for several encodings; a training run
SIGKILLed between steps resumes from its DCP checkpoint bit for bit; a checkpoint written by 2 processes resumes on 1
with the next-step loss of a 2-process resume; exports load with visionpe.load_weights / load_timm_checkpoint. Plus
one-process checks of the checkpoint protocol (atomic commits, a failed save leaves the previous one)."""
from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import requires
from safetensors.torch import load_file
from tinymodels import BUILDS, example_input, logits
from trainutil import kill_torchrun, run_torchrun

import visionpe as vpe
from visionpe.train import parallel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "parallel_worker.py"
TIMEOUT = 420  # seconds for one torchrun launch on a loaded 2-core machine (about a minute when idle)
pytestmark = requires("torch", "2.6", "torch.distributed.fsdp.fully_shard and DCP's state_dict API")
import parallel_worker  # noqa: E402  (beside this file: pytest puts tests/train on the path)


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}


def torchrun(processes: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            str(WORKER), *args]


def run(processes: int, *args: str) -> str:
    return run_torchrun(torchrun(processes, *args), env=env(), timeout=TIMEOUT)


def run_until_killed(after: str, *args: str) -> str:
    """Start a 2-process run and SIGKILL it (launcher and workers) once ``after`` is printed."""
    proc = subprocess.Popen(torchrun(2, *args), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env(), cwd=ROOT, start_new_session=True)
    seen, start = [], time.monotonic()
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.strip() == after or time.monotonic() - start > TIMEOUT:
                break
    finally:
        kill_torchrun(proc)  # the workers too: they would go on without the launcher
    assert any(line.strip() == after for line in seen), "".join(seen)[-2000:]
    assert proc.returncode == -signal.SIGKILL
    return "".join(seen)


STEPS = 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """FSDP against DDP, then an uninterrupted 2-process run (one launch); a run killed after a commit and resumed;
    that commit resumed on 1 process."""
    base = tmp_path_factory.mktemp("runs")
    full, killed, kept, one = base / "full", base / "killed", base / "kept", base / "one"
    run(2, "train", str(full), "--steps", str(STEPS), "--equal")
    run_until_killed("committed step 2", "train", str(killed), "--steps", str(STEPS))
    shutil.copytree(killed / "checkpoint", kept)  # the commit the kill left, before the resume replaces it
    run(2, "train", str(killed), "--steps", str(STEPS), "--resume", str(killed / "checkpoint"))
    committed = int(parallel.latest_checkpoint(kept).name.split("-")[1])
    run(1, "train", str(one), "--steps", str(committed + 1), "--resume", str(kept))
    return {"full": full, "killed": killed, "kept": kept, "one": one, "committed": committed}


def test_fsdp_weights_equal_ddp_weights_after_a_few_steps(runs):
    """Three SGD steps of two accumulated micro-batches each, EMA included: FSDP2 (sharded parameters, gradients
    reduce-scattered) and DDP (all-reduced) agree to float rounding, far below how far the weights moved."""
    equal = json.loads((runs["full"] / "equal.json").read_text())
    for pe in parallel_worker.EQUAL_PES:
        got = equal[pe]
        assert got["keys_equal"] and got["sharded"], pe
        assert got["moved"] > 1e-2, pe
        assert got["max_diff"] < 1e-6, (pe, got)
        assert got["ema_max_diff"] < 1e-6, (pe, got)


def test_a_killed_run_resumes_bit_for_bit(runs):
    full, killed = runs["full"], runs["killed"]
    assert json.loads((killed / "losses.json").read_text()) == json.loads((full / "losses.json").read_text())
    for name in ("final.safetensors", "ema.safetensors"):
        a, b = load_file(full / name), load_file(killed / name)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert not list((killed / "checkpoint").glob(".*.tmp"))  # the resumed run's commits cleaned the killed one's


def test_a_two_process_checkpoint_resumes_on_one_process(runs):
    """DCP reshards: the step after the commit, trained by 1 process from the 2-process shards, has the loss (and
    weights) the 2-process resume had, to float rounding (the reduction order differs)."""
    k = runs["committed"]
    two = json.loads((runs["killed"] / "losses.json").read_text())  # the 2-process resume of the same commit
    one = json.loads((runs["one"] / "losses.json").read_text())
    assert one[:k] == two[:k]  # carried in the checkpoint
    assert one[k] == pytest.approx(two[k], rel=1e-6, abs=1e-7)
    if k + 1 == STEPS:
        one, two = (load_file(runs[d] / "final.safetensors") for d in ("one", "killed"))
        assert max(float((one[n] - two[n]).abs().max()) for n in two) < 1e-5


def tiny_model():
    return parallel_worker.build(parallel_worker.TRAIN_PE, "cpu")


def test_the_export_loads_with_load_weights_and_load_timm_checkpoint(runs):
    path = runs["full"] / "final.safetensors"
    state = load_file(path)
    model = tiny_model()
    vpe.load_weights(model, path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    other = tiny_model()
    report = vpe.load_timm_checkpoint(other, path, strict=True)
    assert not report.dropped and not report.new
    assert all(torch.equal(other.state_dict()[k], v) for k, v in state.items())


def test_a_two_process_checkpoint_loads_into_a_plain_model_without_a_group(runs):
    """No process group at all (inference, a notebook): DCP reads every shard into whole tensors."""
    assert not dist.is_initialized()
    model = tiny_model()
    optimizer = parallel_worker.optimizer_for(model)
    extra = parallel.load_checkpoint(parallel.latest_checkpoint(runs["killed"] / "checkpoint"), model, optimizer)
    assert extra["step"] == STEPS and len(extra["losses"]) == STEPS
    final = load_file(runs["full"] / "final.safetensors")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in final.items())
    assert len(optimizer.state) == len(list(model.parameters()))  # Adam's moments came back


# -- the checkpoint protocol, one process ----------------------------------------------------------------------------
@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_commits_are_atomic_and_a_failed_save_keeps_the_previous_one(tmp_path, group, monkeypatch):
    model = parallel.parallelize(tiny_model(), "fsdp", "cpu")
    optimizer = parallel_worker.optimizer_for(model)
    directory = tmp_path / "checkpoint"
    assert parallel.latest_checkpoint(directory) is None
    first = parallel.save_checkpoint(directory, model, optimizer, tag="step-1", extra={"step": 1})
    assert parallel.latest_checkpoint(directory) == first
    import torch.distributed.checkpoint as dcp
    real_save = dcp.save

    def dies_half_way(state, checkpoint_id):
        real_save({"model": state["model"]}, checkpoint_id=checkpoint_id)  # some shards written, then the kill
        raise KeyboardInterrupt
    monkeypatch.setattr(dcp, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        parallel.save_checkpoint(directory, model, optimizer, tag="step-2", extra={"step": 2})
    monkeypatch.setattr(dcp, "save", real_save)
    assert parallel.latest_checkpoint(directory) == first  # the half-written folder is not the commit
    fresh = parallel.parallelize(tiny_model(), "fsdp", "cpu")
    assert parallel.load_checkpoint(first, fresh, parallel_worker.optimizer_for(fresh)) == {"step": 1}
    second = parallel.save_checkpoint(directory, model, optimizer, tag="step-2", extra={"step": 2})
    assert sorted(p.name for p in directory.iterdir()) == ["latest", "step-2"]  # the stale temporary is gone too
    assert parallel.latest_checkpoint(directory) == second


def test_the_index_reader_finds_the_globals_of_a_real_index_and_nothing_else(tmp_path, group):
    """The allow-list against a real commit (FSDP model, Adam moments, EMA, extra): every global its index names is
    allowed, and the list holds nothing but DCP's dataclasses, torch's value types and a path."""
    model = parallel.parallelize(tiny_model(), "fsdp", "cpu")
    optimizer = parallel_worker.optimizer_for(model)
    ema = parallel.parallelize(tiny_model(), "fsdp", "cpu")
    parallel_worker.train_step(model, optimizer, 0, "cpu")  # Adam moments in the state
    folder = parallel.save_checkpoint(tmp_path, model, optimizer, tag="epoch-1", ema=ema, extra={"epoch": 1})
    named = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            named.add((module, name))
            return super().find_class(module, name)
    with open(folder / parallel.METADATA, "rb") as f:
        Recording(f).load()
    assert named <= parallel.METADATA_GLOBALS and ("torch", "float32") in named
    assert {module for module, _ in parallel.METADATA_GLOBALS} == {
        "torch", "torch.serialization", "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.filesystem", "pathlib", "pathlib._local"}
    assert not any(callable(getattr(torch, name)) for module, name in parallel.METADATA_GLOBALS
                   if module == "torch" and name != "Size")  # dtypes, layouts, memory formats: values
    assert parallel.read_metadata(folder).state_dict_metadata.keys() == \
        pickle.loads((folder / parallel.METADATA).read_bytes()).state_dict_metadata.keys()


class Touch:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_the_index_reader_refuses_what_dcp_does_not_write(tmp_path):
    """A pickle naming anything but DCP's classes is refused unread (its code never runs); a genuine index of another
    shape, a data file outside the folder, or bytes that are no pickle are refused too, each naming the file."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex
    index, marker = tmp_path / parallel.METADATA, tmp_path / "ran"
    outside = Metadata({"extra": BytesStorageMetadata()},
                       storage_data={MetadataIndex("extra"): _StorageInfo("../../x.distcp", 0, 1)})
    cases = [(Touch(marker), "names pathlib.Path.touch, which no DCP index holds"),
             (os.system, "names posix.system"), (eval, "names builtins.eval"), (getattr, "names builtins.getattr"),
             ({"state_dict_metadata": {}}, "is not a DCP index"), (outside, "names the data file '../../x.distcp'")]
    for value, message in cases:
        index.write_bytes(pickle.dumps(value))
        with pytest.raises(parallel.RefusedCheckpoint, match=f"^{index} {message}"):
            parallel.read_metadata(tmp_path)
    index.write_bytes(b"\x80\x04garbage")
    with pytest.raises(parallel.RefusedCheckpoint, match=f"cannot read {index}: damaged or not a DCP index"):
        parallel.read_metadata(tmp_path)
    assert not marker.exists()


def test_gradient_sync_is_off_inside_no_gradient_sync_only(group):
    model = parallel.parallelize(tiny_model(), "fsdp", "cpu")
    states = [s for m in model.modules() if isinstance(m, parallel.fsdp_api()[3]) for s in [m._get_fsdp_state()]]
    groups = [s._fsdp_param_group for s in states if s._fsdp_param_group is not None]
    with parallel.no_gradient_sync(model):
        assert not any(g.reduce_grads for g in groups) and not any(g.reshard_after_backward for g in groups)
    assert all(g.reduce_grads for g in groups) and all(g.reshard_after_backward for g in groups)


def test_a_meta_build_is_sharded_then_materialised_and_trains(group):
    with torch.device("meta"):
        model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+cpb+learned", **parallel_worker.TINY)
    model = parallel.parallelize(model, "fsdp", "cpu")
    assert not any(p.is_meta for p in model.parameters()) and not any(b.is_meta for b in model.buffers())
    eager = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+cpb+learned", **parallel_worker.TINY)
    for (name, b), (_, e) in zip(model.named_buffers(), eager.named_buffers()):
        assert torch.equal(b, e), name
    for name, p in model.named_parameters():  # timm's init scheme reached through the sharded model's adapter
        reference = eager.get_parameter(name)
        if p.numel() > 8 and reference.std() > 0:
            assert 0.5 < float(p.full_tensor().std() / reference.detach().std()) < 2, name
    loss = model(torch.randn(2, 3, 16, 16)).logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad.full_tensor()).all() for p in model.parameters())


@pytest.mark.parametrize("name", list(BUILDS))
def test_every_backbone_shards_per_block_and_trains_as_unsharded(group, name):
    """timm ViT and Swin (v1, v2), the tubelet video ViT, torchvision's ViT and Video Swin, transformers' ViT: one unit
    per transformer block, one per encoding with parameters, the root; a step's gradients are the plain model's."""
    from visionpe.backbones import repeated_blocks
    torch.manual_seed(0)
    plain = BUILDS[name]()
    sharded = parallel.parallelize(copy.deepcopy(plain), "fsdp", "cpu")
    fsdp_module = parallel.fsdp_api()[3]
    assert all(isinstance(b, fsdp_module) for b in repeated_blocks(sharded))
    assert all(isinstance(e, fsdp_module) for e in sharded.modules()
               if isinstance(e, vpe.Encoding) and any(True for _ in e.parameters()))
    x = example_input(name)
    for model in (plain, sharded):
        torch.manual_seed(1)  # the same drop-path draws (timm's Swin default 0.1)
        logits(model(x)).logsumexp(-1).mean().backward()
    for (n, p), (_, q) in zip(plain.named_parameters(), sharded.named_parameters()):
        if p.grad is None:
            assert q.grad is None, n
            continue
        torch.testing.assert_close(q.grad.full_tensor(), p.grad, rtol=1e-5, atol=1e-6, msg=n)
    if hasattr(plain, "forward_masked"):  # an entry point besides forward, registered with FSDP
        keep = torch.tensor([[0, 2, 3]])
        with torch.no_grad():
            torch.testing.assert_close(sharded.forward_masked(x, keep=keep)[0], plain.forward_masked(x, keep=keep)[0])


def step_gradients(model) -> dict:
    x, y = parallel_worker.batch(0, 0, 1, 0, "cpu")
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return {n: p.grad.full_tensor() for n, p in model.named_parameters()}


@pytest.mark.parametrize("options", [dict(grad_checkpointing=True), dict(compile={"backend": "eager"})],
                         ids=["grad_checkpointing", "compile"])
def test_checkpointed_or_compiled_blocks_give_the_same_gradients(group, options):
    """Activation checkpointing (the model's own, replaying coordinate draws) and torch.compile per block (dynamo;
    inductor's kernels are the GPU check's) under FSDP2 leave every gradient as it was."""
    torch._dynamo.reset()
    plain = step_gradients(parallel.parallelize(tiny_model(), "fsdp", "cpu"))
    other = step_gradients(parallel.parallelize(tiny_model(), "fsdp", "cpu", **options))
    assert plain.keys() == other.keys()
    for n in plain:
        torch.testing.assert_close(other[n], plain[n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("mode", parallel.MODES)
def test_memory_per_rank_counts_the_bytes_each_rank_holds(group, mode):
    """One process: the whole model is this rank's; AdamW keeps two moments per parameter and a step count per
    tensor; the peak RSS includes everything before the model."""
    got = parallel.measure_memory("vit_tiny_patch16_224", mode, "cpu", batch_size=1, img_size=16, patch_size=4,
                                  embed_dim=16, depth=2, num_heads=2, num_classes=3)
    model = vpe.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2,
                             num_classes=3)
    params = [p for p in model.parameters()]
    size = sum(p.numel() * 4 for p in params)
    assert got["parameters"] == size and got["gradients"] == size
    assert got["optimizer"] == 2 * size + 4 * len(params)  # exp_avg, exp_avg_sq, and a float32 step each
    assert got["peak_rss"] >= got["rss_before"] > 0


def test_scaling_memory_table_and_bad_arguments(capsys):
    from visionpe.bench import scaling_memory
    from visionpe.cli.commands import main
    rank = {"parameters": 2**30, "gradients": 2**30, "optimizer": 2**31, "peak_rss": 5 * 2**30, "rss_before": 2**29}
    text = scaling_memory.table([{"model": "vit_x", "mode": "fsdp", "ranks": [rank, {**rank, "peak_rss": 1}]}], 2, 4,
                                224)
    assert "| vit_x | fsdp | 1.00 GiB | 1.00 GiB | 2.00 GiB | 4.00 GiB | 5.00 GiB | 0.50 GiB |" in text
    assert text.endswith("per rank, 2 processes, batch 4 per rank at 224 px, one AdamW step")
    with pytest.raises(SystemExit) as exit_:
        main(["scaling-memory", "--batch-size", "0"])
    assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_bad_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="mode='zero3'.*'ddp', 'fsdp'"):
        parallel.parallelize(tiny_model(), "zero3", "cpu")
