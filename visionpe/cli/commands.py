"""The ``visionpe`` command: one name on PATH, a subcommand per workbench entry point (as ``git`` and ``hf`` have).

    visionpe --help                      every subcommand, from :data:`COMMANDS`
    visionpe train --config shapes_tiny --pe rope_mixed
    python -m visionpe sweep runs/A --res 24 32 48      # the same without the console script
    python -m visionpe.train ...                         # training alone, e.g. under torchrun:
    torchrun --nproc_per_node 2 -m visionpe.train --config shapes_tiny

:data:`COMMANDS` is the one table of the subcommands: the dispatcher and its help are read from it, and
tests/packaging/test_commands.py holds pyproject.toml's entry point to it. Each target is ``module:function``, imported
only when its subcommand runs, with the signature ``main(argv) -> result``; a :class:`~visionpe.cli.UserError` it raises
becomes one line ``visionpe NAME: error: ...`` and exit status 2 (:func:`~visionpe.cli.run`).
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

from .convention import run

PROG = "visionpe"


@dataclass(frozen=True)
class Command:
    name: str  # the subcommand: visionpe NAME
    target: str  # "module:function", the function taking argv (the arguments after NAME)
    summary: str  # one line for `visionpe --help`

    @property
    def prog(self) -> str:
        return f"{PROG} {self.name}"

    def load(self):
        """The function the command runs (its module imported now)."""
        module, _, function = self.target.partition(":")
        return getattr(importlib.import_module(module), function)


COMMANDS = {c.name: c for c in (
    Command("train", "visionpe.train.train_vit:main",
            "train a ViT (or Swin, video ViT) with any positional encoding, then test it across resolutions"),
    Command("sweep", "visionpe.train.sweep:main",
            "evaluate trained runs at several resolutions with each encoding's resolution adaptation"),
    Command("benchmark", "visionpe.bench.accuracy.cli:main",
            "the accuracy benchmark: every encoding trained over seeds, swept, reported (OUT/BENCHMARK.md)"),
    Command("convert-benchmark", "visionpe.bench.accuracy.conversion:main",
            "a trained learned-APE model converted to RoPE and fine-tuned, against RoPE from scratch"),
    Command("visualize", "visionpe.train.visualize:main",
            "draw what an encoding knows about space (PNG figures or an HTML explorer), fresh or from a run"),
    Command("bench-speed", "visionpe.bench.speed.cli:main",
            "speed and memory of the encodings as ratios measured side by side"),
    Command("export", "visionpe.train.export_run:main",
            "export a trained run's model (torch.export .pt2 or ONNX, any input size), checked against eager"),
    Command("predict", "visionpe.train.predict:main",
            "classify image files with a trained run: the top-k classes of each, by the run's class names"),
    Command("small-folder-benchmark", "visionpe.bench.accuracy.small_folder:main",
            "the small-folder recipe against timm's augmentation and resize+flip, on generated image folders"),
    Command("make-image-folders", "visionpe.bench.image_folders:main",
            "write a small image folder (procedural objects or photo crops) to measure training recipes on"),
    Command("scaling-memory", "visionpe.bench.scaling_memory:main",
            "memory per rank of data-parallel training, DDP against FSDP2, under torchrun"),
)}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [ARGS ...]   ({PROG} COMMAND --help: the command's own arguments)", "",
             "Positional encodings for vision transformers: the workbench's commands.", "", "commands:"]
    lines += [f"  {c.name:<{width}}  {c.summary}" for c in COMMANDS.values()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None):
    """``visionpe COMMAND ARGS...``: runs COMMAND's function on ARGS (``--help`` or no command: the table); returns
    what it returned. An unknown command exits with status 2 and one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"{PROG}: error: unknown command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    command = COMMANDS[name]
    return run(command.load(), prog=command.prog, argv=rest)


def console() -> int:
    """The console script ``visionpe`` (pyproject.toml's ``[project.scripts]``): exit status 0 once the command has
    returned (what it returned is for callers in Python; a mistake has exited with status 2 already)."""
    main()
    return 0
