"""The explorer page in a real browser: headless Chromium from the OS packages (Debian's ``chromium``, or the binary
named by $VISIONPE_CHROMIUM) driven by Playwright for Python; no browser is ever downloaded. Skips, with the reason,
where Playwright or Chromium is missing (.ci/run installs Chromium; ``pip install -e '.[dev]'`` installs Playwright).

Pointing the mouse at patches, choosing layers, heads and grids, and moving the frame slider must change what the
canvas shows to the numbers of :func:`visionpe.viz.similarity` (within one quantisation step), peaked at the query
for RoPE. ``VISIONPE_EXPLORER_SCREENSHOT=docs/figures/explorer.png`` refreshes docs/visualize.md's screenshot."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import visionpe
from visionpe import viz

CHROMIUM = os.environ.get("VISIONPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright for Python is not installed (pip install -e '.[dev]')")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set VISIONPE_CHROMIUM)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


def palette() -> np.ndarray:
    """The colour of each of the 256 levels, ``(256, 3)`` uint8: matplotlib's viridis."""
    import matplotlib

    return np.rint(matplotlib.colormaps["viridis"](np.arange(256) / 255)[:, :3] * 255).astype(int)


class Page:
    """One explorer page in a browser tab, with every error and request it makes recorded."""

    def __init__(self, browser, path: Path):
        self.tab = browser.new_page(viewport={"width": 720, "height": 560})
        self.errors, self.requests = [], []
        self.tab.on("pageerror", lambda error: self.errors.append(str(error)))
        self.tab.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.tab.on("request", lambda request: self.requests.append(request.url))
        self.url = path.resolve().as_uri()
        self.tab.goto(self.url)

    def state(self) -> dict:
        return self.tab.evaluate("window.vpeExplorer.idle().then(() => window.vpeExplorer.state())")

    def centre(self, h: int, w: int) -> dict:
        cell = self.state()["cell"]
        return {"x": (w + 0.5) * cell, "y": (h + 0.5) * cell}

    def hover(self, h: int, w: int) -> dict:
        self.tab.hover("#map", position=self.centre(h, w))
        return self.state()

    def click(self, h: int, w: int) -> dict:
        self.tab.click("#map", position=self.centre(h, w))
        return self.state()

    def choose(self, control: str, index: int) -> dict:
        self.tab.select_option(f"#{control}", str(index))
        return self.state()

    def pixel(self, h: int, w: int) -> list[int]:
        at = self.centre(h, w)
        return self.tab.evaluate(f"Array.from(document.getElementById('map').getContext('2d')"
                                 f".getImageData({int(at['x'])}, {int(at['y'])}, 1, 1).data.slice(0, 3))")

    def close(self) -> None:
        assert self.errors == [], self.errors
        assert set(self.requests) == {self.url}, self.requests  # the page itself, nothing else
        self.tab.close()


def row(sim: torch.Tensor, shape, query, frame: int | None = None) -> np.ndarray:
    """The query's map over the keys of one frame (image grids: all keys), ``(H * W,)``."""
    values = sim[int(np.ravel_multi_index(query, shape))].double().numpy().reshape(-1, *shape[-2:])
    return values[0 if frame is None else frame].ravel()


def assert_shows(state: dict, expected: np.ndarray) -> None:
    np.testing.assert_allclose(state["values"], expected, rtol=0, atol=state["step"] + 1e-9)


def assert_peaks_at_query(state: dict) -> None:
    width = state["shape"][2]
    values = np.array(state["values"])
    peak = state["query"][1] * width + state["query"][2]
    assert values.argmax() == peak and (np.delete(values, peak) < values[peak]).all(), state["query"]


def test_pointing_at_a_patch_shows_its_rope_map(browser, tmp_path):
    shape = (14, 14)
    pe = visionpe.build("rope_axial", head_dim=32, num_heads=2, ndim=2)
    page = Page(browser, viz.write_explorer(pe, tmp_path / "rope_axial.html", shape))
    assert page.tab.is_hidden("#frame-box") and page.tab.is_disabled("#head")  # an image grid; one map every head
    sim = viz.similarity(pe, shape)
    first = page.hover(2, 3)
    assert first["query"] == [0, 2, 3] and first["shape"] == [1, 14, 14]
    assert_shows(first, row(sim, shape, (2, 3)))
    assert_peaks_at_query(first)
    colours = palette()
    assert page.pixel(2, 3) == colours[255].tolist()  # the query is the map's maximum: the top colour
    assert page.pixel(13, 0) == colours[first["levels"][13 * 14]].tolist()
    second = page.hover(9, 11)
    assert second["query"] == [0, 9, 11]
    assert_shows(second, row(sim, shape, (9, 11)))
    assert_peaks_at_query(second)
    assert np.abs(np.subtract(first["values"], second["values"])).max() > 0.1  # the map follows the pointer
    screenshot = page.tab.screenshot(path=str(tmp_path / "explorer.png"), full_page=True)
    assert screenshot[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("VISIONPE_EXPLORER_SCREENSHOT"):
        Path(os.environ["VISIONPE_EXPLORER_SCREENSHOT"]).write_bytes(screenshot)
    # a click pins the query: the pointer then reads keys
    pinned = page.click(9, 11)
    moved = page.hover(0, 0)
    assert pinned["pinned"] and moved["query"] == [0, 9, 11] and moved["values"] == second["values"]
    assert "key (0, 0): " in page.tab.inner_text("#readout")
    assert not page.click(5, 5)["pinned"]
    page.hover(9, 11)
    # the larger grid under position interpolation: another map, the query kept at its place
    labels = page.tab.eval_on_selector_all("#view option", "options => options.map(o => o.textContent)")
    assert labels[0] == "native grid 14x14" and len(labels) == 5
    pi = next(k for k, label in enumerate(labels) if "scaling=pi" in label)
    adapted = page.choose("view", pi)
    assert adapted["shape"] == [1, 28, 28] and adapted["query"] == [0, 19, 23]
    assert_shows(adapted, row(viz.similarity(viz.adapt(pe, shape, (28, 28), "pi")[0], (28, 28)), (28, 28), (19, 23)))
    assert_peaks_at_query(adapted)
    extrapolated = page.choose("view", next(k for k, label in enumerate(labels) if "extrapolated" in label))
    assert np.abs(np.subtract(adapted["values"], extrapolated["values"])).max() > 0.1
    page.close()


def test_layer_and_head_controls_change_the_map(browser, tmp_path):
    torch.manual_seed(0)
    grid = (8, 8)
    model = visionpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+learned", img_size=32, patch_size=4,
                                  num_classes=3, depth=2, embed_dim=48, num_heads=2)
    found = visionpe.encodings_of(model)
    with torch.no_grad():
        found["rotary"][1].freqs.mul_(3.0)  # as training might have moved them
    page = Page(browser, viz.write_explorer(model, tmp_path / "model.html", new_shape=grid))  # native grids only
    layers = page.tab.eval_on_selector_all("#layer option", "options => options.map(o => o.textContent)")
    assert layers == ["learned", "rope_mixed, layer 0", "rope_mixed, layer 1"]
    tokens = page.hover(1, 2)
    assert page.tab.is_disabled("#head")
    assert_shows(tokens, row(viz.similarity(found["tokens"][0], grid), grid, (1, 2)))
    assert_peaks_at_query(tokens)
    mean0 = page.choose("layer", 1)
    assert_shows(mean0, row(viz.similarity(found["rotary"][0], grid), grid, (1, 2)))
    head1 = page.choose("head", 2)  # options: mean over heads, head 0, head 1
    assert_shows(head1, row(viz.similarity(found["rotary"][0], grid, head=1), grid, (1, 2)))
    layer1 = page.choose("layer", 2)
    assert layer1["head"] == 2
    assert_shows(layer1, row(viz.similarity(found["rotary"][1], grid, head=1), grid, (1, 2)))
    for state in (mean0, head1, layer1):
        assert_peaks_at_query(state)
    for a, b in ((tokens, mean0), (mean0, head1), (head1, layer1)):  # each control changed the map
        assert np.abs(np.subtract(a["values"], b["values"])).max() > 4 * max(a["step"], b["step"])
    page.close()


def test_the_frame_slider_of_a_video_grid_changes_the_map(browser, tmp_path):
    shape = (3, 4, 4)
    pe = visionpe.build("rope_axial", head_dim=24, num_heads=2, ndim=3)
    sim = viz.similarity(pe, shape)
    page = Page(browser, viz.write_explorer(pe, tmp_path / "video.html", shape))
    assert page.tab.is_visible("#frame-box")
    start = page.state()
    assert start["frame"] == 1 and start["query"] == [1, 2, 2]  # the centre of the clip
    here = page.hover(1, 1)
    assert here["query"] == [1, 1, 1]
    assert_shows(here, row(sim, shape, (1, 1, 1), frame=1))
    assert_peaks_at_query(here)
    page.tab.focus("#frame")
    page.tab.keyboard.press("ArrowRight")
    later = page.state()
    assert later["frame"] == 2 and later["query"] == [1, 1, 1]  # the query stays; the keys of frame 2 are shown
    assert_shows(later, row(sim, shape, (1, 1, 1), frame=2))
    assert np.abs(np.subtract(here["values"], later["values"])).max() > 0.01
    assert page.tab.inner_text("#frame-out") == "2 / 2"
    page.tab.keyboard.press("ArrowLeft")
    page.tab.keyboard.press("ArrowLeft")
    earlier = page.state()
    assert earlier["frame"] == 0
    assert_shows(earlier, row(sim, shape, (1, 1, 1), frame=0))
    assert page.hover(3, 0)["query"] == [0, 3, 0]  # pointing on frame 0 picks a query there
    page.close()


def test_an_asymmetric_bias_on_a_non_square_grid(browser, tmp_path):
    """A random Swin table is not symmetric (bias(q, k) != bias(k, q)) and 3x5 is not square: the page's offset
    arithmetic must get both the sign and the axes right."""
    shape = (3, 5)
    torch.manual_seed(0)
    pe = visionpe.build("swin_bias", num_heads=2, window_size=shape)
    with torch.no_grad():
        pe.relative_position_bias_table.normal_()
    page = Page(browser, viz.write_explorer(pe, tmp_path / "swin.html", shape, new_shape=shape))
    for head, (h, w) in ((0, (0, 4)), (1, (2, 1)), (2, (1, 3))):
        state = page.choose("head", head)
        state = page.hover(h, w)
        assert state["query"] == [0, h, w] and state["shape"] == [1, 3, 5]
        assert_shows(state, row(viz.similarity(pe, shape, head=None if head == 0 else head - 1), shape, (h, w)))
    page.close()
