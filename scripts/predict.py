#!/usr/bin/env python
"""``python scripts/predict.py ARGS`` from a checkout is ``visionpe predict ARGS`` (``--help``: its arguments;
``visionpe --help``: every command)."""
import sys

from visionpe.cli.commands import main

if __name__ == "__main__":
    result = main(["predict", *sys.argv[1:]])  # what the command returned, for callers that use runpy
