#!/usr/bin/env python
"""``python scripts/bench_speed.py ARGS`` from a checkout is ``visionpe bench-speed ARGS`` (``--help``: its arguments;
``visionpe --help``: every command)."""
import sys

from visionpe.cli.commands import main

if __name__ == "__main__":
    result = main(["bench-speed", *sys.argv[1:]])  # what the command returned, for callers that use runpy
