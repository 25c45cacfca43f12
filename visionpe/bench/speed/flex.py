"""Part ``flex`` (opt-in): compiled FlexAttention with a ``score_mod`` vs SDPA with the same bias materialised."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .tables import MB, Table, ms, versus
from .timing import CONTROL, Run, compiled, error_text, timed_or_error


def grid_coords(side: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each token of a ``side x side`` grid, row-major."""
    rows, cols = torch.meshgrid(torch.arange(side, device=device), torch.arange(side, device=device), indexing="ij")
    return rows.flatten(), cols.flatten()


def alibi_2d_bias(heads: int, side: int, device):
    """ALiBi-2D as ``bias(h, q, kv)``: ``-slope[h]`` times the euclidean distance of the query's and the key's grid
    coordinates, with ALiBi's geometric slopes ``2 ** (-8 (h + 1) / heads)``. The arguments are index tensors that
    broadcast: scalars inside ``score_mod``, a whole (heads, T, T) grid for the dense mask."""
    rows, cols = grid_coords(side, device)
    slopes = 2 ** (-8 / heads * torch.arange(1, heads + 1, device=device))

    def bias(h, q, kv):
        dy, dx = (rows[q] - rows[kv]).float(), (cols[q] - cols[kv]).float()
        return -slopes[h] * torch.sqrt(dy * dy + dx * dx)
    return bias


def swin_table_bias(heads: int, side: int, device):
    """A Swin relative position bias as ``bias(h, q, kv)``: a learned ``((2 side - 1)^2, heads)`` table (random here,
    of the scores' order of magnitude) gathered at the offset of the query's and the key's grid coordinates."""
    rows, cols = grid_coords(side, device)
    span = 2 * side - 1
    table = (0.5 * torch.randn(span * span, heads, generator=torch.Generator().manual_seed(0))).to(device)

    def bias(h, q, kv):
        return table[(rows[q] - rows[kv] + side - 1) * span + cols[q] - cols[kv] + side - 1, h]
    return bias


FLEX_BIASES = {"ALiBi-2D": alibi_2d_bias, "Swin table": swin_table_bias}


def dense_bias(bias, heads: int, tokens: int, device) -> torch.Tensor:
    """``bias`` at every head, query and key: the ``(1, heads, T, T)`` float mask that SDPA adds to its scores."""
    index = torch.arange(tokens, device=device)
    return bias(torch.arange(heads, device=device)[:, None, None], index[:, None], index).unsqueeze(0)


def score_mod(bias):
    """FlexAttention's ``score_mod`` adding ``bias(h, q, kv)`` to each score."""
    return lambda score, b, h, q, kv: score + bias(h, q, kv)


def flex_cost(run: Run) -> list[Table]:
    """Per size of the plan, compiled FlexAttention vs SDPA with the same bias as a mask; then whether training
    through FlexAttention works on this device."""
    heads, head_dim, sizes = run.plan.flex
    tables = [flex_table(run, batch, side, heads, head_dim) for batch, side in sizes]
    return tables + [flex_training(run, *sizes[0], heads, head_dim)]


def qkv(run: Run, batch: int, tokens: int, heads: int, head_dim: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(batch, heads, tokens, head_dim, generator=generator).to(run.device) for _ in range(3)]


def flex_table(run: Run, batch: int, side: int, heads: int, head_dim: int) -> Table:
    """SDPA without a mask (the floor), with each bias precomputed or built in each call, and compiled
    ``flex_attention`` computing the bias in its ``score_mod``, all timed side by side."""
    from torch.nn.attention.flex_attention import flex_attention  # torch >= 2.5; the other parts run without it
    tokens, device, sdpa = side * side, run.device, F.scaled_dot_product_attention
    q, k, v = qkv(run, batch, tokens, heads, head_dim)
    fns = {"SDPA, no mask": lambda: sdpa(q, k, v), "SDPA, no mask" + CONTROL: lambda: sdpa(q, k, v)}
    notes = []
    for case, make in FLEX_BIASES.items():
        bias = make(heads, side, device)
        mask, mod = dense_bias(bias, heads, tokens, device), score_mod(bias)
        flex, seconds = compiled(lambda mod=mod: flex_attention(q, k, v, score_mod=mod))
        fns |= {f"{case}: SDPA + bias precomputed": lambda mask=mask: sdpa(q, k, v, attn_mask=mask),
                f"{case}: SDPA + bias built per call":
                    lambda bias=bias: sdpa(q, k, v, attn_mask=dense_bias(bias, heads, tokens, device)),
                f"{case}: flex_attention + score_mod, compiled": flex}
        if callable(flex):
            with torch.no_grad():
                diff = (flex() - sdpa(q, k, v, attn_mask=mask)).abs().max().item()
            notes.append(f"{case}: compiled in {seconds:.1f} s, max abs difference to SDPA + bias {diff:.1e}")
    with torch.no_grad():
        t = timed_or_error(run, fns)
    return versus(f"FlexAttention vs SDPA with a (1, heads, T, T) bias: batch {batch}, {heads} heads, {tokens} tokens "
                  f"({side}x{side} grid), head dim {head_dim}, float32", t, "SDPA, no mask", "ms", ms, name="attention",
                  note=f"Flex: `torch.compile(fullgraph=True)` of `flex_attention` with a `score_mod` computing the "
                       f"bias from the token coordinates; SDPA: the same bias as a {mask.nbytes / MB:.3g} MB float "
                       f"mask. ALiBi-2D: -slope[h] x euclidean grid distance; Swin table: a learned "
                       f"{(2 * side - 1) ** 2} x {heads} table (one row per 2D offset) gathered at the coordinate "
                       f"offset. {'; '.join(notes)}.")


def flex_training(run: Run, batch: int, side: int, heads: int, head_dim: int) -> Table:
    """Forward + backward through compiled ``flex_attention`` with q, k, v requiring grad: the gradients' difference to
    SDPA + bias, or the error it raises."""
    tokens, device = side * side, run.device
    q, k, v = (t.requires_grad_() for t in qkv(run, batch, tokens, heads, head_dim))
    grad_out = torch.randn_like(q)
    from torch.nn.attention.flex_attention import flex_attention
    # not fullgraph: dynamo would report an error raised inside flex_attention as "Unsupported: Observed exception"
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    for case, make in FLEX_BIASES.items():
        bias = make(heads, side, device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_bias(bias, heads, tokens, device))
        expected = torch.autograd.grad(out, (q, k, v), grad_out)
        try:
            grads = torch.autograd.grad(flex(q, k, v, score_mod=score_mod(bias)), (q, k, v), grad_out)
            diff = max((g - e).abs().max().item() for g, e in zip(grads, expected))
            rows.append((case, f"works: max abs difference of the q, k, v gradients to SDPA + bias {diff:.1e}"))
        except Exception as error:
            rows.append((case, error_text(error)))
    return Table(f"Training through FlexAttention on {device.type}: forward + backward of compiled flex_attention, "
                 f"q, k, v requiring grad, batch {batch}, {tokens} tokens", ["bias", "forward + backward"], rows)


