"""``python -m visionpe.train ...``: training alone (``visionpe train``), so that
``torchrun --nproc_per_node 2 -m visionpe.train --config shapes_tiny`` starts it in every process."""
import sys

from visionpe.cli.commands import main

if __name__ == "__main__":
    result = main(["train", *sys.argv[1:]])  # what training returned, for callers that use runpy
