"""Parts ``forward``, ``train``, ``compile``, ``compile-train`` and ``cache``: each encoding's model vs the same
model without position, eager and compiled, at fixed and alternating resolutions."""
from __future__ import annotations

import torch

from .tables import Table, encoding_limit, ms, versus
from .timing import Run, TrainStep, compiled, first_call, timed_or_error
from .versus_timm import pairs_table, timm_pairs


def forward_cost(run: Run) -> list[Table]:
    """Eval forward of each encoding vs none, at ViT-S/16 and at the small training config."""
    tables = []
    for setup in (run.plan.vit, run.plan.tiny):
        x = setup.input(run.device)
        models = {pe: m.eval() for pe, m in run.models(setup).items()}
        with torch.no_grad():
            t = run.side_by_side({pe: (lambda m=m: m(x)) for pe, m in models.items()}, run.rounds(setup))
        tables.append(versus(f"Eval forward: {setup.label}, batch {setup.batch}", t, "none", "ms", ms,
                             encoding_limit))
    return tables



def train_cost(run: Run) -> list[Table]:
    """A training step of each encoding vs none, at ViT-S/16 and at the small training config."""
    tables = []
    for setup in (run.plan.vit, run.plan.tiny):
        t = run.side_by_side(run.train_steps(setup), run.rounds(setup))
        tables.append(versus(f"Training step (forward + backward + AdamW): {setup.label}, batch {setup.batch}",
                             t, "none", "ms", ms, encoding_limit))
    return tables



def compiled_cost(run: Run) -> list[Table]:
    """Compiled eval forward of each encoding vs compiled none (small config); compiled visionpe vs compiled timm."""
    setup = run.plan.compiled
    x = setup.input(run.device)
    fns, seconds = {}, {}
    for pe, model in run.models(setup).items():
        fns[pe], spent = compiled(model.eval(), x)
        seconds[pe] = (f"{spent:.1f}",)
    values = timed_or_error(run, fns)
    tables = [versus(f"Compiled eval forward (`torch.compile(model, fullgraph=True)`, inductor): {setup.label}, "
                     f"batch {setup.batch}", values, "none", "ms", ms, encoding_limit, extra=(["compile s"], seconds),
                     note="Compile s: the first call (compilation and one forward).")]
    if run.compile_pairs:
        pairs = {k: v for k, v in timm_pairs(run).items() if k.startswith(run.compile_pairs)}
        tables.append(pairs_table(run, pairs, compile_models=True))
    return tables


def compiled_train_cost(run: Run) -> list[Table]:
    """Training step of ``torch.compile(model, fullgraph=True)`` per encoding vs compiled none (small config)."""
    setup = run.plan.compiled
    x, y = setup.input(run.device), setup.labels(run.device)
    fns, seconds = {}, {}
    for pe, model in run.models(setup).items():
        fns[pe], spent = first_call(TrainStep(torch.compile(model, fullgraph=True, dynamic=False), x, y))
        seconds[pe] = (f"{spent:.1f}",)
    values = timed_or_error(run, fns)
    return [versus(f"Compiled training step (`torch.compile(model, fullgraph=True)`, inductor; forward, backward, "
                   f"AdamW): {setup.label}, batch {setup.batch}", values, "none", "ms", ms, encoding_limit,
                   extra=(["compile s"], seconds),
                   note="Compile s: the first step (compiling forward and backward, and the step). Under compile, "
                        "learned biases train through SDPA's own path: the fused CPU bias backward is eager only.")]



def cache_hits(run: Run) -> list[Table]:
    """Two sizes in turn vs the same two sizes run without switching: a table cache that thrashed would show."""
    vit, other = run.plan.vit, run.plan.alt_size
    rows = []
    for pe in [p for p in ["learned", "rope_mixed", "rel_bias", "cpb"] if p in run.pes]:
        model = vit.create(pe, run.device).eval()
        a, b = vit.input(run.device), vit.input(run.device, other)
        with torch.no_grad():
            t = run.side_by_side({"fixed": lambda: model(a), "alternating": lambda: (model(a), model(b)),
                                  "fixed other": lambda: model(b)}, run.rounds(vit))
        # alternating does one forward at each size: compare with the sum of the fixed-size forwards
        expected = t["fixed"] + t["fixed other"]
        rows.append((pe, ms(t["alternating"]), ms(expected), f"{t['alternating'] / expected:.3f}x"))
    return [Table(f"Alternating resolutions: {vit.label}, batch {vit.batch}, {vit.size[0]} and {other[0]} px in turn "
                  f"vs the same two sizes run without switching", ["pe", "alternating ms", "fixed ms", "ratio"], rows,
                  "A ratio near 1 means each grid's tables are built once and then served from the cache.")]


