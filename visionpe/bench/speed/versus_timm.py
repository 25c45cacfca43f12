"""Part ``timm``: visionpe vs timm's own models holding the same weights (learned ViT, rope-vit ports, Swin,
SwinV2)."""
from __future__ import annotations

import copy

import timm
import torch

import visionpe as vpe
from .plan import NUM_CLASSES, Setup
from .tables import Table, ms
from .timing import Run, compiled, timed_or_error


def timm_pairs(run: Run) -> dict[str, tuple]:
    """``name -> (ours, timm's, input)``: the visionpe model is the timm model with the encoding applied to a copy,
    so both hold the same weights."""
    vit, device = run.plan.vit, run.device
    ref = timm.create_model(vit.model, dynamic_img_size=True, num_classes=NUM_CLASSES, **vit.kwargs)
    x = vit.input(device)
    pairs = {"learned ViT vs timm ViT (dynamic_img_size)": (vpe.apply(copy.deepcopy(ref), "learned"), ref, x),
             "control: timm ViT vs an identical timm ViT": (copy.deepcopy(ref), ref, x)}
    for pe, eva in (("rope_axial", "vit_small_patch16_rope_224"), ("rope_mixed", "vit_small_patch16_rope_mixed_224")):
        pairs[f"{pe} ViT vs timm {eva} (rope-vit port)"] = (*rope_vit_pair(vit, pe, eva), x)
    for label, pe in (("Swin-T", "swin_bias"), ("SwinV2-T", "cpb")):
        name, kwargs, size = run.plan.swin[label]
        ref = timm.create_model(name, num_classes=NUM_CLASSES, **kwargs)
        x = torch.randn(vit.batch, 3, *size, generator=torch.Generator().manual_seed(0)).to(device)
        pairs[f"{pe} {label} vs timm {label} ({size[0]} px)"] = (vpe.apply(copy.deepcopy(ref), pe), ref, x)
    return {k: (ours.to(device).eval(), ref.to(device).eval(), x) for k, (ours, ref, x) in pairs.items()}


def rope_vit_pair(vit: Setup, pe: str, eva_name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A visionpe ViT with ``pe`` holding the weights of timm's rope-vit port ``eva_name`` (an ``Eva`` model with
    layer scale, qkv bias and class-token pooling), and that port: the same logits (tests/test_backbones.py)."""
    eva = timm.create_model(eva_name, num_classes=NUM_CLASSES, **vit.kwargs)
    ours = vpe.create_model(vit.model, pe=pe, num_classes=NUM_CLASSES, qkv_bias=True, init_values=1e-5,
                            global_pool="token", **vit.kwargs)
    vpe.load_timm_checkpoint(ours, eva.state_dict())
    return ours, eva


def pairs_table(run: Run, pairs: dict, compile_models: bool = False) -> Table:
    """ours / timm per pair, each pair timed side by side (compiled with fullgraph=True when ``compile_models``)."""
    rows = []
    for name, (ours, ref, x) in pairs.items():
        if compile_models:
            fns = {"ours": compiled(ours, x)[0], "timm": compiled(ref, x)[0]}
        else:
            fns = {"ours": lambda m=ours, x=x: m(x), "timm": lambda m=ref, x=x: m(x)}
        with torch.no_grad():
            t = timed_or_error(run, fns, run.slow_repeats)
        ok = all(not isinstance(v, str) for v in t.values())
        rows.append((name, *(v if isinstance(v, str) else ms(v) for v in t.values()),
                     f"{t['ours'] / t['timm']:.3f}x" if ok else "-"))
    kind = "compiled (`fullgraph=True`, inductor) " if compile_models else ""
    return Table(f"visionpe vs timm native, {kind}eval forward, batch {run.plan.vit.batch}",
                 ["pair", "ours ms", "timm ms", "ours / timm"], rows,
                 "Each pair holds the same weights" + ("; the control pair is two identical timm models (the noise)."
                                                       if any(k.startswith("control") for k in pairs) else "."))


def versus_timm(run: Run) -> list[Table]:
    return [pairs_table(run, timm_pairs(run))]


