"""Part ``rope``: RoPE apply on q and k sliced from a fused qkv vs a copy of q and k (the memory floor) and
timm's ``apply_rot_embed_cat``, eager and compiled."""
from __future__ import annotations

import math

import timm
import torch
from einops import rearrange

import visionpe as vpe
from ...rotary.rope import apply_rotary
from .tables import Table, ms, versus
from .timing import CONTROL, Run, compiled, timed_or_error


def rope_apply(run: Run) -> list[Table]:
    """RoPE on q and k vs a copy of q and k, eager and compiled, at each batch size of the plan."""
    heads, shape, head_dim, batches = run.plan.rope
    return [rope_table(run, batch, heads, shape, head_dim) for batch in batches]


def rope_table(run: Run, batch: int, heads: int, shape, head_dim: int) -> Table:
    torch.manual_seed(0)
    grid = vpe.Grid(shape, prefix=1)
    qkv = torch.randn(batch, 1 + math.prod(shape), 3, heads, head_dim, device=run.device)
    q, k = rearrange(qkv, "b t three h d -> three b h t d")[:2]  # sliced from a fused qkv, as every backbone does
    axial = vpe.build("rope_axial", head_dim=head_dim, num_heads=heads).to(run.device).eval()
    mixed = vpe.build("rope_mixed", head_dim=head_dim, num_heads=heads).to(run.device).eval()
    rotations = axial.rotations(grid, run.device, tokens_first=True)  # the module's cached table for q, k
    timm_rope = timm.layers.RotaryEmbeddingCat(head_dim, in_pixels=False, temperature=100, grid_indexing="xy")
    timm_embed = timm_rope.get_embed(shape).to(run.device)

    def timm_apply():
        # timm rotates the patch tokens only; the prefix is concatenated back, as in timm's Eva
        rq = timm.layers.apply_rot_embed_cat(q[:, :, 1:], timm_embed)
        rk = timm.layers.apply_rot_embed_cat(k[:, :, 1:], timm_embed)
        return torch.cat([q[:, :, :1], rq], 2), torch.cat([k[:, :, :1], rk], 2)

    with torch.no_grad():
        t = timed_or_error(run, {
            "copy q, k": lambda: (q.clone(), k.clone()),
            "copy q, k" + CONTROL: lambda: (q.clone(), k.clone()),
            "rope_axial, eager (cached table)": lambda: axial(q, k, grid),
            "rope_mixed, eager (cached table)": lambda: mixed(q, k, grid),
            "apply_rotary only, eager": lambda: (apply_rotary(q, rotations), apply_rotary(k, rotations)),
            "timm apply_rot_embed_cat, eager": timm_apply,
            "rope_axial, compiled (table in graph)": compiled(axial, q, k, grid)[0],
            "rope_mixed, compiled (table in graph)": compiled(mixed, q, k, grid)[0],
            "apply_rotary only, compiled": compiled(lambda: (apply_rotary(q, rotations),
                                                              apply_rotary(k, rotations)))[0],
        })
    speedup = t["timm apply_rot_embed_cat, eager"] / t["rope_axial, eager (cached table)"]
    return versus(f"RoPE apply: q and k of shape {tuple(q.shape)} sliced from a fused qkv, float32", t, "copy q, k",
                  "ms", ms,
                  name="apply", note=f"Eager visionpe rope_axial is {speedup:.2f}x faster than timm's eager "
                                     "apply_rot_embed_cat. Compiled: `torch.compile(fullgraph=True)` of the module "
                                     "(under compile the table is built inside the graph, not cached) and of the "
                                     "apply alone on the cached table.")


