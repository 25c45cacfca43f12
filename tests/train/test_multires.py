"""Multi-resolution training (--train-res): a resolution per step, the same on every process, schedule unchanged."""
import json

import torch
import yaml

from trainutil import TINY, train_main
from visionpe.train import loop


def test_step_resolution_is_a_function_of_seed_epoch_and_step():
    draws = [loop.step_resolution([12, 16, 24], 0, epoch, step) for epoch in range(2) for step in range(30)]
    assert set(draws) == {12, 16, 24}  # every size is used
    again = [loop.step_resolution([12, 16, 24], 0, epoch, step) for epoch in range(2) for step in range(30)]
    assert draws == again  # what every DDP rank (and a resumed run) computes: no rank, no global RNG
    other = [loop.step_resolution([12, 16, 24], 1, epoch, step) for epoch in range(2) for step in range(30)]
    assert draws != other
    assert loop.step_resolution([], 0, 0, 0) is None


def test_train_res_feeds_each_step_its_size_and_keeps_the_schedule(tmp_path, monkeypatch):
    seen = []
    interpolate = torch.nn.functional.interpolate

    def spy(x, *args, **kwargs):
        seen.append(tuple(kwargs.get("size") or args[0]))
        return interpolate(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "interpolate", spy)
    multi = train_main(TINY + ["--pe", "rope_mixed", "--train-res", "12", "16", "24", "--epochs", "1",
                               "--output", str(tmp_path / "multi")])
    monkeypatch.setattr(torch.nn.functional, "interpolate", interpolate)
    single = train_main(TINY + ["--pe", "rope_mixed", "--epochs", "1", "--output", str(tmp_path / "single")])
    steps = 64 // 16
    expected = [loop.step_resolution([12, 16, 24], 0, 0, s) for s in range(steps)]
    assert seen == [(r, r) for r in expected if r != 16]  # 16 px is the data's own size: no resize
    assert yaml.safe_load((tmp_path / "multi" / "config.yaml").read_text())["train_res"] == [12, 16, 24]
    # the learning-rate schedule is the same: same steps, same final learning rate
    state = {name: torch.load(tmp_path / name / "state.pt", weights_only=True)["scheduler"] for name in ("multi",
                                                                                                         "single")}
    assert state["multi"] == state["single"]
    assert json.loads((tmp_path / "multi" / "results.json").read_text())["results"]["last"]
    assert multi and single
