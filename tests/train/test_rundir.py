"""The run directory under stress (issue 9): kills at every write, --overwrite, changed settings on resume, a
diverging loss, file modes, an ImageFolder run swept afterwards. Runs are tiny and run in this process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file
from trainutil import ROOT, run_script, train_main

from visionpe.weights import io as checkpoint
from visionpe import data as vdata
from visionpe.train import rundir

MINI = ["--data", "shapes-position", "--train-samples", "32", "--val-samples", "16", "--batch-size", "16",
        "--epochs", "2", "--img-size", "16", "--patch-size", "4", "--embed-dim", "8", "--depth", "1",
        "--num-heads", "2", "--warmup-epochs", "0.5", "--lr", "3e-3", "--no-progress", "--threads", "1",
        "--pe", "rope_mixed"]


class Killed(BaseException):
    """A simulated SIGKILL: nothing in the code under test catches it."""


class KillAt:
    """Wraps ``checkpoint.atomic_write`` and ``rundir._unlink``; every write has two instants (before the data is
    written, and after it is written but before the rename) and every deletion one; the ``k``-th instant raises
    :class:`Killed` (``k=None``: count only)."""

    def __init__(self, monkeypatch, k=None):
        self.k, self.count = k, 0
        real_write, real_unlink = checkpoint.atomic_write, rundir._unlink

        def write(path, fn):
            def wrapped(tmp):
                self.tick()
                fn(tmp)
                self.tick()
            real_write(path, wrapped)

        def unlink(path):
            if Path(path).exists():
                self.tick()
            real_unlink(path)

        monkeypatch.setattr(checkpoint, "atomic_write", write)
        monkeypatch.setattr(rundir, "_unlink", unlink)

    def tick(self):
        if self.count == self.k:
            self.count += 1
            raise Killed(self.count)
        self.count += 1


def epochs_of(out):
    strip = lambda r: {k: v for k, v in r.items() if k not in ("img_per_s", "epoch_time_s")}
    return [strip(json.loads(line)) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def same_weights(a, b):
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    train_main(MINI + ["--output", str(out)])
    return out


def test_a_kill_at_any_write_leaves_a_run_that_resumes_exactly(reference, tmp_path, monkeypatch):
    with monkeypatch.context() as m:  # how many instants a whole run has
        counter = KillAt(m)
        train_main(MINI + ["--output", str(tmp_path / "count")])
    assert counter.count >= 20
    for k in range(counter.count):
        out = tmp_path / f"k{k}"
        with monkeypatch.context() as m:
            KillAt(m, k)
            with pytest.raises(Killed):
                train_main(MINI + ["--output", str(out)])
        assert not rundir.temp_files(out)
        if not (out / "config.yaml").exists():  # killed before the run existed: no file of it, start it again
            assert not rundir.existing(out), k
            train_main(MINI + ["--output", str(out)])
        elif not (out / "results.json").exists():
            train_main(["--resume", str(out)])
        assert same_weights(out / "last.safetensors", reference / "last.safetensors"), k
        assert same_weights(out / "best.safetensors", reference / "best.safetensors"), k
        assert epochs_of(out) == epochs_of(reference), k
        state = torch.load(out / "state.pt", weights_only=True)
        assert state["epoch"] == 2 and json.loads((out / "results.json").read_text())["epochs"] == 2


# within an epoch: 32 images, 8 a batch, 2 batches a step: 2 optimizer steps an epoch, a commit after the first
WITHIN = MINI + ["--batch-size", "8", "--grad-accum-steps", "2", "--checkpoint-every-steps", "1", "--model-ema",
                 "--model-ema-decay", "0.5", "--drop-path", "0.1", "--mixup", "0.3"]


def test_a_kill_at_any_write_within_epochs_resumes_exactly(tmp_path, monkeypatch):
    """Every instant of a run that also commits within each epoch (with EMA, accumulation and RNG streams to
    restore): killed there, then resumed, it ends as the run that was never killed."""
    reference = tmp_path / "reference"
    commits = []
    save = rundir.save_checkpoint
    with monkeypatch.context() as m:
        m.setattr(rundir, "save_checkpoint", lambda *a, **k: commits.append(k.get("progress")) or save(*a, **k))
        train_main(WITHIN + ["--output", str(reference)])
    assert [c is not None for c in commits] == [True, False, True, False]  # within epoch 1, its end, within 2, end
    assert commits[0]["step"] == 2 and commits[2]["step"] == 2
    resumed_within = 0
    for k, out, within in killed_and_finished(WITHIN, tmp_path, monkeypatch):
        resumed_within += within
        for name in ("last.safetensors", "best.safetensors", "ema.safetensors"):
            assert same_weights(out / name, reference / name), (k, name)
        assert epochs_of(out) == epochs_of(reference), k
    assert resumed_within >= 4  # several kills fell after a commit within an epoch


def killed_and_finished(argv, tmp_path, monkeypatch):
    """For every instant ``k`` of the run ``argv``: the run killed there (no temporary left behind), then finished
    as its user would (started again when killed before it existed, else ``--resume``); yields ``(k, run folder,
    whether the resume continued a commit within an epoch)``."""
    with monkeypatch.context() as m:
        counter = KillAt(m)
        train_main(argv + ["--output", str(tmp_path / "count")])
    for k in range(counter.count):
        out, within = tmp_path / f"k{k}", False
        with monkeypatch.context() as m:
            KillAt(m, k)
            with pytest.raises(Killed):
                train_main(argv + ["--output", str(out)])
        assert not rundir.temp_files(out)
        if not (out / "config.yaml").exists():
            train_main(argv + ["--output", str(out)])
        elif not (out / "results.json").exists():
            state = rundir.load_checkpoint(out)
            within = state is not None and "progress" in state
            train_main(["--resume", str(out)])
        yield k, out, within


def test_a_kill_during_resume_repairs_leaves_it_resumable(reference, tmp_path, monkeypatch):
    """Kill the first save after epoch 2 at every instant, then kill the resume's own repair at every instant."""
    base = tmp_path / "base"
    train_main(MINI + ["--output", str(base), "--stop-after", "1"])
    for k in range(8):
        out = tmp_path / f"k{k}"
        shutil.copytree(base, out)
        with monkeypatch.context() as m:
            KillAt(m, 2 + k % 6)  # inside the save of epoch 2 (after state.pt, before the exports finish)
            with pytest.raises(Killed):
                train_main(["--resume", str(out)])
        with monkeypatch.context() as m:
            KillAt(m, k // 6)  # then inside the repair of the next resume
            try:
                train_main(["--resume", str(out)])
            except Killed:
                pass
        if not (out / "results.json").exists():
            train_main(["--resume", str(out)])
        assert same_weights(out / "last.safetensors", reference / "last.safetensors"), k
        assert epochs_of(out) == epochs_of(reference), k


def test_stray_temp_files_are_removed_on_the_next_start(tmp_path, capsys):
    out = tmp_path / "run"
    train_main(MINI + ["--output", str(out), "--stop-after", "1"])
    stray = [out / ".state.pt.1a2b3c4d.tmp", out / ".last.safetensors.00ff00ff.tmp", out / ".metrics.jsonl.x.tmp"]
    mine = [out / "notes.txt", out / ".my-editor.tmp", out / "state.pt.bak"]
    for path in stray + mine:
        path.write_bytes(b"\x00" * 10)
    train_main(["--resume", str(out)])
    assert not any(p.exists() for p in stray)
    assert all(p.exists() for p in mine)  # never the user's files
    assert "removed the interrupted write .state.pt.1a2b3c4d.tmp" in capsys.readouterr().out


def test_damaged_exports_are_rebuilt_from_state_on_resume(reference, tmp_path, capsys):
    out = tmp_path / "run"
    train_main(MINI + ["--output", str(out), "--stop-after", "1"])
    (out / "last.safetensors").write_bytes(b"\x07" * 100)  # truncated / random bytes
    (out / "best.safetensors").unlink()
    (out / "metrics.jsonl").write_text("")
    train_main(["--resume", str(out)])
    assert "re-exported last.safetensors, best.safetensors, metrics.jsonl from state.pt (epoch 1)" in \
        capsys.readouterr().out
    assert same_weights(out / "last.safetensors", reference / "last.safetensors")
    assert epochs_of(out) == epochs_of(reference)


def test_overwrite_clears_the_previous_run_and_a_killed_overwrite_shows_none_of_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train_main(MINI + ["--output", str(out), "--seed", "1"])
    (out / "notes.txt").write_text("mine")
    old = {name: (out / name).read_bytes() for name in rundir.existing(out)}
    for k in (1, 2, 4, 6, 7, 9, 12, 17):  # instants 0-5 delete the old files, 6-7 write config.yaml, ...
        with monkeypatch.context() as m:
            KillAt(m, k)
            with pytest.raises(Killed):
                train_main(MINI + ["--output", str(out), "--overwrite", "--seed", "2"])
        left = {name: (out / name).read_bytes() for name in rundir.existing(out)}
        assert "results.json" not in left, k
        old_left = [name for name in left if left[name] == old[name]]
        assert not old_left or len(old_left) == len(left), (k, old_left, list(left))  # never old and new together
        assert "config.yaml" not in old_left or k < 2  # what stays of the old run cannot be loaded or resumed
        assert (out / "notes.txt").read_text() == "mine"
        train_main(MINI + ["--output", str(out), "--seed", "1", "--overwrite"])  # the old run again
        old = {name: (out / name).read_bytes() for name in rundir.existing(out)}
    train_main(MINI + ["--output", str(out), "--overwrite", "--seed", "2"])
    assert json.loads((out / "results.json").read_text())["seed"] == 2
    assert (out / "notes.txt").read_text() == "mine"


def test_resume_applies_safe_changes_and_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    train_main(MINI + ["--output", str(out), "--stop-after", "1"])
    before = (out / "config.yaml").read_bytes()
    with pytest.raises(SystemExit):
        train_main(["--resume", str(out), "--pe", "rope_axial", "--depth", "2"])
    err = capsys.readouterr().err
    assert "pe ('rope_mixed' -> 'rope_axial')" in err and "model_kwargs.depth (1 -> 2)" in err
    assert (out / "config.yaml").read_bytes() == before  # a refused resume writes nothing
    train_main(["--resume", str(out), "--eval-res", "12", "24", "--eval-batch-size", "7", "--workers", "0",
                "--threads", "1", "--device", "cpu"])
    log = capsys.readouterr().out
    assert "eval_res changed from [] to [12, 24] (applied)" in log
    assert "eval_batch_size changed from 256 to 7 (applied)" in log and "device changed from 'auto' to 'cpu'" in log
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["eval_res"] == [12, 24] and cfg["device"] == "cpu" and cfg["pe"] == "rope_mixed"
    assert set(json.loads((out / "results.json").read_text())["results"]["last"]) == {"12", "16", "24"}


def test_a_run_killed_before_its_first_epoch_resumes_from_the_start(reference, tmp_path, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        KillAt(m, 2)  # config.yaml written, state.pt not yet
        with pytest.raises(Killed):
            train_main(MINI + ["--output", str(out)])
    assert rundir.existing(out) == ["config.yaml"]
    with pytest.raises(SystemExit):  # a fresh start must not silently replace it
        train_main(MINI + ["--output", str(out)])
    train_main(["--resume", str(out)])
    assert same_weights(out / "last.safetensors", reference / "last.safetensors")


def test_non_finite_loss_stops_with_one_line_and_keeps_nothing_new(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        train_main(MINI + ["--output", str(out), "--lr", "inf", "--weight-decay", "0"])  # (else refused first)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    for words in ("non-finite training loss", "step 2/2 of epoch 1", "last finite loss", "step 1 of epoch 1"):
        assert words in err, err
    assert rundir.existing(out) == ["config.yaml"]  # no weights, no metrics, no results


def test_non_finite_loss_in_epoch_2_keeps_the_checkpoint_of_epoch_1(reference, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    getitem = vdata.ImageTensorDataset.__getitem__

    def poisoned(self, index):  # the training images of epoch 2 are NaN
        x, y = getitem(self, index)
        return (x * float("nan") if self.epoch == 1 else x), y

    with monkeypatch.context() as m:
        m.setattr(vdata.ImageTensorDataset, "__getitem__", poisoned)
        with pytest.raises(SystemExit) as exit_info:
            train_main(MINI + ["--output", str(out)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "step 1/2 of epoch 2" in err and "checkpoint of epoch 1 is kept" in err
    assert "last finite loss" in err and "at step 2 of epoch 1" in err
    assert torch.load(out / "state.pt", weights_only=True)["epoch"] == 1
    assert rundir.weights_epoch(out / "last.safetensors") == 1 and not (out / "results.json").exists()
    train_main(["--resume", str(out)])  # the kept checkpoint continues as if nothing had happened
    assert same_weights(out / "last.safetensors", reference / "last.safetensors")


def test_kill_before_config_yaml_leaves_a_run_the_same_command_starts(tmp_path, capsys):
    """Issue 22 item 3: a kill before config.yaml exists (during its write: a stray temporary) leaves nothing to
    continue; --resume says to rerun the same command, and that command starts the run."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".config.yaml.k1ll3d.tmp").write_text("model: vit_tiny")  # a write cut short
    with pytest.raises(SystemExit):
        train_main(["--resume", str(out)])
    err = capsys.readouterr().err
    assert "no run to continue" in err and "rerun the same command without --resume" in err, err
    train_main(MINI + ["--output", str(out), "--epochs", "1"])
    assert (out / "results.json").is_file() and not rundir.temp_files(out)


def test_remains_without_config_yaml_say_rerun_with_overwrite(tmp_path, capsys):
    """A kill while --overwrite deleted a previous run (config.yaml goes first) leaves its state.pt and exports:
    neither a fresh start nor --resume may use them; both say to rerun the same command with --overwrite."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "state.pt").write_bytes(b"old run")
    (out / "metrics.jsonl").write_text("{}\n")
    for argv in (MINI + ["--output", str(out)], ["--resume", str(out)]):
        with pytest.raises(SystemExit):
            train_main(argv)
        err = capsys.readouterr().err
        assert "without config.yaml" in err or "no config.yaml" in err, err
        assert "state.pt" in err and "same command" in err and "--overwrite" in err, err
    train_main(MINI + ["--output", str(out), "--epochs", "1", "--overwrite"])
    assert (out / "results.json").is_file()


@pytest.mark.parametrize("epochs", ["1", "2"])
def test_diverged_weights_are_never_committed_nor_reported(tmp_path, capsys, epochs):
    """Issue 22: at --lr 1e10 one step leaves a finite training loss and NaN validation loss; the run used to exit 0
    with "loss": NaN and an accuracy in results.json (with more epochs: the diverged epoch 1 committed as "kept")."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        train_main(MINI + ["--output", str(out), "--lr", "1e10", "--weight-decay", "0", "--train-samples", "16",
                           "--epochs", epochs, "--warmup-epochs", "0"])  # (lr x weight_decay >= 1 is refused first)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err  # timm's one-step cosine warning not shown
    assert "non-finite validation loss" in err and "after epoch 1" in err and "no epoch was saved" in err, err
    assert rundir.existing(out) == ["config.yaml"]  # no state.pt, no weights, no metrics, no results


def test_check_finite_names_what_diverged_and_what_is_kept(tmp_path):
    from visionpe.train import commits
    model = torch.nn.Linear(2, 2)
    commits.check_finite(model, epoch=1, kept_epoch=0, val_loss=0.5)  # all finite: nothing
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(commits.NonFiniteLoss, match=r"non-finite weights \(1 tensors, e.g. weight\) at step 3/5 of "
                                                 r"epoch 2.*checkpoint of epoch 1 is kept"):
        commits.check_finite(model, epoch=2, kept_epoch=1, within="at step 3/5 of")
    with pytest.raises(commits.NonFiniteLoss, match="non-finite EMA validation loss"):
        commits.check_finite(torch.nn.Linear(2, 2), epoch=1, kept_epoch=0, val_loss=1.0, ema_loss=float("nan"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    with pytest.raises(rundir.UserError, match="refusing to commit"):  # the last guard, in the writer itself
        rundir.save_checkpoint(tmp_path, model, optimizer, scheduler, epoch=1, best_acc=0.0, best_epoch=1, history=[],
                               config={})
    assert not (tmp_path / "state.pt").exists()


def test_non_finite_loss_under_torchrun_stops_every_rank(tmp_path):
    out = tmp_path / "ddp"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train_vit.py"), *MINI, "--lr", "inf", "--weight-decay", "0", "--output",
                           str(out)],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT,
                          timeout=150)  # a hang would time out
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("visionpe train: error:")]
    assert len(lines) == 1 and "non-finite training loss" in lines[0], proc.stderr[-3000:]
    assert "exitcode  : 2" in proc.stderr  # rank 0 stopped on the error, not killed
    assert not (out / "results.json").exists() and not (out / "state.pt").exists()


def test_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        checkpoint.atomic_write(tmp_path / "a.txt", lambda tmp: Path(tmp).write_text("x"))
        checkpoint.save_weights({"w": torch.zeros(2)}, tmp_path / "w.safetensors")
        out = tmp_path / "run"
        train_main(MINI + ["--output", str(out), "--epochs", "1", "--warmup-epochs", "0"])
        modes = {p.name: p.stat().st_mode & 0o777 for p in [tmp_path / "a.txt", tmp_path / "w.safetensors",
                                                              *out.iterdir()]}
        assert set(modes.values()) == {0o644}, modes
        os.umask(0o077)
        checkpoint.atomic_write(tmp_path / "b.txt", lambda tmp: Path(tmp).write_text("x"))
        assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_imagefolder_run_is_swept_with_its_own_class_count(tmp_path):
    """The sweep rebuilds the model from the run's config (3 classes), not from the data set's name."""
    folder = tmp_path / "folder"
    for split, count in (("train", 6), ("val", 3)):
        for c, colour in enumerate(((250, 40, 40), (40, 250, 40), (40, 40, 250))):
            (folder / split / f"class{c}").mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (12, 10), tuple(max(0, v - 20 * i) for v in colour)).save(
                    folder / split / f"class{c}" / f"{i}.png")
    out = tmp_path / "run"
    train_main(["--data", "imagefolder", "--data-dir", str(folder), "--epochs", "1", "--batch-size", "6",
                "--img-size", "16", "--patch-size", "4", "--embed-dim", "8", "--depth", "1", "--num-heads", "2",
                "--warmup-epochs", "0", "--no-progress", "--threads", "1", "--pe", "rope_axial", "--output", str(out)])
    assert yaml.safe_load((out / "config.yaml").read_text())["num_classes"] == 3
    rows = run_script("resolution_sweep", [str(out), "--res", "16", "24", "--scaling", "none", "pi", "--out", str(tmp_path / "sw")])
    assert len(rows) == 4 and all(r["data"] == "imagefolder" for r in rows)
    assert (tmp_path / "sw" / "sweep.csv").is_file()
