"""Part ``flex-models`` (opt-in): visionpe's ``attention="flex"`` against ``attention="sdpa"`` in a ViT-S/16 with
each kind of bias pair function (``rel_bias``: a learned per-offset table, the form ``swin_bias``, ``cpb`` and
``bucket_bias`` share; ``alibi``: a function of coordinates), at the plan's token counts. Per size: the eval
forward, the training step (forward, backward, AdamW) and, on CUDA, its peak memory; then the compiled eval forward
at the first size. On CUDA the models run under bf16 autocast (the training recipe's precision), on CPU in float32.

Every cell is a measurement or the error the call raised (running out of memory, or training through FlexAttention
on CPU, which PyTorch does not support): the table shows what happened."""
from __future__ import annotations

import contextlib
import copy

import torch

import visionpe as vpe
from .memory import step_peak_bytes
from .plan import Setup
from .tables import Table, megabytes, ms
from .timing import CONTROL, Run, TrainStep, first_call, timed_or_error

ENCODINGS = ("rel_bias", "alibi")
ATTENTIONS = ("sdpa", "flex")


def precision(run: Run):
    """bf16 autocast on CUDA, float32 elsewhere."""
    if run.device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def precision_label(run: Run) -> str:
    return "bf16 autocast" if run.device.type == "cuda" else "float32"


def models_for(run: Run, setup: Setup) -> dict[str, torch.nn.Module]:
    """``none``, its control and each encoding with each attention (the two of one encoding share their weights)."""
    models = {"none": setup.create("none", run.device), "none" + CONTROL: setup.create("none", run.device)}
    for pe in ENCODINGS:
        model = setup.create(pe, run.device)
        for attention in ATTENTIONS:
            models[f"{pe}, {attention}"] = vpe.set_attention(copy.deepcopy(model), attention)
    return models


def under_precision(run: Run, fn):
    """``fn`` called under the run's precision."""
    def call():
        with precision(run):
            fn()
    return call


def checked(calls: dict) -> dict:
    """Each callable after a first call (compilation, caches), or the error text that call raised."""
    return {name: first_call(fn)[0] for name, fn in calls.items()}


def flex_models(run: Run) -> list[Table]:
    """One table per size of the plan, then (CUDA) the compiled eval forward at the first size."""
    tables = [size_table(run, setup) for setup in run.plan.flex_models]
    if run.device.type == "cuda":
        tables.append(compiled_table(run, run.plan.flex_models[0]))
    return tables


def size_table(run: Run, setup: Setup) -> Table:
    """Eval forward, training step and (CUDA) the step's peak memory of every model, side by side."""
    models = models_for(run, setup)
    x, y = setup.input(run.device), setup.labels(run.device)

    def forward(model):
        with torch.no_grad():
            model.eval()(x)

    def train(step):
        step.model.train()
        step()

    evals = checked({name: under_precision(run, lambda m=m: forward(m)) for name, m in models.items()})
    trains = checked({name: under_precision(run, lambda s=TrainStep(m, x, y): train(s)) for name, m in models.items()})
    columns = {("eval forward", "ms"): timed_or_error(run, evals), ("training step", "ms"): timed_or_error(run, trains)}
    if run.device.type == "cuda":
        columns["step peak", "MB"] = {name: step_peak_bytes(call, run.device) if callable(call) else call
                                      for name, call in trains.items()}
    return ratio_table(f"attention='flex' vs 'sdpa': {setup.label}, {setup.tokens(models['none'])} tokens, batch "
                       f"{setup.batch}, {precision_label(run)}", columns, note=(
                           "Each encoding's two models share their weights; `flex / sdpa` is the flex row over the "
                           "sdpa row of the same encoding, `vs none` the row over the model without position. "
                           "SDPA materialises each block's (heads, T, T) bias; flex reads it per token pair."))


def compiled_table(run: Run, setup: Setup) -> Table:
    """``torch.compile(model, fullgraph=True)`` eval forward of rel_bias with each attention vs compiled none."""
    x = setup.input(run.device)
    models = {"none": setup.create("none", run.device)}
    base = setup.create("rel_bias", run.device)
    models |= {f"rel_bias, {a}": vpe.set_attention(copy.deepcopy(base), a) for a in ATTENTIONS}
    calls, seconds = {}, {}
    for name, model in models.items():
        compiled_model = torch.compile(model.eval(), fullgraph=True)

        def forward(m=compiled_model):
            with torch.no_grad(), precision(run):
                m(x)
        calls[name], spent = first_call(forward)
        seconds[name] = f"{spent:.1f}"
    values = timed_or_error(run, calls)
    return ratio_table(f"Compiled eval forward (`torch.compile(model, fullgraph=True)`, inductor): {setup.label}, "
                       f"batch {setup.batch}, {precision_label(run)}", {("eval forward", "ms"): values},
                       extra={"compile s": seconds}, note="Compile s: the first call (compilation and one forward).")


def ratio_table(title: str, columns: dict[tuple[str, str], dict], extra: dict | None = None,
                note: str | None = None) -> Table:
    """Rows: the models; per ``(label, unit)`` column its value, the ratio to ``none`` and, for a flex row, to the sdpa
    row of the same encoding."""
    extra = extra or {}
    header = ["model"]
    for label, unit in columns:
        header += [f"{label} {unit}", f"{label} vs none", f"{label} flex/sdpa"]
    header += list(extra)
    rows = []
    for name in next(iter(columns.values())):
        row = [name]
        for (_, unit), values in columns.items():
            row += cells(values, name, megabytes if unit == "MB" else ms)
        rows.append(tuple(row + [extra[key].get(name, "-") for key in extra]))
    return Table(title, header, rows, note)


def cells(values: dict, name: str, fmt) -> list[str]:
    """The value of row ``name``, its ratio to ``none`` and (flex rows) to the same encoding's sdpa row."""
    value, base = values.get(name), values.get("none")
    if isinstance(value, str) or value is None:
        return [value or "-", "-", "-"]
    sdpa = values.get(name.replace(", flex", ", sdpa")) if name.endswith(", flex") else None
    return [fmt(value), ratio(value, base), ratio(value, sdpa) if sdpa is not None else "-"]


def ratio(value, base) -> str:
    return f"{value / base:.3f}x" if isinstance(base, (int, float)) and base else "-"
