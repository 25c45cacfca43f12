"""What a run prints (issue 30 item 4): the first line and the final table name what tells two runs apart, the
final evaluation says what it is doing, the last line names the run's directory and result files, and timm's
scheduler warning is not shown where the run's own settings make it meaningless."""
import json
import logging
import runpy

import pytest
import torch
from timm.scheduler import CosineLRScheduler

from trainutil import ROOT, TINY, train_main
from visionpe.cli import UserError
from visionpe.train import metrics, optimization, settings
from visionpe.train.distributed import Processes

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
        parts = optimization.build(cfg, model, None, updates_per_epoch=1, procs=Processes(1, 0, 0, torch.device("cpu")),
                                   amp_dtype=None)
        assert parts.scheduler.t_initial == 1 and COSINE_WARNING not in caplog.text
    assert logging.getLogger(optimization.COSINE_LOG).level == logging.NOTSET  # put back as it was


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


def demo():
    """examples/demo.py's functions (its main is not run on import)."""
    return runpy.run_path(str(ROOT / "examples" / "demo.py"))


def test_demo_prints_one_table_with_its_legend_and_ends_with_the_paths(tmp_path, capsys):
    quick = ["--data", "shapes-relation", "--train-samples", "32", "--val-samples", "16", "--batch-size", "16",
             "--epochs", "1", "--img-size", "32", "--patch-size", "8", "--embed-dim", "16", "--depth", "1",
             "--num-heads", "2", "--eval-res", "--no-progress", "--threads", "1"]
    demo()["main"](tmp_path, quick)
    text = capsys.readouterr().out
    lines = text.splitlines()
    heads = [line.split()[0] for line in lines if line.split()[:1] in (["encoding"], ["resolution"])]
    assert heads == ["encoding"], heads  # one table: the trainings' own single-column tables are left out
    assert "32px (train)" in text and "rope_mixed [none]" in text and "rope_mixed [pi]" in text
    for words in ("(retention) = top-1 / top-1 at the training size", "[none]: ", "[pi]: ", "*: "):
        assert any(line.startswith(words) or words in line for line in lines), words
    assert lines[-2].startswith("runs: ") and lines[-1].startswith(f"plot: {tmp_path / 'sweep.png'}")
    assert (tmp_path / "sweep.png").stat().st_size > 1000 and (tmp_path / "sweep.csv").is_file()
    assert any(line.startswith("[learned] run ") for line in lines)  # each training's last line, its files


def test_demo_caveat_names_an_under_trained_row(tmp_path):
    runs = {}
    for pe, accs in (("learned", [40.0, 55.0, 66.0]), ("rope_mixed", [60.0, 80.0, 81.0])):
        runs[pe] = tmp_path / pe
        runs[pe].mkdir()
        (runs[pe] / "metrics.jsonl").write_text("".join(json.dumps({"kind": "epoch", "epoch": i + 1, "val_acc": a})
                                                        + "\n" for i, a in enumerate(accs)))
    rows = [{"pe": "learned", "adaptation": "default", "res": 32, "train_res": 32, "acc": 66.0},
            {"pe": "rope_mixed", "adaptation": "none", "res": 32, "train_res": 32, "acc": 81.0},
            {"pe": "rope_mixed", "adaptation": "pi", "res": 32, "train_res": 32, "acc": 81.0}]
    notes = demo()["caveats"](rows, runs)
    assert notes == ["caveat: learned reaches 66.0% at its training size, 15.0 points below rope_mixed, after 3 "
                     "epochs (its validation top-1 still rose in the last one): it is likely under-trained, so its "
                     "retention compares a weaker model (more --epochs)"], notes
    rows[0]["acc"] = 78.0
    assert demo()["caveats"](rows, runs) == []


def test_warnings_name_threads_beyond_the_cores_and_a_slow_ema(tmp_path, capsys, monkeypatch):
    """One line on stderr each, the run goes on (issue 43): --threads above the cores this process may use, and an
    EMA whose decay leaves it mostly at init over the run's optimizer steps (none with timm's warmup)."""
    monkeypatch.setattr(settings, "cpu_cores", lambda: 2)
    threads = torch.get_num_threads()
    try:
        train_main(TINY + ["--epochs", "1", "--threads", "3", "--model-ema", "--model-ema-decay", "0.9998",
                           "--output", str(tmp_path / "run")])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err.splitlines()
    assert err == ["visionpe train: warning: --threads 3 is more than the 2 CPU cores this process may use: threads "
                   "beyond the cores oversubscribe them and slow every step (0 lets torch choose)",
                   "visionpe train: warning: --model-ema-decay 0.9998 averages over about 5000 optimizer steps "
                   "(1 / (1 - decay)) but this run makes 4: the EMA weights end 100% their initial values; add "
                   "--model-ema-warmup (timm's warmup) or lower the decay"], err
    run = settings.TrainSettings(model_ema=True, model_ema_decay=0.99)
    assert settings.run_warnings(run, 300) == []  # 0.99 ** 300: 5 % of the initial weights left
    assert settings.run_warnings(run.replace(model_ema_decay=0.9998, model_ema_warmup=True), 300) == []
    assert "end 94% their initial values" in settings.run_warnings(run.replace(model_ema_decay=0.9998), 300)[0]


def test_a_run_at_chance_says_it_did_not_learn(tmp_path, capsys):
    """Under the final table, the benchmark's "not learned" rule (metrics.did_not_learn: the last weights' top-1 at
    the training size below chance + 5 points) as a note (issue 43); none for a run that learned."""
    results = {"last": {16: {"acc": 14.0}}}
    cfg = settings.TrainSettings(num_classes=9)
    note = metrics.learning_note(cfg, results, 16)
    assert note.startswith("note: not learned: the last weights' top-1 at the training size, 14.00 %, is below "
                           "chance (11.1 %, 9 classes) + 5 points"), note
    assert metrics.learning_note(cfg, {"last": {16: {"acc": 16.2}}}, 16) is None
    summary = train_main(TINY + ["--epochs", "1", "--lr", "1e-9", "--min-lr", "0", "--warmup-epochs", "0",
                                 "--output", str(tmp_path / "run")])
    out = capsys.readouterr().out
    acc = summary["results"]["last"]["16"]["acc"]
    assert ("note: not learned" in out) == metrics.did_not_learn(acc, 9), (acc, out)
