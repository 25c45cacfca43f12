"""Hugging Face transformers' DINOv3 vision tower (``DINOv3ViTModel``, transformers >= 4.56) with visionpe encodings.

The patched model is :class:`~visionpe.backbones.hf.GridViTModel`'s forward on DINOv3's modules, kept under their
names: the class token and the registers are the grid's prefix (not rotated, as DINOv3 leaves them), the patch
projection is ``embeddings.patch_embeddings``, the layers ``model.layer`` (transformers 4: ``layer``; layer scale,
drop path, MLP or gated MLP), the final ``norm``, ``pooler_output`` the normed class token. DINOv3 has no position table: its RoPE
(``rope_embeddings``, buffers only) gives way to the encodings put in.

``pe="native"`` is DINOv3's own RoPE read from the model's config: ``rope_axial`` on patch centres normalised to
[-1, 1] per axis (``coords="normalized"``, ``normalize_coords="separate"``), ``theta=config.rope_theta`` (periods
``theta ** (i / (head_dim / 4))``), y pairs then x pairs in the rotate-half layout, and the training-time
``pos_embed_shift`` / ``pos_embed_jitter`` / ``pos_embed_rescale`` as ``shift_coords`` / ``jitter_coords`` /
``rescale_coords`` (the ``dinov3`` preset's scheme).
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.models.dinov3_vit.modeling_dinov3_vit import DINOv3ViTLayer, DINOv3ViTModel

from .adapter import GLOBAL_REFUSES, Adapter, register_adapter
from .hf import CheckpointsCarryDraws, GridAttention, GridViTModel, init_weights, layer_scale_forward, put_vit_encodings
from .hf_pretrained import register_conversions


def pair(value) -> tuple:
    """A config's size: one int for both sides, or (height, width)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


class GridDINOv3Layer(CheckpointsCarryDraws, DINOv3ViTLayer):
    """transformers ``DINOv3ViTLayer`` whose forward takes the token layout and returns the attention weights."""

    forward = layer_scale_forward


class DINOv3ViTModelPE(GridViTModel, DINOv3ViTModel):
    """transformers ``DINOv3ViTModel`` with visionpe encodings (:class:`~visionpe.backbones.hf.GridViTModel`)."""

    layer_classes = {DINOv3ViTLayer: GridDINOv3Layer}
    prefix_positions = False  # no table: a learned one put in has rows for the patches only

    def prefix_tokens(self) -> list[torch.Tensor]:
        return [self.embeddings.cls_token, self.embeddings.register_tokens]

    def patch_projection(self) -> nn.Conv2d:
        return self.embeddings.patch_embeddings

    def grid_layers(self) -> nn.ModuleList:
        """transformers 5's ``model.layer`` (inside an encoder module), 4's ``layer``."""
        encoder = getattr(self, "model", None)
        return self.layer if encoder is None else encoder.layer

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def pool(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return sequence_output[:, 0]

    def position_table(self) -> None:
        return None

    def train_grid(self) -> tuple[int, int]:
        return tuple(s // p for s, p in zip(pair(self.config.image_size), pair(self.config.patch_size)))

    def drop_positions(self) -> None:
        self.rope_embeddings = None


def native_dinov3(model: DINOv3ViTModel) -> tuple[str, dict]:
    """DINOv3's RoPE as visionpe's ``rope_axial`` keywords, read from the model's config."""
    config = model.config
    augment = {name: float(value) for name, value in (("shift_coords", config.pos_embed_shift),
                                                       ("jitter_coords", config.pos_embed_jitter),
                                                       ("rescale_coords", config.pos_embed_rescale))
               if value is not None}
    return "rope_axial", dict(theta=float(config.rope_theta), coords="normalized", normalize_coords="separate",
                              axis_order="ij", pairs="half", **augment)


def apply_dinov3(model: DINOv3ViTModel, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a transformers DINOv3 model in place."""
    put_vit_encodings(model, names, kwargs, DINOv3ViTModelPE)


register_adapter(Adapter(DINOv3ViTModel, DINOv3ViTModelPE, apply_dinov3, (GridAttention,), library="transformers",
                         native=native_dinov3, refuses=GLOBAL_REFUSES, init_weights=init_weights))
register_conversions(DINOv3ViTModelPE, DINOv3ViTModel)
