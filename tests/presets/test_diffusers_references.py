"""The video DiT presets (Wan, Cosmos) equal diffusers' own positional modules at random weights: rotations, rotated
q and k and learned tables, at a typical latent grid and at other, non-cubic ones."""
import math

import pytest
import torch

pytest.importorskip("diffusers", reason="the video presets' oracles are diffusers' own modules: pip install "
                                        "visionpe[dev] (absent at the dependency floor)")

from diffusers.models.embeddings import apply_rotary_emb  # noqa: E402
from diffusers.models.transformers.transformer_cosmos import (CosmosLearnablePositionalEmbed,  # noqa: E402
                                                              CosmosRotaryPosEmbed)
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed  # noqa: E402

import visionpe as vpe  # noqa: E402
from visionpe import Grid  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
SHAPES = [(21, 30, 52), (3, 5, 7), (9, 2, 4)]  # Wan 2.1's 480x832 latent of 81 frames, then smaller uneven grids


def latent(shape, patch=(1, 2, 2), channels: int = 1) -> torch.Tensor:
    """A latent clip ``(1, C, T, H, W)`` whose patch grid is ``shape``."""
    return torch.zeros(1, channels, *(s * p for s, p in zip(shape, patch)))


def wan_apply_rotary_emb(hidden_states, freqs_cos, freqs_sin):
    """WanAttnProcessor's nested ``apply_rotary_emb`` (diffusers transformer_wan.py), on ``(B, S, heads, d)``."""
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cos[..., 0::2], freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


@pytest.mark.parametrize("head_dim", [128, 40])  # 128: (22, 21, 21) pairs; 40: (8, 6, 6)
@pytest.mark.parametrize("shape", SHAPES)
def test_wan_rope(head_dim, shape):
    rope = WanRotaryPosEmbed(attention_head_dim=head_dim, patch_size=(1, 2, 2), max_seq_len=1024)
    freqs_cos, freqs_sin = rope(latent(shape))  # (1, N, 1, head_dim)
    q = torch.randn(1, math.prod(shape), 1, head_dim)  # Wan's (B, S, heads, d)
    expected = wan_apply_rotary_emb(q, freqs_cos, freqs_sin)
    pe = vpe.preset("wan", dim=2 * head_dim, num_heads=2).rotary
    pairs = head_dim // 2
    assert pe.sections == (pairs - 2 * (pairs // 3), pairs // 3, pairs // 3)
    torch.testing.assert_close(pe.rotate(q.transpose(1, 2), Grid(shape)).transpose(1, 2), expected, **TOL)
    # the table itself: Wan's cos and sin of each pair (repeat_interleaved over its two channels)
    rotations = pe.rotations(Grid(shape))[0]  # (N, pairs, (cos, sin))
    torch.testing.assert_close(rotations[..., 0], freqs_cos[0, :, 0, 0::2].float(), **TOL)
    torch.testing.assert_close(rotations[..., 1], freqs_sin[0, :, 0, 1::2].float(), **TOL)


@pytest.mark.parametrize("shape,fps", [((16, 44, 80), None),  # a 121-frame 704x1280 clip's latent grid
                                       ((3, 5, 7), None), ((3, 5, 7), 30), ((9, 2, 4), 24), ((9, 2, 4), 8)])
def test_cosmos_rope(shape, fps):
    """A per-axis NTK factor (rope_scale (2, 1, 1)) and time scaled by base_fps / fps: Grid spacing."""
    head_dim = 128
    rope = CosmosRotaryPosEmbed(hidden_size=head_dim, max_size=(128, 240, 240), patch_size=(1, 2, 2))
    cos, sin = rope(latent(shape), fps=fps)  # (N, head_dim)
    pe = vpe.preset("cosmos", dim=2 * head_dim, num_heads=2).rotary
    grid = Grid(shape, spacing=None if fps is None else (rope.base_fps / fps, 1, 1))
    rotations = pe.rotations(grid)[0]  # (N, pairs, (cos, sin)): Cosmos repeats them over both halves of the head
    torch.testing.assert_close(rotations[..., 0].repeat(1, 2), cos, **TOL)
    torch.testing.assert_close(rotations[..., 1].repeat(1, 2), sin, **TOL)
    q = torch.randn(1, 1, math.prod(shape), head_dim)
    expected = apply_rotary_emb(q, (cos, sin), use_real=True, use_real_unbind_dim=-2)  # Cosmos' call
    ours = pe.rotate(q, grid)
    # diffusers forms the angles in float32 (position x frequency up to ~80 rad, rounded by up to 4e-6 rad), so on
    # the 56k-token clip its rotated q is itself up to ~1.2e-5 from the exact rotation that visionpe computes
    # (float64 angles); on the small grids both agree within 1e-5
    torch.testing.assert_close(ours, expected, **(TOL if math.prod(shape) < 1000 else dict(atol=3e-5, rtol=1e-5)))


@pytest.mark.parametrize("shape", [(16, 44, 80), (3, 5, 7), (9, 2, 4)])
def test_cosmos_learned_tables(shape):
    """Per-axis tables cut to the clip (not resized), summed, divided by their RMS per patch."""
    dim = 16
    reference = CosmosLearnablePositionalEmbed(hidden_size=dim, max_size=(128, 240, 240), patch_size=(1, 2, 2))
    tables = (reference.pos_emb_t, reference.pos_emb_h, reference.pos_emb_w)
    with torch.no_grad():
        for table in tables:  # diffusers starts them at zero: random weights instead
            table.normal_()
        expected = reference(latent(shape))[0]  # (N, dim)
    tokens = vpe.preset("cosmos", dim=dim, num_heads=2).tokens
    for ours, theirs in zip(tokens.axis_tables, tables):
        ours.data.copy_(theirs.detach())
    torch.testing.assert_close(tokens.position_vectors(Grid(shape)), expected, **TOL)
