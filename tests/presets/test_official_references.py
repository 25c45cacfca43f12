"""Presets whose reference is not on the package registry, against closed forms of the official code written here
(each names its repository, commit and functions), and, where timm ports the model, against timm's port too.

- Perception Encoder: facebookresearch/perception_models@3e352cca660658d4b5c90f42a7808b11469e4c66,
  core/vision_encoder/pe.py (``VisionTransformer._sample_abs_posemb``) and core/vision_encoder/rope.py
  (``RotaryEmbedding`` with ``freqs_for="lang"``, ``Rope2D.update_grid``, ``apply_rotary_emb``).
- MoonViT (Kimi-VL): moonshotai/Kimi-VL-A3B-Instruct's modeling_kimi_vl.py, as vllm-project/vllm@055e47c
  vllm/model_executor/models/moonvit.py carries it (``Learnable2DInterpPosEmb``, ``Rope2DPosEmb``, ``apply_rope``).
"""
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat

import visionpe as vpe
from visionpe import Grid

from conftest import requires_that

TOL = dict(atol=1e-5, rtol=1e-5)


# -- Perception Encoder --------------------------------------------------------------------------------------------
def pe_rope(q: torch.Tensor, grid_h: int, grid_w: int, use_cls_token: bool = True) -> torch.Tensor:
    """Official PE: ``Rope2D(dim=head_dim)`` holds ``RotaryEmbedding(head_dim // 2)``, whose frequencies are
    ``1 / 10000^(arange(0, d, 2)[:d // 2] / d)`` (``d = head_dim // 2``), each repeated over two adjacent channels;
    rows and columns count from 1 with a class token (which keeps 0), x channels then y channels; ``apply_rotary_emb``
    rotates adjacent pairs: ``t * cos + rotate_half(t) * sin``, ``rotate_half: (x1, x2) -> (-x2, x1)``."""
    d = q.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    rows, cols = torch.arange(grid_h) + use_cls_token, torch.arange(grid_w) + use_cls_token
    freqs_y = (rows[:, None] * freqs).repeat_interleave(2, -1)[:, None].expand(grid_h, grid_w, -1)
    freqs_x = (cols[:, None] * freqs).repeat_interleave(2, -1)[None, :].expand(grid_h, grid_w, -1)
    angles = torch.cat([freqs_x, freqs_y], dim=-1).reshape(grid_h * grid_w, -1)
    if use_cls_token:
        angles = torch.cat([torch.zeros(1, angles.shape[-1]), angles])
    pairs = q.unflatten(-1, (-1, 2))
    rotated_half = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return q * angles.cos() + rotated_half * angles.sin()


def pe_abs_posemb(table: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
    """Official PE's ``_sample_abs_posemb``: the table itself at its own grid, else ``F.interpolate`` bilinear,
    ``align_corners=False`` (no antialias); the class token's row stays."""
    cls, grid = table[:1], table[1:]
    side = int(math.isqrt(grid.shape[0]))
    if (grid_h, grid_w) == (side, side):
        return table
    grid = grid.reshape(1, side, side, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(grid_h, grid_w), mode="bilinear", align_corners=False)
    return torch.cat([cls, grid.permute(0, 2, 3, 1).reshape(grid_h * grid_w, -1)])


@pytest.mark.parametrize("shape", [(24, 24), (16, 20), (30, 12)])  # PE-Core-L14-336's 24x24, then other sizes
def test_perception_encoder_matches_the_official_code(shape):
    grid = Grid(shape, prefix=1)
    scheme = vpe.preset("perception_encoder", dim=64, num_heads=2)
    table = torch.randn(1 + 24 * 24, 64)
    scheme.tokens.table.data.copy_(table[1:].reshape(24, 24, 64))
    scheme.tokens.prefix.data.copy_(table[:1])
    x = torch.randn(2, grid.num_tokens, 64)
    torch.testing.assert_close(scheme.tokens(x, grid), x + pe_abs_posemb(table, *shape), **TOL)
    q = torch.randn(2, 2, grid.num_tokens, 32)
    torch.testing.assert_close(scheme.rotary.rotate(q, grid), pe_rope(q, *shape), **TOL)


def test_perception_encoder_without_class_token_counts_from_0():
    """PE-Lang / PE-Spatial (use_cls_token=False): preset('perception_encoder', grid_offset=0)."""
    pe = vpe.preset("perception_encoder", dim=64, num_heads=2, num_prefix_tokens=0, grid_offset=0.0).rotary
    q = torch.randn(1, 2, 35, 32)
    torch.testing.assert_close(pe.rotate(q, Grid((5, 7))), pe_rope(q, 5, 7, use_cls_token=False), **TOL)


@requires_that(timm.is_model("vit_pe_core_tiny_patch16_384"),
               "timm's Perception Encoder port (the vit_pe_* models of a recent timm)")
def test_perception_encoder_equals_timms_port_at_the_native_grid():
    """timm's port agrees at the training grid (24x24 at 384 px); off it, timm resizes the table bicubic with
    antialias and interpolates RoPE positions (ref_feat_shape), the official code does neither (stated)."""
    model = timm.create_model("vit_pe_core_tiny_patch16_384", pretrained=False).eval()
    head_dim = model.embed_dim // model.blocks[0].attn.num_heads
    scheme = vpe.preset("perception_encoder", dim=model.embed_dim, num_heads=model.blocks[0].attn.num_heads,
                        grid_shape=(24, 24))
    grid = Grid((24, 24), prefix=1)
    q = torch.randn(1, 2, grid.num_tokens, head_dim)
    expected = torch.cat([q[:, :, :1], apply_rot_embed_cat(q[:, :, 1:], model.rope.get_embed())], dim=2)
    torch.testing.assert_close(scheme.rotary.rotate(q, grid), expected, **TOL)


# -- MoonViT (Kimi-VL) ---------------------------------------------------------------------------------------------
def moonvit_table(weight: torch.Tensor, shape) -> torch.Tensor:
    """``Learnable2DInterpPosEmb``: the weight itself at its own shape, else ``F.interpolate(mode="bicubic")``
    (PyTorch's defaults: align_corners=False, no antialias)."""
    if tuple(shape) == tuple(weight.shape[:-1]):
        return weight.flatten(end_dim=1)
    resized = F.interpolate(weight.permute(2, 0, 1).unsqueeze(0), size=tuple(shape), mode="bicubic")
    return resized.squeeze(0).permute(1, 2, 0).flatten(end_dim=1)


def moonvit_rope(q: torch.Tensor, shape, theta: float = 10000.0, max_side: int = 512) -> torch.Tensor:
    """``Rope2DPosEmb.precomputed_freqs_cis`` cut to ``[:h, :w]`` and ``apply_rope``: pair ``2i`` turns with x (the
    column), pair ``2i + 1`` with y, both at ``theta^(-4i / head_dim)``; q ``(..., N, heads, head_dim)``."""
    dim = q.shape[-1]
    flat = torch.arange(max_side * max_side).float()
    x_pos, y_pos = flat % max_side, flat // max_side
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4)[: dim // 4].float() / dim))
    x_cis = torch.polar(torch.ones(len(flat), dim // 4), torch.outer(x_pos, freqs))
    y_cis = torch.polar(torch.ones(len(flat), dim // 4), torch.outer(y_pos, freqs))
    cis = torch.cat([x_cis[..., None], y_cis[..., None]], dim=-1).reshape(max_side, max_side, -1)
    cis = cis[:shape[0], :shape[1]].reshape(-1, dim // 2).unsqueeze(-2)  # (N, 1, dim/2)
    q_ = torch.view_as_complex(q.float().view(*q.shape[:-1], -1, 2))
    return torch.view_as_real(q_ * cis).flatten(-2)


@pytest.mark.parametrize("shape", [(64, 64), (27, 35), (80, 16)])  # the table's grid, then down and up, non-square
def test_moonvit_matches_the_official_code(shape):
    scheme = vpe.preset("moonvit", dim=48, num_heads=2)
    weight = torch.randn(64, 64, 48)  # nn.init.normal_, as the official reset_parameters
    scheme.tokens.table.data.copy_(weight)
    torch.testing.assert_close(scheme.tokens.position_vectors(Grid(shape)), moonvit_table(weight, shape), **TOL)
    q = torch.randn(math.prod(shape), 2, 24)  # the official (tokens, heads, head_dim)
    ours = scheme.rotary.rotate(q.transpose(0, 1)[None], Grid(shape))[0].transpose(0, 1)
    torch.testing.assert_close(ours, moonvit_rope(q, shape), **TOL)
