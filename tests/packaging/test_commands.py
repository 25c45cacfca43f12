"""The ``visionpe`` command: one table of subcommands (visionpe.cli.commands.COMMANDS) behind the dispatcher, its
help and pyproject.toml's console script; every subcommand answers --help under its own name; ``python -m
visionpe`` and ``python -m visionpe.train`` are the same command."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from visionpe.cli import commands
from visionpe.cli.commands import COMMANDS

tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_entry_point_is_the_dispatcher_of_the_table():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"visionpe": "visionpe.cli.commands:console"}
    module, _, function = scripts["visionpe"].partition(":")
    assert module == commands.__name__ and getattr(commands, function) is commands.console


def test_the_table_names_every_workbench_entry_point():
    assert list(COMMANDS) == ["train", "sweep", "benchmark", "convert-benchmark", "visualize", "bench-speed", "export",
                              "predict", "small-folder-benchmark", "make-image-folders", "scaling-memory"]
    # the checkout's one wrapper runs its command through the dispatcher; scripts/ holds no Python (no wrapper of a
    # command, no tool of its own: each is a visionpe command)
    assert 'main(["train", *sys.argv[1:]])' in (ROOT / "train_vit.py").read_text()
    assert not list((ROOT / "scripts").glob("*.py"))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_answers_help_under_its_own_name(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        commands.main([name, "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert out.startswith(f"usage: visionpe {name} "), out[:200]


def test_visionpe_help_lists_every_command_with_its_summary(capsys):
    assert commands.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS.values():
        assert any(line.split() == [command.name, *command.summary.split()] for line in out.splitlines()), command


def test_an_unknown_command_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        commands.main(["trian"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("visionpe: error: unknown command 'trian'") and "train" in err


def test_python_m_visionpe_and_visionpe_train_are_the_command():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv, usage in ((["-m", "visionpe", "--help"], "usage: visionpe COMMAND"),
                        (["-m", "visionpe", "sweep", "--help"], "usage: visionpe sweep "),
                        (["-m", "visionpe.train", "--help"], "usage: visionpe train ")):
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120,
                              env=env)
        assert proc.returncode == 0 and proc.stdout.startswith(usage), (argv, proc.stderr[-2000:])
    proc = subprocess.run([sys.executable, "-m", "visionpe.train", "--epochs", "0"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.startswith("visionpe train: error: epochs"), proc.stderr
