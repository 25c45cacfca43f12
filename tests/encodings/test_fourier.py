"""``fourier`` (XCiT's Fourier position encoding): timm's ``PositionalEncodingFourier`` is the 2D oracle, a closed form
written here the 1D and 3D one. Where it goes with the other encodings comes from the registry-wide tests
(``-k fourier``); XCiT's native path is in tests/backbones/test_xcit.py."""
import math
import re

import numpy as np
import pytest
import torch
from timm.models.xcit import PositionalEncodingFourier

import visionpe as vpe
from visionpe import Grid


def timms_vectors(shape, hidden_dim=32, temperature=10000.0, dim=24):
    """A ``fourier`` encoding holding the weights of a random timm ``PositionalEncodingFourier``, and timm's position
    vectors of ``shape`` as ``(H * W, dim)``, row-major."""
    torch.manual_seed(0)
    ref = PositionalEncodingFourier(hidden_dim=hidden_dim, dim=dim, temperature=temperature)
    pe = vpe.build("fourier", dim=dim, hidden_dim=hidden_dim, temperature=temperature)
    with torch.no_grad():
        pe.projection.weight.copy_(ref.token_projection.weight.flatten(1))
        pe.projection.bias.copy_(ref.token_projection.bias)
        return pe, ref(1, *shape).flatten(2).transpose(1, 2)[0]


@pytest.mark.parametrize("shape,hidden_dim,temperature", [((3, 5), 32, 10000.0), ((7, 7), 32, 10000.0),
                                                          ((1, 4), 32, 10000.0), ((6, 2), 8, 100.0)])
def test_fourier_is_timms_positional_encoding_fourier(shape, hidden_dim, temperature):
    pe, theirs = timms_vectors(shape, hidden_dim, temperature)
    torch.testing.assert_close(pe.position_vectors(Grid(shape)), theirs, atol=1e-6, rtol=0)
    x = torch.randn(2, 1 + math.prod(shape), 24)
    out = pe(x, Grid(shape, prefix=1))  # added to the patches; the class token gets nothing
    torch.testing.assert_close(out, x + torch.cat([torch.zeros(1, 24), theirs])[None], atol=1e-6, rtol=0)


def closed_form(shape, weight, bias, hidden_dim, temperature=10000.0, eps=1e-6) -> np.ndarray:
    """XCiT's encoding in float64 on any grid: per axis of ``n`` patches, patch ``i`` at
    ``c = 2 pi (i + 1) / (n + eps)`` gives ``[sin(c w_0), cos(c w_0), sin(c w_1), ...]`` with ``w_j = temperature ** (-2 j / hidden_dim)``; the axes'
    features are concatenated in grid order and projected by ``weight``, ``bias``."""
    w = temperature ** (-2 * np.arange(hidden_dim // 2) / hidden_dim)
    per_axis = []
    for n in shape:
        c = 2 * np.pi * np.arange(1, n + 1) / (n + eps)
        per_axis.append(np.stack([np.sin(c[:, None] * w), np.cos(c[:, None] * w)], axis=-1).reshape(n, hidden_dim))
    index = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1).reshape(-1, len(shape))
    features = np.concatenate([f[index[:, a]] for a, f in enumerate(per_axis)], axis=1)
    return features @ weight.double().numpy().T + bias.double().numpy()


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), (3, 1, 2)])
def test_fourier_on_any_number_of_axes_is_the_closed_form(shape):
    torch.manual_seed(0)
    pe = vpe.build("fourier", dim=8, ndim=len(shape), hidden_dim=6)
    assert pe.projection.weight.shape == (8, 6 * len(shape))
    expected = closed_form(shape, pe.projection.weight.detach(), pe.projection.bias.detach(), 6)
    torch.testing.assert_close(pe.position_vectors(Grid(shape)).double(), torch.from_numpy(expected), atol=1e-6,
                               rtol=0)


def test_fourier_trains_its_projection():
    pe = vpe.build("fourier", dim=8, hidden_dim=4)
    pe(torch.zeros(1, 6, 8), Grid((2, 3))).pow(2).sum().backward()
    assert pe.projection.weight.grad.abs().sum() > 0 and pe.projection.bias.grad.abs().sum() > 0
    assert pe.no_weight_decay() == {"projection.weight", "projection.bias"}  # timm's XCiT: pos_embed.* undecayed


@pytest.mark.parametrize("kwargs,message", [
    (dict(hidden_dim=5), "hidden_dim"), (dict(hidden_dim=0), "hidden_dim"), (dict(temperature=0.0), "temperature"),
    (dict(eps=-1.0), "eps")])
def test_fourier_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vpe.build("fourier", dim=8, **kwargs)
    with pytest.raises(TypeError):
        vpe.tokens.Fourier(8)  # keyword-only


@pytest.mark.parametrize("grid,message", [(Grid((2, 3), offset=(1, 0)), "offset=(1.0, 0.0)"),
                                          (Grid((2, 3), spacing=(2.0, None)), "spacing")])
def test_fourier_refuses_an_offset_or_a_spacing(grid, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        vpe.build("fourier", dim=8)(torch.zeros(1, 6, 8), grid)

