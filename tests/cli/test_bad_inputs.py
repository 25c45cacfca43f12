"""Every bad input to the public API, one row each: the call, the exception and the words its message must hold.

A row is ``(id, call, exception, *words)``: ``call()`` must raise ``exception`` (``ValueError``, or ``TypeError`` where
Python itself decides, e.g. a missing argument, or for an object of the wrong type) whose message contains every
word (plain text). A new option adds rows here; the table is the matrix of issues 9 and 22.
"""
import functools

import pytest
import timm
import torch

import visionpe as vpe
from visionpe import Grid
from visionpe import data as vdata
from visionpe.data import video_files
from visionpe.grid import Layout, MixedLayout

NAN, INF = float("nan"), float("inf")
VIT = "vit_tiny_patch16_224"
VIT_KW = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=3)
SWIN = "swin_tiny_patch4_window7_224"
SWIN_KW = dict(img_size=16, patch_size=4, embed_dim=16, depths=(1,), num_heads=(2,), window_size=2, num_classes=3)
VIDEO_KW = dict(num_frames=4, img_size=16, tubelet_size=(2, 4, 4), embed_dim=16, depth=1, num_heads=2, num_classes=3)


@functools.lru_cache(maxsize=None)
def vit(pe="learned"):
    return vpe.create_model(VIT, pe=pe, **VIT_KW).eval()


@functools.lru_cache(maxsize=None)
def swin(pe="swin_bias"):
    return vpe.create_model(SWIN, pe=pe, **SWIN_KW).eval()


@functools.lru_cache(maxsize=None)
def video():
    return vpe.create_video_model(VIT, pe="rope_axial", **VIDEO_KW).eval()


@functools.lru_cache(maxsize=None)
def pe(name, **kw):
    """A small built encoding (2D, dim 8, head_dim 8, 2 heads, grid (2, 3))."""
    defaults = {"sincos": dict(dim=8), "learned": dict(dim=8, grid_shape=(2, 3), num_prefix_tokens=1),
                "peg": dict(dim=8), "rope_axial": dict(head_dim=8, num_heads=2),
                "rope_mixed": dict(head_dim=8, num_heads=2), "swin_bias": dict(num_heads=2, window_size=(2, 3)),
                "rel_bias": dict(num_heads=2, grid_shape=(2, 3)), "cpb": dict(num_heads=2, window_size=(2, 3),
                                                                               hidden_dim=8),
                "alibi": dict(num_heads=2), "harope": dict(head_dim=8, num_heads=2),
                "vit5_rope": dict(head_dim=8, num_registers=4),
                "pape": dict(dim=8, num_heads=2, head_dim=8, num_parabolas=3)}[name]
    return vpe.build(name, **{**defaults, **kw})


G = Grid((2, 3), prefix=1)  # 7 tokens


def x(tokens=7, dim=8, batch=1, dtype=torch.float32):
    return torch.randn(batch, tokens, dim).to(dtype)


def qk(heads=2, tokens=7, head_dim=8, dtype=torch.float32):
    return torch.randn(1, heads, tokens, head_dim).to(dtype)


def image(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def keep(rows):
    """A ``keep`` tensor (long) from nested lists."""
    return torch.tensor(rows)


class HalfRotary(torch.nn.Module):
    """A user's rotary module that returns q cut to half its head_dim."""

    def forward(self, q, k, grid):
        return q[..., :q.shape[-1] // 2], k


class NoFamily(vpe.Encoding):
    pass


class Mine(vpe.TokenEncoding):
    def __init__(self, dim: int):
        super().__init__()


_TMP = []  # the running row's tmp_path


def _tmp():
    return _TMP[0]


def _file(name, data: bytes):
    path = _tmp() / name
    path.write_bytes(data)
    return path


def _truncated():
    path = _tmp() / "truncated.safetensors"
    vpe.save_weights({"w": torch.randn(64, 64)}, path)
    path.write_bytes(path.read_bytes()[:200])
    return path


def _truncated_pth():
    path = _tmp() / "truncated.pth"
    torch.save({"w": torch.randn(64, 64)}, path)
    path.write_bytes(path.read_bytes()[:300])
    return path


def _tensor_file():
    path = _tmp() / "tensor.pth"
    torch.save(torch.randn(3), path)
    return path


def _other_model_weights():
    path = _tmp() / "other.safetensors"
    vpe.save_weights({"pe_tokens.table": torch.randn(9, 9, 16)}, path)
    return path


def _poisoned(value, path=None):
    """``vit()``'s weights with ``value`` (NaN or inf) in one entry of ``head.weight``; written to ``path`` if given."""
    state = {k: v.clone() for k, v in vit().state_dict().items()}
    state["head.weight"][1, 2] = value
    if path is None:
        return state
    vpe.save_weights(state, _tmp() / path)
    return _tmp() / path


VE = ValueError


def build_rows(name, base, *rows):
    """Rows for ``vpe.build(name, **base, **kw)``: each of ``rows`` is ``(kw, *words)``."""
    return [(f"build-{name}-{'-'.join(f'{k}={v!r}' for k, v in kw.items())}",
             (lambda kw=kw: vpe.build(name, **{**base, **kw})), VE, *words) for kw, *words in rows]


ROWS = [
    # -- Grid ------------------------------------------------------------------------------------------------------
    ("grid-shape-float", lambda: Grid((2.5, 2)), VE, "shape", "positive integer", "2.5"),
    ("grid-shape-nan", lambda: Grid((NAN, 2)), VE, "shape", "positive integer", "nan"),
    ("grid-shape-inf", lambda: Grid((INF, 2)), VE, "shape", "positive integer", "inf"),
    ("grid-shape-str", lambda: Grid("ab"), VE, "shape", "positive integer", "'ab'"),
    ("grid-shape-bool", lambda: Grid((True, 2)), VE, "shape", "positive integer", "True"),
    ("grid-shape-empty", lambda: Grid(()), VE, "shape", "positive integer"),
    ("grid-shape-zero", lambda: Grid((0, 3)), VE, "shape", "positive integer", "(0, 3)"),
    ("grid-shape-negative", lambda: Grid((3, -1)), VE, "shape", "positive integer", "(3, -1)"),
    ("grid-shape-none", lambda: Grid(None), VE, "shape", "positive integer", "None"),
    ("grid-shape-tensor", lambda: Grid(torch.tensor([2, 2])), VE, "shape", "positive integer"),
    ("grid-prefix-negative", lambda: Grid((2, 2), prefix=-1), VE, "prefix", "positive integer", "-1"),
    ("grid-prefix-float", lambda: Grid((2, 2), prefix=1.5), VE, "prefix", "positive integer", "1.5"),
    ("grid-prefix-bool", lambda: Grid((2, 2), prefix=True), VE, "prefix", "positive integer", "True"),
    ("grid-prefix-str", lambda: Grid((2, 2), prefix="1"), VE, "prefix", "positive integer", "'1'"),
    ("grid-prefix-nan", lambda: Grid((2, 2), prefix=NAN), VE, "prefix", "positive integer", "nan"),
    ("grid-offset-nan", lambda: Grid((2, 2), offset=(NAN, 0)), VE, "offset", "finite number", "nan"),
    ("grid-offset-inf", lambda: Grid((2, 2), offset=(0, INF)), VE, "offset", "finite number", "inf"),
    ("grid-offset-str-item", lambda: Grid((2, 2), offset=("a", 0)), VE, "offset", "finite number", "'a'"),
    ("grid-offset-bool", lambda: Grid((2, 2), offset=(True, 0)), VE, "offset", "finite number", "True"),
    ("grid-offset-length", lambda: Grid((2, 2), offset=(1, 2, 3)), VE, "offset", "one value per axis"),
    ("grid-offset-beyond-float64", lambda: Grid((2, 2), offset=(0, 1e16)).coords(dtype=torch.float64), VE, "offset",
     "2^53", "neighbouring patches coincide"),
    ("grid-offset-beyond-float32", lambda: Grid((2, 2), offset=(3e7, 0)).coords(), VE, "offset", "2^24"),
    ("rope-offset-beyond-float64", lambda: vpe.build("rope_axial", head_dim=8, num_heads=2, ndim=2)(
        torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), Grid((2, 2), offset=(1e16, 0))), VE, "offset", "2^53"),
    ("sincos-offset-beyond-float64", lambda: vpe.build("sincos", dim=8, ndim=2)(
        torch.randn(1, 4, 8), Grid((2, 2), offset=(0, 1e17))), VE, "offset", "2^53"),
    ("grid-offset-str", lambda: Grid((2, 2), offset="ab"), VE, "offset", "one value per axis"),
    ("grid-offset-scalar", lambda: Grid((2, 2), offset=5), VE, "offset", "one value per axis"),
    ("grid-with-shape-bad", lambda: Grid((2, 2)).with_shape((0, 2)), VE, "shape", "positive integer"),
    ("layout-keep-negative", lambda: Layout(G, keep([[-1, 0]])), VE, "keep", "-1 .. 0", "allowed 0 .. 5",
     "not counted from the end"),
    ("layout-keep-past-the-end", lambda: Layout(G, keep([[0, 6]])), VE, "keep", "0 .. 6", "allowed 0 .. 5"),
    ("layout-keep-float", lambda: Layout(G, torch.zeros(1, 2)), VE, "keep", "integer tensor", "torch.float32"),
    ("layout-keep-1d", lambda: Layout(G, keep([0, 1])), VE, "keep", "(batch, kept)", "(2,)"),

    # -- build: names and keywords ---------------------------------------------------------------------------------
    ("build-unknown-name", lambda: vpe.build("rope_fancy"), VE, "'rope_fancy'", "available", "sincos", "alibi"),
    ("build-name-none", lambda: vpe.build(None), VE, "name=None", "available"),
    ("build-name-int", lambda: vpe.build(3), VE, "name=3", "available"),
    ("build-missing-keyword", lambda: vpe.build("rope_mixed", head_dim=8), TypeError, "num_heads"),
    *[(f"build-{n}-unknown-keyword", (lambda n=n: vpe.build(n, bogus=1)), VE, "'bogus'", "keywords")
      for n in vpe.available()],

    # -- build: sincos ---------------------------------------------------------------------------------------------
    *build_rows("sincos", {},
                (dict(dim=10), "dim=10", "divisible by 4"), (dict(dim=0), "dim", "positive integer"),
                (dict(dim=-4), "dim", "positive integer"), (dict(dim=1.5), "dim", "positive integer"),
                (dict(dim="16"), "dim", "positive integer", "'16'"), (dict(dim=True), "dim", "positive integer"),
                (dict(dim=16, ndim=4), "ndim=4", "1, 2, 3"), (dict(dim=16, ndim=0), "ndim=0", "1, 2, 3"),
                (dict(dim=16, ndim="2"), "ndim='2'", "1, 2, 3"), (dict(dim=16, ndim=2.0), "ndim=2.0", "1, 2, 3"),
                (dict(dim=16, ndim=True), "ndim=True", "1, 2, 3"),
                (dict(dim=16, layout="xy"), "layout='xy'", "'mae'", "'timm'"),
                (dict(dim=16, temperature=0), "temperature", "> 0"),
                (dict(dim=16, temperature=-1.0), "temperature", "> 0"),
                (dict(dim=16, temperature=NAN), "temperature", "finite number"),
                (dict(dim=16, temperature=INF), "temperature", "finite number"),
                (dict(dim=16, temperature="1e4"), "temperature", "finite number", "'1e4'"),
                (dict(dim=16, ref_shape=(0, 4)), "ref_shape", "positive integer"),
                (dict(dim=16, ref_shape=(4, 4, 4)), "ref_shape", "ndim=2"),
                (dict(dim=16, ref_shape="ab"), "ref_shape", "positive integer")),
    # -- build: learned --------------------------------------------------------------------------------------------
    *build_rows("learned", dict(dim=8),
                (dict(dim=0), "dim", "positive integer"), (dict(grid_shape=(3,)), "grid_shape", "ndim=2"),
                (dict(grid_shape=(0, 3)), "grid_shape", "positive integer"),
                (dict(grid_shape=(2.5, 3)), "grid_shape", "positive integer"),
                (dict(num_prefix_tokens=1.5), "num_prefix_tokens", "positive integer", "1.5"),
                (dict(num_prefix_tokens=-1), "num_prefix_tokens", "positive integer"),
                (dict(num_prefix_tokens=NAN), "num_prefix_tokens", "positive integer"),
                (dict(factorized="yes"), "factorized", "True or False"),
                (dict(interpolation="cubic"), "interpolation='cubic'", "'bicubic'", "'bilinear'"),
                (dict(antialias=1), "antialias", "True or False"),
                (dict(init_std=-1.0), "init_std", ">= 0"), (dict(init_std=NAN), "init_std", "finite number"),
                (dict(init_std="0.02"), "init_std", "finite number"), (dict(ndim=5), "ndim=5", "1, 2, 3")),
    # -- build: peg ------------------------------------------------------------------------------------------------
    *build_rows("peg", dict(dim=8),
                (dict(dim=0), "dim", "positive integer"), (dict(dim=8.0), "dim", "positive integer"),
                (dict(kernel_size=2), "kernel_size", "odd"), (dict(kernel_size=0), "kernel_size", "positive integer"),
                (dict(kernel_size=1.5), "kernel_size", "positive integer"),
                (dict(kernel_size="3"), "kernel_size", "positive integer"), (dict(ndim=4), "ndim=4", "1, 2, 3")),
    # -- build: rope_axial -----------------------------------------------------------------------------------------
    *build_rows("rope_axial", dict(head_dim=8),
                (dict(head_dim=0), "head_dim", "positive integer"),
                (dict(head_dim=10), "head_dim=10", "divisible by 4"),
                (dict(head_dim=8.0), "head_dim", "positive integer"),
                (dict(num_heads=0), "num_heads", "positive integer"),
                (dict(theta="100"), "theta", "finite number", "'100'"), (dict(theta=NAN), "theta", "finite number"),
                (dict(theta=INF), "theta", "finite number"), (dict(theta=1), "theta", "> 1"),
                (dict(theta=0.5), "theta", "> 1"), (dict(theta=-10.0), "theta", "> 1"),
                (dict(pairs="adjacent"), "pairs='adjacent'", "'interleaved'", "'half'"),
                (dict(scaling="linear", ref_shape=(4, 4)), "scaling='linear'", "'pi'", "'ntk'", "'yarn'"),
                (dict(scaling="pi"), "scaling='pi'", "ref_shape"),
                (dict(scaling="pi", ref_shape=(4, 4, 4)), "ref_shape", "ndim=2"),
                (dict(ref_shape=(0, 4)), "ref_shape", "positive integer"),
                (dict(yarn_alpha=NAN), "yarn_alpha", "finite number"),
                (dict(yarn_beta="32"), "yarn_beta", "finite number"),
                (dict(yarn_alpha=40.0), "yarn_alpha=40.0", "smaller than yarn_beta"),
                (dict(sections=(1, 2)), "sections", "sum to head_dim / 2 = 4"),
                (dict(sections=(2, 1, 1)), "sections", "ndim=2"), (dict(sections=(4, 0)), "sections", "positive"),
                (dict(ndim=4), "ndim=4", "1, 2, 3"), (dict(head_dim=16, ndim=3), "head_dim=16", "divisible by 6")),
    # -- build: rope_mixed -----------------------------------------------------------------------------------------
    ("build-rope_axial-mrope-sections-past-the-head",
     lambda: vpe.build("rope_axial", head_dim=8, ndim=3, spectrum="mrope_interleaved", sections=(2, 2, 2)), VE,
     "sections=(2, 2, 2)", "6 rotation pairs", "head_dim / 2 = 4", "at most"),
    *build_rows("rope_mixed", dict(head_dim=8, num_heads=2),
                (dict(num_heads=0), "num_heads", "positive integer"),
                (dict(num_heads=2.0), "num_heads", "positive integer"),
                (dict(num_heads=NAN), "num_heads", "positive integer"),
                (dict(head_dim=10), "head_dim=10", "divisible by 4"), (dict(head_dim=-8), "head_dim", "positive"),
                (dict(theta=-1.0), "theta", "> 1"), (dict(theta="10"), "theta", "finite number"),
                (dict(pairs="x"), "pairs='x'", "'interleaved'"), (dict(scaling="ntk"), "scaling='ntk'", "ref_shape"),
                (dict(generator="seed"), "generator", "torch.Generator"),
                (dict(ndim=0), "ndim=0", "1, 2, 3")),
    # -- build: swin_bias ------------------------------------------------------------------------------------------
    *build_rows("swin_bias", dict(num_heads=2),
                (dict(num_heads=0), "num_heads", "positive integer"),
                (dict(num_heads="2"), "num_heads", "positive integer"),
                (dict(window_size=(0, 7)), "window_size", "positive integer"),
                (dict(window_size=(2, 2, 2, 2)), "window_size", "1, 2 or 3"),
                (dict(window_size=(2.0, 2)), "window_size", "positive integer"),
                (dict(window_size="77"), "window_size", "positive integer"),
                (dict(interpolation="lanczos"), "interpolation='lanczos'", "'bicubic'"),
                (dict(antialias="no"), "antialias", "True or False")),
    # -- build: rel_bias -------------------------------------------------------------------------------------------
    *build_rows("rel_bias", dict(num_heads=2),
                (dict(num_heads=-1), "num_heads", "positive integer"),
                (dict(grid_shape=(0, 3)), "grid_shape", "positive integer"),
                (dict(grid_shape=(NAN, 3)), "grid_shape", "positive integer"),
                (dict(grid_shape=(2, 2, 2, 2)), "grid_shape", "1, 2 or 3"),
                (dict(interpolation="cubic"), "interpolation='cubic'", "'bicubic'"),
                (dict(antialias=None), "antialias", "True or False")),
    # -- build: cpb ------------------------------------------------------------------------------------------------
    *build_rows("cpb", dict(num_heads=2),
                (dict(num_heads=0), "num_heads", "positive integer"),
                (dict(window_size=(0, 7)), "window_size", "positive integer"),
                (dict(window_size=(2, 2, 2, 2)), "window_size", "1, 2 or 3"),
                (dict(pretrained_window_size=(4, 4, 4)), "pretrained_window_size", "ndim=2"),
                (dict(pretrained_window_size=(-3, -3)), "pretrained_window_size", "positive integer"),
                (dict(pretrained_window_size=(NAN, 4)), "pretrained_window_size", "positive integer"),
                (dict(hidden_dim=0), "hidden_dim", "positive integer"),
                (dict(hidden_dim=2.5), "hidden_dim", "positive integer")),
    # -- build: alibi ----------------------------------------------------------------------------------------------
    *build_rows("alibi", dict(num_heads=2),
                (dict(num_heads=0), "num_heads", "positive integer"),
                (dict(num_heads=1.5), "num_heads", "positive integer"),
                (dict(num_heads=INF), "num_heads", "positive integer"),
                (dict(ndim=4), "ndim=4", "1, 2, 3"), (dict(ndim="2"), "ndim='2'", "1, 2, 3"),
                (dict(slope_scale=-1.0), "slope_scale", ">= 0"), (dict(slope_scale=NAN), "slope_scale", "finite")),
    *build_rows("fire", dict(num_heads=2), (dict(threshold_scale=0.0), "threshold_scale", "> 0")),
    # -- build: the 2026 encodings ---------------------------------------------------------------------------------
    *build_rows("spiral_rope", dict(head_dim=8),
                (dict(num_directions=3), "num_directions=3", "even"), (dict(num_directions=0), "num_directions",
                                                                        "positive integer"),
                (dict(max_freq=0), "max_freq", "> 0"), (dict(max_freq=NAN), "max_freq", "finite number"),
                (dict(ndim=3), "ndim must be 2", "ndim=3"), (dict(head_dim=6), "head_dim=6", "divisible by 4"),
                (dict(axis_order="yx"), "axis_order='yx'", "'xy'", "'ij'")),
    *build_rows("harope", dict(head_dim=8, num_heads=2),
                (dict(head_dim=6), "head_dim=6", "divisible by 4"), (dict(num_heads=0), "num_heads",
                                                                      "positive integer"),
                (dict(theta=1.0), "theta", "> 1.0"), (dict(pairs="pairs"), "pairs='pairs'", "'interleaved'")),
    *build_rows("vit5_rope", dict(head_dim=8),
                (dict(num_registers=3), "num_registers=3", "square"),
                (dict(num_registers=-1), "num_registers", "0 or a positive integer"),
                (dict(register_theta=1.0), "register_theta", "> 1.0"),
                (dict(register_theta=INF), "register_theta", "finite number")),
    *build_rows("riflex", dict(head_dim=12, ref_shape=(2, 3, 4)),
                (dict(ndim=2, ref_shape=(3, 4)), "riflex is defined on (T, H, W) grids", "ndim=2"),
                (dict(ref_shape=None), "ref_shape=(T, H, W)", "intrinsic_index", "repetition_frame"),
                (dict(intrinsic_index=3), "intrinsic_index=3", "allowed 1 .. 2"),
                (dict(intrinsic_index=0), "intrinsic_index", "positive integer"),
                (dict(repetition_frame=-2), "repetition_frame", "> 0"),
                (dict(period_margin=1.5), "period_margin", "<= 1"), (dict(period_margin=0), "period_margin", "> 0"),
                (dict(theta=1.5, ref_shape=(40, 3, 4)), "no time band has a period longer than", "40")),
    *build_rows("pape", dict(dim=8, num_heads=2, head_dim=8),
                (dict(num_parabolas=0), "num_parabolas", "positive integer"),
                (dict(dim=0), "dim", "positive integer"), (dict(head_dim=2.5), "head_dim", "positive integer"),
                (dict(prefix_position="first"), "prefix_position='first'", "'corner'", "'none'"),
                (dict(axis_order="yx"), "axis_order='yx'", "'xy'", "'ij'"), (dict(ndim=4), "ndim=4", "1, 2, 3"),
                (dict(coords="pixels"), "coords='pixels'", "'index'", "'normalized'")),
    *build_rows("pape_ri", dict(dim=8, num_heads=2, head_dim=8),
                (dict(num_heads=-1), "num_heads", "positive integer"), (dict(generator=3), "generator",
                                                                         "torch.Generator"),
                (dict(prefix_position=None), "prefix_position=None", "'corner'")),

    # -- calls of built encodings ----------------------------------------------------------------------------------
    ("call-sincos-wrong-width", lambda: pe("sincos")(x(dim=12), G), VE, "width 12", "dim=8"),
    ("call-sincos-no-batch-axis", lambda: pe("sincos")(torch.randn(7, 8), G), VE, "(batch, tokens, dim)", "(7, 8)"),
    ("call-sincos-wrong-tokens", lambda: pe("sincos")(x(tokens=6), G), VE, "6 tokens", "has 7"),
    ("call-sincos-integer-x", lambda: pe("sincos")(x(dtype=torch.int64), G), VE, "floating", "torch.int64"),
    ("call-sincos-list-x", lambda: pe("sincos")([[0.0] * 8] * 7, G), VE, "x must be a", "tensor"),
    ("call-sincos-grid-3-axes", lambda: pe("sincos")(x(tokens=13), Grid((2, 2, 3), prefix=1)), VE, "3 axes",
     "ndim=2"),
    ("call-sincos-grid-str", lambda: pe("sincos")(x(), "ab"), VE, "grid must be", "Grid"),
    ("call-sincos-grid-int", lambda: pe("sincos")(x(), 7), VE, "grid must be", "Grid"),
    ("call-sincos-grid-bad-tuple", lambda: pe("sincos")(x(), (0, 7)), VE, "shape", "positive integer"),
    ("call-learned-wrong-tokens", lambda: pe("learned")(x(tokens=8), G), VE, "8 tokens", "has 7"),
    ("call-learned-wrong-width", lambda: pe("learned")(x(dim=4), G), VE, "width 4", "dim=8"),
    ("call-learned-prefix-mismatch", lambda: pe("learned")(x(tokens=8), Grid((2, 3), prefix=2)), VE,
     "prefix=2", "num_prefix_tokens=1"),
    ("call-learned-grid-1-axis", lambda: pe("learned")(x(tokens=4), Grid((3,), prefix=1)), VE, "1 axes", "ndim=2"),
    ("call-learned-offset-outside", lambda: pe("learned")(x(tokens=7), Grid((2, 3), prefix=1, offset=(1, 0))), VE,
     "offset", "(2, 3)"),
    ("call-learned-integer-x", lambda: pe("learned")(x(dtype=torch.int32), G), VE, "floating", "torch.int32"),
    ("call-peg-wrong-width", lambda: pe("peg")(x(dim=6), G), VE, "width 6", "dim=8"),
    ("call-peg-wrong-tokens", lambda: pe("peg")(x(tokens=5), G), VE, "5 tokens", "has 7"),
    ("call-peg-no-batch-axis", lambda: pe("peg")(torch.randn(7, 8), G), VE, "(batch, tokens, dim)"),
    ("call-peg-grid-3-axes", lambda: pe("peg")(x(tokens=13), Grid((2, 2, 3), prefix=1)), VE, "3 axes", "ndim=2"),
    ("call-peg-integer-x", lambda: pe("peg")(x(dtype=torch.int64), G), VE, "floating", "torch.int64"),
    ("call-rope_axial-integer-q", lambda: pe("rope_axial")(qk(dtype=torch.int64), qk(), G), VE, "floating-point",
     "torch.int64"),
    ("call-rope_axial-integer-k", lambda: pe("rope_axial")(qk(), qk(dtype=torch.int32), G), VE, "floating-point",
     "torch.int32"),
    ("call-rope_axial-wrong-head-dim", lambda: pe("rope_axial")(qk(head_dim=6), qk(head_dim=6), G), VE,
     "(batch, heads, 7, 8)", "(1, 2, 7, 6)"),
    ("call-rope_axial-wrong-tokens", lambda: pe("rope_axial")(qk(tokens=6), qk(tokens=6), G), VE,
     "(batch, heads, 7, 8)"),
    ("call-rope_axial-2d-q", lambda: pe("rope_axial")(torch.randn(7, 8), torch.randn(7, 8), G), VE,
     "(batch, heads, 7, 8)"),
    ("call-rope_axial-grid-3-axes", lambda: pe("rope_axial")(qk(tokens=13), qk(tokens=13), Grid((2, 2, 3), prefix=1)),
     VE, "3 axes", "ndim=2"),
    ("call-rope_mixed-wrong-heads", lambda: pe("rope_mixed")(qk(heads=3), qk(heads=3), G), VE, "3 heads",
     "num_heads=2"),
    ("call-rope_mixed-integer-q", lambda: pe("rope_mixed")(qk(dtype=torch.int64), qk(), G), VE, "floating-point"),
    ("call-rope_mixed-grid-1-axis", lambda: pe("rope_mixed")(qk(tokens=4), qk(tokens=4), Grid((3,), prefix=1)), VE,
     "1 axes", "ndim=2"),
    ("call-swin_bias-grid-larger", lambda: pe("swin_bias")(Grid((4, 3))), VE, "(4, 3)", "window_size=(2, 3)",
     "resize"),
    ("call-swin_bias-grid-3-axes", lambda: pe("swin_bias")(Grid((2, 2, 2))), VE, "3 axes", "ndim=2"),
    ("call-rel_bias-grid-1-axis", lambda: pe("rel_bias")(Grid((3,))), VE, "1 axes", "ndim=2"),
    ("call-cpb-grid-3-axes", lambda: pe("cpb")(Grid((2, 2, 2))), VE, "3 axes", "ndim=2"),
    ("call-alibi-grid-3-axes", lambda: pe("alibi")(Grid((2, 2, 2))), VE, "3 axes", "ndim=2"),
    ("call-alibi-grid-none", lambda: pe("alibi")(None), VE, "grid must be", "Grid"),
    ("call-harope-wrong-heads", lambda: pe("harope")(qk(heads=3), qk(heads=3), G), VE, "3 heads", "num_heads=2"),
    ("call-harope-rotate-side", lambda: pe("harope").rotate(qk(), G, side="value"), VE, "side='value'", "'query'",
     "'key'"),
    ("call-vit5_rope-too-few-prefix-tokens", lambda: pe("vit5_rope")(qk(heads=1), qk(heads=1), G), VE,
     "num_registers=4", "prefix=1", "reg_tokens=4"),
    ("call-pape-without-tokens", lambda: pe("pape")(G), VE, "reads the attention's input tokens", "pe(grid, tokens)"),
    ("call-pape-tokens-width", lambda: pe("pape")(G, x(dim=6)), VE, "tokens", "dim=8", "(1, 7, 6)"),
    ("call-pape-tokens-count", lambda: pe("pape")(G, x(tokens=6)), VE, "tokens", "(batch, 7, dim=8)"),
    ("call-pape-tokens-integer", lambda: pe("pape")(G, x(dtype=torch.int64)), VE, "tokens", "floating"),
    ("call-pape-grid-3-axes", lambda: pe("pape")(Grid((2, 2, 3), prefix=1), x(tokens=13)), VE, "3 axes", "ndim=2"),
    ("call-learned-resize-bad", lambda: pe("learned", dim=8).resize((4, 4, 4)), VE, "new_shape", "ndim=2"),
    ("call-swin_bias-resize-bad", lambda: pe("swin_bias").resize((0, 3)), VE, "new_window", "positive integer"),

    # -- attend and Attention --------------------------------------------------------------------------------------
    ("attend-head-dims", lambda: vpe.attend(qk(head_dim=8), qk(head_dim=6), qk(), G), VE, "same head_dim", "8", "6"),
    ("attend-3d", lambda: vpe.attend(torch.randn(2, 7, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 8), G), VE,
     "q must be", "(batch, heads, tokens, head_dim)", "(2, 7, 8)"),
    ("attend-integer", lambda: vpe.attend(qk(dtype=torch.int64), qk(), qk(), G), VE, "floating", "torch.int64"),
    ("attend-v-tokens", lambda: vpe.attend(qk(), qk(), qk(tokens=6), G), VE, "q, k, v disagree"),
    ("attend-heads", lambda: vpe.attend(qk(heads=3), qk(), qk(), G), VE, "q, k, v disagree"),
    ("attend-grid-tokens", lambda: vpe.attend(qk(tokens=5), qk(tokens=5), qk(tokens=5), G, bias=pe("alibi")), VE,
     "5 tokens",
     "grid (2, 3) with prefix=1", "7"),
    ("attend-token-bias-without-tokens", lambda: vpe.attend(qk(), qk(), qk(), G, bias=pe("pape")), VE,
     "reads the attention's input tokens", "tokens=x"),
    ("attend-token-bias-tokens-count", lambda: vpe.attend(qk(), qk(), qk(), G, bias=pe("pape"), tokens=x(tokens=5)),
     VE, "tokens must be", "tokens=7", "(1, 5, 8)"),
    ("attend-token-bias-tokens-2d", lambda: vpe.attend(qk(), qk(), qk(), G, bias=pe("pape"), tokens=torch.zeros(7, 8)),
     VE, "tokens must be", "(7, 8)"),
    ("attend-bias-heads", lambda: vpe.attend(qk(heads=4), qk(heads=4), qk(heads=4), G, bias=pe("alibi")), VE,
     "bias", "2 heads", "4"),
    ("attend-mask-shape", lambda: vpe.attend(qk(), qk(), qk(), G, attn_mask=torch.zeros(5, 5)), VE, "attn_mask",
     "(5, 5)", "(1, 2, 7, 7)"),
    ("attend-dropout", lambda: vpe.attend(qk(), qk(), qk(), G, dropout_p=1.5), VE, "dropout_p", "<= 1"),
    ("attend-scale-nan", lambda: vpe.attend(qk(), qk(), qk(), G, scale=NAN), VE, "scale", "finite number"),
    ("Attention-not-divisible", lambda: vpe.Attention(10, num_heads=3), VE, "dim=10", "divisible by num_heads=3"),
    ("Attention-num-heads-zero", lambda: vpe.Attention(8, num_heads=0), VE, "num_heads", "positive integer"),
    ("Attention-dim-zero", lambda: vpe.Attention(0, num_heads=2), VE, "dim", "positive integer"),
    ("Attention-dim-float", lambda: vpe.Attention(8.0, num_heads=2), VE, "dim", "positive integer"),
    ("Attention-wrong-width", lambda: vpe.Attention(8, num_heads=2)(x(dim=6), G), VE, "width 6", "dim=8"),
    ("attend-bias-in-rotary-slot", lambda: vpe.attend(qk(), qk(), qk(), G, rotary=pe("alibi")), VE,
     "rotary=ALiBi", "'bias' encoding", "pass it as bias="),
    ("attend-rotary-in-bias-slot", lambda: vpe.attend(qk(), qk(), qk(), G, bias=pe("rope_mixed")), VE,
     "bias=MixedRoPE", "'rotary' encoding", "pass it as rotary="),
    ("attend-tokens-in-rotary-slot", lambda: vpe.attend(qk(), qk(), qk(), G, rotary=pe("sincos")), VE,
     "'tokens' encoding", "added to the tokens before attention"),
    ("attend-rotary-not-a-module", lambda: vpe.attend(qk(), qk(), qk(), G, rotary=lambda q, k, g: (q, k)), VE,
     "rotary must be a torch.nn.Module", "None"),
    ("attend-rotary-wrong-output", lambda: vpe.attend(qk(), qk(), qk(), G, rotary=HalfRotary()), VE,
     "rotary HalfRotary returned", "(1, 2, 7, 4)", "(1, 2, 7, 8)"),
    ("Attention-bias-in-rotary-slot", lambda: vpe.Attention(8, num_heads=2, rotary=pe("alibi")), VE,
     "rotary=ALiBi", "pass it as bias="),
    ("attend-keep-batch", lambda: vpe.attend(qk(tokens=3), qk(tokens=3), qk(tokens=3), Layout(G, keep([[0, 1]] * 2)),
                                             bias=pe("alibi")), VE, "keep has 2 rows", "batch has 1", "1 row"),
    ("attend-keep-device", lambda: vpe.attend(qk(tokens=3), qk(tokens=3), qk(tokens=3),
                                              Layout(G, keep([[0, 1]]).to("meta")), pe("rope_axial")), VE,
     "keep is on meta", "tokens are on cpu"),
    ("attend-mixed-fewer-grids", lambda: vpe.attend(*[torch.randn(2, 2, 7, 8)] * 3, MixedLayout((G,)),
                                                    pe("rope_axial")), VE, "1 grids", "batch has 2 samples"),
    ("call-rope_axial-keep-batch", lambda: pe("rope_axial")(qk(tokens=3), qk(tokens=3), Layout(G, keep([[0, 1]] * 3))),
     VE, "keep has 3 rows", "batch has 1"),
    ("call-learned-keep-batch", lambda: pe("learned")(x(tokens=3, batch=2), Layout(G, keep([[0, 1]] * 3))), VE,
     "keep has 3 rows", "batch has 2"),

    # -- register --------------------------------------------------------------------------------------------------
    ("register-bad-name", lambda: vpe.register("1bad", Mine), VE, "name='1bad'", "identifier"),
    ("register-name-none", lambda: vpe.register("none", Mine), VE, "name='none'", "other than 'none'"),
    ("register-name-int", lambda: vpe.register(5, Mine), VE, "name=5", "identifier"),
    ("register-not-encoding", lambda: vpe.register("mine", int), VE, "cls=", "TokenEncoding"),
    ("register-instance", lambda: vpe.register("mine", Mine(8)), VE, "cls=", "TokenEncoding"),
    ("register-no-family", lambda: vpe.register("mine", NoFamily), VE, "cls=", "family one of"),
    ("register-builtin-taken", lambda: vpe.register("sincos", Mine), VE, "name='sincos'", "overwrite=True"),
    ("unregister-unknown", lambda: vpe.unregister("nope"), VE, "name='nope'", "not a known encoding"),
    ("unregister-builtin", lambda: vpe.unregister("sincos"), VE, "name='sincos'", "built-in", "cannot be unregistered"),

    # -- create_model ----------------------------------------------------------------------------------------------
    ("create-unknown-model", lambda: vpe.create_model("vit_nonexistent", pe="learned"), VE, "'vit_nonexistent'",
     "not a timm model"),
    ("create-model-name-int", lambda: vpe.create_model(5), VE, "model_name=5", "not a timm model"),
    ("create-unsupported-class", lambda: vpe.create_model("resnet18", pe="none", num_classes=3), VE, "ResNet",
     "supported: timm VisionTransformer, timm SwinTransformer"),
    ("create-bad-pe", lambda: vpe.create_model(VIT, pe="rope", **VIT_KW), VE, "pe='rope'", "available: sincos"),
    ("create-pe-empty", lambda: vpe.create_model(VIT, pe="", **VIT_KW), VE, "pe", "'rope_mixed+learned'"),
    ("create-pe-none-object", lambda: vpe.create_model(VIT, pe=None, **VIT_KW), VE, "pe", "None"),
    ("create-pe-two-rotary", lambda: vpe.create_model(VIT, pe="rope_axial+rope_mixed", **VIT_KW), VE,
     "both of family 'rotary'"),
    ("create-pe-two-tokens", lambda: vpe.create_model(VIT, pe="learned+sincos", **VIT_KW), VE,
     "both of family 'tokens'"),
    ("create-pe-two-bias", lambda: vpe.create_model(VIT, pe="alibi+cpb", **VIT_KW), VE, "both of family 'bias'"),
    ("create-pe-trailing-plus", lambda: vpe.create_model(VIT, pe="learned+", **VIT_KW), VE, "pe=''", "available"),
    ("create-unknown-pe-kwargs", lambda: vpe.create_model(VIT, pe="learned", pe_kwargs={"nope": 1}, **VIT_KW), VE,
     "pe keyword 'nope'", "learned"),
    ("create-pe-kwargs-not-dict", lambda: vpe.create_model(VIT, pe="learned", pe_kwargs=[1], **VIT_KW), VE,
     "pe_kwargs", "mapping"),
    ("create-pe-kwargs-bad-theta", lambda: vpe.create_model(VIT, pe="rope_axial", pe_kwargs={"theta": "100"},
                                                            **VIT_KW), VE, "theta", "finite number"),
    ("create-img-not-multiple", lambda: vpe.create_model(VIT, pe="learned", **{**VIT_KW, "img_size": 30,
                                                                             "patch_size": 8}), VE,
     "img_size=30", "multiple of patch_size=8"),
    ("create-img-size-zero", lambda: vpe.create_model(VIT, pe="learned", **{**VIT_KW, "img_size": 0}), VE,
     "img_size", "positive integer", "(0, 0)"),
    ("create-img-size-1-axis", lambda: vpe.create_model(VIT, pe="learned", **{**VIT_KW, "img_size": (16,)}), VE,
     "img_size=(16,)", "1 axes", "ndim=2"),
    ("create-img-size-str", lambda: vpe.create_model(VIT, pe="learned", **{**VIT_KW, "img_size": "16"}), VE,
     "img_size", "positive integer", "'16'"),
    ("create-patch-size-zero", lambda: vpe.create_model(VIT, pe="learned", **{**VIT_KW, "patch_size": 0}), VE,
     "patch_size", "positive integer"),
    ("create-patch-size-zero-no-img", lambda: vpe.create_model(VIT, pe="learned", patch_size=0, embed_dim=16,
                                                                depth=1, num_heads=2), VE,
     "patch_size", "positive integer"),
    ("create-swin-window-zero", lambda: vpe.create_model(SWIN, pe="swin_bias", **{**SWIN_KW, "window_size": 0}), VE,
     "window_size", "positive integer"),
    ("create-swin-img-not-multiple", lambda: vpe.create_model(SWIN, pe="swin_bias", **{**SWIN_KW, "img_size": 18}),
     VE, "img_size=18", "multiple of patch_size=4"),
    ("create-pretrained-not-bool", lambda: vpe.create_model(VIT, pe="learned", pretrained="yes", **VIT_KW), VE,
     "pretrained", "True or False"),
    ("create-rope-head-dim", lambda: vpe.create_model(VIT, pe="rope_axial", **{**VIT_KW, "embed_dim": 12}), VE,
     "head_dim=6", "divisible by 4"),
    ("create-sincos-embed-dim", lambda: vpe.create_model(VIT, pe="sincos", **{**VIT_KW, "embed_dim": 18,
                                                                              "num_heads": 3}), VE,
     "dim=18", "divisible by 4"),
    *[(f"create-{param}={value!r}", (lambda kw=kw: vpe.create_model(VIT, pe="learned", **{**VIT_KW, **kw})), VE,
       *words) for kw, words in [
        (dict(num_classes=-1), ("num_classes", "0 (no head", "positive integer", "-1")),
        (dict(num_classes=2.0), ("num_classes", "positive integer", "2.0")),
        (dict(in_chans=0), ("in_chans", "positive integer", "0")),
        (dict(num_heads=2.0), ("num_heads", "positive integer", "2.0")),
        (dict(depth=0), ("depth", "positive integer", "0")),
        (dict(embed_dim=0), ("embed_dim", "positive integer")),
        (dict(num_heads=3), ("embed_dim=16", "divisible by 3", "num_heads=3"))] for param, value in kw.items()],
    ("create-rope-heads-not-dividing", lambda: vpe.create_model(VIT, pe="rope_axial", **{**VIT_KW, "num_heads": 3}),
     VE, "embed_dim=16", "divisible by 3"),
    ("create-swin-num-classes", lambda: vpe.create_model(SWIN, pe="swin_bias", **{**SWIN_KW, "num_classes": -1}), VE,
     "num_classes", "positive integer", "-1"),
    ("create-swin-depths-zero", lambda: vpe.create_model(SWIN, pe="swin_bias", **{**SWIN_KW, "depths": (0,)}), VE,
     "depths", "one positive integer per stage", "(0,)"),
    ("create-swin-num-heads-int", lambda: vpe.create_model(SWIN, pe="swin_bias", **{**SWIN_KW, "num_heads": 2}), VE,
     "num_heads", "one positive integer per stage", "2"),
    ("apply-depth-zero", lambda: vpe.apply(timm.create_model(VIT, **{**VIT_KW, "depth": 0}), "rope_axial"), VE,
     "no blocks", "depth must be a positive integer"),
    ("video-in-chans-zero", lambda: vpe.create_video_model(VIT, **{**VIDEO_KW, "in_chans": 0}), VE, "in_chans",
     "positive integer"),
    ("apply-unknown-keyword", lambda: vpe.apply(vit("learned"), "learned", theta=10.0), VE, "pe keyword 'theta'",
     "learned"),
    ("create-swin_bias-on-vit", lambda: vpe.create_model(VIT, pe="swin_bias", **VIT_KW), VE,
     "swin_bias needs window attention", "rel_bias"),
    ("create-rel_bias-on-swin", lambda: vpe.create_model(SWIN, pe="rel_bias", **SWIN_KW), VE, "rel_bias",
     "swin_bias"),
    ("create-learned-on-swin", lambda: vpe.create_model(SWIN, pe="learned", **SWIN_KW), VE, "tokens encodings",
     "learned", "ViT"),
    ("apply-not-a-model", lambda: vpe.apply(torch.nn.Linear(2, 2), "learned"), VE,
     "supported: timm VisionTransformer, timm SwinTransformer"),

    # -- a patched model's forward ---------------------------------------------------------------------------------
    ("forward-no-batch-axis", lambda: vit()(image(3, 16, 16)), VE, "(B, C, H, W)", "(3, 16, 16)", "x[None]"),
    ("forward-one-channel", lambda: vit()(image(1, 1, 16, 16)), VE, "in_chans=3", "1 channels"),
    ("forward-uint8", lambda: vit()(image(1, 3, 16, 16, dtype=torch.uint8)), VE, "floating-point", "torch.uint8"),
    ("forward-not-multiple", lambda: vit()(image(1, 3, 18, 16)), VE, "(18, 16)", "multiple of", "(4, 4)"),
    ("forward-too-small", lambda: vit()(image(1, 3, 2, 16)), VE, "(2, 16)", "multiple of"),
    ("forward-5d-into-image", lambda: vit()(image(1, 3, 2, 16, 16)), VE, "(B, C, H, W)", "(1, 3, 2, 16, 16)"),
    ("forward-list", lambda: vit()([1.0, 2.0]), VE, "(B, C, H, W)", "list"),
    ("forward-rope-uint8", lambda: vit("rope_mixed")(image(1, 3, 16, 16, dtype=torch.uint8)), VE, "floating-point"),
    ("forward-grid-offset-nan", lambda: vit("rope_axial")(image(1, 3, 16, 16), grid_offset=(NAN, 0)), VE, "offset",
     "finite number"),
    ("forward-grid-offset-length", lambda: vit("rope_axial")(image(1, 3, 16, 16), grid_offset=(1, 2, 3)), VE,
     "offset", "one value per axis"),
    ("forward-is-causal", lambda: vit()(image(1, 3, 16, 16), is_causal=True), VE, "is_causal=True", "not supported"),
    ("forward-attn-mask-shape", lambda: vit("alibi")(image(1, 3, 16, 16), attn_mask=torch.zeros(3, 3)), VE,
     "attn_mask", "(3, 3)", "(1, 2, 17, 17)"),
    ("forward-masked-keep-negative", lambda: vit("rope_axial").forward_masked(image(1, 3, 16, 16), keep=keep([[-1]])),
     VE, "keep", "allowed 0 .. 15"),
    ("forward-masked-keep-batch", lambda: vit().forward_masked(image(2, 3, 16, 16), keep=keep([[0]] * 3)), VE,
     "keep", "batch=2 or 1"),
    ("forward-intermediates-fmt", lambda: vit().forward_intermediates(image(1, 3, 16, 16), output_fmt="NHWC"), VE,
     "output_fmt='NHWC'", "'NCHW'", "'NLC'"),
    ("forward-intermediates-index-past-depth", lambda: vit().forward_intermediates(image(1, 3, 16, 16), indices=[5]),
     VE, "indices=[5]", "block(s) [5]", "depth=1", "allowed -1 .. 0"),
    ("forward-intermediates-index-negative", lambda: vit().forward_intermediates(image(1, 3, 16, 16), indices=[-2]),
     VE, "block(s) [-2]", "allowed -1 .. 0"),
    ("forward-intermediates-last-n-zero", lambda: vit().forward_intermediates(image(1, 3, 16, 16), indices=0), VE,
     "indices=0", "allowed 1 .. 1"),
    ("forward-intermediates-last-n-past-depth", lambda: vit().forward_intermediates(image(1, 3, 16, 16), indices=3),
     VE, "indices=3", "depth=1", "allowed 1 .. 1"),
    ("forward-intermediates-index-str", lambda: vit().forward_intermediates(image(1, 3, 16, 16), indices="0"), VE,
     "indices must be None, an int", "'0'"),
    ("forward-float64-into-float32", lambda: vit()(image(1, 3, 16, 16, dtype=torch.float64)), VE,
     "torch.float32 weights", "input is torch.float64", "x.to(torch.float32)", "autocast"),
    ("forward-bfloat16-into-float32", lambda: vit("rope_mixed")(image(1, 3, 16, 16, dtype=torch.bfloat16)), VE,
     "torch.float32 weights", "input is torch.bfloat16"),
    ("forward-swin-float64", lambda: swin()(image(1, 3, 16, 16, dtype=torch.float64)), VE, "torch.float32 weights",
     "torch.float64"),
    ("video-forward-float16", lambda: video()(image(1, 3, 4, 16, 16, dtype=torch.float16)), VE,
     "torch.float32 weights", "torch.float16"),
    ("forward-swin-no-batch-axis", lambda: swin()(image(3, 16, 16)), VE, "(B, C, H, W)", "x[None]"),
    ("forward-swin-one-channel", lambda: swin()(image(1, 1, 16, 16)), VE, "in_chans=3", "1 channels"),
    ("forward-swin-uint8", lambda: swin()(image(1, 3, 16, 16, dtype=torch.uint8)), VE, "floating-point"),
    ("forward-swin-not-multiple", lambda: swin()(image(1, 3, 18, 16)), VE, "multiple of"),

    # -- create_video_model ----------------------------------------------------------------------------------------
    ("video-tubelet-2-axes", lambda: vpe.create_video_model(VIT, **{**VIDEO_KW, "tubelet_size": (2, 4)}), VE,
     "tubelet_size", "3"),
    ("video-tubelet-zero", lambda: vpe.create_video_model(VIT, **{**VIDEO_KW, "tubelet_size": (0, 4, 4)}), VE,
     "tubelet_size", "positive integer"),
    ("video-tubelet-float", lambda: vpe.create_video_model(VIT, **{**VIDEO_KW, "tubelet_size": 2.5}), VE,
     "tubelet_size", "positive integer"),
    ("video-non-vit", lambda: vpe.create_video_model(SWIN, pe="rope_axial"), VE, f"model_name={SWIN!r}", "ViT"),
    ("video-name-int", lambda: vpe.create_video_model(5), VE, "model_name=5", "ViT"),
    ("video-bad-pe", lambda: vpe.create_video_model(VIT, pe="rope", **VIDEO_KW), VE, "pe='rope'", "available"),
    ("video-num-frames-zero", lambda: vpe.create_video_model(VIT, **{**VIDEO_KW, "num_frames": 0}), VE,
     "num_frames", "positive integer"),
    ("video-num-frames-not-multiple", lambda: vpe.create_video_model(VIT, **{**VIDEO_KW, "num_frames": 5}), VE,
     "num_frames=5", "divisible by 2"),
    ("video-img-not-multiple", lambda: vpe.create_video_model(VIT, **{**VIDEO_KW, "img_size": 18}), VE,
     "img_size=18", "multiple of"),
    ("video-unknown-pe-kwargs", lambda: vpe.create_video_model(VIT, pe_kwargs={"nope": 1}, **VIDEO_KW), VE,
     "pe keyword 'nope'", "rope_axial"),
    ("video-forward-4d", lambda: video()(image(1, 3, 16, 16)), VE, "(B, C, T, H, W)", "(1, 3, 16, 16)"),
    ("video-forward-no-batch", lambda: video()(image(3, 4, 16, 16)), VE, "(B, C, T, H, W)", "x[None]"),
    ("video-forward-odd-frames", lambda: video()(image(1, 3, 3, 16, 16)), VE, "multiple of", "(2, 4, 4)"),
    # -- checkpoints: the message names the file (or the source that is not a state dict) --------------------------
    ("load_weights-garbage-safetensors", lambda: vpe.load_weights(vit(), _file("g.safetensors", b"\x00garbage" * 8)),
     VE, "g.safetensors", "safetensors"),
    ("load_weights-garbage-pth", lambda: vpe.load_weights(vit(), _file("g.pth", b"not a torch file" * 3)), VE,
     "g.pth", "torch"),
    ("load_weights-truncated-safetensors", lambda: vpe.load_weights(vit(), _truncated()), VE,
     "truncated.safetensors", "safetensors"),
    ("load_weights-truncated-pth", lambda: vpe.load_weights(vit(), _truncated_pth()), VE, "truncated.pth"),
    ("load_weights-empty-file", lambda: vpe.load_weights(vit(), _file("e.safetensors", b"")), VE, "e.safetensors"),
    ("load_weights-missing-file", lambda: vpe.load_weights(vit(), _tmp() / "missing.safetensors"), FileNotFoundError,
     "missing.safetensors", "does not exist"),
    ("load_weights-directory", lambda: vpe.load_weights(vit(), _tmp()), FileNotFoundError, "does not exist"),
    ("load_weights-other-model", lambda: vpe.load_weights(vit(), _other_model_weights()), VE, "other.safetensors",
     "pe_tokens.table", "(9, 9, 16)"),
    ("load_weights-tensor-file", lambda: vpe.load_weights(vit(), _tensor_file()), VE, "tensor.pth", "state dict",
     "Tensor"),
    ("load_weights-list", lambda: vpe.load_weights(vit(), [1, 2]), VE, "source", "state dict", "list"),
    ("load_weights-int", lambda: vpe.load_weights(vit(), 5), VE, "source", "state dict", "5"),
    ("load_weights-nan-dict", lambda: vpe.load_weights(vit(), _poisoned(NAN)), VE, "state dict", "1 NaN or infinite",
     "'head.weight'", "(3, 16)", "finite weights"),
    ("load_weights-inf-file", lambda: vpe.load_weights(vit(), _poisoned(-INF, "inf.safetensors")), VE,
     "inf.safetensors", "'head.weight'", "finite weights"),
    ("save_weights-int-value", lambda: vpe.save_weights({"w": 1}, _tmp() / "s.safetensors"), TypeError,
     "entry 'w' holds a int", "tensor values"),
    ("save_weights-int-key", lambda: vpe.save_weights({3: torch.zeros(1)}, _tmp() / "s.safetensors"), TypeError,
     "entry 3", "string keys"),
    ("save_weights-list", lambda: vpe.save_weights([torch.zeros(1)], _tmp() / "s.safetensors"), TypeError,
     "model_or_state", "torch.nn.Module or a state dict", "list"),
    ("encodings_of-none", lambda: vpe.encodings_of(None), TypeError, "model must be a torch.nn.Module", "NoneType"),
    ("load_timm-list", lambda: vpe.load_timm_checkpoint(vit(), [torch.randn(2)]), VE, "source", "state dict", "list"),
    ("load_timm-tensor", lambda: vpe.load_timm_checkpoint(vit(), torch.randn(3)), VE, "source", "state dict",
     "Tensor"),
    ("load_timm-none", lambda: vpe.load_timm_checkpoint(vit(), None), VE, "source", "state dict", "None"),
    ("load_timm-non-tensor-values", lambda: vpe.load_timm_checkpoint(vit(), {"head.weight": [1.0]}), VE,
     "'head.weight'", "tensor"),
    ("load_timm-random-bytes", lambda: vpe.load_timm_checkpoint(vit(), _file("r.pth", bytes(range(256)) * 4)), VE,
     "r.pth"),
    ("load_timm-random-bytes-safetensors",
     lambda: vpe.load_timm_checkpoint(vit(), _file("r.safetensors", bytes(range(256)) * 4)), VE, "r.safetensors"),
    ("load_timm-tensor-file", lambda: vpe.load_timm_checkpoint(vit(), _tensor_file()), VE, "tensor.pth",
     "state dict"),
    ("load_weights-strict-not-bool", lambda: vpe.load_weights(vit(), vit().state_dict(), strict="yes"), VE,
     "strict", "True or False"),
    ("load_timm-strict-not-bool", lambda: vpe.load_timm_checkpoint(vit(), vit().state_dict(), strict=1), VE,
     "strict", "True or False"),
    ("load_timm-truncated", lambda: vpe.load_timm_checkpoint(vit(), _truncated()), VE, "truncated.safetensors"),
]


# -- issue 32: timm's transforms read strictly and bounded, video files, one-class sets ------------------------------
def _folder(layout: dict, suffix: str = ".png"):
    """``tmp/data/<split>/<class>/0<suffix>`` for ``layout`` ``{split: classes}``: PNGs, or empty files named as
    clips (enough to build a video set that is not read)."""
    from PIL import Image
    for split, classes in layout.items():
        for c in classes:
            (_tmp() / "data" / split / c).mkdir(parents=True, exist_ok=True)
            path = _tmp() / "data" / split / c / f"0{suffix}"
            Image.new("RGB", (8, 8)).save(path) if suffix == ".png" else path.write_bytes(b"")
    return _tmp() / "data"


def _not_a_video():
    pytest.importorskip("av")  # the decoder that reads it
    return video_files.clip_length(str(_file("x.mp4", bytes(range(256)) * 2)), "av")


ROWS += [
    ("transforms-aa-part-timm-skips", lambda: vdata.Transforms(aa="rand-zz"), VE, "aa 'rand-zz'", "'zz'",
     "timm would skip it"),
    ("transforms-aa-magnitude-beyond-timms", lambda: vdata.Transforms(aa="rand-m1000"), VE, "m1000", "0..10",
     "clamp"),
    ("transforms-aa-part-twice", lambda: vdata.Transforms(aa="rand-m9-n2-m5"), VE, "m is given twice"),
    ("transforms-aa-unknown-set", lambda: vdata.Transforms(aa="rand-m9-tfoo"), VE, "transform set 'foo'"),
    ("transforms-aa-probability", lambda: vdata.Transforms(aa="rand-p2"), VE, "p2", "[0, 1]"),
    ("transforms-color-jitter-huge", lambda: vdata.Transforms(color_jitter=1e30), VE, "color_jitter must be in [0, 1]",
     "1e+30"),
    ("transforms-recount-huge", lambda: vdata.Transforms(reprob=1.0, recount=10**6), VE,
     "recount must be an integer in [1, 100]", "1000000"),
    ("build_dataset-first-negative", lambda: vdata.build_dataset("clutter-count", "train", 16, first=-1), VE,
     "first=-1", "non-negative integer", "clutter-count"),
    ("build_dataset-first-real-set", lambda: vdata.build_dataset("cifar10", "train", 16, first=5), VE, "first=5",
     "shapes-position"),
    ("build_dataset-imagefolder-one-class", lambda: vdata.build_dataset(
        "imagefolder", "train", 16, data_dir=_folder({"train": ["cat"], "val": ["cat"]})), VE,
     "imagefolder: 1 class (cat)", "at least 2"),
    ("video-files-hflip-above-1", lambda: video_files.VideoFileDataset(str(_folder({"train": ["a", "b"]}, ".mp4")
                                                                           / "train"), 16, 2, hflip=1.5), VE,
     "hflip must be <= 1.0", "1.5"),
    ("video-files-not-a-video", _not_a_video, VE, "video-files: cannot decode", "x.mp4", "remove or replace it"),
]


# -- issue 32: the library's cases (sizes past memory, the shared vocabulary, rotary inputs, weights files) -----------
# (kept apart from the rows above so that other blocks can be appended beside it)
HUGE = 10**15  # more memory than any machine has, for one float32 value per unit
ROTARY = {"rope_axial": dict(head_dim=8, num_heads=2), "rope_mixed": dict(head_dim=8, num_heads=2),
          "videorope": dict(head_dim=12, num_heads=2, ndim=3), "string": dict(head_dim=8, num_heads=2),
          "comrope": dict(head_dim=8, num_heads=2), "liere": dict(head_dim=8, num_heads=2, block_size=4)}
BIASES = ("swin_bias", "rel_bias", "cpb", "alibi", "bucket_bias", "lookhere", "fire")


@functools.lru_cache(maxsize=None)
def rotary(name):
    return vpe.build(name, **ROTARY[name])


def rotary_grid(name):
    return Grid((2, 2, 3), prefix=1) if name == "videorope" else G  # 13 or 7 tokens


def rotary_qk(name, **kw):
    tokens = rotary_grid(name).num_tokens
    return qk(tokens=tokens, head_dim=ROTARY[name]["head_dim"], **kw)


class SharedWeights(torch.nn.Module):
    """Two names of one tensor (tied weights), as a tied classifier head has."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        self.b.weight = self.a.weight


class FlatOnly(vpe.BiasEncoding):
    """A user's bias defined on 2D grids only that does not check ndim itself."""

    ndims = (2,)

    def __init__(self, num_heads: int, ndim: int = 2):
        super().__init__()

    def forward(self, grid):
        return torch.zeros(1, grid.num_tokens, grid.num_tokens)


def _poisoned_timm(key, value, path=None):
    """``vit()``'s state dict with ``value`` in the first entry of ``key``; written to ``path`` if given."""
    state = {k: v.clone() for k, v in vit().state_dict().items()}
    if key == "pos_embed":  # a timm ViT's table, converted into the learned encoding on load
        state = {k: v for k, v in state.items() if not k.startswith("pe_tokens.")}
        state["pos_embed"] = torch.randn(1, 17, 16)
    state[key].view(-1)[0] = value
    if path is None:
        return state
    vpe.save_weights(state, _tmp() / path)
    return _tmp() / path


ROWS += [
    # sizes past memory: refused by the shared vocabulary check before any allocation
    *[(f"huge-{name}-{word}", (lambda name=name, word=word: vpe.build(name, **{word: HUGE})), VE, f"{word}={HUGE}",
       "float32", "more than the", "of memory", f"give a smaller {word}")
      for name, family in vpe.registry.available().items() if name in vpe.registry.BUILTIN
      for word in {"tokens": ("dim",), "rotary": ("head_dim", "num_heads"), "bias": ("num_heads",)}[family]],
    ("huge-lookhere-num-heads-fast", lambda: vpe.build("lookhere", num_heads=HUGE, head_directions="halves"), VE,
     "num_heads=1000000000000000", "TiB"),
    ("huge-learned-grid-shape", lambda: vpe.build("learned", dim=8, grid_shape=(HUGE, HUGE)), VE,
     f"grid_shape=({HUGE}, {HUGE})", "patch", "give a smaller grid_shape"),
    ("huge-rel_bias-grid-shape", lambda: vpe.build("rel_bias", num_heads=2, grid_shape=(HUGE, 2)), VE,
     "grid_shape", "give a smaller grid_shape"),
    ("huge-swin_bias-window", lambda: vpe.build("swin_bias", num_heads=2, window_size=(HUGE, 7)), VE,
     "window_size", "give a smaller window_size"),
    ("huge-cpb-hidden-dim", lambda: vpe.build("cpb", num_heads=2, hidden_dim=HUGE), VE, f"hidden_dim={HUGE}",
     "a tensor of", "it creates", "give smaller sizes"),
    *[(f"huge-grid-{name}", (lambda name=name: vpe.build(name, num_heads=2, **(
        {"window_size": (2000, 2000)} if name == "swin_bias" else {}))(Grid((2000, 2000)))), VE,
       "grid=(2000, 2000)", "4000000 tokens", "bias table", "TiB", "use a smaller grid") for name in BIASES],
    ("huge-grid-alibi-names-flex", lambda: pe("alibi")(Grid((2000, 2000))), VE, "attention='flex'"),
    *[(f"huge-grid-{name}-rotations", (lambda name=name: rotary(name).rotations(
        Grid((10**5, 10**5, 2) if name == "videorope" else (10**5, 10**5)))), VE, "grid=(100000, 100000",
       "rotation table", "use a smaller grid") for name in ROTARY],
    ("huge-grid-rope-pair-map", lambda: rotary("rope_axial").pair_map(Grid((1000, 1000))), VE, "grid=(1000, 1000)",
     "kernel"),
    # the shared vocabulary, for every encoding (also a user's)
    *[(f"vocabulary-string-ndim={v!r}", (lambda v=v: vpe.build("string", head_dim=8, num_heads=2, ndim=v)), VE,
       f"ndim={v!r}", "StringRoPE", "1, 2, 3") for v in (0, 2.0, "2")],
    ("vocabulary-lookhere-ndim-float", lambda: vpe.build("lookhere", num_heads=2, ndim=2.0), VE, "ndim=2.0",
     "LookHere", "allowed values: 2"),
    ("vocabulary-liere-head-dim-1", lambda: vpe.build("liere", head_dim=1), VE, "head_dim must be >= 2", "got 1"),
    ("vocabulary-user-class-dim", lambda: Mine(0), VE, "dim must be a positive integer", "got 0"),
    ("vocabulary-user-class-ndims", lambda: FlatOnly(2, ndim=3), VE, "ndim=3", "FlatOnly", "allowed values: 2"),
    ("vocabulary-num-prefix-tokens", lambda: vpe.build("learned", dim=8, num_prefix_tokens="1"), VE,
     "num_prefix_tokens", "'1'"),
    ("vocabulary-ref-shape-axes", lambda: vpe.build("string", head_dim=8, ref_shape=(4, 4, 4)), VE, "ref_shape",
     "ndim=2"),
    # rotary inputs: q or k named, 3-D input with a rotation per head refused
    *[row for name in ROTARY for row in [
        (f"rotary-{name}-k-none", (lambda name=name: rotary(name)(rotary_qk(name), None, rotary_grid(name))), VE,
         "k must be a floating-point tensor", "NoneType"),
        (f"rotary-{name}-q-list", (lambda name=name: rotary(name)([1.0], rotary_qk(name), rotary_grid(name))), VE,
         "q must be a floating-point tensor", "list"),
        (f"rotary-{name}-k-integer", (lambda name=name: rotary(name)(
            rotary_qk(name), rotary_qk(name, dtype=torch.int64), rotary_grid(name))), VE,
         "k must be a floating-point tensor", "torch.int64"),
        (f"rotary-{name}-q-tokens", (lambda name=name: rotary(name)(
            qk(tokens=5, head_dim=ROTARY[name]["head_dim"]), rotary_qk(name), rotary_grid(name))), VE,
         "q has shape (1, 2, 5,", "expected (batch, heads,"),
        (f"rotary-{name}-k-head-dim", (lambda name=name: rotary(name)(
            rotary_qk(name), qk(tokens=rotary_grid(name).num_tokens, head_dim=4), rotary_grid(name))), VE,
         "k has shape", ", 4)", "expected (batch, heads,"),
    ]],
    # a 3-D input (2 samples or 2 heads?) is refused where each head has its own rotation
    *[(f"rotary-{name}-q-3d-heads-first", (lambda name=name: rotary(name)(
        rotary_qk(name)[0], rotary_qk(name)[0], rotary_grid(name))), VE, "q has shape (2, 7, 8)",
       "batch or the heads" if name == "rope_mixed" else "expected (batch, heads, 7, 8)")
      for name in ("rope_mixed", "string", "comrope", "liere")],
    ("rotary-rope_mixed-k-heads", lambda: rotary("rope_mixed")(qk(), qk(heads=3), G), VE, "k has 3 heads",
     "num_heads=2"),
    # models and files of the wrong type, weights files
    *[(f"{fn.__name__}-model={bad!r}", (lambda fn=fn, bad=bad: fn(bad, *rest)), TypeError,
       "model must be a torch.nn.Module", type(bad).__name__)
      for fn, rest in ((vpe.set_attention, ("sdpa",)), (vpe.load_weights, ({},)), (vpe.load_timm_checkpoint, ({},)))
      for bad in (None, "vit", 3)],
    *[(f"save_weights-path={bad!r}", (lambda bad=bad: vpe.save_weights(vit(), bad)), TypeError, "path must be a file "
       "path", type(bad).__name__) for bad in (None, 3, b"w.safetensors")],
    ("save_weights-unknown-suffix", lambda: vpe.save_weights(vit(), _tmp() / "w.bin"), VE, "w.bin",
     "must end in .safetensors", ".pth"),
    ("save_weights-no-suffix", lambda: vpe.save_weights(vit(), _tmp() / "weights"), VE, "must end in .safetensors"),
    ("save_weights-metadata-pth", lambda: vpe.save_weights(vit(), _tmp() / "w.pth", metadata={"a": "1"}), VE,
     "metadata", ".safetensors files only"),
    ("load_timm-pos-embed-width", lambda: vpe.load_timm_checkpoint(vit(), {"pos_embed": torch.randn(1, 17, 8)}), VE,
     "pe_tokens.table is (4, 4, 8) in the checkpoint", "pos_embed -> pe_tokens.table", "(4, 4, 16) in the model"),
    ("forward_batch-4d-item", lambda: vit().forward_batch([image(3, 16, 16), image(1, 3, 16, 16)]), VE,
     "images[1] must be a (C, H, W) tensor", "(1, 3, 16, 16)"),
    ("forward_batch-list-item", lambda: vit().forward_batch([[1.0]]), VE, "images[0]", "list"),
    *[(f"load_timm-nonfinite-{key}", (lambda key=key, value=value: vpe.load_timm_checkpoint(
        vit(), _poisoned_timm(key, value))), VE, f"{key!r}", "NaN or infinite", "allow_nonfinite=True")
      for key, value in (("blocks.0.attn.qkv.weight", NAN), ("head.bias", INF), ("pos_embed", NAN))],
    ("load_timm-nonfinite-file", lambda: vpe.load_timm_checkpoint(vit(), _poisoned_timm("head.bias", -INF,
                                                                                          "bad.safetensors")), VE,
     "bad.safetensors", "'head.bias'", "allow_nonfinite=True"),
    ("load_timm-allow-nonfinite-not-bool", lambda: vpe.load_timm_checkpoint(vit(), {}, allow_nonfinite="yes"), VE,
     "allow_nonfinite", "True or False"),
    # pe keywords that contradict the model, refused at build
    ("create-pe-kwargs-head-dim", lambda: vpe.create_model(VIT, pe="rope_axial", pe_kwargs={"head_dim": 4}, **VIT_KW),
     VE, "pe keyword head_dim=4", "head_dim is 8", "leave it out"),
    ("create-pe-kwargs-dim", lambda: vpe.create_model(VIT, pe="learned", pe_kwargs={"dim": 8}, **VIT_KW), VE,
     "pe keyword dim=8", "dim is 16"),
    ("create-pe-kwargs-num-heads", lambda: vpe.create_model(VIT, pe="alibi", pe_kwargs={"num_heads": 3}, **VIT_KW),
     VE, "pe keyword num_heads=3", "num_heads is 2", "pass 1"),
    ("create-pe-kwargs-ndim", lambda: vpe.create_model(VIT, pe="rope_mixed", pe_kwargs={"ndim": 3}, **VIT_KW), VE,
     "pe keyword ndim=3", "ndim is 2"),
    ("apply-pe-kwargs-head-dim", lambda: vpe.apply(timm.create_model(VIT, **VIT_KW), "string", head_dim=16), VE,
     "pe keyword head_dim=16", "head_dim is 8"),
    # layouts and attention without encodings
    ("layout-keep-duplicate", lambda: Layout(G, keep([[0, 1], [2, 2]])), VE, "keep row 1", "patch 2",
     "more than once"),
    ("attend-no-encoding-tokens", lambda: vpe.attend(qk(tokens=6), qk(tokens=6), qk(tokens=6), G), VE,
     "6 tokens", "grid (2, 3) with prefix=1 has 7"),
    ("attend-no-encoding-layout-batch", lambda: vpe.attend(qk(tokens=3), qk(tokens=3), qk(tokens=3),
                                                           Layout(G, keep([[0, 1]] * 2))), VE, "keep has 2 rows"),
]


# -- issue 43: the probe's last silent and unclear cases --------------------------------------------------------------
ROWS += [
    ("load_timm-source-grid-unread", lambda: vpe.load_timm_checkpoint(vit(), vit("rope_mixed").state_dict(),
                                                                     source_grid=(3, 5)), VE,
     "source_grid=(3, 5)", "holds no pos_embed", "leave out source_grid"),
    ("transforms-scale-huge", lambda: vdata.Transforms(scale=(1e30, 1e30)), VE, "scale", "0.0 < low <= high <= 1",
     "1e+30"),
    ("transforms-ratio-huge", lambda: vdata.Transforms(ratio=(1e30, 1e30)), VE, "ratio", "<= high <= 100", "1e+30"),
    ("build-spiral_rope-num-directions-huge", lambda: vpe.build("spiral_rope", head_dim=16, num_directions=10**6), VE,
     "num_directions=1000000", "at most the head's 8 frequency pairs", "head_dim=16"),
    *[(f"preset-qwen3_vl-depth={v}", (lambda v=v: vpe.preset("qwen3_vl", depth=v)), VE, "depth must be a positive "
       "integer", f"got {v}") for v in (0, -1)],
    ("preset-qwen3_vl-num-heads-0", lambda: vpe.preset("qwen3_vl", num_heads=0), VE, "num_heads must be a positive "
     "integer", "got 0"),
    ("preset-qwen3_vl-num-heads-negative", lambda: vpe.preset("qwen3_vl", num_heads=-4), VE, "num_heads", "got -4"),
    ("preset-qwen3_vl-num-heads-not-dividing", lambda: vpe.preset("qwen3_vl", num_heads=5), VE, "num_heads=5",
     "does not divide dim=1152", "head_dim"),
    ("preset-qwen3_vl-grid-one-axis", lambda: vpe.preset("qwen3_vl", grid_shape=(4,)), VE, "grid_shape=(4,) has 1 "
     "axes", "2-axis scheme", "(48, 48)"),
    ("preset-qwen3_vl-grid-string", lambda: vpe.preset("qwen3_vl", grid_shape="16x16"), VE, "grid_shape must be a "
     "tuple of 2 positive integers", "'16x16'"),
    *[(f"attend-scale={v}", (lambda v=v: vpe.attend(qk(), qk(), qk(), G, scale=v)), VE, "scale must be > 0.0",
       f"got {v}") for v in (-1.0, 0.0)],
    ("create-vit5_rope-registers-the-model-lacks", lambda: vpe.create_model(VIT, pe="vit5_rope", pe_kwargs={
        "num_registers": 4}, **VIT_KW), VE, "num_registers=4", "the model has 0 register tokens", "reg_tokens=4"),
    *[(f"create_video-{pe}-head-dim-4", (lambda pe=pe: vpe.create_video_model(VIT, pe=pe, **{
        **VIDEO_KW, "embed_dim": 8})), VE, "head_dim=4 is too small for RoPE on a (T, H, W) grid",
       "at least 6") for pe in ("rope_axial", "rope_mixed", "videorope")],
    ("load_timm-source-grid-no-table", lambda: vpe.load_timm_checkpoint(
        vit("rope_mixed"), timm.create_model(VIT, **VIT_KW).state_dict(), source_grid=(4, 4)), VE,
     "source_grid=(4, 4)", "the model has no learned table"),
]


# -- issue 43: the fresh probe's cases (unclear: an allocator error, torch's dtype message, an AttributeError) -----------
ROWS += [
    ("attend-dtypes-differ", lambda: vpe.attend(qk(dtype=torch.float16), qk(), qk(), G), VE,
     "q, k, v must share one dtype", "torch.float16, torch.float32, torch.float32"),
    ("reset_parameters-not-a-module", lambda: vpe.reset_parameters("m"), TypeError, "model must be a torch.nn.Module",
     "str"),
    ("create-img-size-past-memory", lambda: vpe.create_model(VIT, pe="rope_mixed", **{**VIT_KW, "img_size": 10**9}),
     VE, "img_size=1000000000", "tokens", "more than the", "give a smaller img_size"),
    ("create_video-num-frames-past-memory", lambda: vpe.create_video_model(VIT, pe="rope_axial", **{
        **VIDEO_KW, "num_frames": 10**18}), VE, f"img_size=16 with num_frames={10**18}", "give a smaller img_size or "
     "num_frames"),
    *[(f"build-rope_axial-{k}-negative", (lambda k=k: vpe.build("rope_axial", head_dim=8, scaling="yarn",
                                                                 ref_shape=(4, 4), **{k: -1.0})), VE, f"{k} must be",
       ">= 0.0", "-1.0") for k in ("yarn_alpha", "yarn_beta")],
    ("load_timm-nothing-fits", lambda: vpe.load_timm_checkpoint(vit("rope_mixed"), vpe.create_model(
        VIT, pe="rope_mixed", **{**VIT_KW, "embed_dim": 32}).state_dict()), VE, "nothing of", "fits",
     "is (1, 1, 32) in the checkpoint, (1, 1, 16) in the model", "would keep its initial weights"),
]


@pytest.mark.parametrize("call,exc,words", [pytest.param(c, e, w, id=i) for i, c, e, *w in ROWS])
def test_bad_input_is_named(call, exc, words, tmp_path):
    _TMP[:] = [tmp_path]
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"{type(info.value).__name__}: {message!r} lacks {missing}"


def test_matrix_size_and_unique_ids():
    assert len(ROWS) >= 453
    assert len({r[0] for r in ROWS}) == len(ROWS), "ids must be unique"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_peg_called_directly_with_half_input_works(dtype):
    """Like every other tokens encoding, PEG takes half-precision tokens outside autocast and returns their dtype."""
    module = pe("peg")
    tokens = x(dtype=dtype)
    out = module(tokens, G)
    assert out.dtype == dtype and out.shape == tokens.shape and torch.isfinite(out.float()).all()
    for name in ("sincos", "learned"):
        assert pe(name)(tokens, G).dtype == dtype


def test_an_input_of_the_model_dtype_or_under_autocast_runs():
    """The dtype check refuses only what PyTorch would: a bfloat16 model takes bfloat16 images, autocast casts."""
    model = vpe.create_model(VIT, pe="rope_mixed", **VIT_KW).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(image(1, 3, 16, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with torch.no_grad():
        assert model.to(torch.float64)(image(1, 3, 16, 16, dtype=torch.float64)).dtype == torch.float64


def test_unregister_gives_an_overwritten_builtin_back():
    class Other(vpe.TokenEncoding):
        def __init__(self, dim: int):
            super().__init__()

    vpe.register("peg", Other, overwrite=True)
    try:
        assert vpe.registry.ENCODINGS["peg"] is Other
    finally:
        vpe.unregister("peg")
    assert vpe.registry.ENCODINGS["peg"] is vpe.PEG


# -- issue 32: what the library's rows above do not show (correct behaviour, and checks before allocation) -----------

def test_every_registered_encoding_refuses_sizes_past_memory():
    """Every encoding (a new one too: the check is the shared vocabulary's) refuses each size word of its constructor
    at a size no memory holds, fast and before allocating."""
    from visionpe.encoding import constructor_keywords
    for name, cls in vpe.registry.ENCODINGS.items():
        for word in set(constructor_keywords(cls)) & {"dim", "head_dim", "num_heads"}:
            with pytest.raises(ValueError, match=f"{word}={HUGE}.*more than the .* of memory"):
                vpe.build(name, **{word: HUGE})


SIZES_UNDER_A_LIMIT = """
import resource, time
import visionpe as vpe
from visionpe import Grid, _checks
pages = int(open("/proc/self/statm").read().split()[0])
limit = pages * resource.getpagesize() + 2 * 2**30  # what the process maps now, and 2 GiB more
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
assert _checks.machine_memory() <= limit
calls = {"learned table 16 GiB": lambda: vpe.build("learned", dim=4096, grid_shape=(1024, 1024)),
         "cpb MLP 32 GiB": lambda: vpe.build("cpb", num_heads=2, hidden_dim=2**32),
         "alibi bias 64 GiB": lambda: vpe.build("alibi", num_heads=2)(Grid((256, 256))),
         "rope table 16 GiB": lambda: vpe.build("rope_mixed", head_dim=64, num_heads=64).rotations(Grid((1024, 1024)))}
for what, call in calls.items():
    start = time.perf_counter()
    try:
        call()
    except ValueError as err:
        print(what, "|", round(time.perf_counter() - start, 3), "|", err)
    except Exception as err:
        print(what, "| allocator |", type(err).__name__, err)
"""


def test_sizes_are_checked_before_allocation_under_an_address_space_limit(tmp_path):
    """Under ``RLIMIT_AS`` (2 GiB above what the process maps; far less than the sizes asked for, whatever the
    machine has) each call is one ValueError raised at once, not an allocator error: the check reads the limit and
    runs before anything is allocated."""
    import subprocess
    import sys
    script = tmp_path / "limit.py"
    script.write_text(SIZES_UNDER_A_LIMIT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if "|" in line]
    assert len(lines) == 3 + 1, out.stdout
    for line in lines:
        what, seconds, message = line.split(" | ", 2)
        assert seconds != "allocator" and float(seconds) < 2.0, line
        assert "more than the" in message and "of memory this process may use" in message, line
    by_call = dict(line.split(" | ")[::2] for line in lines)
    assert "hidden_dim=4294967296" in by_call["cpb MLP 32 GiB"] and "grid=(256, 256)" in by_call["alibi bias 64 GiB"]
    assert "rotation table" in by_call["rope table 16 GiB"]


def test_the_checks_compare_with_the_memory_the_process_may_use(monkeypatch):
    """The same sizes pass or fail with the memory :func:`visionpe._checks.machine_memory` reports (here pretended
    to be 100 MiB): a 128 MiB MLP weight and a 256 MiB bias table are refused, nothing is allocated for them."""
    from visionpe import _checks
    monkeypatch.setattr(_checks, "machine_memory", lambda: 100 * 2**20)
    with pytest.raises(ValueError, match=r"ContinuousPositionBias\(.*hidden_dim=16777216.*more than the 0.0977 GiB"):
        vpe.build("cpb", num_heads=2, hidden_dim=2**24)  # Linear(2, 2**24): 128 MiB of float32
    assert vpe.build("cpb", num_heads=2, hidden_dim=2**20).cpb_mlp[0].weight.shape == (2**20, 2)  # 8 MiB fits
    alibi = vpe.build("alibi", num_heads=2)
    with pytest.raises(ValueError, match=r"grid=\(64, 64\).*bias table of ALiBi needs 0.25 GiB"):
        alibi(Grid((64, 64)))  # 4096 tokens: (2, T, T) float32 and a (T, T) distance
    assert alibi(Grid((8, 8))).shape == (2, 64, 64)


@pytest.mark.parametrize("name", ["rope_axial", "videorope"])
def test_a_3d_rotary_input_with_rotations_shared_by_the_heads_is_each_sample_alike(name):
    """With one rotation for every head a 3-D input is unambiguous: each leading index is rotated as the 4-D input's
    heads are."""
    pe, grid = rotary(name), rotary_grid(name)
    q, k = rotary_qk(name)[0], rotary_qk(name)[0]  # (2, T, head_dim)
    got = pe(q, k, grid)
    expected = pe(q[None], k[None], grid)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b[0], rtol=0, atol=0)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth", ".pt"])
def test_save_weights_round_trips_in_the_format_its_suffix_names(tmp_path, suffix):
    """``.safetensors`` is written as safetensors, ``.pth``/``.pt`` as a torch file (``torch.load(weights_only=True)``
    reads it), and load_weights reads each back into a model that then gives the same outputs."""
    source = vpe.create_model(VIT, pe="rope_mixed", **VIT_KW).eval()
    path = tmp_path / f"w{suffix}"
    vpe.save_weights(source, path)
    if suffix == ".safetensors":
        assert vpe.weights.weights_metadata(path) == {}
    else:
        assert set(torch.load(path, weights_only=True)) == set(source.state_dict())
    target = vpe.create_model(VIT, pe="rope_mixed", **VIT_KW).eval()
    vpe.load_weights(target, path)
    x = image(1, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(target(x), source(x), rtol=0, atol=0)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_tied_weights_are_written_once_and_loaded_into_both_names(tmp_path, suffix):
    """Two names of one tensor (safetensors refuses shared memory) are written once, under the first name, as
    safetensors' ``save_model`` does; load_weights (strict) fills the second from it, and the tie holds."""
    source = SharedWeights()
    path = tmp_path / f"tied{suffix}"
    vpe.save_weights(source, path)
    assert set(vpe.weights.read_state_dict(path)) == {"a.weight", "a.bias", "b.bias"}
    target = SharedWeights()
    vpe.load_weights(target, path)
    assert target.b.weight is target.a.weight
    torch.testing.assert_close(target.a.weight, source.a.weight, rtol=0, atol=0)
    torch.testing.assert_close(target.b.bias, source.b.bias, rtol=0, atol=0)
    untied = {k: v.clone() for k, v in source.state_dict().items()}  # one tensor in two places of a dict: copied
    view = {"w": untied["a.weight"], "w_row": untied["a.weight"][0]}
    vpe.save_weights(view, tmp_path / f"view{suffix}")
    torch.testing.assert_close(vpe.weights.read_state_dict(tmp_path / f"view{suffix}")["w_row"], view["w_row"])


def test_load_timm_checkpoint_takes_nonfinite_weights_only_when_asked():
    state = _poisoned_timm("head.bias", INF)
    model = vpe.create_model(VIT, pe="learned", **VIT_KW)
    vpe.load_timm_checkpoint(model, state, allow_nonfinite=True)
    assert torch.isinf(model.head.bias).any()


def test_pe_keywords_that_agree_with_the_model_or_share_one_set_by_the_heads_build():
    """The model's own value, or ``num_heads=1`` (one set of rotations or biases for every head), is accepted."""
    model = vpe.create_model(VIT, pe="rope_mixed", pe_kwargs={"head_dim": 8, "num_heads": 1}, **VIT_KW).eval()
    assert model.blocks[0].attn.rotary.freqs.shape[1] == 1
    with torch.no_grad():
        assert torch.isfinite(model(image(1, 3, 16, 16))).all()
