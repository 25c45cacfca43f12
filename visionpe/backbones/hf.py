"""Hugging Face transformers' image transformers with visionpe encodings, at any input size: ViT (``ViTModel``,
``ViTForImageClassification``), DeiT (``DeiTModel``, ``DeiTForImageClassification``,
``DeiTForImageClassificationWithTeacher``), DINOv2 (``Dinov2Model``, ``Dinov2ForImageClassification``) and Swin
(``SwinModel``, ``SwinForImageClassification``).

``pip install visionpe[hf]`` (transformers >= :data:`MIN_TRANSFORMERS`; below it, importing this module is an
``ImportError`` naming the release needed). This module is imported (and its adapters registered) once transformers
is imported (:mod:`visionpe._import_hook`); the rest of visionpe never imports it. It follows both module layouts
transformers has had: 5's (attentions with ``q_proj``/``k_proj``/``v_proj``/``o_proj``, a ViT's layers in
``layers``, the layers' ``mlp`` and ``dropout``) and 4's (a self-attention with ``query``/``key``/``value`` beside
its output module ``attention.output``, layers in ``encoder.layer`` with ``intermediate`` and ``output``), keeping
every module under the name transformers gives it, so a state dict's keys are those of the installed release. A
patched model saves and loads with its encoding (``save_pretrained``, :func:`~visionpe.from_pretrained`:
``hf_pretrained.py``).

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
SDPA); ``grid_offset`` shifts the grid (a crop of a larger image). Activation checkpointing is transformers' own
(``gradient_checkpointing_enable``), each layer recomputed with the forward's coordinate draws.

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
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import transformers
from einops import rearrange
from packaging.version import Version
from torch import nn

MIN_TRANSFORMERS = "4.46"  # the oldest release the adapter runs on (pyproject's hf extra, the CI floor)


def check_transformers(installed: str) -> None:
    """An ``ImportError`` of one line naming the release needed when transformers ``installed`` is older."""
    if Version(installed).release < Version(MIN_TRANSFORMERS).release:
        raise ImportError(f"visionpe's Hugging Face adapter needs transformers >= {MIN_TRANSFORMERS}, found "
                          f"{installed}: pip install -U 'transformers>={MIN_TRANSFORMERS}'")


check_transformers(transformers.__version__)

from transformers.modeling_outputs import BaseModelOutputWithPooling  # noqa: E402
from transformers.models.deit.modeling_deit import (DeiTForImageClassification,  # noqa: E402
                                                    DeiTForImageClassificationWithTeacher, DeiTLayer, DeiTModel)
from transformers.models.dinov2.modeling_dinov2 import (Dinov2ForImageClassification, Dinov2Layer,  # noqa: E402
                                                        Dinov2Model)
from transformers.models.swin.modeling_swin import (SwinEncoder, SwinForImageClassification, SwinLayer,  # noqa: E402
                                                    SwinModel, SwinStage)
from transformers.models.vit.modeling_vit import ViTForImageClassification, ViTLayer, ViTModel  # noqa: E402

from ..attention import attend  # noqa: E402
from ..coords import shares_draws, with_draws  # noqa: E402
from ..encoding import ModelContext, constructor_keywords  # noqa: E402
from ..grid import Grid, Layout, MixedLayout  # noqa: E402
from ..registry import ENCODINGS  # noqa: E402
from .adapter import (GLOBAL_REFUSES, WINDOW_FAMILIES, WINDOW_REFUSES, Adapter, EncodingSet,  # noqa: E402
                      adapter_for, build_tokens, check_input, register_adapter)
from .hf_pretrained import PretrainedPositionalModel, register_conversions  # noqa: E402
from .swin import take_over_bias  # noqa: E402
from .windows import shift_mask  # noqa: E402

# where transformers' attentions keep their projections: role -> attribute ("o": the output projection, when the
# attention has it; transformers 4's self-attentions have it beside them, in the attention's ``output``)
PROJECTION_LAYOUTS = (
    {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"},  # transformers 5: ViT, DeiT, DINOv2, Swin
    {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"},  # SigLIP 2's attention
    {"q": "query", "k": "key", "v": "value"},  # transformers 4's self-attentions (ViT, DeiT, DINOv2, Swin)
    {"qkv": "qkv", "o": "proj"},  # one fused projection, q then k then v (Qwen3-VL's vision tower)
)


@dataclass(frozen=True)
class Projections:
    """A transformers attention's projections (:data:`PROJECTION_LAYOUTS`: ``role -> attribute``), heads, head width
    and attention dropout probability."""

    names: dict
    num_heads: int
    head_dim: int
    dropout: float


def projections(source: nn.Module) -> Projections | None:
    """What :class:`GridAttention` takes from the transformers attention ``source`` (or a patched one), None when
    ``source`` has none of the known layouts."""
    if isinstance(source, GridAttention):
        return Projections(dict(source.names), source.num_attention_heads, source.head_dim, source.attention_dropout)
    for names in PROJECTION_LAYOUTS:
        if all(isinstance(getattr(source, n, None), nn.Linear) for n in names.values()):
            heads = next(getattr(source, n) for n in ("num_attention_heads", "num_heads") if hasattr(source, n))
            head_dim = next(getattr(source, n) for n in ("head_dim", "attention_head_size") if hasattr(source, n))
            return Projections(dict(names), heads, head_dim, attention_dropout(source))
    return None


def unsupported_attention(source: nn.Module) -> ValueError:
    """The error for an attention of none of :data:`PROJECTION_LAYOUTS`."""
    known = "; ".join(", ".join(n.values()) for n in PROJECTION_LAYOUTS)
    return ValueError(f"attention {type(source).__name__} is not supported: visionpe's transformers adapters take "
                      f"attentions with the projections {known} (transformers >= {MIN_TRANSFORMERS})")


def attention_dropout(source: nn.Module) -> float:
    """The attention-probability dropout of a transformers attention (a float or an ``nn.Dropout``, by release)."""
    for name in ("attention_dropout", "dropout_prob", "dropout"):
        value = getattr(source, name, None)
        if isinstance(value, nn.Dropout):
            return value.p
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


class GridAttention(nn.Module):
    """Replaces a transformers attention: its projections under their names (:data:`PROJECTION_LAYOUTS`: ``q_proj``,
    ``k_proj``, ``v_proj``, ``o_proj`` (SigLIP 2: ``out_proj``); transformers 4's ``query``, ``key``, ``value``, whose
    output projection stays in the attention module around them; Qwen3-VL's fused ``qkv`` and ``proj``), so the
    model's state dict keys are transformers'; ``num_attention_heads``, ``head_dim`` (scale ``head_dim ** -0.5``) and
    ``attention_dropout``; ``rotary`` and ``bias`` hold the block's encodings.

    Call: ``attn(x, layout, attention_mask=None, output_attentions=False) -> (out, weights)`` with
    ``x: (B, T, dim)`` and ``layout`` the call's grid; ``attention_mask`` broadcastable to ``(B, heads, T, T)``
    (boolean: True = attend, or additive); ``weights: (B, heads, T, T)`` the softmax probabilities (after dropout, as
    transformers' eager attention returns them) when ``output_attentions``, else None.
    """

    attention: str = "auto"  # visionpe.attend's choice (visionpe.set_attention)

    def __init__(self, source: nn.Module, rotary: nn.Module | None = None, bias: nn.Module | None = None):
        super().__init__()
        found = projections(source)
        if found is None:
            raise unsupported_attention(source)
        self.num_attention_heads, self.head_dim, self.attention_dropout = found.num_heads, found.head_dim, found.dropout
        self.names = found.names
        for name in found.names.values():
            setattr(self, name, getattr(source, name))
        self.rotary, self.bias = rotary, bias
        self.stock_class = type(source)
        if getattr(source, "_is_hf_initialized", False):  # transformers initialised it: not again (as_stock)
            self._is_hf_initialized = True

    def as_stock(self) -> nn.Module:
        """A stand-in of the stock attention class this module replaced, holding its projections (the same modules):
        what transformers' ``_init_weights`` reads, whose branches test the class (SigLIP 2 initialises its
        attention's projections with xavier)."""
        stand_in = self.stock_class.__new__(self.stock_class)
        nn.Module.__init__(stand_in)
        for name in self.names.values():
            setattr(stand_in, name, getattr(self, name))
        return stand_in

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x: (B, T, dim)`` -> q, k, v ``(B, heads, T, head_dim)``."""
        if "qkv" in self.names:  # fused: (B, T, 3 * dim), q then k then v, each heads-major
            return tuple(rearrange(self.qkv(x), "b t (three h d) -> three b h t d", three=3,
                                   h=self.num_attention_heads))
        return tuple(rearrange(getattr(self, self.names[role])(x), "b t (h d) -> b h t d", h=self.num_attention_heads)
                     for role in ("q", "k", "v"))

    def forward(self, x: torch.Tensor, layout: Grid | Layout, attention_mask: torch.Tensor | None = None,
                output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = self.project(x)
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
        out = rearrange(out, "b h t d -> b t (h d)")
        return (getattr(self, self.names["o"])(out) if "o" in self.names else out), weights


def attention_slot(layer: nn.Module, name: str = "attention") -> tuple[nn.Module, str]:
    """``(parent, attribute)`` of the attention a layer's :class:`GridAttention` replaces: the layer's own
    ``name`` (transformers 5), or the self-attention inside it (transformers 4: ``attention.attention``, Swin's
    ``attention.self``, beside the ``output`` module that projects its result)."""
    outer = getattr(layer, name)
    if projections(outer) is not None:
        return layer, name
    for inner in ("attention", "self"):
        if isinstance(getattr(outer, inner, None), nn.Module) and projections(getattr(outer, inner)) is not None:
            return outer, inner
    raise unsupported_attention(outer)


def put_attention(layer: nn.Module, rotary: nn.Module | None, bias: nn.Module | None,
                  name: str = "attention") -> GridAttention:
    """The layer's attention (:func:`attention_slot`) replaced by a :class:`GridAttention` with the block's
    encodings; returns it."""
    parent, slot = attention_slot(layer, name)
    attention = GridAttention(getattr(parent, slot), rotary, bias)
    setattr(parent, slot, attention)
    return attention


def layer_attention(layer: nn.Module, x: torch.Tensor, layout, attention_mask=None,
                    output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A patched layer's attention on ``x``, projected out: transformers 5's :class:`GridAttention`, or 4's
    self-attention and then its attention module's ``output`` (dense and dropout): ``(out, weights)``."""
    attention = layer.attention
    if isinstance(attention, GridAttention):
        return attention(x, layout, attention_mask, output_attentions)
    inner = attention.attention if isinstance(getattr(attention, "attention", None), GridAttention) else attention.self
    out, weights = inner(x, layout, attention_mask, output_attentions)
    return attention.output(out, x), weights


def after_attention(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The dropout transformers 5's layers apply to the attention's output (transformers 4's output module has
    applied its own)."""
    dropout = getattr(layer, "dropout", None)
    return x if dropout is None else dropout(x)


def feed_forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A ViT/DeiT/Swin layer's MLP with its dropout: transformers 5's ``mlp`` and ``dropout``, 4's
    ``intermediate`` and ``output`` (without the residual transformers 4's ``ViTOutput`` adds)."""
    if hasattr(layer, "mlp"):
        return layer.dropout(layer.mlp(x))
    return layer.output.dropout(layer.output.dense(layer.intermediate(x)))


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
    """A ViT/DeiT layer (pre-norm: ``layernorm_before``, attention, dropout, residual; ``layernorm_after``, MLP,
    dropout, residual) on the call's layout: ``(x, weights)``."""
    attended, weights = layer_attention(self, self.layernorm_before(hidden_states), layout, attention_mask,
                                        output_attentions)
    hidden_states = after_attention(self, attended) + hidden_states
    return feed_forward(self, self.layernorm_after(hidden_states)) + hidden_states, weights


def layer_scale_forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                        layout: Layout | None = None, output_attentions: bool = False):
    """A DINOv2/DINOv3 layer (``norm1``, attention, ``layer_scale1``, drop path, residual; ``norm2``, ``mlp``,
    ``layer_scale2``, drop path, residual) on the call's layout: ``(x, weights)``."""
    attended, weights = layer_attention(self, self.norm1(hidden_states), layout, attention_mask, output_attentions)
    hidden_states = self.drop_path(self.layer_scale1(attended)) + hidden_states
    return self.drop_path(self.layer_scale2(self.mlp(self.norm2(hidden_states)))) + hidden_states, weights


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

    forward = layer_scale_forward


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


class GridViTModel(PretrainedPositionalModel):
    """Mixin of the patched ViT, DeiT, DINOv2 (and DINOv3) base models: one forward that builds the grid and runs
    the layers.

    ``forward(pixel_values, bool_masked_pos=None, interpolate_pos_encoding=None, attention_mask=None,
    grid_offset=None, output_attentions=None, output_hidden_states=None, return_dict=None)`` ->
    ``BaseModelOutputWithPooling`` (or its tuple); ``pixel_values: (B, C, H, W)``, each side a positive multiple
    of the patch. Other keyword arguments (those transformers' classification heads pass along) are ignored, as
    transformers' attention ignores them.

    A family differs in the methods below (where its prefix tokens, patch projection, layers, final norm and position
    table are); :attr:`layer_classes` maps its transformers layer classes to their patched ones.
    """

    pe_tokens: nn.Module | None
    layer_classes: dict = {}
    attention_name = "attention"  # the layers' attention attribute (transformers 4: the module around it)
    prefix_positions = True  # the model's table has rows for its prefix tokens (a tokens encoding keeps them)
    # a tokens encoding's defaults (the user's keywords win), where it takes them: transformers'
    # interpolate_pos_encoding (bicubic, no antialias)
    tokens_defaults = {"antialias": False}

    def prefix_tokens(self) -> list[torch.Tensor]:
        """The prefix token parameters ``(1, n, D)``, in sequence order."""
        return [self.embeddings.cls_token]

    def patch_projection(self) -> nn.Conv2d:
        return self.embeddings.patch_embeddings.projection

    def grid_layers(self) -> nn.ModuleList:
        """transformers 5's ``layers``, or its ``encoder.layer`` (transformers 4; DINOv2 in both)."""
        layers = getattr(self, "layers", None)
        return self.encoder.layer if layers is None else layers

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.layernorm(x)

    def pool(self, sequence_output: torch.Tensor) -> torch.Tensor | None:
        return self.pooler(sequence_output) if self.pooler is not None else None

    def position_table(self) -> torch.Tensor | None:
        """The model's own absolute table ``(1, P + N, D)`` (what ``learned`` takes over), or None."""
        return self.embeddings.position_embeddings

    def train_grid(self) -> tuple[int, int]:
        """The patch grid the model was configured for (its position table's)."""
        patch = self.embeddings.patch_embeddings
        return tuple(i // p for i, p in zip(patch.image_size, patch.patch_size))

    def drop_positions(self) -> None:
        """Remove the model's own encoding (the encodings visionpe puts in replace it)."""
        self.embeddings.position_embeddings = None

    def check_input(self, x: torch.Tensor) -> None:
        projection = self.patch_projection()
        check_input(x, tuple(projection.stride), projection.in_channels, type(self).__name__)

    def embed(self, pixel_values: torch.Tensor, bool_masked_pos: torch.Tensor | None = None,
              grid_offset=None) -> tuple[torch.Tensor, Layout]:
        """Images -> tokens ``(B, P + N, D)`` (prefix tokens first) with position, and their layout."""
        self.check_input(pixel_values)
        projection = self.patch_projection()
        x = projection(pixel_values.to(projection.weight.dtype))  # (B, D, h, w)
        prefix = self.prefix_tokens()
        grid = Grid(tuple(x.shape[2:]), prefix=sum(t.shape[1] for t in prefix), offset=grid_offset)
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
        dropout = getattr(self.embeddings, "dropout", None)
        return (x if dropout is None else dropout(x)), Layout(grid)

    def checkpointing(self, layers: nn.ModuleList):
        """transformers 4 checkpoints a ViT's layers from its encoder's loop, which :meth:`forward` replaces: the
        encoder's checkpointing function (carrying the coordinate draws) when it is on; None otherwise and with
        transformers 5, whose layers checkpoint themselves."""
        encoder = getattr(self, "encoder", None)
        if not (self.training and getattr(encoder, "gradient_checkpointing", False)) \
                or hasattr(layers[0], "gradient_checkpointing"):
            return None
        return carrying_draws(encoder._gradient_checkpointing_func)

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
        x, hidden_states, attentions = self.run_layers(x, layout, key_mask(attention_mask, x.shape[1]),
                                                       output_attentions, output_hidden_states)
        sequence_output = self.final_norm(x)
        out = BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=self.pool(sequence_output),
                                         hidden_states=hidden_states, attentions=attentions)
        return out if return_dict else out.to_tuple()

    def run_layers(self, x: torch.Tensor, layout: Layout | MixedLayout, mask: torch.Tensor | None,
                   output_attentions: bool, output_hidden_states) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        """The layers on tokens ``x: (B, T, D)`` of ``layout`` (a late tokens encoding, PEG after block 0, added
        before its block, per grid of a mixed layout) with the key ``mask`` -> ``(x, hidden_states, attentions)``:
        the last layer's output and, when asked, the embeddings and each layer's output (``output_hidden_states``:
        True or indices) and each layer's attention probabilities."""
        layers = self.grid_layers()
        checkpoint = self.checkpointing(layers)
        keep = selected_indices(output_hidden_states, len(layers) + 1)
        hidden_states = [] if output_hidden_states else None
        attentions = [] if output_attentions else None
        late = self.pe_tokens if self.pe_tokens is not None and self.pe_tokens.block_index > 0 else None
        for i, layer in enumerate(layers):
            if hidden_states is not None:
                hidden_states.append(x if keep is None or i in keep else None)
            if late is not None and i == late.block_index:
                x = layout.per_grid(x, late) if isinstance(layout, MixedLayout) else late(x, layout.unwrap())
            if checkpoint is None:
                x, weights = layer(x, mask, layout=layout, output_attentions=bool(output_attentions))
            else:
                x, weights = checkpoint(layer.__call__, x, mask, layout, bool(output_attentions))
            if attentions is not None:
                attentions.append(weights)
        if hidden_states is not None:
            hidden_states.append(x if keep is None or len(layers) in keep else None)
        return (x, None if hidden_states is None else tuple(hidden_states),
                None if attentions is None else tuple(attentions))


class ViTModelPE(GridViTModel, ViTModel):
    """transformers ``ViTModel`` with visionpe encodings (:class:`GridViTModel`)."""

    layer_classes = {ViTLayer: GridViTLayer}


class DeiTModelPE(GridViTModel, DeiTModel):
    """transformers ``DeiTModel`` with visionpe encodings: class and distillation tokens are the prefix."""

    layer_classes = {DeiTLayer: GridDeiTLayer}

    def prefix_tokens(self) -> list[torch.Tensor]:
        return [self.embeddings.cls_token, self.embeddings.distillation_token]


class Dinov2ModelPE(GridViTModel, Dinov2Model):
    """transformers ``Dinov2Model`` with visionpe encodings; ``pooler_output`` is the normed class token."""

    layer_classes = {Dinov2Layer: GridDinov2Layer}

    def pool(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return sequence_output[:, 0]


def put_vit_encodings(model: nn.Module, names: dict, kwargs: dict, patched: type) -> None:
    """Put the encodings ``names`` (family -> name) into a transformers ViT-like base model (``patched``: its
    :class:`GridViTModel` class) in place: the tokens encoding (taking over the model's table), each layer patched
    with its rotary and bias encodings."""
    layers = patched.grid_layers(model)
    classes, name = patched.layer_classes, patched.attention_name
    for layer in layers:
        if not isinstance(layer, tuple(classes)):
            raise ValueError(f"layer type {type(layer).__name__} is not supported; supported transformers layers: "
                             f"{', '.join(b.__name__ for b in classes)}")
        attention_slot(layer, name)
    found = projections(getattr(*attention_slot(layers[0], name)))
    table = patched.position_table(model)
    registers = getattr(model.config, "num_register_tokens", 0)
    prefix = sum(t.shape[1] for t in patched.prefix_tokens(model)) if patched.prefix_positions else 0
    context = ModelContext(patched.train_grid(model), model.config.hidden_size, found.num_heads, found.head_dim,
                           num_prefix_tokens=prefix, depth=len(layers), num_registers=registers)
    defaults = {}
    if "tokens" in names:
        taken = constructor_keywords(ENCODINGS[names["tokens"]])
        defaults = {k: v for k, v in patched.tokens_defaults.items() if k in taken}
    model.pe_tokens = build_tokens(names, kwargs, context, table, getattr(model, "pe_tokens", None), **defaults)
    patched.drop_positions(model)
    encodings = EncodingSet(names, kwargs)
    for layer in layers:
        swap_class(layer, classes[next(b for b in classes if isinstance(layer, b))])
        source = getattr(*attention_slot(layer, name))
        put_attention(layer, encodings.block("rotary", context, getattr(source, "rotary", None)),
                      encodings.block("bias", context, getattr(source, "bias", None)), name)


def apply_vit_like(model: nn.Module, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` into a transformers ViT/DeiT/DINOv2 base model in place."""
    put_vit_encodings(model, names, kwargs, type(model) if isinstance(model, GridViTModel) else BASE_MODELS[
        type(model)])


# -- Swin ------------------------------------------------------------------------------------------------------------
def swin_window(size, window: int, shift: int) -> tuple[int, int]:
    """transformers' window and shift for a feature map of ``size = (h, w)``: a map whose shorter side is no longer
    than the window is one unshifted window of that side (square windows, padded along the longer side)."""
    return (min(size), 0) if min(size) <= window else (window, shift)


class GridSwinLayer(CheckpointsCarryDraws, SwinLayer):
    """transformers ``SwinLayer`` whose window and shift are computed per call (``window_size``, ``shift_size`` stay
    the configured ones) and whose attention reads the window's grid. Called as transformers 5 calls it,
    ``layer(x, input_dimensions, always_partition=False, output_attentions=False)``, or as 4 does, ``layer(x,
    input_dimensions, head_mask, output_attentions, always_partition)``; ``x: (B, h * w, C)``; returns ``(x,
    weights)`` with ``weights: (B * windows, heads, n, n)`` or None."""

    def forward(self, hidden_states: torch.Tensor, input_dimensions, *legacy, always_partition: bool = False,
                output_attentions: bool = False, **kwargs):
        if legacy:  # transformers 4's positional call: head_mask (unused, as in visionpe's ViTs), then the flags
            output_attentions, always_partition = (*legacy[1:], output_attentions, always_partition)[:2]
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
        attended, weights = layer_attention(self, windows, Grid((window, window)), mask, output_attentions)
        x = rearrange(after_attention(self, attended), "(b nh nw) (wh ww) c -> b (nh wh) (nw ww) c", b=batch,
                      nh=padded[0] // window, wh=window)
        if shift:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        x = x[:, :height, :width].reshape(batch, height * width, channels)
        hidden_states = hidden_states + self.drop_path(x)
        return feed_forward(self, self.layernorm_after(hidden_states)) + hidden_states, weights


class GridSwinStage(CheckpointsCarryDraws, SwinStage):
    """transformers ``SwinStage`` whose checkpointing (transformers 5's) carries the coordinate draws
    (:class:`CheckpointsCarryDraws`)."""


class GridSwinEncoder(CheckpointsCarryDraws, SwinEncoder):
    """transformers ``SwinEncoder`` whose checkpointing of the stages (transformers 4's) carries the coordinate
    draws."""


class SwinModelPE(PretrainedPositionalModel, SwinModel):
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


SwinModelPE.forward.__signature__ = inspect.signature(SwinModel.forward)  # the arguments transformers' tests read


def apply_swin(model: SwinModel, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into every window attention of a transformers Swin, in place."""
    if model.embeddings.position_embeddings is not None:
        raise ValueError("a Swin with use_absolute_embeddings=True is not supported: its absolute table is a tokens "
                         "encoding, and Swin windows take rotary and bias encodings (build it with the default "
                         "use_absolute_embeddings=False)")
    layers = [(index, layer) for stage in model.encoder.layers for index, layer in enumerate(stage.blocks)]
    for _, layer in layers:
        attention_slot(layer)
    for stage in model.encoder.layers:
        swap_class(stage, GridSwinStage)
    if hasattr(model.encoder, "gradient_checkpointing"):  # transformers 4 checkpoints the stages from the encoder
        swap_class(model.encoder, GridSwinEncoder)
    encodings = EncodingSet(names, kwargs)
    window = model.config.window_size
    for index, layer in layers:
        # the configured window and shift (transformers' layer may have shrunk them for good in an earlier call)
        layer.window_size, layer.shift_size = window, 0 if index % 2 == 0 else window // 2
        swap_class(layer, GridSwinLayer)
        source = getattr(*attention_slot(layer))
        found = projections(source)
        dim = layer.layernorm_before.normalized_shape[0]
        context = ModelContext((window, window), dim, found.num_heads, found.head_dim)
        rotary = encodings.block("rotary", context, getattr(source, "rotary", None))
        bias = encodings.block("bias", context, getattr(source, "bias", None))
        # transformers 5 keeps the table in its own module, 4 in the attention
        take_over_bias(bias, getattr(source, "relative_position_bias", source))
        put_attention(layer, rotary, bias)


# -- the task models: a transformers head around a patched base model --------------------------------------------------
class GridTaskModel(PretrainedPositionalModel):
    """Mixin of the patched task models (``...ForImageClassification``) and wrappers: the base model
    (``base_model_prefix``: ``vit``, ``deit``, ``dinov2``, ``swin``; or the attribute :attr:`tower`) is patched,
    transformers' forward runs unchanged around it."""

    tower: str | None = None  # the attribute holding the model that is patched; None: transformers' base_model

    @classmethod
    def tower_of(cls, model: nn.Module) -> nn.Module:
        """The model inside ``model`` (of this class, patched or not yet) that is patched."""
        return model.base_model if cls.tower is None else getattr(model, cls.tower)

    def tower_model(self) -> nn.Module:
        return self.tower_of(self)

    @property
    def pe_tokens(self) -> nn.Module | None:
        return getattr(self.tower_model(), "pe_tokens", None)

    @property
    def pe(self) -> str:
        return self.tower_model().pe

    @pe.setter
    def pe(self, value: str) -> None:
        self.tower_model().pe = value

    def check_input(self, x: torch.Tensor) -> None:
        self.tower_model().check_input(x)


def apply_task_model(model: nn.Module, names: dict, kwargs: dict) -> None:
    """Patch a task model's base model (its adapter's class and encodings); the head and its weights stay."""
    base = adapter_for(model).patched.tower_of(model)
    adapter = adapter_for(base)
    adapter.put_encodings(base, names, kwargs)
    base.__class__ = adapter.patched


def task_model(cls: type, tower: str | None = None) -> type:
    """The patched class of a transformers task model (or wrapper) class; ``tower``: see :attr:`GridTaskModel.tower`."""
    return type(f"{cls.__name__}PE", (GridTaskModel, cls),
                {"__doc__": f"transformers ``{cls.__name__}`` around a patched base model, with visionpe encodings.",
                 "__module__": __name__, "tower": tower})


def init_weights(model: nn.Module) -> None:
    """transformers' own init scheme over every module (``init_weights``), also over modules its construction marked
    initialised already (transformers 4 skips a module with ``_is_hf_initialized``: a meta-device build's class token
    would keep the garbage of ``to_empty``)."""
    for module in model.modules():
        if getattr(module, "_is_hf_initialized", False):
            module._is_hf_initialized = False
    model.init_weights()


BASE_MODELS = {ViTModel: ViTModelPE, DeiTModel: DeiTModelPE, Dinov2Model: Dinov2ModelPE}
GLOBAL_RECORD = dict(library="transformers", native="learned", refuses=GLOBAL_REFUSES, init_weights=init_weights)
WINDOW_RECORD = dict(library="transformers", native="swin_bias", families=WINDOW_FAMILIES, refuses=WINDOW_REFUSES,
                     init_weights=init_weights)
for _base, _patched in BASE_MODELS.items():
    register_adapter(Adapter(_base, _patched, apply_vit_like, (GridAttention,), **GLOBAL_RECORD))
register_adapter(Adapter(SwinModel, SwinModelPE, apply_swin, (GridAttention,), **WINDOW_RECORD))
TASK_MODELS = {cls: task_model(cls) for cls in (ViTForImageClassification, DeiTForImageClassification,
                                                DeiTForImageClassificationWithTeacher, Dinov2ForImageClassification,
                                                SwinForImageClassification)}
for _base, _patched in TASK_MODELS.items():
    _record = WINDOW_RECORD if _base is SwinForImageClassification else GLOBAL_RECORD
    register_adapter(Adapter(_base, _patched, apply_task_model, (GridAttention,), **_record))
# transformers 4 keeps a ViT's encodings in its self-attention (attention.attention), Swin's in attention.self
ENCODING_KEYS_4 = {"vit": "attention.attention", "deit": "attention.attention", "dinov2": "attention.attention",
                   "swin": "attention.self"}
for _base, _patched in {**BASE_MODELS, SwinModel: SwinModelPE}.items():  # a task model's base model carries them
    register_conversions(_patched, _base, ENCODING_KEYS_4[_base.config_class.model_type],
                         replaced=("relative_position_bias",) if _base is SwinModel else ())
