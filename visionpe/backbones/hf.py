"""Hugging Face transformers' image transformers with visionpe encodings, at any input size: ViT (``ViTModel``,
``ViTForImageClassification``), DeiT (``DeiTModel``, ``DeiTForImageClassification``,
``DeiTForImageClassificationWithTeacher``), DINOv2 (``Dinov2Model``, ``Dinov2ForImageClassification``) and Swin
(``SwinModel``, ``SwinForImageClassification``).

``pip install visionpe[hf]``. This module is imported (and its adapters registered) once transformers is
imported (:mod:`visionpe._import_hook`); the rest of visionpe never imports it. It follows transformers' 5.x module
layout (attentions with
``q_proj``/``k_proj``/``v_proj``/``o_proj``; a ViT's layers in ``layers``, DINOv2's in ``encoder.layer``; Swin's
``encoder.layers[i].blocks``).

ViT, DeiT, DINOv2 (global attention). The patched base model's ``forward`` embeds the image, builds the
:class:`~visionpe.Grid` (``prefix`` = the class token, and DeiT's distillation token) and runs the layers itself,
passing the layout to every layer (:class:`GridViTLayer`, :class:`GridDinov2Layer`: transformers' layers with the
same pieces in the same order) and from there to its :class:`GridAttention` (transformers' projections, names kept;
SDPA over the call's layout with the block's rotary and bias encodings). Nothing is stored between calls.
``embeddings.position_embeddings`` (class rows, then the patch grid) is removed; ``pe="learned"`` takes it over, with
transformers' resampling at other sizes (its ``interpolate_pos_encoding``: bicubic to the new grid's size,
``align_corners=False``, no antialias, computed in float32 as DINOv2's), so logits equal transformers' at every size it
runs.
Outputs keep their meaning: ``last_hidden_state`` (after the final norm), ``pooler_output``, ``hidden_states`` (the
embeddings, then each layer's output, before the final norm; ``output_hidden_states`` may select indices, as in
transformers) and ``attentions`` (each layer's softmax probabilities ``(B, heads, T, T)``, given whenever
``output_attentions`` is asked: transformers' SDPA attention gives none, its eager attention gives the same).
``bool_masked_pos`` replaces the masked patch tokens by the mask token before position is added, as transformers
does (a replacement: every token keeps its position); ``attention_mask`` ``(B, T)`` (nonzero = attend) or a prepared
4-D mask is applied in every layer. ``interpolate_pos_encoding`` is accepted and has no effect: every size runs,
with each encoding's own adaptation. ``config._attn_implementation`` is not used (attention is always visionpe's
SDPA); ``grid_offset`` shifts the grid (a crop of a larger image).

Swin (window attention). Swin's windows are fixed grids, so the encodings are built per block for its window, as in
timm's Swin; ``swin_bias`` takes over transformers' ``relative_position_bias_table``. transformers' ``SwinLayer``
shrinks its window and drops its shift by writing to the layer when a feature map is no larger than the window, and
never restores them (a later larger input keeps the small window, and concurrent calls race);
:class:`GridSwinLayer` computes the window and shift per call from the configured ones with transformers' rule, and
passes the window's grid to its attention. transformers' stages, encoder, model and outputs run unchanged.
``use_absolute_embeddings=True`` (a tokens table on Swin) is not supported.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.models.deit.modeling_deit import (DeiTForImageClassification, DeiTForImageClassificationWithTeacher,
                                                    DeiTLayer, DeiTModel)
from transformers.models.dinov2.modeling_dinov2 import Dinov2ForImageClassification, Dinov2Layer, Dinov2Model
from transformers.models.swin.modeling_swin import SwinForImageClassification, SwinLayer, SwinModel, SwinStage
from transformers.models.vit.modeling_vit import ViTForImageClassification, ViTLayer, ViTModel

from ..attention import attend
from ..coords import shares_draws, with_draws
from ..encoding import ModelContext, constructor_keywords
from ..grid import Grid, Layout
from ..registry import ENCODINGS
from .adapter import (GLOBAL_REFUSES, WINDOW_FAMILIES, WINDOW_REFUSES, Adapter, EncodingSet, PositionalModel,
                      adapter_for, build_tokens, check_input, register_adapter)
from .swin import take_over_bias
from .windows import shift_mask


class GridAttention(nn.Module):
    """Replaces a transformers ViT/DeiT/DINOv2/Swin attention: its ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``
    (names kept, so the model's state dict keys are transformers'), ``num_attention_heads``, ``head_dim`` (scale
    ``head_dim ** -0.5``) and ``attention_dropout``; ``rotary`` and ``bias`` hold the block's encodings.

    Call: ``attn(x, layout, attention_mask=None, output_attentions=False) -> (out, weights)`` with
    ``x: (B, T, dim)`` and ``layout`` the call's grid; ``attention_mask`` broadcastable to ``(B, heads, T, T)``
    (boolean: True = attend, or additive); ``weights: (B, heads, T, T)`` the softmax probabilities (after dropout, as
    transformers' eager attention returns them) when ``output_attentions``, else None.
    """

    attention: str = "auto"  # visionpe.attend's choice (visionpe.set_attention)

    def __init__(self, source: nn.Module, rotary: nn.Module | None = None, bias: nn.Module | None = None):
        super().__init__()
        self.num_attention_heads, self.head_dim = source.num_attention_heads, source.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = source.q_proj, source.k_proj, source.v_proj, source.o_proj
        self.attention_dropout = source.attention_dropout
        self.rotary, self.bias = rotary, bias

    def forward(self, x: torch.Tensor, layout: Grid | Layout, attention_mask: torch.Tensor | None = None,
                output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = (rearrange(proj(x), "b t (h d) -> b h t d", h=self.num_attention_heads)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        dropout_p = self.attention_dropout if self.training else 0.0
        weights = None
        if output_attentions:  # the probabilities are attention applied to the identity: the same path, exactly
            eye = torch.eye(q.shape[2], dtype=q.dtype, device=q.device).expand(*q.shape[:2], -1, -1)
            weights = F.dropout(attend(q, k, eye, layout, self.rotary, self.bias, attention_mask, tokens=x),
                                dropout_p, self.training)
            out = weights @ v
        else:
            out = attend(q, k, v, layout, self.rotary, self.bias, attention_mask, dropout_p=dropout_p,
                         attention=self.attention, tokens=x)
        return self.o_proj(rearrange(out, "b h t d -> b t (h d)")), weights


def carrying_draws(checkpoint_fn):
    """transformers' checkpointing function ``checkpoint_fn(fn, *args)`` with ``fn`` bound to the forward's coordinate
    augmentation draws (:func:`~visionpe.coords.with_draws`): the recomputation in the backward pass reuses them
    instead of drawing new coordinates per layer."""
    if getattr(checkpoint_fn, "carries_draws", False):
        return checkpoint_fn

    @functools.wraps(checkpoint_fn)
    def checkpointed(fn, *args, **kwargs):
        return checkpoint_fn(with_draws(fn), *args, **kwargs)
    checkpointed.carries_draws = True
    return checkpointed


class CheckpointsCarryDraws:
    """Mixin of the patched transformers layers (and Swin stages), which transformers checkpoints one by one
    (``gradient_checkpointing_enable``): the checkpointing function it gives them is :func:`carrying_draws`."""

    def __setattr__(self, name, value):
        if name == "_gradient_checkpointing_func" and callable(value):
            value = carrying_draws(value)
        super().__setattr__(name, value)


def swap_class(module: nn.Module, cls: type) -> None:
    """``module`` becomes a ``cls`` in place; a checkpointing function transformers gave it before is re-wrapped."""
    module.__class__ = cls
    if "_gradient_checkpointing_func" in vars(module):
        module._gradient_checkpointing_func = vars(module)["_gradient_checkpointing_func"]


def pre_norm_forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                     layout: Layout | None = None, output_attentions: bool = False):
    """A ViT/DeiT layer (pre-norm: ``layernorm_before``, attention, ``dropout``, residual; ``layernorm_after``,
    ``mlp``, ``dropout``, residual) on the call's layout: ``(x, weights)``."""
    attended, weights = self.attention(self.layernorm_before(hidden_states), layout, attention_mask,
                                       output_attentions)
    hidden_states = self.dropout(attended) + hidden_states
    return self.dropout(self.mlp(self.layernorm_after(hidden_states))) + hidden_states, weights


class GridViTLayer(CheckpointsCarryDraws, ViTLayer):
    """transformers ``ViTLayer`` whose forward takes the token layout and returns the attention weights:
    ``layer(x, attention_mask, layout=, output_attentions=) -> (x, weights)``."""

    forward = pre_norm_forward


class GridDeiTLayer(CheckpointsCarryDraws, DeiTLayer):
    """transformers ``DeiTLayer`` (ViT's layer) whose forward takes the token layout (as :class:`GridViTLayer`)."""

    forward = pre_norm_forward


class GridDinov2Layer(CheckpointsCarryDraws, Dinov2Layer):
    """transformers ``Dinov2Layer`` (layer scale, drop path, MLP or SwiGLU) whose forward takes the token layout and
    returns the attention weights, as :class:`GridViTLayer`."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                layout: Layout | None = None, output_attentions: bool = False):
        attended, weights = self.attention(self.norm1(hidden_states), layout, attention_mask, output_attentions)
        hidden_states = self.drop_path(self.layer_scale1(attended)) + hidden_states
        return self.drop_path(self.layer_scale2(self.mlp(self.norm2(hidden_states)))) + hidden_states, weights


GRID_LAYERS = {ViTLayer: GridViTLayer, DeiTLayer: GridDeiTLayer, Dinov2Layer: GridDinov2Layer}


def selected_indices(flag, count: int) -> set[int] | None:
    """transformers' ``output_hidden_states``: True (every state, None here) or indices (negatives from the end)."""
    if flag is None or isinstance(flag, bool):
        return None
    chosen = [flag] if isinstance(flag, int) else list(flag)
    return {i % count for i in chosen if -count <= i < count}


def key_mask(attention_mask: torch.Tensor | None, num_tokens: int) -> torch.Tensor | None:
    """transformers' ``attention_mask``: ``(B, T)`` (nonzero = attend) -> a boolean ``(B, 1, 1, T)`` key mask; a
    prepared 4-D mask (boolean, True = attend, or additive) as it is."""
    if attention_mask is None or attention_mask.ndim == 4:
        return attention_mask
    if attention_mask.ndim != 2 or attention_mask.shape[1] != num_tokens:
        raise ValueError(f"attention_mask must be (batch, tokens={num_tokens}) or a 4-D (batch, 1, tokens, tokens) "
                         f"mask, got shape {tuple(attention_mask.shape)}")
    return attention_mask.bool()[:, None, None, :]


class GridViTModel(PositionalModel):
    """Mixin of the patched ViT, DeiT and DINOv2 base models: one forward that builds the grid and runs the layers.

    ``forward(pixel_values, bool_masked_pos=None, interpolate_pos_encoding=None, attention_mask=None,
    grid_offset=None, output_attentions=None, output_hidden_states=None, return_dict=None)`` ->
    ``BaseModelOutputWithPooling`` (or its tuple); ``pixel_values: (B, C, H, W)``, each side a positive multiple
    of the patch. Other keyword arguments (those transformers' classification heads pass along) are ignored, as
    transformers' attention ignores them.
    """

    pe_tokens: nn.Module | None

    def prefix_tokens(self) -> list[torch.Tensor]:
        """The prefix token parameters ``(1, 1, D)``, in sequence order."""
        return [self.embeddings.cls_token]

    def grid_layers(self) -> nn.ModuleList:
        return self.layers

    def pool(self, sequence_output: torch.Tensor) -> torch.Tensor | None:
        return self.pooler(sequence_output) if self.pooler is not None else None

    def check_input(self, x: torch.Tensor) -> None:
        patch = self.embeddings.patch_embeddings
        check_input(x, tuple(patch.patch_size), patch.projection.in_channels, type(self).__name__)

    def embed(self, pixel_values: torch.Tensor, bool_masked_pos: torch.Tensor | None = None,
              grid_offset=None) -> tuple[torch.Tensor, Layout]:
        """Images -> tokens ``(B, P + N, D)`` (prefix tokens first) with position, and their layout."""
        self.check_input(pixel_values)
        projection = self.embeddings.patch_embeddings.projection
        x = projection(pixel_values.to(projection.weight.dtype))  # (B, D, h, w)
        prefix = self.prefix_tokens()
        grid = Grid(tuple(x.shape[2:]), prefix=len(prefix), offset=grid_offset)
        x = rearrange(x, "b d h w -> b (h w) d")
        if bool_masked_pos is not None:
            if self.embeddings.mask_token is None:
                raise ValueError(f"bool_masked_pos needs a mask token; {type(self).__name__} has none (build it with "
                                 "use_mask_token=True)")
            if tuple(bool_masked_pos.shape) != x.shape[:2]:
                raise ValueError(f"bool_masked_pos must be (batch, patches) = {tuple(x.shape[:2])}, got "
                                 f"{tuple(bool_masked_pos.shape)}")
            mask = bool_masked_pos.unsqueeze(-1).type_as(x)
            x = x * (1.0 - mask) + self.embeddings.mask_token.expand(*x.shape[:2], -1) * mask
        x = torch.cat([t.expand(x.shape[0], -1, -1) for t in prefix] + [x], dim=1)
        if self.pe_tokens is not None and self.pe_tokens.block_index == 0:
            x = self.pe_tokens(x, grid)
        return self.embeddings.dropout(x), Layout(grid)

    @shares_draws
    def forward(self, pixel_values: torch.Tensor | None = None, bool_masked_pos: torch.Tensor | None = None,
                interpolate_pos_encoding: bool | None = None, attention_mask: torch.Tensor | None = None,
                grid_offset=None, output_attentions: bool | None = None, output_hidden_states=None,
                return_dict: bool | None = None, **kwargs):
        config = self.config
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = config.return_dict if return_dict is None else return_dict
        x, layout = self.embed(pixel_values, bool_masked_pos, grid_offset)
        mask = key_mask(attention_mask, x.shape[1])
        layers = self.grid_layers()
        keep = selected_indices(output_hidden_states, len(layers) + 1)
        hidden_states = [] if output_hidden_states else None
        attentions = [] if output_attentions else None
        late = self.pe_tokens if self.pe_tokens is not None and self.pe_tokens.block_index > 0 else None
        for i, layer in enumerate(layers):
            if hidden_states is not None:
                hidden_states.append(x if keep is None or i in keep else None)
            if late is not None and i == late.block_index:
                x = late(x, layout.unwrap())
            x, weights = layer(x, mask, layout=layout, output_attentions=bool(output_attentions))
            if attentions is not None:
                attentions.append(weights)
        if hidden_states is not None:
            hidden_states.append(x if keep is None or len(layers) in keep else None)
        sequence_output = self.layernorm(x)
        out = BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=self.pool(sequence_output),
                                         hidden_states=None if hidden_states is None else tuple(hidden_states),
                                         attentions=None if attentions is None else tuple(attentions))
        return out if return_dict else out.to_tuple()


class ViTModelPE(GridViTModel, ViTModel):
    """transformers ``ViTModel`` with visionpe encodings (:class:`GridViTModel`)."""


class DeiTModelPE(GridViTModel, DeiTModel):
    """transformers ``DeiTModel`` with visionpe encodings: class and distillation tokens are the prefix."""

    def prefix_tokens(self) -> list[torch.Tensor]:
        return [self.embeddings.cls_token, self.embeddings.distillation_token]


class Dinov2ModelPE(GridViTModel, Dinov2Model):
    """transformers ``Dinov2Model`` with visionpe encodings; ``pooler_output`` is the normed class token."""

    def grid_layers(self) -> nn.ModuleList:
        return self.encoder.layer

    def pool(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return sequence_output[:, 0]


def apply_vit_like(model: nn.Module, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a transformers ViT/DeiT/DINOv2 base model in place."""
    patched = type(model) if isinstance(model, GridViTModel) else BASE_MODELS[type(model)]
    layers = patched.grid_layers(model)
    for layer in layers:
        if not isinstance(layer, tuple(GRID_LAYERS)):
            raise ValueError(f"layer type {type(layer).__name__} is not supported; supported transformers layers: "
                             f"{', '.join(b.__name__ for b in GRID_LAYERS)}")
        check_attention(layer.attention)
    embeddings = model.embeddings
    patch = embeddings.patch_embeddings
    grid_shape = tuple(i // p for i, p in zip(patch.image_size, patch.patch_size))
    source = layers[0].attention
    context = ModelContext(grid_shape, model.config.hidden_size, source.num_attention_heads, source.head_dim,
                           num_prefix_tokens=len(patched.prefix_tokens(model)), depth=len(layers))
    defaults = {}
    if "tokens" in names and "antialias" in constructor_keywords(ENCODINGS[names["tokens"]]):
        defaults["antialias"] = False  # transformers' interpolate_pos_encoding
    model.pe_tokens = build_tokens(names, kwargs, context, embeddings.position_embeddings,
                                   getattr(model, "pe_tokens", None), **defaults)
    embeddings.position_embeddings = None
    encodings = EncodingSet(names, kwargs)
    for layer in layers:
        swap_class(layer, GRID_LAYERS[next(b for b in GRID_LAYERS if isinstance(layer, b))])
        source = layer.attention
        rotary = encodings.block("rotary", context, getattr(source, "rotary", None))
        bias = encodings.block("bias", context, getattr(source, "bias", None))
        layer.attention = GridAttention(source, rotary, bias)


def check_attention(source: nn.Module) -> None:
    """A transformers attention with separate q/k/v/o projections (transformers >= 5), or an already patched one."""
    if not all(hasattr(source, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "num_attention_heads")):
        raise ValueError(f"attention {type(source).__name__} is not supported: visionpe's transformers adapter needs "
                         "attentions with q_proj, k_proj, v_proj and o_proj (transformers >= 5.24)")


# -- Swin ------------------------------------------------------------------------------------------------------------
def swin_window(size, window: int, shift: int) -> tuple[int, int]:
    """transformers' window and shift for a feature map of ``size = (h, w)``: a map whose shorter side is no longer
    than the window is one unshifted window of that side (square windows, padded along the longer side)."""
    return (min(size), 0) if min(size) <= window else (window, shift)


class GridSwinLayer(CheckpointsCarryDraws, SwinLayer):
    """transformers ``SwinLayer`` whose window and shift are computed per call (``window_size``, ``shift_size`` stay
    the configured ones) and whose attention reads the window's grid. Call as transformers':
    ``layer(x, input_dimensions, always_partition=False, output_attentions=False) -> (x, weights)`` with
    ``x: (B, h * w, C)``; ``weights: (B * windows, heads, n, n)`` or None."""

    def forward(self, hidden_states: torch.Tensor, input_dimensions, always_partition: bool = False,
                output_attentions: bool = False, **kwargs):
        height, width = input_dimensions
        window, shift = (self.window_size, self.shift_size) if always_partition else \
            swin_window(input_dimensions, self.window_size, self.shift_size)
        batch, _, channels = hidden_states.shape
        x = self.layernorm_before(hidden_states).view(batch, height, width, channels)
        x = F.pad(x, (0, 0, 0, -width % window, 0, -height % window))
        padded = tuple(x.shape[1:3])
        if shift:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        windows = rearrange(x, "b (nh wh) (nw ww) c -> (b nh nw) (wh ww) c", wh=window, ww=window)
        mask = None
        if shift:
            mask = shift_mask((1, *padded), (1, window, window), (0, shift, shift), x.device, x.dtype)
            mask = rearrange(mask[None].expand(batch, -1, -1, -1), "b nw n m -> (b nw) 1 n m")
        attended, weights = self.attention(windows, Grid((window, window)), mask, output_attentions)
        x = rearrange(self.dropout(attended), "(b nh nw) (wh ww) c -> b (nh wh) (nw ww) c", b=batch,
                      nh=padded[0] // window, wh=window)
        if shift:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        x = x[:, :height, :width].reshape(batch, height * width, channels)
        hidden_states = hidden_states + self.drop_path(x)
        return self.dropout(self.mlp(self.layernorm_after(hidden_states))) + hidden_states, weights


class GridSwinStage(CheckpointsCarryDraws, SwinStage):
    """transformers ``SwinStage`` whose checkpointing carries the coordinate draws (:class:`CheckpointsCarryDraws`)."""


class SwinModelPE(PositionalModel, SwinModel):
    """transformers ``SwinModel`` with visionpe encodings inside its windows; takes what transformers takes:
    ``(B, C, H, W)`` of any size (padded to whole patches and windows). ``output_attentions`` defaults to the
    config's, as transformers'."""

    def check_input(self, x: torch.Tensor) -> None:
        check_input(x, (1, 1), self.embeddings.patch_embeddings.projection.in_channels, type(self).__name__)

    @shares_draws
    def forward(self, pixel_values: torch.Tensor | None = None, *args, **kwargs):
        self.check_input(pixel_values)
        kwargs.setdefault("output_attentions", self.config.output_attentions)
        return super().forward(pixel_values, *args, **kwargs)


def apply_swin(model: SwinModel, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into every window attention of a transformers Swin, in place."""
    if model.embeddings.position_embeddings is not None:
        raise ValueError("a Swin with use_absolute_embeddings=True is not supported: its absolute table is a tokens "
                         "encoding, and Swin windows take rotary and bias encodings (build it with the default "
                         "use_absolute_embeddings=False)")
    layers = [(index, layer) for stage in model.encoder.layers for index, layer in enumerate(stage.blocks)]
    for _, layer in layers:
        check_attention(layer.attention)
    for stage in model.encoder.layers:
        swap_class(stage, GridSwinStage)
    encodings = EncodingSet(names, kwargs)
    window = model.config.window_size
    for index, layer in layers:
        # the configured window and shift (transformers' layer may have shrunk them for good in an earlier call)
        layer.window_size, layer.shift_size = window, 0 if index % 2 == 0 else window // 2
        swap_class(layer, GridSwinLayer)
        source = layer.attention
        context = ModelContext((window, window), source.q_proj.in_features, source.num_attention_heads,
                               source.head_dim)
        rotary = encodings.block("rotary", context, getattr(source, "rotary", None))
        bias = encodings.block("bias", context, getattr(source, "bias", None))
        take_over_bias(bias, getattr(source, "relative_position_bias", None))
        layer.attention = GridAttention(source, rotary, bias)


# -- the task models: a transformers head around a patched base model --------------------------------------------------
class GridTaskModel(PositionalModel):
    """Mixin of the patched task models (``...ForImageClassification``): the base model (``base_model_prefix``:
    ``vit``, ``deit``, ``dinov2``, ``swin``) is patched, transformers' forward runs unchanged around it."""

    @property
    def pe_tokens(self) -> nn.Module | None:
        return getattr(self.base_model, "pe_tokens", None)

    @property
    def pe(self) -> str:
        return self.base_model.pe

    @pe.setter
    def pe(self, value: str) -> None:
        self.base_model.pe = value

    def check_input(self, x: torch.Tensor) -> None:
        self.base_model.check_input(x)


def apply_task_model(model: nn.Module, names: dict, kwargs: dict) -> None:
    """Patch a task model's base model (its adapter's class and encodings); the head and its weights stay."""
    base = model.base_model
    adapter = adapter_for(base)
    adapter.put_encodings(base, names, kwargs)
    base.__class__ = adapter.patched


def task_model(cls: type) -> type:
    """The patched class of a transformers task model class."""
    return type(f"{cls.__name__}PE", (GridTaskModel, cls),
                {"__doc__": f"transformers ``{cls.__name__}`` around a patched base model, with visionpe encodings.",
                 "__module__": __name__})


BASE_MODELS = {ViTModel: ViTModelPE, DeiTModel: DeiTModelPE, Dinov2Model: Dinov2ModelPE}
GLOBAL_RECORD = dict(library="transformers", native="learned", refuses=GLOBAL_REFUSES,
                     init_weights=lambda model: model.init_weights())
WINDOW_RECORD = dict(library="transformers", native="swin_bias", families=WINDOW_FAMILIES, refuses=WINDOW_REFUSES,
                     init_weights=lambda model: model.init_weights())
for _base, _patched in BASE_MODELS.items():
    register_adapter(Adapter(_base, _patched, apply_vit_like, (GridAttention,), **GLOBAL_RECORD))
register_adapter(Adapter(SwinModel, SwinModelPE, apply_swin, (GridAttention,), **WINDOW_RECORD))
TASK_MODELS = {cls: task_model(cls) for cls in (ViTForImageClassification, DeiTForImageClassification,
                                                DeiTForImageClassificationWithTeacher, Dinov2ForImageClassification,
                                                SwinForImageClassification)}
for _base, _patched in TASK_MODELS.items():
    _record = WINDOW_RECORD if _base is SwinForImageClassification else GLOBAL_RECORD
    register_adapter(Adapter(_base, _patched, apply_task_model, (GridAttention,), **_record))
