#!/usr/bin/env python
"""``python scripts/convert_benchmark.py ARGS`` from a checkout is ``visionpe convert-benchmark ARGS`` (``--help``: its
arguments; ``visionpe --help``: every command)."""
import sys

from visionpe.cli.commands import main

if __name__ == "__main__":
    result = main(["convert-benchmark", *sys.argv[1:]])  # what the command returned, for callers that use runpy
