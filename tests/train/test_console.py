"""What a run prints (issue 30 item 4): the first line and the final table name what tells two runs apart, the
final evaluation says what it is doing, the last line names the run's directory and result files, and timm's
scheduler warning is not shown where the run's own settings make it meaningless."""
import logging

import pytest
import torch
from timm.scheduler import CosineLRScheduler

from trainutil import TINY, train_main
from visionpe.cli import UserError
from visionpe.train import metrics, recipe, settings

COSINE_WARNING = "Cosine annealing scheduler will have no effect"


def test_a_run_names_what_tells_it_apart_and_ends_with_its_files(tmp_path, capsys):
    out = tmp_path / "run"
    train_main(TINY + ["--epochs", "1", "--pe", "rope_mixed", "--pe-kwargs", "theta=10", "--train-res", "12", "16",
                       "--mixup", "0.2", "--eval-res", "12", "--output", str(out)])
    lines = capsys.readouterr().out.splitlines()
    setup = "pe_kwargs theta=10, train_res 12 16 px, augmentation mixup=0.2"
    assert setup in lines[0] and "evaluated under protocol resize" in lines[0], lines[0]
    table = next(line for line in lines if line.startswith("shapes-position  "))
    assert setup in table and "evaluated under protocol resize" in table, table
    evaluating = [line for line in lines if line.startswith("evaluating the ")]
    assert evaluating == ["evaluating the last weights at 12 16 px ...", "evaluating the best weights at 12 16 px ..."]
    assert lines.index(evaluating[-1]) < lines.index(table)
    last = lines[-1]
    assert last.startswith(f"run {out}: results.json "), last
    named = [word.strip(",") for word in last.split() if "." in word and not word.startswith(str(out))]
    assert {"results.json", "metrics.jsonl", "summary.csv", "last.safetensors", "best.safetensors", "config.yaml",
            "state.pt"} == set(named), named
    assert all((out / name).is_file() for name in named)


def test_defaults_read_as_such():
    cfg = settings.resolve({"data": "shapes-position"})
    assert metrics.setup_text(cfg) == "augmentation as the defaults"


def test_the_cosine_warning_of_a_one_step_schedule_is_not_shown(caplog):
    cfg = settings.resolve({"data": "shapes-position", "epochs": 1, "warmup_epochs": 0})
    model = torch.nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING):
        CosineLRScheduler(torch.optim.SGD(model.parameters(), lr=0.1), t_initial=1)  # timm warns here
        assert COSINE_WARNING in caplog.text
        caplog.clear()
        parts = recipe.build(cfg, model, updates_per_epoch=1, device=torch.device("cpu"), amp_dtype=None)
        assert parts.scheduler.t_initial == 1 and COSINE_WARNING not in caplog.text
    assert logging.getLogger(recipe.COSINE_LOG).level == logging.NOTSET  # put back as it was


def test_help_shows_the_examples_first_and_no_double_negation(capsys, tmp_path):
    with pytest.raises(SystemExit):
        train_main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: visionpe train [--config RECIPE]") and len(text.split("\n", 3)[1]) < 110
    assert text.index("examples:") < text.index("model settings:") and "--resume runs/NAME --epochs" in text
    assert "--no-no-" not in text and "--no-aug" in text
    recipe_file = tmp_path / "plain.yaml"
    recipe_file.write_text("no_aug: true\n")
    assert settings.resolve(settings.parse_args(["--config", str(recipe_file)]))["no_aug"] is True
    assert settings.resolve(settings.parse_args(["--config", str(recipe_file), "--aug"]))["no_aug"] is False
    with pytest.raises(UserError, match="not allowed with"):
        settings.parse_args(["--aug", "--no-aug"])
