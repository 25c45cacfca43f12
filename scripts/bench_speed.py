"""Speed of visionpe encodings, as ratios measured side by side in one run (docs/PERFORMANCE.md holds the
results and, under "Reading these numbers", how to read them).

    python scripts/bench_speed.py [--device cpu|cuda] [--repeats 7] [--out docs/PERFORMANCE.md]

Every ratio compares two timings taken in the same process, interleaved round by round, and reports the
median over rounds (``torch.utils.benchmark``'s median per round). Sections:

1. RoPE apply on q and k of ViT-S/16 shape vs a plain copy of q and k (the memory floor), ours and timm's
   ``apply_rot_embed_cat``.
2. Forward (inference) of a ViT-S/16 at 224 with each encoding vs the same model without position.
3. visionpe vs timm native: learned ViT vs timm ViT (dynamic size), swin_bias Swin-T vs timm Swin-T,
   cpb SwinV2-T vs timm SwinV2-T.
4. Alternating resolutions (224/256) vs a fixed resolution: the table caches at work.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import timm
import torch
from torch.utils.benchmark import Timer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import visionpe as vpe  # noqa: E402
from visionpe.rotary.rope import apply_rotary  # noqa: E402


def median_time(fn, min_run_time: float) -> float:
    return Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def side_by_side(fns: dict, repeats: int, min_run_time: float, sync) -> dict[str, float]:
    """Median seconds per call of each function, measured round-robin ``repeats`` times."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn(), sync()  # warm-up: caches, allocator
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(median_time(lambda: (fn(), sync()), min_run_time))
    return {name: statistics.median(t) for name, t in times.items()}


def rope_apply(device, args, sync):
    torch.manual_seed(0)
    batch, heads, tokens, head_dim = args.batch, 6, 197, 64
    grid = vpe.Grid((14, 14), prefix=1)
    q = torch.randn(batch, heads, tokens, head_dim, device=device)
    k = torch.randn_like(q)
    axial = vpe.build("rope_axial", head_dim=head_dim, num_heads=heads).to(device)
    mixed = vpe.build("rope_mixed", head_dim=head_dim, num_heads=heads).to(device).eval()
    timm_rope = timm.layers.RotaryEmbeddingCat(head_dim, in_pixels=False, temperature=100, grid_indexing="xy")
    timm_embed = timm_rope.get_embed((14, 14)).to(device)
    cis = axial.cis(grid, device)

    def timm_apply():
        # timm rotates the patch tokens only; the prefix is concatenated back, as in timm's Eva
        rq = timm.layers.apply_rot_embed_cat(q[:, :, 1:], timm_embed)
        rk = timm.layers.apply_rot_embed_cat(k[:, :, 1:], timm_embed)
        return torch.cat([q[:, :, :1], rq], 2), torch.cat([k[:, :, :1], rk], 2)

    with torch.no_grad():
        t = side_by_side({
            "copy q, k": lambda: (q.clone(), k.clone()),
            "visionpe rope_axial (cached table)": lambda: axial(q, k, grid),
            "visionpe rope_mixed (cached table)": lambda: mixed(q, k, grid),
            "visionpe apply_rotary only": lambda: (apply_rotary(q, cis), apply_rotary(k, cis)),
            "timm apply_rot_embed_cat": timm_apply,
        }, args.repeats, args.min_run_time, sync)
    base = t["copy q, k"]
    rows = [(name, f"{sec * 1e3:.3f}", f"{sec / base:.2f}x") for name, sec in t.items()]
    ratio = t["timm apply_rot_embed_cat"] / t["visionpe rope_axial (cached table)"]
    return (f"q and k of shape {tuple(q.shape)}, float32", ["apply", "ms", "vs copy"], rows,
            f"visionpe rope_axial is {ratio:.2f}x faster than timm's eager apply_rot_embed_cat.")


def forward_cost(device, args, sync):
    kw = dict(img_size=224, num_classes=10)
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    pes = ["none", "none (control)", "learned", "sincos", "peg", "rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi"]
    models = {}
    for pe in pes:
        torch.manual_seed(0)
        models[pe] = vpe.create_model("vit_small_patch16_224", pe=pe.split()[0], **kw).to(device).eval()
    with torch.no_grad():
        t = side_by_side({pe: (lambda m=m: m(x)) for pe, m in models.items()}, args.repeats, args.min_run_time, sync)
    base = t["none"]
    rows = [(pe, f"{sec * 1e3:.1f}", f"{sec / base:.3f}", f"{(sec / base - 1) * 100:+.1f} %") for pe, sec in t.items()]
    noise = abs(t["none (control)"] / base - 1) * 100
    return (f"vit_small_patch16_224 forward, batch {args.batch}, 224 px, inference", ["pe", "ms", "vs none", "cost"],
            rows, f"`none (control)` is a second, identical model without position: its {noise:.1f} % gap to `none` "
                  f"is the measurement noise of this run; smaller costs are within noise.")


def versus_timm(device, args, sync):
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    pairs = {}
    torch.manual_seed(0)
    ref = timm.create_model("vit_small_patch16_224", dynamic_img_size=True, num_classes=10)
    ours = vpe.apply(timm.create_model("vit_small_patch16_224", num_classes=10), "learned")
    ours.load_state_dict(vpe.create_model("vit_small_patch16_224", pe="learned", num_classes=10).state_dict())
    pairs["learned ViT-S/16 vs timm ViT-S/16 (dynamic_img_size)"] = (ours, ref)
    control = timm.create_model("vit_small_patch16_224", dynamic_img_size=True, num_classes=10)
    pairs["control: timm ViT-S/16 vs an identical timm ViT-S/16"] = (control, ref)
    ref = timm.create_model("swin_tiny_patch4_window7_224", num_classes=10)
    pairs["swin_bias Swin-T vs timm Swin-T"] = (vpe.apply(timm.create_model("swin_tiny_patch4_window7_224",
                                                                            num_classes=10), "swin_bias"), ref)
    x_v2 = torch.randn(args.batch, 3, 256, 256, device=device)
    ref = timm.create_model("swinv2_tiny_window8_256", num_classes=10)
    pairs["cpb SwinV2-T vs timm SwinV2-T (256 px)"] = (vpe.apply(timm.create_model("swinv2_tiny_window8_256",
                                                                                   num_classes=10), "cpb"), ref)
    rows = []
    with torch.no_grad():
        for name, (a, b) in pairs.items():
            a, b = a.to(device).eval(), b.to(device).eval()
            inp = x_v2 if "256" in name else x
            t = side_by_side({"ours": lambda: a(inp), "timm": lambda: b(inp)}, args.repeats, args.min_run_time, sync)
            rows.append((name, f"{t['ours'] * 1e3:.1f}", f"{t['timm'] * 1e3:.1f}", f"{t['ours'] / t['timm']:.3f}"))
    return f"forward, batch {args.batch}, inference", ["pair", "ours ms", "timm ms", "ours / timm"], rows, None


def cache_hits(device, args, sync):
    torch.manual_seed(0)
    rows = []
    for pe in ["learned", "rope_mixed", "rel_bias", "cpb"]:
        model = vpe.create_model("vit_small_patch16_224", pe=pe, num_classes=10).to(device).eval()
        a = torch.randn(args.batch, 3, 224, 224, device=device)
        b = torch.randn(args.batch, 3, 256, 256, device=device)
        with torch.no_grad():
            t = side_by_side({"fixed": lambda: (model(a), model(a)), "alternating": lambda: (model(a), model(b))},
                             args.repeats, args.min_run_time, sync)
            fixed_256 = side_by_side({"b": lambda: model(b)}, args.repeats, args.min_run_time, sync)["b"]
        # alternating does one 224 and one 256 forward: compare with the sum of the fixed-size forwards
        expected = t["fixed"] / 2 + fixed_256
        rows.append((pe, f"{t['alternating'] * 1e3:.1f}", f"{expected * 1e3:.1f}", f"{t['alternating'] / expected:.3f}"))
    return (f"ViT-S/16, batch {args.batch}: 224 and 256 px in turn vs the same two sizes run without switching",
            ["pe", "alternating ms", "fixed ms", "ratio"], rows, None)


def markdown(title, header, rows) -> str:
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-run-time", type=float, default=0.5)
    parser.add_argument("--sections", nargs="+", default=["rope", "forward", "timm", "cache"],
                        choices=["rope", "forward", "timm", "cache"])
    parser.add_argument("--out", type=Path, help="write the tables as markdown to this file")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sections = {"rope": rope_apply, "forward": forward_cost, "timm": versus_timm, "cache": cache_hits}
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"{platform.processor() or 'cpu'}, " \
                                                                       f"{torch.get_num_threads()} threads"
    command = "python scripts/bench_speed.py " + " ".join(sys.argv[1:])
    out = ["# Performance", "", f"Made by `{command}`.", "",
           f"Device: {name}; torch {torch.__version__}, timm {timm.__version__}; medians over {args.repeats} "
           f"interleaved rounds. Only ratios measured side by side mean anything.", ""]
    for key in args.sections:
        title, header, rows, note = sections[key](device, args, sync)
        block = markdown(title, header, rows) + (f"\n\n{note}" if note else "")
        print(block + "\n", flush=True)
        out += [block, ""]
    if args.out:
        args.out.write_text("\n".join(out))


if __name__ == "__main__":
    main()
