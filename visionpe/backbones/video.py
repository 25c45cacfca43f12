"""Video: a timm ViT on tubelets (ViViT / VideoMAE style), with any encoding on the (T, H, W) grid.

``create_video_model`` swaps the image patch embedding for a 3D tubelet embedding; the rest of the timm
ViT and the encodings are the same code as for images, on a 3-axis :class:`~visionpe.Grid`.
``inflate_patch_embed`` turns a 2D patch embedding into a tubelet one (I3D: weights repeated over time
and divided by the tubelet length, so a static clip gives the image's tokens).
"""
from __future__ import annotations

import timm
import torch
from torch import nn

from .._checks import check_divisible, check_positive_int, to_shape
from ..weights.convert import inflate_patch_weight
from ..presets import conventions_of
from .adapter import check_grid_fits, check_model_sizes, default_sections, parse_pe, route_kwargs
from .api import apply


class TubeletEmbed(nn.Module):
    """Non-overlapping ``(t, p, p)`` tubelets -> tokens: ``(B, C, T, H, W) -> (B, T/t, H/p, W/p, D)``.

    Exposes ``patch_size`` (the tubelet), ``grid_size`` and ``num_patches`` as timm's ``PatchEmbed`` does.
    """

    def __init__(self, num_frames: int = 8, img_size=224, tubelet_size=(2, 16, 16), in_chans: int = 3,
                 embed_dim: int = 768):
        super().__init__()
        self.patch_size = to_shape("tubelet_size", tubelet_size, 3)
        self.img_size = (num_frames, *to_shape("img_size", img_size, 2))
        self.grid_size = tuple(s // p for s, p in zip(self.img_size, self.patch_size))
        self.num_patches = self.grid_size[0] * self.grid_size[1] * self.grid_size[2]
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)
        self.norm = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 4, 1))  # (B, D, T, H, W) -> (B, T, H, W, D)


@torch.no_grad()
def inflate_patch_embed(patch_embed: nn.Module, tubelet: TubeletEmbed) -> TubeletEmbed:
    """Copy a 2D ``PatchEmbed``'s conv into ``tubelet``: ``w3d[:, :, i] = w2d / t`` for each of the ``t`` frames."""
    weight = patch_embed.proj.weight  # (D, C, p, p)
    if weight.shape[-2:] != tubelet.proj.weight.shape[-2:]:
        raise ValueError(f"patch size {tuple(weight.shape[-2:])} differs from tubelet {tubelet.patch_size[1:]}")
    tubelet.proj.weight.copy_(inflate_patch_weight(weight, tubelet.patch_size[0]))
    if patch_embed.proj.bias is not None:
        tubelet.proj.bias.copy_(patch_embed.proj.bias)
    return tubelet


def create_video_model(model_name: str, pe: str = "rope_axial", num_frames: int = 8, tubelet_size=(2, 16, 16),
                       pe_kwargs: dict | None = None, attention: str = "auto", **timm_kwargs) -> nn.Module:
    """A timm ViT that takes clips ``(B, C, T, H, W)``, with the encoding ``pe`` on the 3D token grid.

    >>> model = create_video_model("vit_tiny_patch16_224", pe="rope_mixed", num_frames=8, img_size=32,
    ...                            tubelet_size=(2, 8, 8), num_classes=10)
    >>> model(torch.randn(1, 3, 8, 32, 32)).shape
    torch.Size([1, 10])

    Any clip length and frame size divisible by the tubelet works at run time. A rotary encoding whose head_dim
    does not split into three equal bands gets :func:`~visionpe.rotary.sections.video_sections` unless ``pe_kwargs``
    sets ``sections`` (or the encoding has no per-axis channels: :func:`~visionpe.backbones.adapter.default_sections`).
    ``attention``: every attention's :func:`visionpe.attend` choice (see :func:`~visionpe.apply`).
    """
    names = parse_pe(pe)
    route_kwargs(names, {} if pe_kwargs is None else pe_kwargs)
    if not isinstance(model_name, str) or not timm.is_model(model_name) \
            or not timm.models.is_model_in_modules(model_name, ["vision_transformer"]):
        raise ValueError(f"model_name={model_name!r}: video models are built on timm ViTs (vit_*, deit_*)")
    tubelet_size = to_shape("tubelet_size", tubelet_size, 3)
    check_positive_int("num_frames", num_frames)
    check_model_sizes(timm_kwargs)
    check_divisible("num_frames", num_frames, tubelet_size[0], f"whole tubelets of tubelet_size={tubelet_size}")
    check_grid_fits({**timm_kwargs, "patch_size": tubelet_size[1:]}, num_frames, tubelet_size[0])
    if "img_size" in timm_kwargs:
        img_size = to_shape("img_size", timm_kwargs["img_size"], 2)
        if any(s % t for s, t in zip(img_size, tubelet_size[1:])):
            raise ValueError(f"img_size={timm_kwargs['img_size']!r} must be a multiple of the tubelet's frame patch "
                             f"{tubelet_size[1:]} (tubelet_size={tubelet_size})")
    model = timm.create_model(model_name, pretrained=timm_kwargs.pop("pretrained", False),
                              patch_size=tubelet_size[1:], **timm_kwargs)
    tubelet = TubeletEmbed(num_frames, model.patch_embed.img_size, tubelet_size,
                           model.patch_embed.proj.in_channels, model.embed_dim)
    model.patch_embed = inflate_patch_embed(model.patch_embed, tubelet)
    model.pos_embed = None  # the 2D table has no meaning on a 3D grid; apply() builds the chosen encoding
    pe_kwargs = dict(pe_kwargs or {})
    head_dim = model.blocks[0].attn.head_dim
    if "sections" not in pe_kwargs and "sections" not in conventions_of(names).get(names.get("rotary"), {}):
        pe_kwargs.update(default_sections(names.get("rotary"), head_dim))
    return apply(model, pe, attention, **pe_kwargs)
