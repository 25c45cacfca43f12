"""STRING, ComRoPE and LieRE everywhere the rotary encodings go: timm ViT and Swin windows, video, mixed-size
batches, torch.compile(fullgraph=True), concurrent forwards, the optimizer's no-decay set, visualization and bad
input."""
from __future__ import annotations

import pytest
import timm.optim
import torch
from conftest import compiled_matches_eager_and_trains, requires, run_concurrently

import visionpe as vpe
from visionpe import Grid, viz
from visionpe.backbones.video import create_video_model

VIT = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=3)
SWIN = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2), num_classes=3)
VIDEO = dict(num_frames=4, img_size=16, tubelet_size=(2, 4, 4), embed_dim=24, num_heads=2, depth=1, num_classes=3)
CASES = [("string", {}), ("string", {"variant": "circulant"}), ("comrope", {}), ("comrope", {"variant": "ap"}),
         ("liere", {}), ("string", {"coords": "normalized"}), ("comrope", {"coords": "index"})]
IDS = [f"{n}-{'-'.join(map(str, kw.values())) or 'default'}" for n, kw in CASES]
EACH = [0, 2, 4]  # one case per encoding where the variants run the same code in a backbone


def cases(index):
    return pytest.mark.parametrize("pe,kw", [CASES[i] for i in index], ids=[IDS[i] for i in index])


def perturbed(model: torch.nn.Module, std: float = 0.5) -> torch.nn.Module:
    """Fresh STRING is RoPE-Mixed (S = 0): random generators make every parameter count."""
    for enc in vpe.encodings_of(model)["rotary"]:
        with torch.no_grad():
            for p in enc.parameters():
                p.normal_(0, std)
    return model


@pytest.mark.parametrize("pe,kw", CASES, ids=IDS)
def test_vit_any_size_trains_and_excludes_generators_from_weight_decay(pe, kw):
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIT)
    rotary = vpe.encodings_of(model)["rotary"]
    assert len(rotary) == 2 and rotary[0] is not rotary[1]  # learned: one per block
    coords = kw.get("coords", "index" if pe == "string" else "normalized")  # each paper's coordinates by default
    assert rotary[0].coordinates.coords == coords and rotary[0].ref_shape == (4, 4)
    assert rotary[0].scaling == ("pi" if coords == "index" else "none")  # in a model: index coordinates interpolate
    for size in ((16, 16), (24, 16), (32, 32)):
        out = model(torch.randn(2, 3, *size))
        assert out.shape == (2, 3) and torch.isfinite(out).all()
        out.sum().backward()
    names = dict(model.named_parameters())
    positional = {f"blocks.{b}.attn.rotary.{n}" for b in range(2) for n, _ in rotary[b].named_parameters()}
    assert positional and positional <= model.no_weight_decay()
    for name in positional:
        assert names[name].grad is not None and names[name].grad.abs().sum() > 0, name
    optimizer = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert all(id(names[n]) in no_decay for n in positional)


@cases(EACH)
def test_swin_windows_any_size(pe, kw):
    torch.manual_seed(0)
    model = vpe.create_model("swin_tiny_patch4_window7_224", pe=pe, pe_kwargs=kw, **SWIN)
    assert vpe.encodings_of(model)["rotary"][0].ndim == 2
    for size in ((32, 32), (48, 32)):
        out = model(torch.randn(2, 3, *size))
        assert out.shape == (2, 3) and torch.isfinite(out).all()
        out.sum().backward()


@cases(EACH)
def test_video_clips_of_any_length(pe, kw):
    model = create_video_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIDEO)
    assert all(enc.ndim == 3 for enc in vpe.encodings_of(model)["rotary"])
    for clip in [(4, 16, 16), (8, 24, 16)]:
        out = model(torch.randn(1, 3, *clip))
        assert out.shape == (1, 3) and torch.isfinite(out).all()
        out.sum().backward()


def test_video_string_takes_the_backbones_sections_when_pairs_do_not_split_in_three():
    """head_dim 16: 8 rotation pairs, (2, 3, 3) per (T, H, W) as video_sections gives rope_*; STRING's initial
    frequency groups follow them."""
    model = create_video_model("vit_tiny_patch16_224", pe="string", **{**VIDEO, "embed_dim": 32})
    rotary = vpe.encodings_of(model)["rotary"][0]
    assert rotary.sections == (2, 3, 3) and rotary.ndim == 3
    assert model(torch.randn(1, 3, 4, 16, 16)).shape == (1, 3)


@cases([0, 2, 4, 6])
def test_each_image_of_a_mixed_batch_gets_its_own_positions(pe, kw):
    torch.manual_seed(0)
    model = perturbed(vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIT)).eval()
    images = [torch.randn(3, 16, 24), torch.randn(3, 24, 16), torch.randn(3, 16, 16), torch.randn(3, 16, 24)]
    with torch.no_grad():
        together = model.forward_batch(images)
        alone = torch.cat([model(image[None]) for image in images])
    torch.testing.assert_close(together, alone, atol=2e-5, rtol=2e-5)


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
@cases(EACH)
def test_fullgraph_compile_matches_eager_and_trains(pe, kw):
    """dynamo traces the matrix exponentials, the Cayley solve and the block products as one graph (no graph break),
    in evaluation and training."""
    torch.manual_seed(0)
    model = perturbed(vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIT))
    assert not compiled_matches_eager_and_trains(model, torch.randn(2, 3, 16, 20), atol=1e-5, rtol=1e-5)

@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_inductor_compiles_the_table_builders_and_their_gradients():
    """Inductor (not only dynamo's tracing): the exponentials and the block products compile to the eager values in the inference and the training graph, gradients included (matrix_exp needs a contiguous input,
    which inductor's inference graph did not give an einsum's output even after .contiguous())."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    grid = Grid((3, 4), prefix=1)
    encodings = [vpe.build(name, head_dim=12, num_heads=2, **kw) for name, kw in (CASES[2], CASES[4])]
    q, k = torch.randn(2, 2, 2, 13, 12).unbind(0)

    def scores_of_all(q, k):
        return torch.stack([torch.einsum("bhid,bhjd->bhij", *pe(q, k, grid)) for pe in encodings])

    compiled = torch.compile(scores_of_all, fullgraph=True)
    with torch.no_grad():  # the inference graph (evaluation)
        torch.testing.assert_close(compiled(q, k), scores_of_all(q, k), atol=1e-5, rtol=1e-5)
    out = compiled(q, k)  # the training graph
    torch.testing.assert_close(out, scores_of_all(q, k), atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    compiled_grads = [p.grad.clone() for pe in encodings for p in pe.parameters()]
    for pe in encodings:
        pe.zero_grad()
    (scores_of_all(q, k) * weights).sum().backward()
    for got, want in zip(compiled_grads, [p.grad for pe in encodings for p in pe.parameters()]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@cases(EACH)
def test_concurrent_forwards_at_different_sizes_equal_single_threaded(one_thread_kernels, pe, kw):
    torch.manual_seed(0)
    model = perturbed(vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIT)).eval()
    inputs = [torch.randn(2, 3, *size) for size in ((16, 24), (24, 16), (16, 16), (32, 20))]
    errors = run_concurrently(model, inputs, iterations=12)
    assert not errors, errors[:3]


# -- visualization ---------------------------------------------------------------------------------------------------
KINDS = {"string": viz.KINDS, "comrope": viz.KINDS, "liere": tuple(k for k in viz.KINDS if k != "freqs")}
RENDERED = [(2, i) for i in range(5)] + [(3, 1), (3, 3), (3, 4)]


@pytest.mark.parametrize("ndim,case", RENDERED, ids=[f"{IDS[i]}-{ndim}d" for ndim, i in RENDERED])
def test_every_kind_that_applies_renders_a_png(tmp_path, ndim, case):
    pe, kw = CASES[case]
    shape = {2: (4, 4), 3: (2, 3, 3)}[ndim]
    context = vpe.ModelContext(shape, dim=48, num_heads=2, head_dim=24)
    enc = vpe.registry.ENCODINGS[pe].for_model(context, **kw)
    for kind in KINDS[pe]:
        out = viz.save(viz.render(enc, kind, shape), tmp_path / f"{kind}.png", dpi=40)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000, kind


def test_liere_has_no_frequency_vectors():
    enc = vpe.build("liere", head_dim=12, num_heads=2)
    with pytest.raises(ValueError, match="LieRE has no frequency vectors"):
        viz.render(enc, "freqs", (3, 3))


def test_heatmap_channels_of_pairs_are_cos_then_sin_and_blocks_their_first_columns():
    rope = vpe.build("rope_mixed", head_dim=12, num_heads=2)
    cis = rope.cis(Grid((3, 4)))[1]
    channels, label = viz.encoding_channels(rope, (3, 4), head=1)
    torch.testing.assert_close(channels, torch.cat([cis.real, cis.imag], dim=-1))
    assert label == "rotation pair (cos | sin)"
    comrope = vpe.build("comrope", head_dim=12, num_heads=2, block_size=4)
    channels, label = viz.encoding_channels(comrope, (3, 4), head=1)
    blocks = comrope.rotation_blocks((3, 4))[1]  # (N, 3 blocks, 4, 4)
    assert channels.shape == (12, 12) and "4x4" in label
    torch.testing.assert_close(channels[:, 3:6], blocks[:, :, 1, 0])  # row 1 of every block's first column


def test_frequency_vectors_of_comrope_are_its_blocks_eigenfrequencies():
    """exp(t (P - P^T)) turns b/2 planes at the eigenfrequencies; LD scales them per axis, AP puts them on one axis."""
    for variant in ("ld", "ap"):
        pe = vpe.build("comrope", head_dim=12, num_heads=2, variant=variant, block_size=4)
        freqs = viz.rope_frequencies(pe)  # (heads, planes, ndim) xy
        skew = (pe.bases - pe.bases.transpose(-1, -2)).detach().double()
        omega = torch.linalg.eigvals(skew).imag.abs().sort(-1, descending=True).values[..., ::2]  # (heads, m, 2)
        weights = pe.scales.detach() if variant == "ld" else pe.partition
        expected = (weights.double()[:, None, :, None] * omega[None]).flatten(-2).flip(0)  # (ndim, heads, planes)
        torch.testing.assert_close(freqs, expected.permute(1, 2, 0).float(), atol=1e-5, rtol=1e-5)
    string = vpe.build("string", head_dim=12, num_heads=2)
    torch.testing.assert_close(viz.rope_frequencies(string), string.freqs.detach().permute(1, 2, 0))
    assert viz.axial_reference(string).shape == (6, 2) and viz.axial_reference(pe) is None


# -- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,kw,words", [
    ("string", dict(variant="dense"), ["variant='dense'", "'cayley'", "'circulant'"]),
    ("string", dict(head_dim=10), ["head_dim=10", "divisible by 4"]),
    ("string", dict(scaling="ntk", ref_shape=(3, 3)), ["scaling='ntk'", "'none'", "'pi'"]),
    ("string", dict(scaling="pi"), ["scaling='pi' needs ref_shape"]),
    ("comrope", dict(variant="xy"), ["variant='xy'", "'ap'", "'ld'"]),
    ("comrope", dict(block_size=5), ["head_dim=12", "divisible by 5", "block_size"]),
    ("comrope", dict(block_size=1), ["block_size must be >= 2"]),
    ("comrope", dict(init_std=-1.0), ["init_std", ">= 0"]),
    ("liere", dict(block_size=0), ["block_size must be a positive integer"]),
    ("liere", dict(block_size=8), ["divisible by 8"]),
    ("liere", dict(coords="normalized", scaling="pi", ref_shape=(3, 3)), ["coords='normalized'"]),
    ("liere", dict(ndim=4), ["ndim=4", "1, 2, 3"]),
    ("liere", dict(generator=3), ["generator must be a torch.Generator"]),
])
def test_bad_keywords_are_clear_errors(name, kw, words):
    with pytest.raises(ValueError) as info:
        vpe.build(name, **{"head_dim": 12, "num_heads": 2, **kw})
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bad_inputs_at_call_time_are_clear_errors():
    pe = vpe.build("comrope", head_dim=12, num_heads=2)
    q = torch.randn(1, 2, 13, 12)
    with pytest.raises(ValueError, match="grid has 3 axes"):
        pe(q, q, Grid((1, 3, 4), prefix=1))
    with pytest.raises(ValueError, match=r"expected \(batch, heads, 13, 12\)"):
        pe(q[..., :8], q[..., :8], Grid((3, 4), prefix=1))
    with pytest.raises(ValueError, match="built with num_heads=2"):
        pe(torch.randn(1, 3, 13, 12), torch.randn(1, 3, 13, 12), Grid((3, 4), prefix=1))
    with pytest.raises(ValueError, match="floating-point"):
        pe(q.long(), q.long(), Grid((3, 4), prefix=1))
    streaming = vpe.build("string", head_dim=12, coords="index", scaling="pi", ref_shape=(3, 4))
    with pytest.raises(ValueError, match="scaling='none'"):
        streaming.rotations(Grid((3, 8), offset=(0, 4)))
