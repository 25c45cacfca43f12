#!/usr/bin/env python
"""``visionpe train`` from a checkout: ``python train_vit.py ARGS`` runs the training story of
visionpe/train/train_vit.py (``python train_vit.py --help``: every setting). Installed, the same is ``visionpe train
ARGS``, ``python -m visionpe train ARGS`` or, under torchrun, ``torchrun --nproc_per_node 2 -m visionpe.train ARGS``.
"""
import sys

from visionpe.cli.commands import main

if __name__ == "__main__":
    result = main(["train", *sys.argv[1:]])  # what training returned, for callers that use runpy
