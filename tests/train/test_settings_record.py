"""The typed settings record (issue 42): one field per entry of the Setting table, frozen, read from a run folder
that today's config.yaml wrote, and the default run folder's name (timm's: the start time, then what is trained)."""
from __future__ import annotations

import dataclasses
import datetime

import pytest
import yaml

from visionpe.train import restore, settings
from visionpe.train.settings import SETTINGS, TrainSettings

KIND_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "choice": str, "mapping": dict, "ints": list[int],
              "floats": list[float], "strs": list[str], "choices": list[str]}


def test_the_record_is_the_setting_table():
    """Each setting is a field of its name, its kind's type and its default (written out here, not read from the
    code's table of types); the derived fields follow; the record cannot be changed in place."""
    fields = dataclasses.fields(TrainSettings)
    assert [f.name for f in fields] == [*SETTINGS, "num_classes", "in_chans", "classes", "sizes_from"]
    record = TrainSettings()
    for f in fields[:len(SETTINGS)]:
        entry = SETTINGS[f.name]
        assert f.metadata["setting"] is entry
        typ = KIND_TYPES[entry.kind.rstrip("?")]
        assert f.type == (typ | None if entry.kind.endswith("?") else typ), f.name
        assert getattr(record, f.name) == entry.default, f.name
    assert record.model_kwargs is not TrainSettings().model_kwargs  # a fresh list or mapping per record
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.lr = 1.0
    assert record.replace(lr=2.0).lr == 2.0 and record.lr == SETTINGS["lr"].default


def test_a_run_folder_of_todays_config_yaml_loads_and_resumes_as_a_record(tmp_path):
    """A config.yaml as runs wrote it before the record (a plain mapping of settings by name, ``classes`` absent):
    read back as a checked TrainSettings, and the settings of --resume take only the safe changes."""
    saved = {"model": "vit_tiny_patch16_224", "pe": "rope_mixed", "pe_kwargs": {}, "img_size": 16, "patch_size": 4,
             "model_kwargs": {"embed_dim": 8, "depth": 1, "num_heads": 2}, "data": "shapes-position", "lr": 0.003,
             "epochs": 2, "seed": 0, "num_classes": 9, "in_chans": 3, "output": "elsewhere", "eval_res": [16],
             "eval_protocol": "resize"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    run = restore.load_run(tmp_path)
    assert isinstance(run, TrainSettings)
    assert (run.lr, run.epochs, run.num_classes, run.model_kwargs["depth"]) == (0.003, 2, 9, 1)
    assert run.output == str(tmp_path) and run.batch_size == SETTINGS["batch_size"].default  # a default fills in
    again = settings.saved_form(run)
    assert {k: again[k] for k in saved if k not in ("model_kwargs", "output")} == \
        {k: v for k, v in saved.items() if k not in ("model_kwargs", "output")} and "classes" not in again
    resumed, changed = restore.resume_config({"resume": str(tmp_path), "eval_res": [16, 24]})
    assert resumed.eval_res == [16, 24] and changed == [("eval_res", [16], [16, 24])]
    with pytest.raises(settings.UserError, match=r"cannot change lr \(0.003 -> 0.1\)"):
        restore.resume_config({"resume": str(tmp_path), "lr": 0.1})


def test_the_default_run_folder_holds_the_time_and_never_an_older_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = datetime.datetime(2026, 12, 6, 21, 5, 9)
    run = TrainSettings(data="imagefolder", data_dir=str(tmp_path / "my flowers"), pe="rope_mixed+learned", seed=2)
    name = "runs/20261206-210509-imagefolder-my_flowers-rope_mixed-learned-s2"
    assert settings.default_output(run, now) == name
    (tmp_path / name).mkdir(parents=True)  # a run started in the same second
    assert settings.default_output(run, now) == name + "-1"
    assert settings.default_output(run.replace(seed=3), now) != settings.default_output(run, now)
    later = settings.default_output(run, now + datetime.timedelta(seconds=1))
    assert later == "runs/20261206-210510-imagefolder-my_flowers-rope_mixed-learned-s2"
    resolved = settings.resolve({"data": "shapes-position", "pe": "learned"})
    assert resolved.output.startswith("runs/") and resolved.output.endswith("-shapes-position-learned-s0")
    assert settings.resolve({"data": "shapes-position", "output": "mine"}).output == "mine"  # --output as given


def test_a_run_folder_of_the_old_pe_timm_loads_as_timm_unpatched(tmp_path):
    """A config.yaml written before the rename (``pe: timm``) reads as ``timm_unpatched``, and a commit recording
    the old name is no change of settings; typed on the command line, the old name is an error naming the new."""
    saved = {"model": "vit_tiny_patch16_224", "pe": "timm", "img_size": 16, "patch_size": 4, "num_classes": 9,
             "in_chans": 3, "data": "shapes-position", "eval_protocol": "resize",
             "model_kwargs": {"embed_dim": 8, "depth": 1, "num_heads": 2}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    run = restore.load_run(tmp_path)
    assert run.pe == "timm_unpatched"
    assert settings.changes({**settings.saved_form(run), "pe": "timm"}, run) == []
    with pytest.raises(settings.UserError, match="--pe timm is now --pe timm_unpatched"):
        settings.resolve({"data": "shapes-position", "pe": "timm"})

