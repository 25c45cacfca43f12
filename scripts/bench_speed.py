"""Speed and memory of visionpe encodings, as ratios measured side by side in one run (docs/PERFORMANCE.md holds the
results and, under "Reading these numbers", how to read them).

    python scripts/bench_speed.py [--device cpu|cuda] [--sections rope forward ...] [--pes rope_mixed ...]
                                  [--repeats 5] [--slow-repeats 5] [--min-run-time 0.25] [--scale-repeats 1]
                                  [--threads N] [--compile-pairs learned swin_bias ...] [--quick] [--out PATH]

Every time ratio compares timings taken in the same process, interleaved round-robin: each round times every
function in turn for a block of calls lasting at least ``--min-run-time`` seconds, and the median of the rounds'
per-call times is reported. The tables of the ViT-S/16 and Swin models at ``--batch`` 8 (ViT-S/16 eval forward and
training step, timm, cache), whose calls take 0.5 to 2.5 s on CPU (a round is one call, 2-10x ``--min-run-time``),
use ``--slow-repeats`` rounds. Rows named ``... (control)`` repeat the baseline with a second, identical model or
op: their gap to the baseline is the noise of the run. Sections (``--sections``, default all but the opt-in
``compile-train``, ``flex`` and ``profile``, in this order):

- ``rope``: RoPE apply on q and k of ViT-S/16 shape sliced from a fused qkv at batch 8 and 64, eager and compiled,
  vs a copy of q and k (the memory floor) and timm's ``apply_rot_embed_cat``.
- ``forward``: eval forward of each encoding vs the same model without position, at ViT-S/16 224 px and at the
  small training config (``configs/bench_vit_tiny.yaml``).
- ``train``: a training step (forward, backward, AdamW step; train mode, same batch, fixed seed), same models.
- ``memory``: peak memory of that training step per encoding vs none (CUDA: ``max_memory_allocated``; CPU: the
  peak of live tensor storages allocated in the step, tracked per operator by :class:`LiveTensorBytes`).
- ``compile``: ``torch.compile(model, fullgraph=True)`` eval forward per encoding vs compiled none (small config);
  and compiled visionpe vs compiled timm, same weights (``--compile-pairs``, each pair 1-1.5 min of compilation on
  2 cores with an empty inductor cache: by default learned ViT-S/16 and ``swin_bias`` Swin-T; ``control``,
  ``rope_axial``, ``rope_mixed`` on request; none when given no names).
- ``compile-train`` (opt-in: compiling eleven training steps takes 3-4 minutes on 2 cores, which would take the
  default run past 10): the training step of ``torch.compile(model, fullgraph=True)`` per encoding vs compiled none
  (small config).
- ``timm``: visionpe vs timm native, eager, same weights: learned ViT vs timm ViT (dynamic size), axial and mixed
  RoPE ViT vs timm's rope-vit ports (``Eva``), swin_bias Swin-T, cpb SwinV2-T.
- ``cache``: alternating resolutions (224/256) vs fixed ones: the table caches at work.
- ``scale``: large grids, batch 1 (ViT-S/16 at 1024 px, a 16-frame video): forward time and the position tables
  each encoding uses per forward.
- ``flex`` (opt-in, not in the default list: ``--sections flex``): compiled FlexAttention with a ``score_mod`` vs SDPA
  with the same bias materialised, for biases computed from token coordinates (ALiBi-2D, a Swin table), at ViT-S/16
  shape and at 4096 tokens; and whether training through FlexAttention works on the device.
- ``profile`` (opt-in): the training step of each encoding under ``torch.profiler`` at ViT-S/16 and the small config:
  the operators where its time over ``none`` goes (the evidence behind "Not met, and why" in docs/PERFORMANCE.md).

``--quick`` swaps every model for a tiny one and times one short round: a smoke test of the script, not a
measurement. ``--out`` rewrites the file's tables and keeps its hand-written "Reading these numbers" section.
Targets (printed with each ratio): time and memory of an encoding <= 1.05x none (``peg`` <= 1.10x).
"""
from __future__ import annotations

import argparse
import copy
import math
import platform
import statistics
import sys
import time
import weakref
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
import yaml
from einops import rearrange
from torch.nn.attention.flex_attention import flex_attention
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import visionpe as vpe  # noqa: E402
from visionpe.cache import TableCache  # noqa: E402
from visionpe.rotary.rope import apply_rotary  # noqa: E402

SECTIONS = ["rope", "forward", "train", "memory", "compile", "timm", "cache", "scale"]  # the default run
OPT_IN = ["compile-train", "flex", "profile"]  # run only when named in --sections
COMPILED_PAIRS = ("learned", "swin_bias", "control", "rope_axial", "rope_mixed")  # --compile-pairs: first two default
PES = ["learned", "sincos", "peg", "rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi"]
CONTROL = " (control)"
TINY_RECIPE = ROOT / "configs" / "bench_vit_tiny.yaml"
NUM_CLASSES = 10
MB = 2 ** 20


# -- what is measured on which model ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Setup:
    """A model recipe and its input batch: ``create(pe)`` builds the model (same seed for every encoding)."""

    label: str
    model: str
    kwargs: dict
    batch: int
    size: tuple[int, ...]  # input size, (H, W), or (T, H, W) for a video model
    video: dict | None = None  # create_video_model keywords (num_frames, tubelet_size)

    def create(self, pe: str, device) -> torch.nn.Module:
        torch.manual_seed(0)
        if self.video is None:
            model = vpe.create_model(self.model, pe=pe, num_classes=NUM_CLASSES, **self.kwargs)
        else:
            model = vpe.create_video_model(self.model, pe=pe, num_classes=NUM_CLASSES, **self.video, **self.kwargs)
        return model.to(device)

    def input(self, device, size: tuple[int, ...] | None = None) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        return torch.randn(self.batch, 3, *(size or self.size), generator=generator).to(device)

    def labels(self, device) -> torch.Tensor:
        return torch.randint(NUM_CLASSES, (self.batch,), generator=torch.Generator().manual_seed(1)).to(device)

    def tokens(self, model: torch.nn.Module) -> int:
        """Tokens per sample: prefix + patches."""
        patches = math.prod(s // p for s, p in zip(self.size, model.patch_embed.patch_size))
        return model.num_prefix_tokens + patches


@dataclass(frozen=True)
class Plan:
    """Model and input sizes of every section: the full ones, or tiny ones under ``--quick``."""

    vit: Setup  # ViT-S/16 at 224 px: forward, train, memory, timm, cache
    tiny: Setup  # the small training config: forward, train, memory
    compiled: Setup  # the compile section's per-encoding model (the small training config; quick: the quick ViT)
    large: tuple[Setup, ...]  # the scale section's grids
    rope: tuple[int, tuple[int, int], int, tuple[int, ...]]  # heads, patch grid, head_dim, batches
    swin: dict[str, tuple[str, dict, tuple[int, int]]]  # (timm name, kwargs, input size) of Swin-T and SwinV2-T
    alt_size: tuple[int, int]  # the cache section's second input size
    flex: tuple[int, int, tuple[tuple[int, int], ...]]  # heads, head_dim, (batch, grid side) of each flex table


def tiny_recipe(batch: int | None = None) -> Setup:
    """The model of ``configs/bench_vit_tiny.yaml`` (the CPU training benchmark's recipe) at its batch size."""
    cfg = yaml.safe_load(TINY_RECIPE.read_text())
    size = cfg["img_size"]
    kwargs = dict(cfg.get("model_kwargs", {}), img_size=size, patch_size=cfg["patch_size"])
    return Setup(f"{cfg['model']} of {TINY_RECIPE.name} ({kwargs['embed_dim']}-dim, {kwargs['depth']} blocks, "
                 f"{size} px / {cfg['patch_size']})", cfg["model"], kwargs, batch or cfg["batch_size"], (size, size))


def make_plan(quick: bool, batch: int) -> Plan:
    """The full sizes (ViT-S/16, Swin-T, 1024 px...) or, with ``quick``, tiny models that run in seconds."""
    if quick:
        width = dict(embed_dim=48, depth=2, num_heads=2)  # 48: sin and cos channels for 3 axes
        kw = dict(width, img_size=32, patch_size=8)
        swin = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2))
        vit = Setup("quick ViT (32 px / 8)", "vit_tiny_patch16_224", kw, 2, (32, 32))
        return Plan(
            vit=vit,
            tiny=tiny_recipe(batch=8),
            compiled=vit,
            large=(Setup("quick ViT, 64 px", "vit_tiny_patch16_224", kw, 1, (64, 64)),
                   Setup("quick video ViT, 4 frames of 32 px", "vit_tiny_patch16_224", dict(width, img_size=32), 1,
                         (4, 32, 32),
                         video=dict(num_frames=4, tubelet_size=(2, 8, 8)))),
            rope=(2, (4, 4), 16, (2, 4)),
            swin={"Swin-T": ("swin_tiny_patch4_window7_224", swin, (32, 32)),
                  "SwinV2-T": ("swinv2_tiny_window8_256", swin, (32, 32))},
            alt_size=(48, 48),
            flex=(2, 16, ((2, 4),)))
    return Plan(
        vit=Setup("vit_small_patch16_224 (ViT-S/16), 224 px", "vit_small_patch16_224", {}, batch, (224, 224)),
        tiny=tiny_recipe(),
        compiled=tiny_recipe(),
        large=(Setup("ViT-S/16, 1024 px", "vit_small_patch16_224", {}, 1, (1024, 1024)),
               Setup("ViT-S/16 video, 16 frames of 224 px, tubelets 2x16x16", "vit_small_patch16_224", {}, 1,
                     (16, 224, 224), video=dict(num_frames=16, tubelet_size=(2, 16, 16)))),
        rope=(6, (14, 14), 64, (batch, 64)),
        swin={"Swin-T": ("swin_tiny_patch4_window7_224", {}, (224, 224)),
              "SwinV2-T": ("swinv2_tiny_window8_256", {}, (256, 256))},
        alt_size=(256, 256),
        flex=(6, 64, ((batch, 14), (1, 64))))


@dataclass
class Run:
    """What every section needs: the device, the timing settings, the sizes and the encodings to compare."""

    device: torch.device
    repeats: int
    min_run_time: float
    plan: Plan
    pes: list[str]
    scale_repeats: int = 1
    compile_pairs: tuple[str, ...] = ("learned", "swin_bias")
    slow_repeats: int = 5
    steps: dict = field(default_factory=dict)  # setup label -> the training steps shared by train and memory

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def side_by_side(self, fns: dict, repeats: int | None = None) -> dict[str, float]:
        """Median seconds per call of each function, measured round-robin ``repeats`` times after one warm-up
        call each (caches, allocator, compilation)."""
        times = {name: [] for name in fns}
        for fn in fns.values():
            fn(), self.sync()
        for _ in range(repeats or self.repeats):
            for name, fn in fns.items():
                times[name].append(self.time_per_call(fn))
        return {name: statistics.median(t) for name, t in times.items()}

    def time_per_call(self, fn) -> float:
        """Mean seconds per call of a block of calls lasting at least ``min_run_time`` (at least one call)."""
        calls, start = 0, time.perf_counter()
        while True:
            fn(), self.sync()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= self.min_run_time:
                return elapsed / calls

    def rounds(self, setup: Setup) -> int:
        """``slow_repeats`` for the ViT-S/16 setup (a call lasts longer than ``min_run_time``: a round is one call),
        ``repeats`` otherwise."""
        return self.slow_repeats if setup == self.plan.vit else self.repeats

    def models(self, setup: Setup) -> dict[str, torch.nn.Module]:
        """``none``, ``none (control)`` (a second, identical model) and each encoding of ``--pes``."""
        names = ["none", "none" + CONTROL, *self.pes]
        return {name: setup.create(name.removesuffix(CONTROL), self.device) for name in names}

    def train_steps(self, setup: Setup) -> dict[str, TrainStep]:
        """A :class:`TrainStep` per model of :meth:`models`, made once and shared by the train and memory sections
        (after the train section's steps, the memory section needs no warm-up step)."""
        if setup.label not in self.steps:
            x, y = setup.input(self.device), setup.labels(self.device)
            self.steps[setup.label] = {pe: TrainStep(m, x, y) for pe, m in self.models(setup).items()}
        return self.steps[setup.label]


def timed_or_error(run: Run, fns: dict, repeats: int | None = None) -> dict:
    """Times the callable entries side by side; error strings are kept as they are."""
    callables = {k: f for k, f in fns.items() if callable(f)}
    times = run.side_by_side(callables, repeats) if callables else {}
    return {k: times.get(k, f) for k, f in fns.items()}


def allow_recompiles(limit: int = 64) -> None:
    """One compiled graph per model on the same ``forward``: raise dynamo's recompile limit (default 8) so that no
    model falls back to eager."""
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def compiled(fn, *inputs):
    """``(call, seconds)``: ``torch.compile(fn, fullgraph=True, dynamic=False)`` compiled by a first call on
    ``inputs`` (the seconds it took) and ``call()`` running it again, both without gradients; ``(error text,
    seconds)`` when compiling fails."""
    compiled_fn = torch.compile(fn, fullgraph=True, dynamic=False)

    def call():
        with torch.no_grad():  # always: a call with gradients on would compile a second graph
            return compiled_fn(*inputs)

    return first_call(call)


def first_call(call) -> tuple:
    """``(call, seconds)`` after calling ``call()`` once (for a compiled function: compilation and one call), or
    ``(error text, seconds)`` when that first call raises."""
    start = time.perf_counter()
    try:
        call()
    except Exception as error:  # a failing encoding is a row of the table, not the end of the run
        return error_text(error), time.perf_counter() - start
    return call, time.perf_counter() - start


def error_text(error: Exception) -> str:
    """``error: Type: first line of the message`` (120 characters at most), fit for a table cell."""
    first = (str(error).strip().splitlines() or [""])[0][:120].replace("|", "/")
    return f"error: {type(error).__name__}: {first}"


# -- report tables ----------------------------------------------------------------------------------------------

@dataclass
class Table:
    """One markdown table of the report, with the sentence under it."""

    title: str
    header: list[str]
    rows: list[tuple]
    note: str | None = None

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(map(str, row)) + " |" for row in self.rows]
        return "\n".join(lines) + (f"\n\n{self.note}" if self.note else "")


def encoding_limit(name: str) -> float:
    """The issue's target ratio to ``none``: 1.10 for PEG (a convolution per forward), 1.05 otherwise."""
    return 1.10 if name == "peg" else 1.05


def versus(title: str, values: dict, base: str, unit: str, fmt, limit=None, note: str | None = None,
           extra: tuple[list[str], dict] | None = None, name: str = "pe") -> Table:
    """The shared "ratio table vs baseline": one row per entry of ``values`` (name -> seconds or bytes, or an error
    string) with its value (``fmt``), its ratio to ``values[base]`` and, when ``limit(name)`` gives a target ratio,
    whether it is met. ``extra = (headers, {name: cells})`` adds columns; a ``... (control)`` row adds the noise
    sentence."""
    header = [name, unit, f"vs {base}"] + (["target"] if limit else []) + (extra[0] if extra else [])
    rows = []
    for key, value in values.items():
        ok = not isinstance(value, str) and not isinstance(values[base], str)
        ratio = value / values[base] if ok else None
        row = [key, value if isinstance(value, str) else fmt(value), f"{ratio:.3f}x" if ratio is not None else "-"]
        if limit:
            row.append(target_cell(key, base, ratio, limit))
        rows.append(tuple(row + list(extra[1].get(key, ()) if extra else [])))
    control = base + CONTROL
    if control in values and not isinstance(values[control], str) and not isinstance(values[base], str):
        gap = abs(values[control] / values[base] - 1) * 100
        noise = (f"`{control}` repeats `{base}` with a second, identical model or op: its {gap:.1f} % gap is the "
                 f"noise of this run; smaller differences are within noise.")
        note = noise + (f" {note}" if note else "")
    return Table(title, header, rows, note)


def target_cell(key: str, base: str, ratio: float | None, limit) -> str:
    if key == base:
        return "baseline"
    if key.endswith(CONTROL):
        return "noise"
    if ratio is None:
        return "-"
    bound = limit(key)
    return f"{'met' if ratio <= bound else 'NOT met'} (<= {bound:.2f}x)"


def ms(seconds) -> str:
    return f"{seconds * 1e3:.1f}" if seconds >= 0.01 else f"{seconds * 1e3:.3f}"


def megabytes(nbytes) -> str:
    return f"{nbytes / MB:.1f}"


# -- 1. RoPE apply ----------------------------------------------------------------------------------------------

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


# -- 2. forward and training step per encoding ------------------------------------------------------------------

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


class TrainStep:
    """One training step of ``model`` on a fixed batch: forward, cross-entropy, backward, AdamW step, gradients
    set to None (so gradients are not held between steps)."""

    def __init__(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
        self.model, self.x, self.y = model.train(), x, y
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def __call__(self) -> None:
        F.cross_entropy(self.model(self.x), self.y).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def held_bytes(self) -> int:
        """Bytes held between steps: parameters, buffers, optimizer state and the batch (distinct storages)."""
        tensors = [*self.model.parameters(), *self.model.buffers(), self.x, self.y]
        tensors += [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())


def train_cost(run: Run) -> list[Table]:
    """A training step of each encoding vs none, at ViT-S/16 and at the small training config."""
    tables = []
    for setup in (run.plan.vit, run.plan.tiny):
        t = run.side_by_side(run.train_steps(setup), run.rounds(setup))
        tables.append(versus(f"Training step (forward + backward + AdamW): {setup.label}, batch {setup.batch}",
                             t, "none", "ms", ms, encoding_limit))
    return tables


# -- 3. peak memory of the training step ------------------------------------------------------------------------

class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensor storages that operators allocate while the mode is on and that are still alive, and
    their peak. Views and in-place results share their input's storage and are not counted again; a storage is
    forgotten when it is freed. Buffers a kernel allocates internally and frees before returning are not seen."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._known = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage.data_ptr() not in inputs and storage not in self._known:
                    self._allocated(storage)
        return out

    def _allocated(self, storage) -> None:
        nbytes = storage.nbytes()
        self._known[storage] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, nbytes)

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


def step_peak_bytes(step, device: torch.device) -> int:
    """Peak bytes allocated during one call of ``step`` above what was allocated before it: on CUDA from the
    caching allocator's statistics, on CPU from :class:`LiveTensorBytes`."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
    with LiveTensorBytes() as tracker:
        step()
    return tracker.peak


def memory_cost(run: Run) -> list[Table]:
    """Peak memory of a training step (after a warm-up step that creates the optimizer state) vs none."""
    if run.device.type == "cuda":
        what = ("`torch.cuda.max_memory_allocated` during one step minus `memory_allocated` before it (after "
                "`reset_peak_memory_stats`)")
    else:
        what = ("the peak, during one step, of the bytes of tensor storages that operators allocated in that step and "
                "that were still alive (a `TorchDispatchMode` over every operator, forward, backward and optimizer; "
                "views and in-place results not counted twice; exact and deterministic, but scratch buffers that a "
                "kernel frees before returning are not seen)")
    tables = []
    for setup in (run.plan.vit, run.plan.tiny):
        peaks, held = {}, {}
        for pe, step in run.train_steps(setup).items():
            if not step.optimizer.state:  # a first step (none if the train section ran): the optimizer state exists
                step()
            peaks[pe] = step_peak_bytes(step, run.device)
            held[pe] = (megabytes(step.held_bytes()),)
        tables.append(versus(f"Training step peak memory: {setup.label}, batch {setup.batch}", peaks, "none",
                             "step peak MB", megabytes, lambda pe: 1.05, extra=(["held MB"], held),
                             note=f"Step peak: {what}. Held: parameters, buffers, AdamW state and the batch, held "
                                  f"before and after the step (not in the step peak)."))
    return tables


# -- 4. compiled ------------------------------------------------------------------------------------------------

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


# -- 5. visionpe vs timm native ---------------------------------------------------------------------------------

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


# -- 6. alternating resolutions ---------------------------------------------------------------------------------

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


# -- 7. large grids: time and position tables -------------------------------------------------------------------

@dataclass
class ForwardTables:
    """The position tables of one forward: ``tables`` maps a table's identity (its cache and key, or the bias
    module that built it uncached) to ``(bytes, shape)``."""

    calls: int = 0
    built: int = 0
    tables: dict = field(default_factory=dict)
    returned: list = field(default_factory=list)  # storages of the cached tables handed out, in order


class TableCensus:
    """Counts the position tables that a model's encodings use, one forward at a time.

    A table is what an encoding gets from its :class:`~visionpe.cache.TableCache` (position vectors, rotations,
    biases, bias indices; ``built`` when the cache had to compute it) or a bias encoding's ``(heads, T, T)`` output
    computed without a cache (built at every call). A table is identified by its cache and key (or its bias
    module), so a table shared by all blocks counts once and one rebuilt per block counts once per build.
    """

    def __init__(self):
        self.forwards: dict[str, list[ForwardTables]] = {}
        self._current: ForwardTables | None = None
        self._starts: dict[int, int] = {}  # encoding module -> tables handed out before its call

    @contextmanager
    def installed(self, models: dict[str, torch.nn.Module]):
        """Hooks on every encoding of ``models`` and a counting ``TableCache.get`` while the block runs."""
        original = TableCache.get
        census = self

        def get(cache, key, build, params=()):
            fresh = []
            table = original(cache, key, lambda: fresh.append(True) or build(), params)
            census._table(("cache", id(cache), key), table, built=bool(fresh))
            return table

        handles = []
        for model in models.values():
            for module in model.modules():
                if isinstance(module, vpe.Encoding):
                    handles.append(module.register_forward_pre_hook(self._enter))
                if isinstance(module, vpe.BiasEncoding):
                    handles.append(module.register_forward_hook(self._bias_output))
        TableCache.get = get
        try:
            yield self
        finally:
            TableCache.get = original
            for handle in handles:
                handle.remove()

    def run(self, name: str, model: torch.nn.Module, x: torch.Tensor):
        """``model(x)`` with its tables counted under ``name``."""
        self._current = ForwardTables()
        self.forwards.setdefault(name, []).append(self._current)
        try:
            return model(x)
        finally:
            self._current = None

    def _enter(self, module, args) -> None:
        if self._current is not None:
            self._current.calls += 1
            self._starts[id(module)] = len(self._current.returned)

    def _bias_output(self, module, args, output) -> None:
        if self._current is None:
            return
        start = self._starts.pop(id(module), 0)
        if output.untyped_storage().data_ptr() not in self._current.returned[start:]:
            self._table(("bias", id(module)), output, built=True)

    def _table(self, identity, table: torch.Tensor, built: bool) -> None:
        record = self._current
        if record is None:
            return
        record.returned.append(table.untyped_storage().data_ptr())
        record.tables[identity] = (table.untyped_storage().nbytes(), tuple(table.shape))
        record.built += built


def scale_cost(run: Run) -> list[Table]:
    """Forward time (inference, batch 1) and position tables per encoding on the plan's large grids."""
    return [scale_table(run, setup) for setup in run.plan.large]


def scale_table(run: Run, setup: Setup) -> Table:
    """One model at a time (the cached (heads, T, T) tables of several models at 4096 tokens would not fit in memory
    together): a first forward, then ``scale_repeats`` timed ones; ``none (control)`` runs last, so its gap to
    ``none`` shows the drift over the section."""
    x = setup.input(run.device)
    census, times, tokens = TableCensus(), {}, 0
    for name in ["none", *run.pes, "none" + CONTROL]:
        model = setup.create(name.removesuffix(CONTROL), run.device).eval()
        tokens = setup.tokens(model)
        times[name] = scale_time(run, census, name, model, x)
        del model  # frees its cached tables before the next model
    order = ["none", "none" + CONTROL, *run.pes]
    cells = {pe: table_cells(census.forwards[pe]) for pe in order}
    return versus(f"Large grid: {setup.label}, {tokens} tokens, batch 1, inference", {pe: times[pe] for pe in order},
                  "none", "ms", ms, extra=(["encoding calls", "tables (1st / next forward)", "built (1st / next)",
                                            "tables MB (1st / next)", "largest", "built once"], cells),
                  note=f"One model after the other, {run.scale_repeats} timed forward(s) after a first one; the "
                       "control runs last. Tables: the distinct position tables the encodings use in the first and in "
                       "a later forward (a cached table is identified by its cache and key, so a table shared by all "
                       "blocks counts once; a learned table at its native size is the parameter itself and is not "
                       "counted), their total size and the largest shape; built: how many of them were computed in "
                       "that forward. Built once (the target): no table is built more than once per forward "
                       "(built <= tables in both forwards).")


def scale_time(run: Run, census: TableCensus, name: str, model: torch.nn.Module, x: torch.Tensor) -> float:
    """Median seconds of the forwards after the first, each one's tables counted under ``name``."""
    with census.installed({name: model}), torch.no_grad():
        return run.side_by_side({name: lambda: census.run(name, model, x)}, run.scale_repeats)[name]


def table_cells(forwards: list[ForwardTables]) -> tuple:
    """Encoding calls, distinct tables, builds and megabytes in the first and the last forward, the largest shape,
    and whether every table was built at most once per forward."""
    first, last = forwards[0], forwards[-1]

    def size(record):
        return megabytes(sum(nbytes for nbytes, _ in record.tables.values()))

    shapes = [shape for _, shape in [*first.tables.values(), *last.tables.values()]]
    largest = "x".join(map(str, max(shapes, key=math.prod))) if shapes else "-"
    once = all(record.built <= len(record.tables) for record in (first, last))
    return (last.calls, f"{len(first.tables)} / {len(last.tables)}", f"{first.built} / {last.built}",
            f"{size(first)} / {size(last)}", largest, "met" if once else "NOT met")


# -- 8. FlexAttention vs SDPA with a materialised bias (opt-in) -------------------------------------------------

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


# -- 9. where the time goes (opt-in) ----------------------------------------------------------------------------

PROFILE_OPS = 5  # operators listed per encoding


def profile_cost(run: Run) -> list[Table]:
    """The training step of each encoding under ``torch.profiler``, at ViT-S/16 and the small config: which operators
    its extra time over ``none`` is spent in."""
    return [profile_table(run, setup) for setup in (run.plan.vit, run.plan.tiny)]


def operator_times(run: Run, step) -> tuple[Counter, Counter]:
    """``(ms, calls)`` per operator of one ``step()``: self time (the device's on CUDA)."""
    cuda = run.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        step()
        run.sync()
    times, counts = Counter(), Counter()
    for event in prof.key_averages():
        times[event.key] += (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e3
        counts[event.key] += event.count
    return times, counts


def profile_table(run: Run, setup: Setup) -> Table:
    """Profiles of the setup's training steps, one step each in turn for a few rounds (as the timed tables
    interleave), averaged per step; each encoding's operators compared with ``none``'s."""
    steps = run.train_steps(setup)
    for step in steps.values():
        step(), run.sync()  # warm-up outside the profile
    rounds = max(3, round(4 * run.min_run_time / run.time_per_call(steps["none"])))  # 3 at ViT-S/16, about 14 small
    totals = {name: (Counter(), Counter()) for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            for total, part in zip(totals[name], operator_times(run, step)):
                total.update(part)
    base_times, base_counts = totals.pop("none")
    rows = []
    for name, (times, counts) in totals.items():
        ops = times.keys() | base_times.keys()
        extra = {op: (times[op] - base_times[op]) / rounds for op in ops}
        changed = sorted((op for op in ops if counts[op] != base_counts[op]), key=lambda op: -abs(extra[op]))
        cells = [f"`{op}` {extra[op]:+.1f} ms ({(counts[op] - base_counts[op]) / rounds:+.3g} calls)"
                 for op in changed[:PROFILE_OPS]]
        same = sum(extra[op] for op in ops if counts[op] == base_counts[op])
        rows.append((name, f"{sum(times.values()) / rounds:.1f}", f"{sum(extra.values()):+.1f}",
                     "; ".join(cells) or "-", f"{same:+.1f}"))
    return Table(f"Where the training step's time goes: {setup.label}, batch {setup.batch}, {rounds} profiled steps "
                 f"per encoding", ["pe", "profiled ms / step", "vs none ms",
                                   f"operators it adds or removes, {PROFILE_OPS} largest (ms, calls per step)",
                                   "operators with none's calls, net ms"], rows,
                 f"`torch.profiler`, self time per operator ({'CUDA' if run.device.type == 'cuda' else 'CPU'}), "
                 f"per step, minus `none`'s ({sum(base_times.values()) / rounds:.1f} ms); one step of each model "
                 f"in turn per round. Operators called as often as in `none` (matmuls, GELU, SDPA's forward with a "
                 f"mask) differ by noise, or by the work an encoding adds to them (a mask in the attention kernel); "
                 f"the control row shows the noise. The profiler adds a fixed cost to every operator, so many small "
                 f"operators weigh more here than in the timed tables; Python autograd functions "
                 f"(`_FusedBiasAttentionBackward`, `_RotateBackward`) appear with their interpreter time.")


# -- the report -------------------------------------------------------------------------------------------------

RUNNERS = {"rope": rope_apply, "forward": forward_cost, "train": train_cost, "memory": memory_cost,
           "compile": compiled_cost, "timm": versus_timm, "cache": cache_hits, "scale": scale_cost,
           "compile-train": compiled_train_cost, "flex": flex_cost, "profile": profile_cost}
READING = "## Reading these numbers"


def header(run: Run, argv: list[str]) -> list[str]:
    device = torch.cuda.get_device_name() if run.device.type == "cuda" else \
        f"{platform.processor() or 'cpu'}, {torch.get_num_threads()} threads"
    command = " ".join(["python scripts/bench_speed.py", *argv])
    return ["# Performance", "", f"Made by `{command}`.", "",
            f"Device: {device}; torch {torch.__version__}, timm {timm.__version__}; medians over {run.repeats} "
            f"interleaved rounds ({run.slow_repeats} for the ViT-S/16 and Swin tables at batch {run.plan.vit.batch}: "
            f"eval forward, training step, timm, cache) of at least {run.min_run_time} s per row. Only ratios measured "
            f"side by side mean anything. Targets: time and memory of an encoding <= 1.05x none (peg <= 1.10x).", ""]


def write_report(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, keeping the hand-written "Reading these numbers" section of the old file."""
    if path.exists() and READING in (old := path.read_text()):
        text += "\n" + old[old.index(READING):]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=8, help="batch of the ViT-S/16 sections (default 8)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds per measurement")
    parser.add_argument("--slow-repeats", type=int, default=5,
                        help="interleaved rounds of the ViT-S/16 and Swin tables (forward, train, timm, cache), "
                             "whose rows are single calls of 0.5-2.5 s on CPU (default 5; fewer shortens the run)")
    parser.add_argument("--min-run-time", type=float, default=0.25, help="seconds of calls per row and round")
    parser.add_argument("--scale-repeats", type=int, default=1, help="timed rounds of the large-grid section")
    parser.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS + OPT_IN,
                        help=f"default: {' '.join(SECTIONS)}; opt-in: {' '.join(OPT_IN)}")
    parser.add_argument("--pes", nargs="+", default=PES, choices=PES, help="encodings compared with none")
    parser.add_argument("--compile-pairs", nargs="*", default=list(COMPILED_PAIRS[:2]), choices=COMPILED_PAIRS,
                        metavar="PAIR", help="compile section: the visionpe-vs-timm pairs compiled at full size, of "
                        f"{' '.join(COMPILED_PAIRS)} (default: learned swin_bias; each pair takes 1-1.5 min of "
                        "compilation on 2 cores with an empty inductor cache; no names: none)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="tiny models, one short round: a smoke test")
    parser.add_argument("--out", type=Path, help="write the tables as markdown to this file")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    return args


def main(argv: list[str] | None = None) -> str:
    """Run the sections, print each table as it is done, write the report to ``--out``; returns the report."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.quick:
        args.repeats, args.slow_repeats, args.min_run_time, args.scale_repeats = 1, 1, 0.01, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    allow_recompiles()
    run = Run(torch.device(args.device), args.repeats, args.min_run_time, make_plan(args.quick, args.batch),
              args.pes, args.scale_repeats, tuple(args.compile_pairs), args.slow_repeats)
    out = header(run, argv)
    for i, key in enumerate(args.sections):
        start = time.perf_counter()
        for table in RUNNERS[key](run):
            print(table.markdown() + "\n", flush=True)
            out += [table.markdown(), ""]
        if not {"train", "memory"} & set(args.sections[i + 1:]):
            run.steps.clear()  # the training steps shared by train and memory: models and optimizer state
        print(f"[{key}: {time.perf_counter() - start:.0f} s]\n", file=sys.stderr, flush=True)
    report = "\n".join(out)
    if args.out:
        write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
