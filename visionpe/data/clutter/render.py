"""Drawing a clutter scene at any size: each item at 4x supersampling (textures band-limited for the output size,
box outlines by exact coverage), then area-averaged."""
from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from ..base import image_hw
from ..scenes import SUPERSAMPLE, _draw_shape
from .items import Item, Texture

TEXTURE_AMPLITUDE = 0.35  # a texture scales an item's colour by 1 +- this (its mean is the flat colour)
OUTLINE = 0.02  # the box outline's thickness, a fraction of the side


def _shading(texture: Texture, xs: np.ndarray, ys: np.ndarray, pixels: float) -> np.ndarray:
    """The texture's brightness factor on a grid of normalised coordinates ``xs (w,)``, ``ys (h,)`` -> ``(h, w)``.
    Band-limited for an output image of ``pixels`` on its shorter side: the modulation fades in from a period of 2
    output pixels (Nyquist) to full at 3, so what the output cannot resolve renders as the flat colour."""
    amplitude = TEXTURE_AMPLITUDE * min(max(texture.period * pixels - 2, 0.0), 1.0)
    if amplitude == 0:
        return np.ones((len(ys), len(xs)), dtype=np.float32)
    c, s, k = math.cos(texture.angle), math.sin(texture.angle), 2 * math.pi / texture.period
    u = xs[None, :] * c + ys[:, None] * s  # (h, w) across the stripes
    wave = np.sin(k * u + texture.phase)
    if texture.pattern == "grid":
        wave = wave * np.sin(k * (ys[:, None] * c - xs[None, :] * s) + texture.phase)
    return (1 + amplitude * wave).astype(np.float32)


def _cover(lo: float, hi: float, n: int) -> np.ndarray:
    """``(n,)`` float32: the length of ``[lo, hi]`` inside each pixel ``[i, i + 1]`` of ``0..n``."""
    edges = np.arange(n, dtype=np.float32)
    return np.clip(np.minimum(hi, edges + 1) - np.maximum(lo, edges), 0, 1)


def _mask(item: Item, box: tuple[int, int, int, int], big_w: int, big_h: int) -> np.ndarray:
    """The item's coverage in ``[0, 1]`` (float32 ``(h, w)``) of the canvas pixels of ``box = (x0, y0, x1, y1)``."""
    x0, y0, x1, y1 = box
    x, y = item.cx * big_w - x0, item.cy * big_h - y0
    rx, ry = item.radius if isinstance(item.radius, tuple) else (item.radius, item.radius)
    rx, ry = rx * big_w, ry * big_h
    if item.kind == "box":  # exact coverage, the outer rectangle less the inner one: thin lines agree across sizes
        tx, ty = OUTLINE * big_w, OUTLINE * big_h
        outer = _cover(y - ry, y + ry, y1 - y0)[:, None] * _cover(x - rx, x + rx, x1 - x0)[None, :]
        return outer - _cover(y - ry + ty, y + ry - ty, y1 - y0)[:, None] * _cover(x - rx + tx, x + rx - tx, x1 - x0)
    img = Image.new("L", (x1 - x0, y1 - y0), 0)
    draw = ImageDraw.Draw(img)
    if item.kind == "ring":
        draw.ellipse([x - rx, y - ry, x + rx, y + ry], fill=255)
        draw.ellipse([x - 0.5 * rx, y - 0.5 * ry, x + 0.5 * rx, y + 0.5 * ry], fill=0)
    else:
        _draw_shape(draw, item.kind, x, y, rx, ry, 255)
    return np.asarray(img, dtype=np.float32) / 255


def render_clutter(sc: dict, size, supersample: int = SUPERSAMPLE) -> np.ndarray:
    """Rasterise a clutter scene at ``size`` pixels (an integer: square; or ``(height, width)``): each item drawn at
    ``supersample`` times the size (its texture band-limited for the output size), then area-averaged. Returns
    ``uint8 (H, W, 3)``."""
    height, width = image_hw(size, "size", 1)
    big_h, big_w = height * supersample, width * supersample
    canvas = np.empty((big_h, big_w, 3), dtype=np.float32)
    canvas[:] = sc["background"]
    for item in sc["items"]:
        rx, ry = item.radius if isinstance(item.radius, tuple) else (item.radius, item.radius)
        x0, x1 = max(0, math.floor((item.cx - rx) * big_w) - 1), min(big_w, math.ceil((item.cx + rx) * big_w) + 1)
        y0, y1 = max(0, math.floor((item.cy - ry) * big_h) - 1), min(big_h, math.ceil((item.cy + ry) * big_h) + 1)
        if x1 <= x0 or y1 <= y0:
            continue
        mask = _mask(item, (x0, y0, x1, y1), big_w, big_h)[..., None]  # (h, w, 1)
        colour = np.asarray(item.colour, dtype=np.float32)
        if item.texture is not None:
            xs = (np.arange(x0, x1, dtype=np.float32) + 0.5) / big_w
            ys = (np.arange(y0, y1, dtype=np.float32) + 0.5) / big_h
            colour = colour * _shading(item.texture, xs, ys, min(height, width))[..., None]
        region = canvas[y0:y1, x0:x1]
        region += mask * (colour - region)
    out = canvas.reshape(height, supersample, width, supersample, 3).mean(axis=(1, 3))
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)

