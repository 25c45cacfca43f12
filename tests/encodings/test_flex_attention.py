"""FlexAttention for the bias family (``attention="flex"``): each encoding's pair form equals its materialised bias
entry for entry, and attention through it equals SDPA with the materialised bias on grids, token subsets (Layout)
and padded mixed batches (MixedLayout), with prefix tokens, extra masks, rotary encodings and in the models; its
gradients to q, k, v and the bias parameters equal SDPA's.

On CPU, PyTorch's FlexAttention runs compiled for inference only (no backward). The compiled tests below reset
dynamo and compile the real kernel; the larger matrices run flex_attention's unfused reference (the same score_mod
semantics, no C++ build per case), and the gradient tests its reference backward (the CUDA kernel's is checked by
tests/cuda)."""
import threading
import warnings

import pytest
import torch
from conftest import DIM, HEAD_DIM, NUM_HEADS, SHAPES, bias_input, build_kwargs, requires

import visionpe as vpe
from visionpe import Grid, flex
from visionpe.grid import Layout, MixedLayout
from visionpe.registry import ENCODINGS

pytestmark = requires("torch", "2.5", "torch.nn.attention.flex_attention")

flex_attention = pytest.importorskip("torch.nn.attention.flex_attention", reason="FlexAttention needs torch >= 2.5")

BIAS_NAMES = [name for name, family in vpe.available().items() if family == "bias"]
PAIR_FORMS = {"alibi", "rel_bias", "swin_bias", "cpb", "bucket_bias", "lookhere", "pape", "pape_ri", "fire"}  # must have one
# (name, extra keywords): every coordinate system and table kind the bias encodings have
VARIANTS = [("alibi", {}), ("alibi", {"coords": "normalized", "normalize_coords": "min"}), ("rel_bias", {}),
            ("swin_bias", {}), ("cpb", {}), ("cpb", {"coords": "normalized"}), ("bucket_bias", {}),
            ("bucket_bias", {"bucket": "piecewise", "method": "cross"}), ("pape", {"num_parabolas": 4}),
            ("pape", {"num_parabolas": 2, "prefix_position": "none", "coords": "normalized"}), ("pape_ri", {}),
            ("fire", {}), ("fire", {"distance": "euclidean", "coords": "normalized"})]
VARIANTS += [(name, {}) for name in BIAS_NAMES if name not in PAIR_FORMS]  # a newly registered bias encoding
VARIANT_IDS = [name + "".join(f"-{v}" for v in kw.values()) for name, kw in VARIANTS]


def build(name: str, ndim: int, **kwargs):
    """A bias encoding for ``SHAPES[ndim]`` with every parameter drawn large enough to count (skips a grid rank the
    encoding is not defined on)."""
    if ndim not in ENCODINGS[name].ndims:
        pytest.skip(f"{name} is defined for {ENCODINGS[name].ndims}D grids")
    pe = vpe.build(name, **{**build_kwargs(name, ndim), **kwargs})
    for p in pe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return pe


def pair_matrix(score, num_tokens: int, batch: int = 1) -> torch.Tensor:
    """A :class:`PairScore` evaluated on every (head, query, key) at once: its ``fn`` reads tables by indexing, so
    broadcast index tensors give the whole ``(heads, T, T)`` map (``(batch, heads, T, T)`` for a per-sample one)."""
    tokens = torch.arange(num_tokens)
    if score.per_sample:
        return score(torch.arange(batch)[:, None, None, None], torch.arange(score.num_heads)[None, :, None, None],
                     tokens[None, None, :, None], tokens[None, None, None, :])
    return score(torch.arange(score.num_heads)[:, None, None], tokens[None, :, None], tokens[None, None, :])


def input_tokens(pe, layout, batch: int = 2):
    """The attention's input tokens ``(batch, T, DIM)`` for a bias that reads them (PaPE), its queries ``(batch, T,
    heads * head_dim)`` for one that reads those (decomposed_rel_pos), else None."""
    return bias_input(pe, layout.num_tokens, batch)


def scores_and_bias(pe, grid):
    """``(pe.score_mod(...), pe(...))`` on a grid, with random input tokens for a bias that reads them."""
    tokens = input_tokens(pe, grid)
    if tokens is None:
        return pe.score_mod(grid), pe(grid)
    return pe.score_mod(grid, tokens), pe(grid, tokens)


def grids_for(name: str, ndim: int) -> list[Grid]:
    """The model grid with and without a prefix token, a smaller grid and (except a fixed Swin window) a larger one
    (rel_bias resamples its table there)."""
    shape = SHAPES[ndim]
    grids = [Grid(shape, prefix=1), Grid(shape), Grid(tuple(max(1, s - 1) for s in shape), prefix=2)]
    if name != "swin_bias":
        grids.append(Grid(tuple(s + 1 for s in shape), prefix=1))
    return grids


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", BIAS_NAMES)
def test_every_pair_form_equals_the_materialised_bias(name, ndim):
    """Every registered bias encoding with a pair form, in eval and in training (one augmentation draw per call,
    the same draw for the same seed)."""
    pe = build(name, ndim)
    if name not in PAIR_FORMS and scores_and_bias(pe, Grid(SHAPES[ndim]))[0] is None:
        pytest.skip(f"{name} has no pair form (attention materialises its bias)")
    for grid in grids_for(name, ndim):
        with torch.no_grad():
            torch.manual_seed(1)
            score, bias = scores_and_bias(pe, grid)
            assert score.num_heads == NUM_HEADS
            pairs = pair_matrix(score, grid.num_tokens, batch=2)
            # a per-sample bias sums C products in another order than its matmul: float32 rounding of its size
            scale = float(bias.abs().max()) if score.per_sample else 1.0
            torch.testing.assert_close(pairs.expand_as(bias), bias, atol=1e-6 * max(scale, 1.0), rtol=1e-6)


@pytest.mark.parametrize("name,kwargs", [("alibi", {"jitter_coords": 1.5, "rescale_coords": 2.0}),
                                         ("cpb", {"jitter_coords": 1.5, "shift_coords": 1.0}),
                                         ("fire", {"jitter_coords": 1.5, "rescale_coords": 2.0})])
def test_pair_form_draws_the_augmentation_as_forward(name, kwargs):
    pe = build(name, 2, **kwargs).train()
    grid = Grid(SHAPES[2], prefix=1)
    torch.manual_seed(3)
    materialised = pe(grid)
    torch.manual_seed(3)
    pairs = pair_matrix(pe.score_mod(grid), grid.num_tokens)
    torch.testing.assert_close(pairs, materialised, atol=1e-6, rtol=1e-6)
    torch.manual_seed(4)
    assert not torch.allclose(pair_matrix(pe.score_mod(grid), grid.num_tokens), materialised)


def test_pair_form_keeps_the_forward_checks():
    with pytest.raises(ValueError, match="larger than window_size"):
        build("swin_bias", 2).score_mod(Grid((5, 5)))
    with pytest.raises(ValueError, match="ndim|axes"):
        build("alibi", 2).score_mod(Grid((2, 2, 2)))


# -- attention through the pair form ---------------------------------------------------------------------------------

def random_keep(batch: int, num_patches: int, num_keep: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(num_patches, generator=g)[:num_keep] for _ in range(batch)])


def layouts(ndim: int, name: str) -> dict:
    """A grid, a token subset (a different unsorted keep set per sample) and a padded mixed batch of 3 grids."""
    shape = SHAPES[ndim]
    grid = Grid(shape, prefix=1)
    small = Grid(tuple(max(1, s - 1) for s in shape), prefix=1)
    other = small if name == "swin_bias" else Grid(tuple(s + 1 for s in shape), prefix=1)
    return {"grid": grid, "layout": Layout(grid, random_keep(2, grid.num_patches, grid.num_patches // 2)),
            "mixed": MixedLayout((small, grid, other, small))}


def qkv(layout, dtype=torch.float32, requires_grad: bool = False):
    batch = len(layout.grids) if isinstance(layout, MixedLayout) else 2
    tensors = torch.randn(3, batch, NUM_HEADS, layout.num_tokens, HEAD_DIM, dtype=dtype).unbind(0)
    return [t.clone().requires_grad_(requires_grad) for t in tensors]


def real_tokens(out: torch.Tensor, layout) -> list[torch.Tensor]:
    """Each sample's real tokens (padded query rows of a mixed batch are ignored by every later step)."""
    if not isinstance(layout, MixedLayout):
        return [out]
    return [out[b, :, :grid.num_tokens] for b, grid in enumerate(layout.grids)]


def assert_same_outputs(flex_out, sdpa_out, layout, atol=1e-5, rtol=1e-5):
    for a, b in zip(real_tokens(flex_out, layout), real_tokens(sdpa_out, layout)):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


@pytest.fixture
def eager_flex(monkeypatch):
    """flex_attention's unfused reference instead of the compiled kernel (same score_mod semantics)."""
    monkeypatch.setattr(flex, "_flex_attention", lambda device_type: flex_attention.flex_attention)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield


@pytest.fixture
def compiled_flex():
    """The real compiled kernel, built afresh (no earlier shape counts against dynamo's recompile limit)."""
    torch._dynamo.reset()
    flex._COMPILED.clear()
    yield
    torch._dynamo.reset()
    flex._COMPILED.clear()


@pytest.mark.parametrize("kind", ["grid", "layout", "mixed"])
@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name,kwargs", VARIANTS, ids=VARIANT_IDS)
def test_flex_equals_sdpa_with_the_materialised_bias(eager_flex, name, kwargs, ndim, kind):
    torch.manual_seed(0)
    pe = build(name, ndim, **kwargs).eval()
    if scores_and_bias(pe, Grid(SHAPES[ndim]))[0] is None:
        pytest.skip(f"{name} has no pair form (attention materialises its bias)")
    layout = layouts(ndim, name)[kind]
    q, k, v = qkv(layout)
    tokens = input_tokens(pe, layout, q.shape[0])
    with torch.no_grad():
        out = vpe.attend(q, k, v, layout, bias=pe, attention="flex", tokens=tokens)
        assert_same_outputs(out, vpe.attend(q, k, v, layout, bias=pe, attention="sdpa", tokens=tokens), layout)


@pytest.mark.parametrize("name,kind", [("alibi", "grid"), ("alibi", "layout"), ("swin_bias", "layout"),
                                       ("cpb", "layout"), ("bucket_bias", "layout"), ("rel_bias", "mixed"),
                                       ("pape_ri", "mixed"), ("pape", "layout")])
def test_compiled_flex_kernel_equals_sdpa(compiled_flex, name, kind):
    """The compiled CPU kernel: every encoding through a token subset (grid indices per sample), a plain grid, and a
    padded mixed batch (stacked tables, BEiT's prefix entries, block mask; PaPE's per-sample features)."""
    torch.manual_seed(0)
    pe = build(name, 2, **({"num_parabolas": 3} if name == "pape" else {})).eval()
    layout = layouts(2, name)[kind]
    q, k, v = qkv(layout)
    tokens = input_tokens(pe, layout, q.shape[0])
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        out = vpe.attend(q, k, v, layout, bias=pe, attention="flex", tokens=tokens)
        assert_same_outputs(out, vpe.attend(q, k, v, layout, bias=pe, attention="sdpa", tokens=tokens), layout)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1  # compiled here, not skipped


def test_compiled_flex_kernel_in_bfloat16(compiled_flex):
    """bf16: flex adds the float32 bias to float32 scores, SDPA adds it rounded to bf16: equal within bf16's
    resolution of the outputs (|out| < 4, bf16 steps 2^-6 there)."""
    torch.manual_seed(0)
    pe = build("rel_bias", 2).eval()
    grid = Grid(SHAPES[2], prefix=1)
    q, k, v = qkv(grid, torch.bfloat16)
    with torch.no_grad():
        out = vpe.attend(q, k, v, grid, bias=pe, attention="flex")
        reference = vpe.attend(q.double(), k.double(), v.double(), grid, bias=pe.double(), attention="sdpa")
        sdpa = vpe.attend(q, k, v, grid, bias=pe, attention="sdpa")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(sdpa.double(), reference, atol=3e-2, rtol=2e-2)


def test_compiled_flex_serves_concurrent_calls(compiled_flex):
    """Threads sharing one compiled kernel and one encoding at two grids get the single-threaded outputs (to float32
    rounding: a CPU kernel called from several threads at once may split its reductions differently; a grid's bias
    read by another thread's call would differ by the bias's scale)."""
    torch.manual_seed(0)
    pe = build("rel_bias", 2).eval()
    cases = [(grid, qkv(grid)) for grid in (Grid((3, 4), prefix=1), Grid((4, 3), prefix=1))]
    with torch.no_grad():
        expected = [vpe.attend(*t, grid, bias=pe, attention="flex") for grid, t in cases]
    errors = []

    def worker(start: int):
        try:
            with torch.no_grad():
                for i in range(12):
                    index = (i + start) % 2
                    grid, tensors = cases[index]
                    out = vpe.attend(*tensors, grid, bias=pe, attention="flex")
                    if not torch.allclose(out, expected[index], atol=1e-6, rtol=1e-6):
                        errors.append(f"grid {grid.shape} differed in thread {start} by "
                                      f"{(out - expected[index]).abs().max().item():.2e}")
        except Exception as err:  # noqa: BLE001 (collected and reported by the test)
            errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


@pytest.mark.parametrize("kind", ["grid", "layout"])
def test_extra_masks_and_scale_read_per_pair(eager_flex, kind):
    """A boolean and a float mask at every broadcast shape (Swin's shift mask is ``(B, 1, T, T)``), with a scale."""
    torch.manual_seed(0)
    pe = build("alibi", 2)
    layout = layouts(2, "alibi")[kind]
    q, k, v = qkv(layout)
    tokens = layout.num_tokens
    for shape in [(tokens, tokens), (2, 1, tokens, tokens), (1, NUM_HEADS, 1, tokens), (2, NUM_HEADS, tokens, 1)]:
        keep = torch.rand(shape) > 0.3
        keep[..., 0] = True  # every row sees a key
        masks = [keep, torch.randn(shape)] if shape[-1] > 1 else [torch.randn(shape)]
        for mask in masks:
            with torch.no_grad():
                out = vpe.attend(q, k, v, layout, bias=pe, attn_mask=mask, scale=0.3, attention="flex")
                ref = vpe.attend(q, k, v, layout, bias=pe, attn_mask=mask, scale=0.3, attention="sdpa")
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["grid", "layout", "mixed"])
@pytest.mark.parametrize("rotary_name", ["rope_axial", "rope_mixed"])
def test_rotary_with_a_flex_bias(eager_flex, rotary_name, kind):
    torch.manual_seed(0)
    rotary = vpe.build(rotary_name, **build_kwargs(rotary_name, 2))
    pe = build("cpb", 2)
    layout = layouts(2, "cpb")[kind]
    q, k, v = qkv(layout)
    with torch.no_grad():
        out = vpe.attend(q, k, v, layout, rotary, pe, attention="flex")
        assert_same_outputs(out, vpe.attend(q, k, v, layout, rotary, pe, attention="sdpa"), layout)


def test_padding_is_invisible_to_flex(eager_flex):
    """Garbage in the padded keys and values of a mixed batch changes no real token."""
    torch.manual_seed(0)
    pe = build("rel_bias", 2)
    layout = layouts(2, "rel_bias")["mixed"]
    q, k, v = qkv(layout)
    with torch.no_grad():
        out = vpe.attend(q, k, v, layout, bias=pe, attention="flex")
        for b, grid in enumerate(layout.grids):
            k[b, :, grid.num_tokens:] = 1e3
            v[b, :, grid.num_tokens:] = -1e3
        assert_same_outputs(vpe.attend(q, k, v, layout, bias=pe, attention="flex"), out, layout)


def test_padding_block_mask_skips_padded_key_blocks():
    """Counts 3, 128, 129 and 300 tokens padded to 300: full blocks below the count, one partial block holding it."""
    layout = MixedLayout(tuple(Grid((n,)) for n in (3, 128, 129, 300)))
    mask = flex.padding_block_mask(layout, "cpu")
    dense = mask.to_dense()[:, 0]  # (B, q blocks, kv blocks): 1 where a block is computed
    assert dense.shape == (4, 3, 3)
    assert dense[:, 0].tolist() == [[1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert mask.full_kv_num_blocks[:, 0, 0].tolist() == [0, 1, 1, 2]
    tokens = torch.arange(300)
    for b, n in enumerate((3, 128, 129, 300)):
        assert torch.equal(mask.mask_mod(torch.tensor(b), 0, tokens, tokens), tokens < n)


# -- gradients ---------------------------------------------------------------------------------------------------------

def reference_with_backward(q, k, v, score_mod=None, block_mask=None, scale=None):
    """flex_attention's unfused reference with its autograd on CPU: the public function's path outside compile,
    minus its refusal of CPU backward (PyTorch's CPU kernel has none; the reference has)."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
    from torch.nn.attention import flex_attention as api

    block_mask = api._create_empty_block_mask(q, k) if block_mask is None else block_mask
    options = api._apply_kernel_options(q, k, v, False, None, None)
    scale = q.shape[-1] ** -0.5 if scale is None else scale

    def call(*args):
        return flex_hop(*args)

    with api.setup_compilation_env() as backend:
        out, _, _ = torch.compile(call, backend=backend, fullgraph=True)(q, k, v, score_mod, block_mask.as_tuple(),
                                                                           scale, options)
    return out


@pytest.mark.parametrize("kind", ["grid", "layout", "mixed"])
@pytest.mark.parametrize("name", ["rel_bias", "swin_bias", "cpb", "bucket_bias", "alibi", "pape_ri"])
def test_gradients_equal_sdpa(monkeypatch, name, kind):
    """Gradients of q, k, v and of every bias parameter (through stacked mixed-batch tables too) equal SDPA's."""
    monkeypatch.setattr(flex, "_flex_attention", lambda device_type: reference_with_backward)
    torch.manual_seed(0)
    pe = build(name, 2).train()
    layout = layouts(2, name)[kind]
    q, k, v = qkv(layout, requires_grad=True)
    tokens = input_tokens(pe, layout, q.shape[0])
    leaves = [q, k, v, *pe.parameters()]
    out = flex.flex_attend(q, k, v, layout, flex.pair_scores(layout, pe, tokens), None, None)
    weights = torch.randn_like(out)
    if isinstance(layout, MixedLayout):  # the loss reads real tokens only
        weights = weights * layout.key_mask()[:, None, :, None]
    grads = torch.autograd.grad((out * weights).sum(), leaves)
    reference = torch.autograd.grad((vpe.attend(q, k, v, layout, bias=pe, attention="sdpa", tokens=tokens)
                                     * weights).sum(), leaves)
    assert len(grads) == 3 + len(list(pe.parameters()))
    for got, expected in zip(grads, reference):
        assert expected.abs().sum() > 0
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-4)


def test_cpu_training_takes_sdpa_under_auto_and_refuses_flex():
    """CPU FlexAttention has no backward: "auto" gives the SDPA gradients; under an explicit "flex" the forward runs
    (the flex values) and its backward is an error, also when only the bias table or a rotary encoding's frequencies
    need a gradient (never a silently missing one)."""
    torch.manual_seed(0)
    pe = build("rel_bias", 2)
    grid = Grid(SHAPES[2], prefix=1)
    q, k, v = qkv(grid, requires_grad=True)
    vpe.attend(q, k, v, grid, bias=pe, attention="auto").sum().backward()
    assert pe.relative_position_bias_table.grad.abs().sum() > 0
    rotary = vpe.build("rope_mixed", **build_kwargs("rope_mixed", 2))  # learned frequencies: rotated q, k need grad
    for args, needs in (((q, k, v), "q, k, v"), ((q.detach(), k.detach(), v.detach()), "the bias table")):
        out = vpe.attend(*args, grid, bias=pe, attention="flex")
        with torch.no_grad():
            expected = vpe.attend(*args, grid, bias=pe, attention="flex")
        assert out.requires_grad, needs
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        with pytest.raises(ValueError, match="attention='flex' cannot train on CPU"):
            out.sum().backward()
    pe.requires_grad_(False)
    out = vpe.attend(q.detach(), k.detach(), v.detach(), grid, rotary, pe, attention="flex")
    with pytest.raises(ValueError, match="attention='flex' cannot train on CPU"):
        out.sum().backward()


def test_an_eval_model_with_flex_runs_on_cpu_without_no_grad():
    """Issue 31: an eval-mode model built with attention="flex" is called without torch.no_grad(): FlexAttention's
    forward runs (the values under no_grad, close to SDPA's); only a backward is refused."""
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="alibi", attention="flex", img_size=16, patch_size=4,
                             embed_dim=16, depth=1, num_heads=2, num_classes=3).eval()
    x = torch.randn(2, 3, 16, 16)
    out = model(x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
        sdpa = vpe.set_attention(model, "sdpa")(x)
    torch.testing.assert_close(out.detach(), sdpa, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="attention='flex' cannot train on CPU"):
        out.sum().backward()


# -- choosing it -------------------------------------------------------------------------------------------------------

def test_auto_choice_per_device_and_fallbacks(monkeypatch):
    """"auto" reads AUTO_ATTENTION for the device; a call without a bias, with a bias that has no pair form, or with
    attention dropout takes SDPA whatever the choice."""
    from visionpe import attention

    calls = []
    monkeypatch.setattr(attention, "flex_attend", lambda *args: calls.append(args) or args[0])
    grid = Grid(SHAPES[2], prefix=1)
    q, k, v = qkv(grid)
    pe = build("alibi", 2)
    with torch.no_grad():
        vpe.attend(q, k, v, grid, bias=pe, attention="auto")
        assert not calls  # AUTO_ATTENTION["cpu"] is SDPA
        monkeypatch.setitem(attention.AUTO_ATTENTION, "cpu", "flex")
        vpe.attend(q, k, v, grid, bias=pe, attention="auto")
        assert len(calls) == 1
        vpe.attend(q, k, v, grid, attention="flex")
        vpe.attend(q, k, v, grid, bias=pe, attention="flex", dropout_p=0.1)
        monkeypatch.setattr(type(pe), "score_mod", lambda self, grid: None)
        vpe.attend(q, k, v, grid, bias=pe, attention="flex")
    assert len(calls) == 1


def test_attention_choice_is_checked_and_reaches_every_block():
    q, k, v = qkv(Grid((2, 2)))
    with pytest.raises(ValueError, match="attention='fast' is not supported; allowed values: 'auto', 'sdpa', 'flex'"):
        vpe.attend(q, k, v, Grid((2, 2)), attention="fast")
    with pytest.raises(ValueError, match="attention="):
        vpe.Attention(8, 2, attention="triton")
    with pytest.raises(ValueError, match="no visionpe attention module"):
        vpe.set_attention(torch.nn.Linear(2, 2), "flex")
    with pytest.raises(ValueError, match="attention="):
        vpe.create_model("vit_tiny_patch16_224", pe="alibi", attention="xformers", img_size=16, patch_size=4)
    vit = vpe.create_model("vit_tiny_patch16_224", pe="alibi", attention="flex", img_size=16, patch_size=4, depth=2,
                           embed_dim=16, num_heads=2)
    swin = vpe.create_model("swin_tiny_patch4_window7_224", pe="swin_bias", attention="flex", **SWIN)
    for model, count in ((vit, 2), (swin, 2)):
        choices = [m.attention for m in model.modules() if hasattr(type(m), "attention")]
        assert choices == ["flex"] * count
    assert {m.attention for m in vpe.set_attention(swin, "sdpa").modules() if hasattr(type(m), "attention")} == {"sdpa"}


# -- in the models -----------------------------------------------------------------------------------------------------

VIT = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=3)
SWIN = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2), num_classes=3)


def flex_and_sdpa(model, run):
    """``run(model)`` with every attention on flex, then on SDPA, under no_grad."""
    with torch.no_grad():
        out = run(vpe.set_attention(model, "flex"))
        return out, run(vpe.set_attention(model, "sdpa"))


def randomise_positions(model):
    for enc in sum(vpe.encodings_of(model).values(), []):
        for p in enc.parameters():
            torch.nn.init.normal_(p, std=0.5)
    return model


@pytest.mark.parametrize("pe", ["rel_bias", "cpb", "alibi", "bucket_bias", "rope_axial+alibi", "rope_mixed+rel_bias",
                                "pape_ri", "harope+pape_ri"])
def test_vit_forward_masked_and_mixed_batches(eager_flex, pe):
    torch.manual_seed(0)
    model = randomise_positions(vpe.create_model("vit_tiny_patch16_224", pe=pe, **VIT).eval())
    x = torch.randn(2, 3, 16, 20)
    torch.testing.assert_close(*flex_and_sdpa(model, lambda m: m(x)), atol=1e-5, rtol=1e-5)
    keep = random_keep(2, 20, 7)
    torch.testing.assert_close(*flex_and_sdpa(model, lambda m: m.forward_masked(x, keep=keep)[0]),
                               atol=1e-5, rtol=1e-5)
    images = [torch.randn(3, 16, 24), torch.randn(3, 24, 16), torch.randn(3, 16, 16)]
    torch.testing.assert_close(*flex_and_sdpa(model, lambda m: m.forward_batch(images)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,pe", [("swin_tiny_patch4_window7_224", "swin_bias"),
                                     ("swin_tiny_patch4_window7_224", "bucket_bias"),
                                     ("swinv2_tiny_window8_256", "cpb"), ("swin_tiny_patch4_window7_224", "pape_ri")])
def test_swin_shifted_windows(eager_flex, name, pe):
    """Shifted windows add Swin's shift mask through the pair function; Swin-V2 passes its cosine scale."""
    torch.manual_seed(0)
    model = randomise_positions(vpe.create_model(name, pe=pe, **SWIN).eval())
    x = torch.randn(2, 3, 32, 48)
    torch.testing.assert_close(*flex_and_sdpa(model, lambda m: m(x)), atol=1e-5, rtol=1e-5)


def test_video_models(eager_flex):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    tubelet = randomise_positions(vpe.create_video_model(
        "vit_tiny_patch16_224", pe="alibi", num_frames=4, img_size=16, tubelet_size=(2, 4, 4), embed_dim=24,
        depth=1, num_heads=2, num_classes=3).eval())
    clip = torch.randn(1, 3, 4, 16, 16)
    torch.testing.assert_close(*flex_and_sdpa(tubelet, lambda m: m(clip)), atol=1e-5, rtol=1e-5)
    swin3d = torchvision.models.video.swin_transformer.SwinTransformer3d(
        patch_size=[2, 4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[2, 4, 4], num_classes=3)
    swin3d = randomise_positions(vpe.apply(swin3d, pe="swin_bias").eval())
    clip = torch.randn(1, 3, 4, 32, 40)  # padded, shifted windows
    torch.testing.assert_close(*flex_and_sdpa(swin3d, lambda m: m(clip)), atol=1e-5, rtol=1e-5)


def test_model_with_flex_traces_as_one_graph():
    """torch.compile(fullgraph=True) of a flex model (inference): flex_attention is traced into the model's graph."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = randomise_positions(vpe.create_model("vit_tiny_patch16_224", pe="rel_bias", attention="flex",
                                                 **VIT).eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True, backend="eager")(x)
        torch.testing.assert_close(compiled, vpe.set_attention(model, "sdpa")(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
