"""The CUDA paths of train_vit.py's recipe (skipped without a GPU): float16 autocast with timm's NativeScaler (its
state resumed), bf16 as the CUDA default, and torch.compile with inductor."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainutil import TINY, train_main

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = TINY + ["--device", "cuda", "--pe", "rope_mixed"]


def epochs(out):
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    timeless = lambda r: {k: v for k, v in r.items() if k not in ("img_per_s", "epoch_time_s")}
    return [timeless(r) for r in rows if r["kind"] == "epoch"]


def test_fp16_trains_with_a_gradient_scaler_and_resumes_with_it(tmp_path, capsys):
    args = CUDA + ["--amp", "fp16", "--model-ema", "--grad-accum-steps", "2", "--checkpoint-every-steps", "1"]
    train_main(args + ["--output", str(tmp_path / "full")])
    assert " fp16" in capsys.readouterr().out
    state = torch.load(tmp_path / "full" / "state.pt", weights_only=True)
    assert state["scaler"]["scale"] > 0 and "ema" in state
    train_main(args + ["--output", str(tmp_path / "part"), "--stop-after", "1"])
    train_main(["--resume", str(tmp_path / "part")])
    a, b = epochs(tmp_path / "full"), epochs(tmp_path / "part")
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], rel=1e-4)
    wa, wb = (load_file(tmp_path / d / "last.safetensors") for d in ("full", "part"))
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=1e-5)


def test_bf16_is_the_cuda_default(tmp_path, capsys):
    train_main(CUDA + ["--epochs", "1", "--output", str(tmp_path / "run")])
    assert " bf16" in capsys.readouterr().out


def test_inductor_compiled_run_trains(tmp_path):
    summary = train_main(CUDA + ["--epochs", "1", "--compile", "--channels-last", "--output", str(tmp_path / "run")])
    assert summary["final_train_loss"] > 0
