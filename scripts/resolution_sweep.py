#!/usr/bin/env python
"""``python scripts/resolution_sweep.py ARGS`` from a checkout is ``visionpe sweep ARGS`` (``--help``: its arguments;
``visionpe --help``: every command)."""
import sys

from visionpe.cli.commands import main

if __name__ == "__main__":
    result = main(["sweep", *sys.argv[1:]])  # what the command returned, for callers that use runpy
