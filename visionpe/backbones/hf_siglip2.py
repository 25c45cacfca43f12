"""Hugging Face transformers' SigLIP 2 vision tower (NaFlex: ``transformers.models.siglip2``, transformers >= 5) with
visionpe encodings, on batches of images of different sizes.

The tower is ``Siglip2VisionModel`` itself in recent transformers 5 releases, and ``Siglip2VisionTransformer``
(``Siglip2VisionModel.vision_model``) in the first ones; the patched class (:class:`Siglip2VisionTowerPE`) is
:class:`~visionpe.backbones.hf.GridViTModel`'s machinery on the tower's modules, kept under their names: the patch
projection ``embeddings.patch_embedding`` (an ``nn.Linear`` on patchified pixels), the layers ``encoder.layers``
(``layer_norm1``, ``self_attn`` with ``q_proj``/``k_proj``/``v_proj``/``out_proj``, ``layer_norm2``, ``mlp``), the
final ``post_layernorm`` and the attention-pooling ``head`` (``vision_use_head``). There is no class token: the grid
has no prefix. The wrappers around a tower (``Siglip2ForImageClassification``, and the first releases'
``Siglip2VisionModel``) are patched as transformers' task models are (:func:`~visionpe.backbones.hf.task_model`), with
their forward unchanged.

Inputs are NaFlex's: ``forward(pixel_values, pixel_attention_mask, spatial_shapes)`` with ``pixel_values: (B, L,
C * p * p)`` patchified and padded to ``L = max_num_patches``, ``pixel_attention_mask: (B, L)`` (nonzero = a real
patch) and ``spatial_shapes: (B, 2)`` each image's patch grid ``(h, w)``, its ``h * w`` patches first (row-major).
Each image gets its own :class:`~visionpe.Grid`: a batch of one grid without padding runs on that grid, any other on
a :class:`~visionpe.grid.MixedLayout` padded to ``L``, so every encoding (tokens, rotary, bias) runs once per
distinct grid on its images' real tokens and padded keys are masked, in every layer and in the pooling head. Outputs
at padded slots are computed but mean nothing (transformers' mean nothing either).

``pe="native"`` (or ``"learned"``) is SigLIP 2's own table: ``learned`` takes over ``embeddings.position_embedding``
(``num_patches`` rows, a square table) and resizes it to each image's grid as the ``siglip2`` preset does (bilinear,
``align_corners=False``, antialias), so outputs equal transformers' at every grid. One difference, stated as in the
preset: transformers adds the image's first position vector to the padding slots, visionpe none (no real token
attends to a padded one in either).
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.models.siglip2 import modeling_siglip2
from transformers.models.siglip2.modeling_siglip2 import (Siglip2EncoderLayer, Siglip2ForImageClassification,
                                                          Siglip2VisionModel)

from ..coords import shares_draws
from ..grid import Grid, Layout, MixedLayout
from ..presets import get_preset
from .adapter import GLOBAL_REFUSES, Adapter, register_adapter
from .hf import (CheckpointsCarryDraws, GridAttention, GridViTModel, apply_task_model, init_weights, key_mask,
                 put_vit_encodings, task_model)
from .hf_pretrained import register_conversions

# the first transformers 5 releases keep the tower in Siglip2VisionModel.vision_model; later ones flattened it
TOWER = getattr(modeling_siglip2, "Siglip2VisionTransformer", Siglip2VisionModel)
WRAPPERS = tuple(cls for cls in (Siglip2VisionModel, Siglip2ForImageClassification) if cls is not TOWER)
# how SigLIP 2 resizes its table (the siglip2 preset's conventions, without its 16x16 grid: a model's table is its own)
RESIZE = {k: v for k, v in get_preset("siglip2").encodings["tokens"][1].items() if k not in ("ndim", "grid_shape")}


class GridSiglip2Layer(CheckpointsCarryDraws, Siglip2EncoderLayer):
    """transformers ``Siglip2EncoderLayer`` (pre-norm: ``layer_norm1``, ``self_attn``, residual; ``layer_norm2``,
    ``mlp``, residual) whose forward takes the token layout and returns the attention weights:
    ``layer(x, attention_mask, layout=, output_attentions=) -> (x, weights)``."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                layout: Grid | Layout | MixedLayout | None = None, output_attentions: bool = False, **kwargs):
        attended, weights = self.self_attn(self.layer_norm1(hidden_states), layout, attention_mask, output_attentions)
        hidden_states = hidden_states + attended
        return hidden_states + self.mlp(self.layer_norm2(hidden_states)), weights


def naflex_layout(spatial_shapes: torch.Tensor, length: int, grid_offset=None) -> Layout | MixedLayout:
    """The layout of a NaFlex batch: each image's grid ``spatial_shapes[b] = (h, w)`` (read on the host), its
    ``h * w`` tokens first; one grid that fills the ``length`` tokens is that grid, anything else a
    :class:`~visionpe.grid.MixedLayout` padded to ``length``."""
    grids = tuple(Grid(tuple(shape), offset=grid_offset) for shape in spatial_shapes.tolist())
    if len(set(grids)) == 1 and grids[0].num_tokens == length:
        return Layout(grids[0])
    return MixedLayout(grids, length=length)


class GridSiglip2Model(GridViTModel):
    """Mixin of the patched SigLIP 2 tower: NaFlex inputs, a grid per image (:func:`naflex_layout`), the layers of
    :class:`~visionpe.backbones.hf.GridViTModel`, ``post_layernorm`` and the pooling head over the real patches.

    ``forward(pixel_values, pixel_attention_mask=None, spatial_shapes=None, output_attentions=None,
    output_hidden_states=None, return_dict=None, grid_offset=None)`` -> ``BaseModelOutputWithPooling`` (or its
    tuple): ``last_hidden_state (B, L, D)``, ``pooler_output (B, D)`` (None without ``vision_use_head``),
    ``hidden_states`` and ``attentions`` as :class:`~visionpe.backbones.hf.GridViTModel`'s. ``attention_mask`` is
    accepted for ``pixel_attention_mask`` (the first transformers 5 towers' name). Without ``pixel_attention_mask``
    the padding (beyond each image's ``h * w`` patches) is still masked, in the layers and the head.
    """

    layer_classes = {Siglip2EncoderLayer: GridSiglip2Layer}
    attention_name = "self_attn"
    tokens_defaults = RESIZE

    def prefix_tokens(self) -> list[torch.Tensor]:
        return []

    def patch_projection(self) -> nn.Linear:
        return self.embeddings.patch_embedding

    def grid_layers(self) -> nn.ModuleList:
        return self.encoder.layers

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.post_layernorm(x)

    def pool(self, sequence_output: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """The attention-pooling head over the tokens ``mask: (B, L)`` keeps (all without one), or None."""
        return self.head(sequence_output, mask) if self.use_head else None

    def position_table(self) -> torch.Tensor | None:
        """``embeddings.position_embedding``'s rows ``(1, N, D)``, a square grid row-major."""
        table = self.embeddings.position_embedding
        return None if table is None else table.weight[None]

    def train_grid(self) -> tuple[int, int]:
        side = self.embeddings.position_embedding_size
        return side, side

    def drop_positions(self) -> None:
        self.embeddings.position_embedding = None

    def check_input(self, x: torch.Tensor) -> None:
        """``x``: patchified pixels ``(B, L, C * p * p)``, floating."""
        width = self.patch_projection().in_features
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[2] != width or not x.is_floating_point():
            got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"pixel_values must be floating patchified pixels (batch, max_num_patches, "
                             f"channels * patch * patch = {width}), as SigLIP 2's image processor gives, got {got}")

    def check_naflex(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None,
                     spatial_shapes: torch.Tensor | None) -> None:
        """NaFlex's inputs fit together: ``spatial_shapes (B, 2)`` positive integers with ``h * w <= L``,
        ``pixel_attention_mask`` None or ``(B, L)`` marking at most each image's ``h * w`` patches (more would let
        padding attend as patches without a position)."""
        self.check_input(pixel_values)
        batch, length = pixel_values.shape[:2]
        if not isinstance(spatial_shapes, torch.Tensor) or tuple(spatial_shapes.shape) != (batch, 2) \
                or spatial_shapes.is_floating_point() or spatial_shapes.is_complex() \
                or spatial_shapes.dtype == torch.bool:
            got = (f"{spatial_shapes.dtype} of shape {tuple(spatial_shapes.shape)}"
                   if isinstance(spatial_shapes, torch.Tensor) else repr(spatial_shapes))
            raise ValueError(f"spatial_shapes must be an integer (batch={batch}, 2) tensor of each image's patch grid "
                             f"(h, w), got {got}")
        if bool((spatial_shapes < 1).any()) or bool((spatial_shapes.prod(-1) > length).any()):
            raise ValueError(f"spatial_shapes must hold positive (h, w) with h * w <= max_num_patches={length}, got "
                             f"{spatial_shapes.tolist()}")
        if pixel_attention_mask is not None and (not isinstance(pixel_attention_mask, torch.Tensor)
                                                 or tuple(pixel_attention_mask.shape) != (batch, length)):
            got = tuple(getattr(pixel_attention_mask, "shape", ()))
            raise ValueError(f"pixel_attention_mask must be (batch, max_num_patches) = {(batch, length)}, got {got}")
        if pixel_attention_mask is not None:
            marked, patches = (pixel_attention_mask != 0).sum(-1), spatial_shapes.prod(-1)
            over = [b for b in range(batch) if int(marked[b]) > int(patches[b])]
            if over:
                b = over[0]
                raise ValueError(f"pixel_attention_mask marks {int(marked[b])} tokens of image {b} as patches, more "
                                 f"than its spatial_shapes {tuple(spatial_shapes[b].tolist())} = {int(patches[b])}: "
                                 f"the padding after them would attend as patches without a position")

    def embed(self, pixel_values: torch.Tensor, spatial_shapes: torch.Tensor,
              grid_offset=None) -> tuple[torch.Tensor, Layout | MixedLayout]:
        """Patchified pixels -> tokens ``(B, L, D)`` with position (each image's on its own grid; padding none),
        and their layout."""
        projection = self.patch_projection()
        x = projection(pixel_values.to(projection.weight.dtype))  # (B, L, D)
        layout = naflex_layout(spatial_shapes, x.shape[1], grid_offset)
        if self.pe_tokens is not None and self.pe_tokens.block_index == 0:
            x = layout.per_grid(x, self.pe_tokens) if isinstance(layout, MixedLayout) else \
                self.pe_tokens(x, layout.grid)
        return x, layout

    @shares_draws
    def forward(self, pixel_values: torch.Tensor | None = None, pixel_attention_mask: torch.Tensor | None = None,
                spatial_shapes: torch.Tensor | None = None, output_attentions: bool | None = None,
                output_hidden_states=None, return_dict: bool | None = None, grid_offset=None,
                attention_mask: torch.Tensor | None = None, **kwargs):
        if attention_mask is not None:
            if pixel_attention_mask is not None:
                raise ValueError("give the padding mask once: pixel_attention_mask or attention_mask, not both")
            pixel_attention_mask = attention_mask
        config = self.config
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = config.return_dict if return_dict is None else return_dict
        self.check_naflex(pixel_values, pixel_attention_mask, spatial_shapes)
        x, layout = self.embed(pixel_values, spatial_shapes, grid_offset)
        x, hidden_states, attentions = self.run_layers(x, layout, key_mask(pixel_attention_mask, x.shape[1]),
                                                       output_attentions, output_hidden_states)
        sequence_output = self.final_norm(x)
        if pixel_attention_mask is None and isinstance(layout, MixedLayout):
            pixel_attention_mask = layout.key_mask(x.device)  # the head pools the real patches only
        out = BaseModelOutputWithPooling(last_hidden_state=sequence_output,
                                         pooler_output=self.pool(sequence_output, pixel_attention_mask),
                                         hidden_states=hidden_states, attentions=attentions)
        return out if return_dict else out.to_tuple()


class Siglip2VisionTowerPE(GridSiglip2Model, TOWER):
    """transformers' SigLIP 2 vision tower (``Siglip2VisionModel``; ``Siglip2VisionTransformer`` in the first
    transformers 5 releases) with visionpe encodings (:class:`GridSiglip2Model`)."""


def apply_siglip2(model: nn.Module, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a transformers SigLIP 2 vision tower in place."""
    put_vit_encodings(model, names, kwargs, Siglip2VisionTowerPE)


RECORD = dict(library="transformers", native="learned", refuses=GLOBAL_REFUSES, init_weights=init_weights)
register_adapter(Adapter(TOWER, Siglip2VisionTowerPE, apply_siglip2, (GridAttention,), **RECORD))
WRAPPER_MODELS = {cls: task_model(cls, tower="vision_model") for cls in WRAPPERS}
for _base, _patched in WRAPPER_MODELS.items():
    register_adapter(Adapter(_base, _patched, apply_task_model, (GridAttention,), **RECORD))
register_conversions(Siglip2VisionTowerPE, TOWER)
