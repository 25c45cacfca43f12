"""visionpe.viz.explorer without a browser: the page is self-contained and small, and the numbers it embeds decode
(with a decoder written here, independently of the page's) to visionpe.viz.similarity within one quantisation step,
for every encoding, 2D and 3D, fresh and in a model."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import visionpe
from visionpe import ModelContext, viz
from visionpe.registry import ENCODINGS
from visionpe.rotary.scaling import SCALINGS
from visionpe.viz import explorer

from explorerutil import check_layer, decode, page_data

SHAPES = {2: (3, 4), 3: (2, 3, 4)}
RELATIVE = {"sincos", "rope_axial", "rope_mixed", "swin_bias", "rel_bias", "cpb", "alibi", "bucket_bias", "fire",
            "lookhere", "videorope", "string", "comrope", "spiral_rope", "harope", "vit5_rope", "riflex", "pape",
            "pape_ri", "v2pe", "hope", "dype", "mhrope",
            "spherical_rope", "decomposed_rel_pos"}  # every map a function of offsets (query - key) alone; not liere (its generators do not
# commute), learned (a table per position), peg (borders) or circle_rope (a ring spread over the grid); harope's kernel
# is RoPE's (a map per head cancels in it), pape's maps are the bias of one query token (zero) for every query,
# decomposed_rel_pos's of one query (ones); v2pe's
# raster index differs by dy * W + dx on a grid of width W; spherical_rope's scores are not relative, but its kernel
# tr(Y_i^T R(dy) Y_j) / d = tr(R(dy) Y(dx)) / d is
VIT = dict(img_size=16, patch_size=4, num_classes=3, depth=2, embed_dim=48, num_heads=2)


def takes_scaling(pe, scaling) -> bool:
    try:
        viz.adapt(pe, (3, 4) if pe.ndims != (3,) else (2, 3, 4), (6, 8) if pe.ndims != (3,) else (4, 6, 8), scaling)
        return True
    except ValueError:
        return False


def make(name: str, shape, num_heads: int = 2, seed: int = 0, **kwargs):
    """A small encoding built as a model builds it; learned bias tables drawn at random (fresh ones are ~0)."""
    torch.manual_seed(seed)
    pe = ENCODINGS[name].for_model(ModelContext(tuple(shape), dim=24, num_heads=num_heads, head_dim=12), **kwargs)
    if pe.family == "bias":
        with torch.no_grad():
            for p in pe.parameters():
                p.normal_()
    return pe


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", sorted(visionpe.available()))
def test_embedded_maps_decode_to_the_similarity_of_every_encoding(name, ndim):
    if ndim not in ENCODINGS[name].ndims:
        pytest.skip(f"{name} is defined on {ENCODINGS[name].ndims}-axis grids only")
    shape = SHAPES[ndim]
    pe = make(name, shape)
    new_shape = viz.larger_shape(shape)
    data = page_data(explorer.explorer_html(pe, shape))
    assert len(data["layers"]) == 1 and data["title"] == viz.name_of(pe)
    layer = data["layers"][0]
    assert layer["family"] == pe.family and layer["note"] == viz.note_of(pe)
    check_layer(layer, pe, shape, new_shape)
    forms = {m["form"] for v in layer["views"] for m in v["maps"]}
    assert forms == ({"relative"} if name in RELATIVE else {"full"}), forms  # offsets only where exactly relative
    if pe.family == "rotary":  # the native grid plus every scaling the encoding takes, each once
        assert len(layer["views"]) == 1 + sum(1 for s in SCALINGS if takes_scaling(pe, s))


def test_the_page_is_self_contained_and_small():
    pe = visionpe.build("rope_mixed", head_dim=32, num_heads=3, ndim=2)
    page = explorer.explorer_html(pe, (14, 14), title="</script><script>alert(1)</script>")
    assert not re.search(r"https?://|ftp://|wss?://", page, re.I)  # no address of anything outside the file
    assert not re.search(r"\b(src|href|action)\s*=|<link|<img|<iframe|<object|<embed|@import|url\(", page, re.I)
    assert not re.search(r"fetch\(|XMLHttpRequest|WebSocket|EventSource|sendBeacon|import\(", page)
    assert "default-src 'none'" in page  # the browser itself refuses any fetch
    assert page.count("<script") == 2 and "alert(1)</script>" not in page  # a title cannot open a script
    data = page_data(page)
    assert data["title"] == "</script><script>alert(1)</script>"
    # 14x14 and four 28x28 views of 4 maps: as float32 JSON that is ~10 MB; as stored, offsets only
    assert len(page.encode()) < 150_000, len(page.encode())
    learned = explorer.explorer_html(visionpe.build("learned", dim=48, grid_shape=(14, 14)), (14, 14))
    full = 196 ** 2 + 784 ** 2  # a random table's maps: one byte per pair (base64: 4/3), ~8 as JSON numbers
    assert len(learned.encode()) < 1.4 * full, len(learned.encode())


def test_a_video_grid_keeps_its_frames_on_the_larger_grid():
    pe = make("rope_mixed", (3, 4, 4))
    data = page_data(explorer.explorer_html(pe, (3, 4, 4), new_shape=(3, 6, 6), scalings=("pi",)))
    views = data["layers"][0]["views"]
    assert [v["shape"] for v in views] == [[3, 4, 4], [3, 6, 6]] and "pi" in views[1]["label"]
    head1 = viz.similarity(viz.adapt(pe, (3, 4, 4), (3, 6, 6), "pi")[0], (3, 6, 6), 1)
    np.testing.assert_allclose(decode(views[1]["maps"][2], (3, 6, 6)), head1.double().numpy(),
                               rtol=0, atol=views[1]["maps"][2]["step"] + 1e-9)


@pytest.fixture(scope="module")
def model():
    """A tiny ViT with a learned table and rope_mixed in 2 blocks; block 1's frequencies differ from block 0's."""
    torch.manual_seed(0)
    vit = visionpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+learned", **VIT)
    with torch.no_grad():
        visionpe.encodings_of(vit)["rotary"][1].freqs.mul_(3.0)
    return vit


def test_a_model_page_holds_every_encoding_of_the_model(model):
    data = page_data(explorer.explorer_html(model))  # the grid from patch_embed: 4x4
    found = visionpe.encodings_of(model)
    assert [layer["label"] for layer in data["layers"]] == ["learned", "rope_mixed, layer 0", "rope_mixed, layer 1"]
    assert "rope_mixed" in data["title"] and "learned" in data["title"]
    for layer, pe in zip(data["layers"], [found["tokens"][0], *found["rotary"]]):
        check_layer(layer, pe, (4, 4), (8, 8))
    layer0, layer1 = (decode(data["layers"][k]["views"][0]["maps"][1], (4, 4)) for k in (1, 2))
    assert np.abs(layer0 - layer1).max() > 0.1  # the layers are different maps
    only = page_data(explorer.explorer_html(model, (4, 4), layers=[2], new_shape=(4, 4)))
    assert [layer["label"] for layer in only["layers"]] == ["rope_mixed, layer 1"]
    assert len(only["layers"][0]["views"]) == 1  # new_shape == shape: the native grid only
    pi = page_data(explorer.explorer_html(model, scalings=("pi",)))  # for the rotary layers; the table keeps its own
    assert [len(layer["views"]) for layer in pi["layers"]] == [2, 2, 2]
    assert "resampled" in pi["layers"][0]["views"][1]["label"] and "pi" in pi["layers"][1]["views"][1]["label"]


def test_a_shared_module_appears_once_and_a_window_bias_lives_on_its_window():
    shared = visionpe.create_model("vit_tiny_patch16_224", pe="rope_axial", **{**VIT, "depth": 3})
    assert [s[0] for s in explorer.explorer_sources(shared)] == ["rope_axial, layers 0-2 (one shared module)"]
    swin = visionpe.create_model("swin_tiny_patch4_window7_224", pe="swin_bias", img_size=32, patch_size=4,
                                 window_size=4, embed_dim=16, depths=(1, 1), num_heads=(1, 2), num_classes=3)
    sources = explorer.explorer_sources(swin, (8, 8))
    assert [(label, grid) for label, _, grid in sources] == [("swin_bias, layer 0", (4, 4)),
                                                             ("swin_bias, layer 1", (4, 4))]
    data = page_data(explorer.explorer_html(swin, (8, 8), new_shape=(16, 16)))
    assert [v["grid"] for v in data["layers"][1]["views"]] == [[4, 4], [8, 8]]  # the window grows as the grid
    assert data["layers"][1]["heads"] == ["mean over heads", "head 0", "head 1"]


def test_maps_are_those_of_evaluation_mode_and_modes_are_restored():
    shape = (4, 4)
    pe = make("alibi", shape, jitter_coords=1.5, rescale_coords=1.5).train()
    torch.manual_seed(1)
    assert not torch.equal(pe(visionpe.Grid(shape)), pe(visionpe.Grid(shape)))  # training draws new coordinates
    pages = [explorer.explorer_html(pe, shape) for _ in range(2)]
    assert pages[0] == pages[1] and pe.training  # deterministic, and the module is back in training mode
    check_layer(page_data(pages[0])["layers"][0], pe.eval(), shape, (8, 8))


def test_normalised_rope_offers_only_the_adaptations_it_takes():
    pe = make("rope_axial", (4, 4), coords="normalized")
    labels = [v["label"] for v in page_data(explorer.explorer_html(pe, (4, 4)))["layers"][0]["views"]]
    assert len(labels) == 2 and labels[0] == "native grid 4x4"  # pi/ntk/yarn do not apply to [-1, 1] coordinates
    with pytest.raises(ValueError, match="scaling='pi'"):
        explorer.explorer_html(pe, (4, 4), scalings=("pi",))


def test_bad_input_gets_a_clear_error(model):
    rope = make("rope_axial", (4, 4))
    with pytest.raises(ValueError, match="shape is required"):
        explorer.explorer_html(rope)
    with pytest.raises(TypeError, match="source must be a visionpe encoding or a model"):
        explorer.explorer_html("rope_axial", (4, 4))
    plain = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="shape is required"):
        explorer.explorer_html(plain)
    with pytest.raises(ValueError, match="Linear has no visionpe encodings"):
        explorer.explorer_html(plain, (4, 4))
    with pytest.raises(ValueError, match=r"the grid 50x50 of rope_axial has 2500 patches.*max_patches=2048"):
        explorer.explorer_html(rope, (25, 25))  # checked before any map is computed
    with pytest.raises(ValueError, match="max_bytes=100 of map data"):
        explorer.explorer_html(rope, (4, 4), max_bytes=100)
    with pytest.raises(ValueError, match=r"layers=\[3\] must be .* 0..2 of: 0 learned; 1 rope_mixed, layer 0"):
        explorer.explorer_html(model, layers=[3])
    with pytest.raises(ValueError, match="layers=1 must be a non-empty list"):
        explorer.explorer_html(model, layers=1)
    with pytest.raises(ValueError, match="max_patches must be a positive integer"):
        explorer.explorer_html(rope, (4, 4), max_patches=0)
    with pytest.raises(ValueError, match=r"scalings=\('pi',\) apply to rotary encodings only; the page shows cpb"):
        explorer.explorer_html(make("cpb", (4, 4)), (4, 4), scalings=("pi",))
    with pytest.raises(ValueError, match="new_shape"):
        explorer.explorer_html(rope, (4, 4), new_shape=(8, 8, 8))
    broken = make("learned", (4, 4))
    with torch.no_grad():
        broken.table[0, 3] = math.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        explorer.explorer_html(broken, (4, 4))


def test_write_explorer_writes_the_page(tmp_path):
    pe = make("cpb", (3, 3))
    out = explorer.write_explorer(pe, tmp_path / "sub" / "page.html", (3, 3))
    assert out == tmp_path / "sub" / "page.html"
    assert out.read_text(encoding="utf-8") == explorer.explorer_html(pe, (3, 3))
    assert viz.write_explorer is explorer.write_explorer  # exported by visionpe.viz
