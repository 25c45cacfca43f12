"""One attention for every encoding: rotary on q/k, bias on the logits, ``scaled_dot_product_attention`` or, for a
bias with a pair form, FlexAttention (:mod:`visionpe.flex`)."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_choice, check_module, check_number, check_positive_int
from ._compat import autocast_dtype, is_autocast_enabled, is_compiling
from .flex import flex_attend, flex_available, pair_scores
from .grid import Grid, Layout, MixedLayout, as_layout

ATTENTIONS = ("auto", "sdpa", "flex")
# What attention="auto" takes per device type for a bias with a pair form, by measurement (docs/reports/PERFORMANCE.md,
# "FlexAttention on CPU" and the GPU section): on CPU flex was never faster than SDPA with the materialised bias, and CPU FlexAttention has no backward;
# on CUDA, SDPA until the GPU check (scripts/gpu_check.sh) has measured flex against it.
AUTO_ATTENTION = {"cpu": "sdpa", "cuda": "sdpa"}


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: Grid | Layout | MixedLayout,
           rotary: nn.Module | None = None,
           bias: nn.Module | None = None, attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
           scale: float | None = None, attention: str = "auto", tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Attention over a grid's tokens with optional rotary and bias encodings.

    Args:
        q, k, v: ``(B, heads, P + N, head_dim)`` (``v`` may have another head_dim); ``P + K`` tokens when
            ``grid`` is a :class:`Layout` that keeps ``K`` patches per sample.
        grid: the token layout, a :class:`Grid`, a :class:`Layout` (kept patches per sample) or a
            :class:`MixedLayout` (a grid per sample, padded; padded keys are masked). Prefix tokens are never rotated
            and get zero bias unless the encoding defines prefix entries; kept tokens keep their own positions.
        rotary: a rotary-family module, ``rotary(q, k, grid) -> (q, k)``.
        bias: a bias-family module, ``bias(grid) -> (heads, P + N, P + N)``.
        attn_mask: extra additive float mask broadcastable to ``(B, heads, T, T)`` (e.g. Swin's shift mask)
            or a boolean mask (True = attend).
        scale: the logits' factor, a finite number > 0 (default ``head_dim ** -0.5``).
        attention: ``"sdpa"``: ``scaled_dot_product_attention`` with the bias materialised; ``"flex"``:
            ``flex_attention`` reading the bias per token pair (:meth:`~visionpe.BiasEncoding.score_mod`; torch >=
            2.5; no backward on CPU: a backward through a CPU call is an error); ``"auto"``: the measured
            choice for the device (:data:`AUTO_ATTENTION`). Calls without a bias, with a bias that has no pair form
            or with attention dropout take SDPA whatever the choice.
        tokens: the attention's input ``(B, T, dim)`` (the tokens q, k, v were projected from, in their order), for a
            bias that reads it (``bias.reads_tokens``: PaPE's per-query parabolas); required then, unused otherwise.
            A bias that reads the queries (``bias.reads_queries``: decomposed relative positions) gets ``q`` itself,
            its heads merged, ``(B, T, heads * head_dim)``, in their place.
    Returns:
        ``(B, heads, P + N, v_head_dim)``.
    """
    check_qkv(q, k, v)
    check_slot("rotary", rotary)
    check_slot("bias", bias)
    check_number("dropout_p", dropout_p, minimum=0.0, maximum=1.0)
    check_choice("attention", attention, ATTENTIONS)
    if scale is not None:
        check_number("scale", scale, minimum=0.0, inclusive=False)  # softmax(scale * q k^T): 0 is uniform, < 0 inverts
    layout = grid if isinstance(grid, MixedLayout) else as_layout(grid)
    attn_mask = _extra_mask(attn_mask, q, k)
    tokens = _bias_tokens(bias, tokens, q)
    if bias is not None and dropout_p == 0.0 and _wants_flex(attention, q):
        _check_tokens(q, layout)
        scores = pair_scores(layout, bias, tokens)
        inputs = [q, k, v, *(rotary.parameters() if rotary else ()), *(t for s in scores or () for t in s.tables)]
        if scores is not None and _flex_runs_here(attention, inputs):
            if q.device.type != "cpu":
                q, k = _rotate(q, k, layout, rotary)
                return flex_attend(q, k, v, layout, scores, attn_mask, scale)
            # CPU FlexAttention has no backward and refuses inputs that require grad (also under no_grad): it runs on
            # detached ones, and where a gradient is needed a backward through its output raises
            with torch.no_grad():
                q, k = _rotate(q, k, layout, rotary)
                out = flex_attend(q.detach(), k.detach(), v.detach(), layout, scores, attn_mask, scale)
            needing = [t for t in inputs if t.requires_grad]
            return _NoCpuFlexBackward.apply(out, *needing) if torch.is_grad_enabled() and needing else out
    if isinstance(layout, MixedLayout):
        q, k, mask = _mixed_positions(q, k, layout, rotary, bias, tokens=tokens)
    else:
        q, k, mask = _positions(q, k, layout, rotary, bias, tokens)
    if (rotary is not None and v.requires_grad and torch.is_grad_enabled() and not is_compiling()
            and _views_larger_buffer(v)):
        # SDPA saves q, k, v for its backward; q and k are now rotated copies, so a v that views the fused qkv would
        # keep the whole buffer alive: a copy of v lets it go (RoPE's training memory is then that of no position;
        # a compiled graph chooses what it saves itself)
        v = v.clone()
    if attn_mask is not None:
        mask = attn_mask if mask is None else mask + attn_mask
    return _sdpa(q, k, v, mask, dropout_p, scale)


def _bias_tokens(bias, tokens, q: torch.Tensor) -> torch.Tensor | None:
    """The tokens a bias that reads them gets (checked: ``(B, T, dim)`` floating, q's batch and tokens), the queries
    ``q`` with their heads merged for a bias that reads those; None for any other bias."""
    if getattr(bias, "reads_queries", False):
        return merge_heads(q)
    if not getattr(bias, "reads_tokens", False):
        return None
    if tokens is None:
        raise ValueError(f"bias {type(bias).__name__} reads the attention's input tokens: pass tokens=x, the (batch, "
                         "tokens, dim) input q, k and v were projected from")
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 3 or not tokens.is_floating_point() \
            or tokens.shape[:2] != (q.shape[0], q.shape[2]):
        got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a floating (batch={q.shape[0]}, tokens={q.shape[2]}, dim) tensor, the "
                         f"attention's input, got {got}")
    return tokens


def _extra_mask(attn_mask, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The caller's mask checked and made additive in q's dtype (a boolean False becomes ``-inf``)."""
    if attn_mask is None:
        return None
    expected = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.ndim > 4 or not _broadcasts(attn_mask.shape, expected):
        raise ValueError(f"attn_mask of shape {tuple(getattr(attn_mask, 'shape', ()))} does not broadcast to "
                         f"(batch, heads, q tokens, k tokens) = {expected}")
    if attn_mask.dtype == torch.bool:
        return torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, float("-inf"))
    return attn_mask.to(q.dtype)


def _wants_flex(attention: str, q: torch.Tensor) -> bool:
    """Whether the choice asks for FlexAttention on q's device (an explicit "flex" needs torch >= 2.5)."""
    if attention == "flex" and not flex_available():
        raise ValueError(f"attention='flex' needs torch >= 2.5 (torch.nn.attention.flex_attention), this is torch "
                         f"{torch.__version__}; use attention='sdpa'")
    return attention == "flex" or (attention == "auto" and AUTO_ATTENTION.get(q.device.type) == "flex"
                                   and flex_available())


def _needs_cpu_backward(inputs: list[torch.Tensor]) -> bool:
    """A CPU call whose output needs a gradient (of q, k, v, a rotary encoding's parameters or the bias tables)."""
    return inputs[0].device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in inputs)


def _flex_runs_here(attention: str, inputs: list[torch.Tensor]) -> bool:
    """FlexAttention has no CPU backward: a CPU call that needs gradients takes SDPA under "auto"; under an explicit
    "flex" FlexAttention runs the forward and a backward through it is an error (:class:`_NoCpuFlexBackward`), so an
    eval-mode model needs no ``torch.no_grad()`` and training is never a silently missing gradient."""
    return attention == "flex" or not _needs_cpu_backward(inputs)


CPU_FLEX_BACKWARD = ("attention='flex' cannot train on CPU: PyTorch's CPU FlexAttention has no backward; use "
                     "attention='auto' or 'sdpa' for CPU training (a forward runs, also without torch.no_grad())")


class _NoCpuFlexBackward(torch.autograd.Function):
    """The output of a CPU FlexAttention forward run without autograd, tied to the inputs that need a gradient: its
    backward is the error :data:`CPU_FLEX_BACKWARD`, never a gradient silently missing."""

    @staticmethod
    def forward(ctx, out, *inputs):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        raise ValueError(CPU_FLEX_BACKWARD)


def _rotate(q: torch.Tensor, k: torch.Tensor, layout: Layout | MixedLayout, rotary):
    """q and k rotated by the rotary encoding (per distinct grid of a mixed layout), or as they are."""
    if rotary is None:
        return q, k
    if isinstance(layout, MixedLayout):
        q, k, _ = _mixed_positions(q, k, layout, rotary, None, with_mask=False)
        return q, k
    return rotated(rotary, q, k, layout.unwrap())


# PyTorch's fused CPU attention as an op that returns the log-sum-exp (private; SDPA's own path where it is missing)
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float,
          scale: float | None) -> torch.Tensor:
    """``scaled_dot_product_attention``, except for a float mask that needs a gradient (a learned bias in
    training) on CPU: SDPA sends that to its unfused math path, which keeps every block's ``(B, heads, T, T)``
    softmax for the backward; :class:`_FusedBiasAttention` runs the fused kernel instead.

    Under CPU autocast q, k, v and a float mask are cast as SDPA's autocast casts them, here: a custom function is
    not autocast, and torch 2.1's CPU autocast does not cover SDPA at all (Swin-V2's normalised q, scaled by its
    float32 logit scale, is float32 there while k and v are bfloat16, which SDPA refuses)."""
    if q.device.type == "cpu" and is_autocast_enabled("cpu"):
        dtype = autocast_dtype("cpu")
        q, k, v = (t.to(dtype) for t in (q, k, v))
        if mask is not None and mask.is_floating_point():
            mask = mask.to(dtype)
    if (mask is not None and mask.requires_grad and torch.is_grad_enabled() and q.device.type == "cpu"
            and dropout_p == 0.0 and mask.is_floating_point() and q.shape[-1] == v.shape[-1]
            and _FLASH_CPU is not None and not is_compiling()):
        return _FusedBiasAttention.apply(q, k, v, mask, q.shape[-1] ** -0.5 if scale is None else scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


class _FusedBiasAttention(torch.autograd.Function):
    """``softmax(scale * q @ k^T + mask) @ v`` with a gradient to ``mask``, for CPU.

    Forward: PyTorch's fused CPU attention kernel, which returns the output and the row log-sum-exp and saves no
    ``(T, T)`` tensor. Backward: for a chunk of the batch at a time (:func:`batch_chunks`) the probabilities are
    recomputed from the log-sum-exp and the gradients of q, k, v and mask follow in closed form
    (``dS = P * (dO @ v^T - rowsum(dO * O))``), the mask's summed to its broadcast shape. Keeps no softmax from
    forward to backward (training memory in docs/reports/PERFORMANCE.md); differentiable once (a second derivative raises).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, scale: float):
        out, logsumexp = _FLASH_CPU(q, k, v, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, mask, out, logsumexp)
        ctx.scale = scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, mask, out, logsumexp = ctx.saved_tensors
        dtypes = [t.dtype for t in (q, k, v, mask)]
        work = torch.promote_types(q.dtype, torch.float32)  # half types recompute in float32
        q, k, v, mask, out, grad_out = (t.to(work) for t in (q, k, v, mask, out, grad_out))
        # q, k and grad_out each feed two batched matmuls, which copy a (B, heads) batch that is not one stride (q, k
        # sliced from a fused qkv) per call: copy them once
        q, k, grad_out = q.contiguous(), k.contiguous(), grad_out.contiguous()
        row_dot = (grad_out * out).sum(-1, keepdim=True)
        logsumexp = logsumexp.to(work).unsqueeze(-1)
        per_sample = mask.ndim == 4 and mask.shape[0] == q.shape[0] > 1
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v, dtype=work)
        grad_mask = torch.empty_like(mask) if per_sample else torch.zeros_like(mask)
        for rows in batch_chunks(q.shape[0], q.shape[1] * q.shape[2] * k.shape[2] * q.element_size()):
            rows_mask = mask[rows] if per_sample else mask
            probs = torch.matmul(q[rows], k[rows].transpose(-2, -1)).mul_(ctx.scale).add_(rows_mask)
            probs = probs.sub_(logsumexp[rows]).exp_()  # (rows, heads, T, S)
            torch.matmul(probs.transpose(-2, -1), grad_out[rows], out=grad_v[rows])
            grad_logits = torch.matmul(grad_out[rows], v[rows].transpose(-2, -1)).sub_(row_dot[rows]).mul_(probs)
            torch.matmul(grad_logits, k[rows], out=grad_q[rows])
            torch.matmul(grad_logits.transpose(-2, -1), q[rows], out=grad_k[rows])
            if per_sample:
                grad_mask[rows] = grad_logits.sum_to_size(rows_mask.shape)
            else:
                grad_mask += grad_logits.sum_to_size(mask.shape)
        grads = (grad.to(dtype) for grad, dtype in zip((grad_q.mul_(ctx.scale), grad_k.mul_(ctx.scale), grad_v,
                                                        grad_mask), dtypes))
        return (*grads, None)


# The fused bias backward splits the batch when a sample's (heads, T, S) map is small (few tokens): its transient
# probabilities and logit gradients then take about BACKWARD_CHUNK_BYTES instead of the whole batch's (training-step
# peak memory of rel_bias at the small config 1.105x -> 1.048x no position) at the same speed (1.21-1.36x either way,
# side by side). Larger maps keep the whole batch, whose batched matmuls do better (ViT-S/16 training step: 1.01x
# whole, 1.07x in chunks of 4 samples, 1.11x of 1). Measured in one process each; docs/reports/PERFORMANCE.md.
BACKWARD_CHUNK_BYTES = 2**20
CHUNKED_SAMPLE_BYTES = 2**18


def batch_chunks(batch: int, sample_bytes: int) -> list[slice]:
    """The batch in one slice, or, when a sample's map of ``sample_bytes`` is under :data:`CHUNKED_SAMPLE_BYTES`, in
    slices of about :data:`BACKWARD_CHUNK_BYTES`."""
    step = batch if sample_bytes >= CHUNKED_SAMPLE_BYTES else max(1, BACKWARD_CHUNK_BYTES // sample_bytes)
    return [slice(start, start + step) for start in range(0, batch, step)]


def _check_tokens(q: torch.Tensor, layout: Layout | MixedLayout) -> None:
    """q's tokens are the layout's; its batch fits the layout's samples (one grid each, or the rows of ``keep``)."""
    if isinstance(layout, MixedLayout):
        layout.check_batch(q.shape[0])
    else:
        layout.check_batch(q.shape[0], q.device)
    if q.shape[2] == layout.num_tokens:
        return
    if isinstance(layout, MixedLayout):
        raise ValueError(f"q, k, v have {q.shape[2]} tokens but the longest sample of the mixed layout has "
                         f"{layout.num_tokens}")
    grid = layout.grid
    raise ValueError(f"q, k, v have {q.shape[2]} tokens but grid {grid.shape} with prefix={grid.prefix} has "
                     f"{layout.num_tokens}{'' if layout.keep is None else ' kept'}")


def _positions(q: torch.Tensor, k: torch.Tensor, layout: Layout, rotary, bias, tokens=None):
    """q and k rotated, and the bias of the layout (``None`` without a bias encoding; ``tokens`` for a bias that
    reads them)."""
    grid = layout.grid
    _check_tokens(q, layout)  # also without encodings: the grid states the tokens
    if rotary is not None:
        q, k = rotated(rotary, q, k, layout.unwrap())
    if bias is None:
        return q, k, None
    if tokens is not None:
        return q, k, _token_bias(bias, layout, tokens, q)
    mask = bias(grid)
    expected = (q.shape[1], grid.num_tokens, grid.num_tokens)
    if not isinstance(mask, torch.Tensor) or mask.ndim != 3 or mask.shape[0] not in (1, q.shape[1]) \
            or tuple(mask.shape[1:]) != expected[1:]:
        heads = f"{mask.shape[0]} heads, " if getattr(mask, "ndim", 0) == 3 else ""
        raise ValueError(f"bias gives {heads}shape {tuple(getattr(mask, 'shape', ()))} but q, k have "
                         f"{q.shape[1]} heads: expected (num_heads, q tokens, k tokens) = {expected} (build the "
                         f"bias with num_heads={q.shape[1]})")
    mask = layout.pairs(mask)  # kept rows and columns per sample: (B, heads, P + K, P + K)
    # 4-D always: SDPA's CPU kernels take a (heads, T, T) mask through a slow broadcasting path (2-3x the attention)
    return q, k, (mask if mask.ndim == 4 else mask[None]).to(q.dtype)


def _token_bias(bias, layout: Layout, tokens: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A token-reading bias of the layout's tokens, checked: ``(B or 1, heads or 1, T, T)`` in q's dtype."""
    mask = bias(layout.unwrap(), tokens)
    t = layout.num_tokens
    if not isinstance(mask, torch.Tensor) or mask.ndim != 4 or mask.shape[0] not in (1, q.shape[0]) \
            or mask.shape[1] not in (1, q.shape[1]) or tuple(mask.shape[2:]) != (t, t):
        raise ValueError(f"bias {type(bias).__name__} gives shape {tuple(getattr(mask, 'shape', ()))} but q, k have "
                         f"batch {q.shape[0]} and {q.shape[1]} heads: expected (batch, num_heads, {t}, {t})")
    return mask.to(q.dtype)


def _mixed_positions(q: torch.Tensor, k: torch.Tensor, layout: MixedLayout, rotary, bias, with_mask: bool = True,
                     tokens: torch.Tensor | None = None):
    """Per-sample grids: every encoding runs once per distinct grid on its samples' real tokens; padded keys are
    masked. Returns q, k and the ``(B, heads or 1, T, T)`` additive mask (None with ``with_mask=False``)."""
    _check_tokens(q, layout)
    mask = None
    if with_mask:
        mask = q.new_zeros(q.shape[0], q.shape[1] if bias is not None else 1, q.shape[2], q.shape[2])
    rotated_q, rotated_k = (q.clone(), k.clone()) if rotary is not None else (q, k)
    for index, grid in layout.groups(q.device):
        n = grid.num_tokens
        group_tokens = None if tokens is None else tokens[index, :n]
        group_q, group_k, group_bias = _positions(q[index, :, :n], k[index, :, :n], Layout(grid), rotary, bias,
                                                  group_tokens)
        if rotary is not None:
            rotated_q[index, :, :n], rotated_k[index, :, :n] = group_q, group_k
        if group_bias is not None:
            mask[index, :, :n, :n] = group_bias
    if mask is not None:
        mask = mask.masked_fill(~layout.key_mask(q.device)[:, None, None, :], float("-inf"))
    return rotated_q, rotated_k, mask


def rotated(rotary, q: torch.Tensor, k: torch.Tensor, grid) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotary(q, k, grid)``, checked: a rotary encoding returns ``(q, k)`` of the shapes it was given."""
    out = rotary(q, k, grid)
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)
            and out[0].shape == q.shape and out[1].shape == k.shape):
        got = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in out] \
            if isinstance(out, (tuple, list)) else type(out).__name__
        raise ValueError(f"rotary {type(rotary).__name__} returned {got}; a rotary encoding must return (q, k) of "
                         f"the shapes it was given, {tuple(q.shape)} and {tuple(k.shape)}")
    return out[0], out[1]


SLOTS = {"rotary": "rotary(q, k, grid) -> (q, k)", "bias": "bias(grid) -> (heads, T, T)"}


def check_slot(param: str, module) -> None:
    """``module`` goes in ``param`` (``"rotary"`` or ``"bias"``): None, or a module whose ``family`` (if it has one, as
    every visionpe encoding) is ``param``."""
    if module is None:
        return
    if not isinstance(module, nn.Module):
        raise ValueError(f"{param} must be a torch.nn.Module ({SLOTS[param]}) or None, got {type(module).__name__}")
    family = getattr(module, "family", param)
    if family == param:
        return
    where = (f"pass it as {family}=..." if family in SLOTS else
             "a tokens encoding is added to the tokens before attention, pe(x, grid); it has no slot in attention")
    raise ValueError(f"{param}={type(module).__name__} is a {family!r} encoding, not a {param} one ({SLOTS[param]}); "
                     f"{where}")


def _views_larger_buffer(t: torch.Tensor) -> bool:
    """``t`` is a view into storage it does not fill (e.g. v sliced from a fused qkv)."""
    return t.untyped_storage().nbytes() > t.numel() * t.element_size()


def _broadcasts(shape, target) -> bool:
    """``shape`` broadcasts to ``target`` without changing it."""
    try:
        return tuple(torch.broadcast_shapes(tuple(shape), tuple(target))) == tuple(target)
    except RuntimeError:
        return False


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k, v must be ``(B, heads, T, d)`` floating tensors with matching batch, heads, tokens and q/k width."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4 or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating (batch, heads, tokens, head_dim) tensor, got "
                             f"{tuple(getattr(t, 'shape', ()))} {getattr(t, 'dtype', type(t).__name__)}")
    if not q.dtype == k.dtype == v.dtype and not is_autocast_enabled(q.device.type):
        raise ValueError(f"q, k, v must share one dtype outside autocast, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if not q.shape[:2] == k.shape[:2] == v.shape[:2] or k.shape[2] != v.shape[2]:
        raise ValueError(f"q, k, v disagree in batch, heads or tokens: {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")


class Attention(nn.Module):
    """Multi-head self-attention with timm's parameter names (``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``gate``,
    ``proj``): a timm ``Attention``'s weights load unchanged. ``rotary`` and ``bias`` hold the block's encodings;
    ``attention`` is :func:`attend`'s choice (``"auto"``, ``"sdpa"``, ``"flex"``; :func:`set_attention` sets it in a
    whole model).

    Call: ``attn(x, grid)`` with ``x: (B, P + N, dim)`` -> same shape. The grid travels with the call, so one
    module serves concurrent calls on different grids.
    """

    attention: str = "auto"

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, norm_layer=nn.LayerNorm,
                 rotary: nn.Module | None = None, bias: nn.Module | None = None, attention: str = "auto"):
        super().__init__()
        check_choice("attention", attention, ATTENTIONS)
        self.attention = attention
        check_positive_int("dim", dim)
        check_positive_int("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = nn.Identity()
        self.gate = None
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        check_slot("rotary", rotary)
        check_slot("bias", bias)
        self.rotary, self.bias = rotary, bias

    @classmethod
    def from_timm(cls, source: nn.Module, rotary: nn.Module | None = None,
                  bias: nn.Module | None = None) -> "Attention":
        """Take over a timm ``Attention``'s modules (weights shared, names kept) and add encodings."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.num_heads, self.head_dim = source.num_heads, source.head_dim
        for name in ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop"):
            module = getattr(source, name, None)
            setattr(self, name, nn.Identity() if module is None else module)
        self.gate = getattr(source, "gate", None)
        self.rotary, self.bias = rotary, bias
        return self

    def forward(self, x: torch.Tensor, grid: Grid, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_attention_input(x, self.qkv.in_features)
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = split_qkv(self.qkv(x), self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        dropout_p = self.attn_drop.p if self.training and isinstance(self.attn_drop, nn.Dropout) else 0.0
        out = attend(q, k, v, grid, self.rotary, self.bias, attn_mask, dropout_p=dropout_p, attention=self.attention,
                     tokens=x)
        out = self.norm(merge_heads(out))
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))


class ScriptedAttention(nn.Module):
    """TorchScript form of :class:`Attention` (what a scripted model's blocks hold): the same modules (weights
    shared) and the TorchScript forms of its encodings (``rotary``, ``bias``: :meth:`~visionpe.Encoding.scriptable`);
    ``forward(x, shape, prefix, attn_mask=None)`` with ``x: (B, P + N, dim)``, ``shape`` the patch grid read from
    the input and ``prefix = P``: q and k rotated, the bias added to the logits (4-D, in q's dtype, as :func:`attend`
    adds it) and an additive float ``attn_mask``, then ``scaled_dot_product_attention`` -> ``(B, P + N, dim)``. A
    subclass projects otherwise (:meth:`project`: Eva's separate biases and grouped key/value heads)."""

    def __init__(self, attn: Attention, rotary: Optional[nn.Module], bias: Optional[nn.Module]):
        super().__init__()
        self.num_heads = attn.num_heads
        for name in ("qkv", "q_norm", "k_norm", "norm", "proj", "proj_drop"):
            setattr(self, name, getattr(attn, name))  # (Eva's attention without a fused qkv: None)
        self.gate = attn.gate
        self.dropout_p = float(attn.attn_drop.p) if isinstance(attn.attn_drop, nn.Dropout) else 0.0
        self.rotary, self.bias = rotary, bias  # the encodings' TorchScript forms, or None
        self.training = attn.training  # the mode of the attention it stands for (an eval model's drops nothing)

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x: (B, T, dim)`` -> q, k, v ``(B, heads, T, head_dim)`` before the q/k norms."""
        qkv = self.qkv(x).unflatten(-1, [3, self.num_heads, -1]).permute(2, 0, 3, 1, 4)  # (3, B, heads, T, d)
        return qkv[0], qkv[1], qkv[2]

    def forward(self, x: torch.Tensor, shape: List[int], prefix: int,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        q, k, v = self.project(x)
        q, k = self.q_norm(q), self.k_norm(k)
        rotary = self.rotary
        if rotary is not None:
            q, k = rotary(q, k, shape, prefix)
        mask = attn_mask
        bias = self.bias
        if bias is not None:
            logits = bias(shape, prefix)[None].to(q.dtype)  # (1, heads, T, T)
            mask = logits if mask is None else logits + mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             dropout_p=self.dropout_p if self.training else 0.0)
        out = self.norm(merge_heads(out))
        gate = self.gate
        if gate is not None:
            out = out * gate(x).sigmoid()
        return self.proj_drop(self.proj(out))


# The heads' reshapes, in plain torch rather than einops so that torch.fx can trace them (timm's and torchvision's FX
# feature extraction of the backbones).

def split_qkv(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused projection ``(B, T, 3 * heads * d)`` -> q, k, v, each ``(B, heads, T, d)``."""
    return qkv.unflatten(-1, (3, num_heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(B, T, heads * d)`` -> ``(B, heads, T, d)``."""
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, heads, T, d)`` -> ``(B, T, heads * d)``."""
    return x.transpose(1, 2).flatten(2)


def check_attention_input(x: torch.Tensor, dim: int) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != dim:
        got = f"width {x.shape[-1]} (shape {tuple(x.shape)})" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a (batch, tokens, dim={dim}) tensor, got {got}")


# torch.fx records each as one call, run on the real tensors: attend computes the positions at the size it is given
# (a symbolically traced model serves any resolution, as the eager one)
torch.fx.wrap("attend")
torch.fx.wrap("check_attention_input")


def set_attention(model: nn.Module, attention: str) -> nn.Module:
    """Set :func:`attend`'s ``attention`` choice (``"auto"``, ``"sdpa"``, ``"flex"``) in every attention module of
    ``model`` (each class that declares an ``attention`` attribute: :class:`Attention`, the Swin and Video Swin window
    attentions); returns ``model``."""
    check_module("model", model)
    check_choice("attention", attention, ATTENTIONS)
    found = [m for m in model.modules() if isinstance(getattr(type(m), "attention", None), str)]
    if not found:
        raise ValueError(f"{type(model).__name__} has no visionpe attention module; build it with "
                         f"visionpe.create_model or visionpe.apply first")
    for module in found:
        module.attention = attention
    return model
