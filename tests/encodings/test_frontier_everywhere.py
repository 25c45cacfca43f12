"""The new layouts and encodings everywhere the others go: timm ViT/DeiT, Swin windows, video ViT and Video Swin,
token subsets, mixed-size batches, torch.compile(fullgraph=True), concurrent forwards, no_weight_decay, coordinate
systems and augmentation, and every visualization kind."""
import pytest
import torch
from conftest import requires, run_concurrently
from torchvision.models.video.swin_transformer import SwinTransformer3d

import visionpe as vpe
from visionpe import Grid, viz
from visionpe.grid import Layout

VIT = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=3)
SWIN = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2), num_classes=3)
VIDEO = dict(num_frames=4, img_size=16, tubelet_size=(2, 4, 4), embed_dim=24, num_heads=2, depth=1, num_classes=3)
VIDEO_SWIN = dict(patch_size=[2, 4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[2, 4, 4],
                  num_classes=3)

# (pe, pe_kwargs) in 2D models (2 heads)
IMAGE = [("rope_axial", {"directions": "golden"}), ("rope_mixed", {"directions": "golden"}),
         ("rope_axial", {"rotate_fraction": 0.5}), ("rope_mixed", {"rotate_fraction": 0.5}),
         ("rope_axial", {"head_axes": ("x", "")}), ("rope_mixed", {"head_axes": ("yx", "y")}),
         ("lookhere", {}), ("fire", {}), ("fire", {"distance": "euclidean"}),
         ("rope_mixed+lookhere", {"directions": "golden"}), ("rope_axial+fire", {"rotate_fraction": 0.75}),
         ("spiral_rope", {}), ("spiral_rope", {"num_directions": 6}), ("harope", {}), ("vit5_rope", {}),
         ("pape", {"num_parabolas": 4}), ("pape_ri", {}), ("harope+pape_ri", {}),
         ("learned+vit5_rope+pape", {"num_parabolas": 2})]
# in 3D models
CLIPS = [("videorope", {}), ("rope_axial", {"rotate_fraction": 0.5}), ("rope_mixed", {"head_axes": ("t", "tyx")}),
         ("fire", {}), ("videorope+fire", {"temporal_spacing": 1.0}), ("riflex", {}), ("harope", {}),
         ("pape_ri", {}), ("riflex+pape", {"num_parabolas": 2})]
IDS = [f"{pe}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for pe, kw in IMAGE]
CLIP_IDS = [f"{pe}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for pe, kw in CLIPS]


def randomise(model):
    """Fresh tables are ~0: make every position parameter count."""
    for enc in sum(vpe.encodings_of(model).values(), []):
        for p in enc.parameters():
            torch.nn.init.normal_(p, std=0.5)
    return model


def position_parameters(model):
    return [p for enc in sum(vpe.encodings_of(model).values(), []) for p in enc.parameters()]


@pytest.mark.parametrize("pe,kw", IMAGE, ids=IDS)
def test_vit_trains_and_runs_at_other_sizes(pe, kw):
    torch.manual_seed(0)
    model = vpe.create_model("deit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIT)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    assert all(p.grad is not None for p in position_parameters(model))
    names = model.no_weight_decay()
    for prefix, module in model.named_modules():
        if isinstance(module, vpe.Encoding):
            assert {f"{prefix}.{n}" for n, _ in module.named_parameters()} <= names
    model.eval()
    with torch.no_grad():
        for size in [(16, 16), (32, 24), (64, 64)]:
            out = model(torch.randn(1, 3, *size))
            assert out.shape == (1, 3) and torch.isfinite(out).all()


@pytest.mark.parametrize("pe,kw", IMAGE, ids=IDS)
def test_kept_tokens_and_mixed_batches_get_their_own_positions(pe, kw):
    torch.manual_seed(0)
    model = randomise(vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIT)).eval()
    images = [torch.randn(3, 16, 24), torch.randn(3, 24, 16), torch.randn(3, 16, 16)]
    with torch.no_grad():
        together = model.forward_batch(images)
        alone = torch.cat([model(image[None]) for image in images])
        torch.testing.assert_close(together, alone, atol=2e-5, rtol=2e-5)
        x = torch.randn(2, 3, 16, 16)
        everything = torch.arange(16).expand(2, -1)
        torch.testing.assert_close(model.forward_masked(x, keep=everything)[0], model.forward_features(x))


def rotary_or_bias(pe_name, kw, shape):
    context = vpe.ModelContext(shape, 24, 2, 12)
    pe = vpe.registry.ENCODINGS[pe_name].for_model(context, **kw)
    for p in pe.parameters():
        torch.nn.init.normal_(p)
    return (pe, None) if pe.family == "rotary" else (None, pe)


SUBSETS = [(pe, kw, (3, 4)) for pe, kw in IMAGE if "+" not in pe] + \
          [(pe, kw, (2, 3, 3)) for pe, kw in CLIPS if "+" not in pe]


@pytest.mark.parametrize("pe,kw,shape", SUBSETS, ids=[f"{p}-{list(k)}-{len(s)}d" for p, k, s in SUBSETS])
def test_layout_subsets_attend_as_the_full_grid_restricted(pe, kw, shape):
    """Each kept token keeps its position: attention over a subset equals the full grid with keys limited to it."""
    torch.manual_seed(0)
    rotary, bias = rotary_or_bias(pe, kw, shape)
    grid = Grid(shape, prefix=1)
    g = torch.Generator().manual_seed(0)
    keep = torch.stack([torch.randperm(grid.num_patches, generator=g)[:5] for _ in range(3)])
    layout = Layout(grid, keep)
    q, k, v = torch.randn(3, 3, 2, grid.num_tokens, 12).unbind(0)
    x = torch.randn(3, grid.num_tokens, 24)  # the attention's input, read by a token-reading bias (PaPE)
    index = layout.token_index()
    gather = lambda t: t.gather(2, index[:, None, :, None].expand(-1, 2, -1, 12))  # noqa: E731
    out = vpe.attend(gather(q), gather(k), gather(v), layout, rotary, bias,
                     tokens=x.gather(1, index[..., None].expand(-1, -1, 24)))
    for b in range(3):
        allowed = torch.zeros(grid.num_tokens, dtype=torch.bool)
        allowed[index[b]] = True
        full = vpe.attend(q[b:b + 1], k[b:b + 1], v[b:b + 1], grid, rotary, bias,
                          attn_mask=allowed[None].expand(grid.num_tokens, -1), tokens=x[b:b + 1])
        torch.testing.assert_close(out[b], full[0][:, index[b]], atol=1e-5, rtol=1e-5)


SWIN_CASES = [("rope_axial", {"directions": "golden"}), ("rope_mixed", {"rotate_fraction": 0.5}),
              ("rope_axial", {"head_axes": ("x", "y")}), ("lookhere", {}), ("fire", {}), ("spiral_rope", {}),
              ("harope", {}), ("pape", {"num_parabolas": 4}), ("pape_ri", {})]


@pytest.mark.parametrize("pe,kw", SWIN_CASES, ids=[f"{p}-{list(k)}" for p, k in SWIN_CASES])
def test_swin_windows(pe, kw):
    torch.manual_seed(0)
    model = vpe.create_model("swin_tiny_patch4_window7_224", pe=pe, pe_kwargs=kw, **SWIN)
    model(torch.randn(1, 3, 32, 32)).sum().backward()
    with torch.no_grad():
        assert torch.isfinite(model.eval()(torch.randn(1, 3, 48, 32))).all()


@pytest.mark.parametrize("pe,kw", CLIPS, ids=CLIP_IDS)
def test_video_models(pe, kw):
    torch.manual_seed(0)
    model = vpe.create_video_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIDEO)
    for clip in [(4, 16, 16), (8, 24, 16)]:
        out = model(torch.randn(1, 3, *clip))
        assert out.shape == (1, 3) and torch.isfinite(out).all()
        out.sum().backward()
    swin = vpe.apply(SwinTransformer3d(**VIDEO_SWIN), pe, **kw)
    assert torch.isfinite(swin(torch.randn(1, 3, 4, 32, 32))).all()


@pytest.mark.parametrize("pe", ["videorope", "rope_axial", "string", "comrope", "liere"])
def test_video_rotation_tables_are_built_once_then_served_from_the_cache(pe):
    """In evaluation a video model's rotary tables are built in the first forward at a clip size and only read in
    the next one (docs/reports/PERFORMANCE.md's video section)."""
    from visionpe.bench.speed.scale import TableCensus
    model = vpe.create_video_model("vit_tiny_patch16_224", pe=pe, **VIDEO).eval()
    census, clip = TableCensus(), torch.randn(1, 3, 4, 16, 16)
    with census.installed({pe: model}), torch.no_grad():
        for _ in range(2):
            census.run(pe, model, clip)
    first, second = census.forwards[pe]
    assert first.built == len(first.tables) >= 1 and second.built == 0 and second.tables.keys() == first.tables.keys()


def test_video_needs_and_image_refuses_what_is_not_defined_there():
    with pytest.raises(ValueError, match="lookhere is defined on 2D grids"):
        vpe.create_video_model("vit_tiny_patch16_224", pe="lookhere", **VIDEO)
    with pytest.raises(ValueError, match="videorope is defined on .T, H, W. grids"):
        vpe.create_model("vit_tiny_patch16_224", pe="videorope", **VIT)
    with pytest.raises(ValueError, match="spiral_rope turns frequency directions in the image plane"):
        vpe.create_video_model("vit_tiny_patch16_224", pe="spiral_rope", **VIDEO)
    with pytest.raises(ValueError, match="riflex is defined on .T, H, W. grids"):
        vpe.create_model("vit_tiny_patch16_224", pe="riflex", **VIT)


COMPILED = [("vit_tiny_patch16_224", pe, kw, VIT, (16, 20)) for pe, kw in IMAGE[:6:2] + IMAGE[6:8]]
COMPILED += [("swin_tiny_patch4_window7_224", "lookhere", {}, SWIN, (32, 48))]
COMPILED += [("vit_tiny_patch16_224", pe, kw, VIT, (16, 20)) for pe, kw in [("harope", {}),
                                                                            ("pape", {"num_parabolas": 4})]]
COMPILED += [("swin_tiny_patch4_window7_224", "pape_ri", {}, SWIN, (32, 48))]


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
@pytest.mark.parametrize("name,pe,kw,cfg,size", COMPILED, ids=[f"{c[0][:4]}-{c[1]}-{list(c[2])}" for c in COMPILED])
def test_fullgraph_compile_matches_eager(name, pe, kw, cfg, size):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = randomise(vpe.create_model(name, pe=pe, pe_kwargs=kw, **cfg)).eval()
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # any graph break raises
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
@pytest.mark.parametrize("pe,kw", [("fire", {}), ("rope_mixed", {"rotate_fraction": 0.5, "directions": "golden"}),
                                   ("rope_mixed", {"head_axes": ("x", "yx")}), ("harope", {}),
                                   ("pape", {"num_parabolas": 4})])
def test_fullgraph_compile_trains(pe, kw):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, global_pool="avg", **VIT).train()
    torch.compile(model, fullgraph=True, backend="eager")(torch.randn(2, 3, 16, 16)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in position_parameters(model))


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_compiled_video_models():
    torch._dynamo.reset()
    for pe in ("videorope", "fire", "riflex"):
        model = randomise(vpe.create_video_model("vit_tiny_patch16_224", pe=pe, **VIDEO)).eval()
        x = torch.randn(1, 3, 4, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="eager")(x), model(x),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pe,kw", [("lookhere", {}), ("fire", {}), ("rope_axial", {"directions": "golden"}),
                                   ("rope_mixed", {"head_axes": ("x", "")}), ("harope", {}), ("pape_ri", {})])
def test_concurrent_forwards_equal_single_threaded(one_thread_kernels, pe, kw):
    torch.manual_seed(0)
    model = randomise(vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kw, **VIT)).eval()
    inputs = [torch.randn(1, 3, *size) for size in [(16, 24), (24, 16), (16, 16)]]
    errors = run_concurrently(model, inputs, iterations=12, threads=3)
    assert not errors, errors[:3]


@pytest.mark.parametrize("pe,kw", [("rope_axial", {"directions": "golden"}), ("rope_mixed", {"rotate_fraction": 0.5}),
                                   ("rope_axial", {"head_axes": ("x", "y")}), ("lookhere", {}), ("fire", {}),
                                   ("spiral_rope", {}), ("harope", {}), ("vit5_rope", {}),
                                   ("pape", {"num_parabolas": 4}), ("pape_ri", {})])
def test_coordinate_systems_and_augmentation(pe, kw):
    """coords='normalized' and train-time augmentation run through a model; augmentation draws differ per call in
    training and are off in evaluation."""
    torch.manual_seed(0)
    model = randomise(vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs={**kw, "coords": "normalized"}, **VIT))
    assert torch.isfinite(model.eval()(torch.randn(1, 3, 24, 16))).all()
    augmented = randomise(vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs={**kw, "rescale_coords": 2.0,
                                                                                     "shift_coords": 1.0}, **VIT))
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert not torch.equal(augmented.train()(x), augmented(x))
        assert torch.equal(augmented.eval()(x), augmented(x))


VIZ = [("rope_axial", {"directions": "golden"}, (4, 4)), ("rope_mixed", {"rotate_fraction": 0.5}, (4, 4)),
       ("rope_axial", {"head_axes": ("x", "")}, (4, 4)), ("videorope", {}, (2, 3, 3)), ("lookhere", {}, (4, 4)),
       ("fire", {}, (4, 4)), ("fire", {}, (2, 3, 3)), ("spiral_rope", {}, (4, 4)), ("harope", {}, (2, 3, 3)),
       ("vit5_rope", {}, (4, 4)), ("riflex", {}, (2, 3, 3)), ("pape", {"num_parabolas": 4}, (4, 4)),
       ("pape_ri", {}, (2, 3, 3))]


@pytest.mark.parametrize("pe,kw,shape", VIZ, ids=[f"{p}-{list(k)}-{len(s)}d" for p, k, s in VIZ])
def test_every_visualization_kind_that_applies(tmp_path, pe, kw, shape):
    context = vpe.ModelContext(shape, 48, 2, 24)
    encoding = vpe.registry.ENCODINGS[pe].for_model(context, **kw)
    kinds = viz.KINDS if encoding.family == "rotary" else ("similarity", "resolution", "video")
    for kind in kinds:
        out = viz.save(viz.render(encoding, kind, shape, head=0 if encoding.family == "bias" else None),
                       tmp_path / f"{kind}.png", dpi=40)
        assert out.stat().st_size > 1000, kind
    for kind in set(viz.KINDS) - set(kinds):
        with pytest.raises(ValueError, match="bias encoding"):
            viz.render(encoding, kind, shape)
