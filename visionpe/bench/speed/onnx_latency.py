"""Part ``onnx`` (opt-in): onnxruntime CPU latency of exported visionpe models against timm's twins holding the
same weights, each exported with a free height and width (the dynamo ONNX exporter, visionpe/export.py), at the
training size and at twice it, batch 1.

Pairs: ``learned`` ViT (``vpe.apply(timm_vit, "learned")``) vs timm's ViT with ``dynamic_img_size=True``; timm's
rope-vit port (an ``Eva`` with axial RoPE, ``vit_small_patch16_rope_224``, ``dynamic_img_size=True``) vs the same
model with visionpe's native encoding (``vpe.apply(eva, "native")``: ``rope_axial``, as ``vpe_<eva name>`` builds
it); and a control: timm's ViT file in a second, identical session (the noise). Each file is checked against its
eager model (visionpe.export.check_export) at both sizes before it is timed. A visionpe model whose dynamic export
refuses a size (a forward that specialises on its size) is timed, with its twin, as one static export per size,
and the row says so.
"""
from __future__ import annotations

import copy

import timm
import torch

import visionpe as vpe
from ... import export
from .plan import NUM_CLASSES
from .tables import Table, ms
from .timing import Run

LIMIT = 1.05  # the target: visionpe's export at most 5 % slower than timm's


def setups(quick: bool) -> tuple[dict, int, int]:
    """``(timm keywords, patch, training size)``: ViT-Ti width (192, 3 heads, 12 blocks) at 224 px, or a tiny
    model at 32 px under ``--quick``."""
    if quick:
        return dict(embed_dim=48, depth=2, num_heads=2, img_size=32, patch_size=8), 8, 32
    return dict(embed_dim=192, depth=12, num_heads=3), 16, 224


def pairs(quick: bool) -> dict[str, tuple[torch.nn.Module, torch.nn.Module]]:
    """``label -> (visionpe model, timm model)``, the same weights, eval mode."""
    kwargs, _, _ = setups(quick)
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", dynamic_img_size=True, num_classes=NUM_CLASSES, **kwargs)
    eva = timm.create_model("vit_small_patch16_rope_224", dynamic_img_size=True, num_classes=NUM_CLASSES, **kwargs)
    found = {"learned ViT vs timm ViT (dynamic_img_size)": (vpe.apply(copy.deepcopy(vit), "learned"), vit),
             "native (rope_axial) Eva vs timm Eva rope-vit port (dynamic_img_size)":
                 (vpe.apply(copy.deepcopy(eva), "native"), eva)}
    return {k: (ours.eval(), ref.eval()) for k, (ours, ref) in found.items()}


def onnx_session(model, example, patch: int, dynamic: bool, sizes, threads: int):
    """An onnxruntime session of ``model`` exported from ``example``, checked at ``sizes``: ``(run, None)`` or
    ``(None, why)``; ``run.data`` holds the file's bytes."""
    try:
        program = export.export_program(model, example, dynamic=dynamic, patch=(patch, patch))
        data = export.to_bytes(export.export_onnx(program, example))
        run = export.runner(data, "onnx", threads=threads)
        run.data = data
    except export.ExportError as err:
        return None, str(err)[:160]
    failed = [c for c in export.check_export(model, run, sizes) if not c.ok]
    if failed:
        c = failed[0]
        return None, f"at {c.size_text}: " + (c.error[:120] if c.error else f"max abs diff {c.max_diff:.1e}")
    return run, None


def timed(run: Run, fns: dict) -> dict[str, float]:
    with torch.no_grad():
        return run.side_by_side(fns, run.repeats)


def onnx_latency(run: Run) -> list[Table]:
    quick = run.plan.vit.label.startswith("quick")
    _, patch, size = setups(quick)
    sizes = [(size, size), (2 * size, 2 * size)]
    threads = torch.get_num_threads()
    rows, notes = [], []
    for label, (ours, ref) in pairs(quick).items():
        example = export.example_input(ref, (size, size), batch=2)
        theirs, why_ref = onnx_session(ref, example, patch, True, sizes, threads)
        mine, why = onnx_session(ours, example, patch, True, sizes, threads)
        if why_ref is not None:
            rows += [(label, f"{s[0]} px", "-", "-", f"timm's export failed: {why_ref}", "-", "-") for s in sizes]
            continue
        per_size = {s: (mine, theirs, "dynamic") for s in sizes}
        if mine is None:  # ours specialises on its size: one static export per size, for both
            notes.append(f"{label}: visionpe's dynamic export failed ({why}); both timed as static exports per size.")
            per_size = {}
            for s in sizes:
                x = export.example_input(ref, s, batch=2)
                m, w = onnx_session(ours, x, patch, False, [s], threads)
                t, wt = onnx_session(ref, x, patch, False, [s], threads)
                per_size[s] = (m, t, "static") if m and t else (None, None, f"static export failed: {w or wt}")
        for s, (m, t, mode) in per_size.items():
            if m is None:
                rows.append((label, f"{s[0]} px", mode, "-", "-", "-", "-"))
                continue
            x = export.example_input(ref, s, batch=1)
            got = timed(run, {"ours": lambda m=m, x=x: m(x), "timm": lambda t=t, x=x: t(x)})
            ratio = got["ours"] / got["timm"]
            rows.append((label, f"{s[0]} px", mode, ms(got["ours"]), ms(got["timm"]), f"{ratio:.3f}x",
                         "met" if ratio <= LIMIT else "NOT met"))
        if label.startswith("learned") and theirs is not None:  # control: timm's file in two sessions
            twin = export.runner(theirs.data, "onnx", threads=threads)
            for s in sizes:
                x = export.example_input(ref, s, batch=1)
                got = timed(run, {"a": lambda f=theirs, x=x: f(x), "b": lambda f=twin, x=x: f(x)})
                rows.append(("control: timm ViT vs the same file in a second session", f"{s[0]} px", "dynamic",
                             ms(got["b"]), ms(got["a"]), f"{got['b'] / got['a']:.3f}x", "noise"))
    width = "quick tiny models" if quick else "ViT-Ti width (192, 3 heads, 12 blocks)"
    note = (f"onnxruntime {onnxruntime_version()} CPU execution provider, {threads} intra-op threads, batch 1; "
            f"{width}, trained size {size} px, patch {patch}. Each file is checked against its eager model at both "
            f"sizes first (max abs diff <= {export.ATOL:g} + {export.RTOL:g} x max |eager|). Target: ours / timm <= "
            f"{LIMIT}x." + ("" if not notes else " " + " ".join(notes)))
    return [Table("Exported models in onnxruntime: visionpe vs timm's twin (same weights), latency",
                  ["pair", "size", "export", "ours ms", "timm ms", "ours / timm", "target"], rows, note)]


def onnxruntime_version() -> str:
    import onnxruntime
    return onnxruntime.__version__
