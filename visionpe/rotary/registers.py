"""ViT-5's register RoPE ("ViT-5: Vision Transformers for the Mid-2020s", arXiv 2602.08071, 2026; official code
``wangf3014/ViT-5``, ``models_vit5.py`` and ``rope.py``): 2D RoPE on the patches, and the register tokens on a small
grid of their own with a RoPE of their own.

A grid's prefix tokens are the class token(s), then the registers (timm's order; ViT-5 appends its registers after
the patches, an order attention does not see). Here the last ``R = num_registers`` prefix tokens sit on a
``sqrt(R) x sqrt(R)`` grid (``(1, r, r)`` in 3D, a line of ``R`` in 1D), row-major, with integer positions and the
patches' channel layout at their own base ``register_theta`` (radians per index, whatever the patches' ``coords``);
the other prefix tokens are not rotated. Registers and patches turn at different frequencies, so their scores are
not a function of an offset: the registers' grid only tells them apart from each other. In a model ``num_registers``
is the model's own count (timm's ``reg_tokens``: :attr:`~visionpe.ModelContext.num_registers`); with none, this is
the patches' RoPE alone, as the official model without registers.

The official ViT-5 (read at commit ``b7b0796``): patches ``VisionRotaryEmbedding(head_dim // 2, img_size //
patch_size)``, ``theta = 10000``, ``head_dim / 4`` bands per axis, y pairs first (``axis_order="ij"``), adjacent
channel pairs, positions interpolated to the training grid (``scaling="pi"``); registers
``VisionRotaryEmbedding(head_dim // 2, 2, theta=reg_theta)`` with ``reg_theta = 100`` and 4 registers (a square count
is asserted); the class token unrotated. Its learned absolute embedding is ``pe="learned+vit5_rope"`` with
``no_embed_class=True`` (ViT-5 adds it to the patches only).
"""
from __future__ import annotations

import math

import torch

from .._checks import angle_dtype, check_nonnegative_int, check_number
from ..coords import CoordinateSystem
from ..grid import Grid
from .conventions import AXIAL_CONVENTIONS, PER_HEAD_LAYOUTS, ChannelLayout, ResolutionScaling, check_records
from .rope import AxialRoPE, axial_frequencies


def register_shape(num_registers: int, ndim: int) -> tuple[int, ...]:
    """The registers' own grid: ``sqrt(R) x sqrt(R)`` (in 3D ``(1, r, r)``), a line of ``R`` in 1D; ``()`` for none."""
    if num_registers == 0:
        return ()
    if ndim == 1:
        return (num_registers,)
    side = math.isqrt(num_registers)
    if side * side != num_registers:
        raise ValueError(f"num_registers={num_registers} must be a square (ViT-5 lays its registers on a sqrt(R) x "
                         f"sqrt(R) grid): 1, 4, 9, 16, ...")
    return (1,) * (ndim - 2) + (side, side)


class RegisterRoPE(AxialRoPE):
    """ViT-5's RoPE: ``pe(q, k, grid) -> (q, k)``; the last ``num_registers`` of the grid's prefix tokens are rotated
    by their place on the register grid (``register_theta``), the patches as :class:`~visionpe.rotary.rope.AxialRoPE`
    (``theta``, ``axis_order``, ``scaling``, coordinates and their augmentation: the registers take none of those)."""

    refused = AXIAL_CONVENTIONS + PER_HEAD_LAYOUTS  # ViT-5's axial RoPE

    def __init__(self, *, head_dim: int, num_heads: int = 1, ndim: int = 2, theta: float = 10000.0,
                 num_registers: int = 4, register_theta: float = 100.0, ref_shape=None,
                 channels: ChannelLayout = ChannelLayout(axis_order="ij"),
                 coordinates: CoordinateSystem = CoordinateSystem(),
                 resolution: ResolutionScaling = ResolutionScaling()):
        check_records("RegisterRoPE", RegisterRoPE.refused, channels=channels, coordinates=coordinates,
                      resolution=resolution)
        self.num_registers = check_nonnegative_int("num_registers", num_registers)
        self.register_theta = check_number("register_theta", register_theta, minimum=1.0, inclusive=False)
        super().__init__(head_dim=head_dim, num_heads=num_heads, ndim=ndim, theta=theta, ref_shape=ref_shape,
                         channels=channels, coordinates=coordinates, resolution=resolution)
        self.register_shape = register_shape(self.num_registers, self.ndim)

    @classmethod
    def for_model(cls, context, **kwargs) -> "RegisterRoPE":
        """In a model ``num_registers`` defaults to the model's register tokens (:attr:`ModelContext.num_registers`);
        more than the model has is a ValueError when the model is built, not at its first forward."""
        wanted = kwargs.get("num_registers")
        if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > context.num_registers:
            raise ValueError(f"pe keyword num_registers={wanted} for vit5_rope, but the model has "
                             f"{context.num_registers} register tokens: give the model {wanted} (timm: "
                             f"reg_tokens={wanted}) or leave num_registers out (the model gives it)")
        return super().for_model(context, **kwargs)

    def register_rotations(self, device=None) -> torch.Tensor:
        """The registers' rotations ``(num_registers, 1, pairs, 2)`` float32 ``(cos, sin)``, row-major on their grid."""
        wide = angle_dtype(device)
        coords = Grid(self.register_shape).coords(device, wide)  # (R, ndim) grid order
        coords = coords.flip(-1) if self.axis_order == "xy" else coords
        freqs = axial_frequencies(self.components(self.sections), self.register_theta, wide)  # radians per index
        angles = torch.einsum("na,ahp->nhp", coords, freqs.to(device))
        return torch.stack([angles.cos(), angles.sin()], dim=-1).float()

    def prefix_rotations(self, prefix: int, device) -> torch.Tensor:
        if prefix < self.num_registers:
            raise ValueError(f"vit5_rope puts the last num_registers={self.num_registers} prefix tokens (ViT-5's "
                             f"registers) on a {self.register_shape} grid, but the grid has prefix={prefix}: give the "
                             f"model {self.num_registers} register tokens (timm: reg_tokens={self.num_registers}) or "
                             "build with the model's num_registers")
        others = super().prefix_rotations(prefix - self.num_registers, device)
        return torch.cat([others, self.register_rotations(device)]) if self.num_registers else others

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_registers={self.num_registers}, register_theta={self.register_theta}"
