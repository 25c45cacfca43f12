"""Part ``video``: eval forward and training step of each video encoding vs the same tubelet video ViT without
position, at the video benchmark's recipe and at ViT-S/16 on 8 frames of 224 px."""
from __future__ import annotations

import torch

from .plan import defined_on
from .tables import Table, encoding_limit, ms, versus
from .timing import Run, TrainStep

VIDEO_ONLY = ("videorope", "riflex")  # encodings defined on (T, H, W) grids only: always rows of this part


def video_encodings(pes: list[str]) -> list[str]:
    """The encodings of ``--pes`` that are defined on 3D grids, then the video-only ones."""
    return [pe for pe in pes if defined_on(pe, 3)] + list(VIDEO_ONLY)


def video_cost(run: Run) -> list[Table]:
    """Per video setup: the eval forward and the training step of ``none``, its control and each video encoding."""
    tables = []
    for setup in run.plan.video:
        models = run.models(setup, video_encodings(run.pes))
        x, y = setup.input(run.device), setup.labels(run.device)
        rounds = run.rounds(setup)
        with torch.no_grad():
            forward = run.side_by_side({n: (lambda m=m.eval(): m(x)) for n, m in models.items()}, rounds)
        steps = {n: TrainStep(m, x, y) for n, m in models.items()}
        train = run.side_by_side(steps, rounds)
        shape = "x".join(map(str, setup.size))
        tables += [versus(f"Video eval forward: {setup.label}, clips {shape}, batch {setup.batch}", forward, "none",
                          "ms", ms, encoding_limit),
                   versus(f"Video training step (forward + backward + AdamW): {setup.label}, clips {shape}, batch "
                          f"{setup.batch}", train, "none", "ms", ms, encoding_limit)]
        del models, steps  # their optimizer state before the next, larger setup
    return tables
