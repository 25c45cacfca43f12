"""timm ``VisionTransformer`` (``vit_*``, ``deit_*``: class and register tokens, ``no_embed_class``, every
``global_pool``) with visionpe encodings, at any input size. :class:`GridTransformer` is the forward it shares with
DeiT's distilled models (``deit.py``) and timm's Eva (``eva.py``).

The grid travels with the call: :meth:`GridTransformer.forward_features` builds the token
:class:`~visionpe.grid.Layout` (the :class:`~visionpe.Grid` from the patch embedding's output and the caller's
``grid_offset`` and, for clips, ``time_spacing``, plus the kept patches under patch dropout or masking) and passes it
to every block, as timm's Eva passes ``rope=``; no state is shared between calls, so one model serves concurrent
forwards at different sizes and time steps.
Blocks become :class:`GridBlock` (timm ``Block``) or :class:`GridResPostBlock`, their attention
:class:`visionpe.Attention` with timm's weights and names.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import List

import torch
from timm.layers import Format, PatchDropout
from timm.layers.patch_dropout import PatchDropoutWithIndices, patch_dropout_forward
from timm.models._features import feature_take_indices
from timm.models.vision_transformer import Block, ResPostBlock, VisionTransformer
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.checkpoint import checkpoint

from ..attention import Attention, ScriptedAttention
from ..coords import shares_draws, with_draws
from ..encoding import ModelContext
from .._checks import check_number
from .._compat import TorchScriptRefusal
from ..grid import Grid, Layout, MixedLayout, time_layout
from ..weights.convert import LoadReport
from .adapter import (GLOBAL_REFUSES, Adapter, EncodingSet, PositionalModel, build_tokens, check_img_size,
                      check_model_sizes, register_adapter)

try:  # timm >= 1.0.2x: the pretrained cfg follows set_input_size; the floor's timm has none
    from timm.models._input import update_model_input_size
except ImportError:
    update_model_input_size = None


class GridBlock(Block):
    """timm ``Block`` whose forward takes the token layout: ``block(x, layout, attn_mask=None)``."""

    def forward(self, x: torch.Tensor, layout: Layout, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), layout, attn_mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class GridResPostBlock(ResPostBlock):
    """timm ``ResPostBlock`` (post-norm) whose forward takes the token layout."""

    def forward(self, x: torch.Tensor, layout: Layout, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop_path1(self.norm1(self.attn(x, layout, attn_mask)))
        return x + self.drop_path2(self.norm2(self.mlp(x)))


GRID_BLOCKS = {Block: GridBlock, ResPostBlock: GridResPostBlock}


class GridTransformer(PositionalModel):
    """Mixin of the patched timm token transformers (ViT, distilled DeiT, Eva): a forward that builds the token
    layout and passes it to every block, at any input size.

    ``forward(x, grid_offset=None, time_spacing=None)``: ``grid_offset`` is the coordinate of the first patch per
    grid axis (a crop of a larger image, a later clip of a video); encodings that read coordinates see the shifted
    grid. ``time_spacing`` (clips): the time coordinate step between neighbouring temporal tokens, one number or a
    ``(B,)`` tensor of one per clip (:func:`~visionpe.grid.time_layout`): clips at different frame rates on one time
    axis, e.g. ``tubelet frames / fps / seconds per position``; clips of a batch whose steps differ run as a
    :class:`~visionpe.grid.MixedLayout` (each clip gets the positions it would get alone).
    Token subsets keep their positions: timm's ``patch_drop_rate`` (training) and :meth:`forward_masked` (MAE's
    encoder on the visible patches) pass a :class:`~visionpe.grid.Layout` with the kept patches to every block.
    A tokens encoding with ``block_index = i > 0`` (PEG after the first block, as CPVT) is added before block ``i``.
    Coordinate augmentation (training) is drawn once per forward and shared by every block, as timm's Eva
    (:func:`~visionpe.coords.coordinate_draws`; ``draw_coords="block"`` for a draw per block).
    """

    pe_tokens: nn.Module | None

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups (layer-wise lr decay), with a tokens encoding in the stem beside ``pos_embed``."""
        groups = super().group_matcher(coarse)
        return {**groups, "stem": groups["stem"] + "|^pe_tokens"}

    def scripted_block(self, block: nn.Module, where: str) -> "ScriptedBlock":
        """The TorchScript form of one of this model's blocks (``where``: its name, ``blocks.i``)."""
        return ScriptedBlock(block, scripted_attention(block.attn, f"{where}.attn"), isinstance(block, GridResPostBlock))

    def prefix_tokens(self) -> list[torch.Tensor]:
        """The prefix token parameters ``(1, n, D)`` in sequence order: the class token, then the register tokens."""
        return [t for t in (self.cls_token, self.reg_token) if t is not None]

    def embed(self, x: torch.Tensor, grid_offset=None, keep: torch.Tensor | None = None,
              with_position: bool = True, time_spacing=None) -> tuple[torch.Tensor, Layout | MixedLayout]:
        """Image (or clip) -> tokens ``(B, P + N, C)`` (``P + K`` with kept patches) with prefix tokens and position,
        and their layout (a :class:`~visionpe.grid.MixedLayout` for per-clip ``time_spacing`` that differ). ``keep:
        (B, K)`` patch indices to keep; in training, timm's patch dropout draws them. ``with_position=False`` stops
        after the prefix tokens (:meth:`embed_batch` adds position per grid)."""
        self.check_input(x)
        x = self.patch_embed(x)  # (B, *grid, C)
        grid = token_grid(x, self.num_prefix_tokens, grid_offset, time_spacing)  # a Grid, or a MixedLayout
        x = x.flatten(1, -2)  # (B, N, C)
        x = torch.cat([t.expand(x.shape[0], -1, -1) for t in self.prefix_tokens()] + [x], dim=1)  # (B, P + N, C)
        if not with_position:
            return x, Layout(grid)
        if self.pe_tokens is not None and self.pe_tokens.block_index == 0:
            x = add_tokens(self.pe_tokens, x, grid)
        x = self.pos_drop(x)
        if isinstance(grid, MixedLayout):
            if keep is not None or (self.training and getattr(self.patch_drop, "prob", 0.0) > 0):
                raise ValueError("clips with different time_spacing in one batch keep every patch: patch dropout and "
                                 "masking take one time step for the batch (a number, or equal steps)")
            return self.norm_pre(x), grid
        if keep is None and isinstance(self.patch_drop, (PatchDropout, PatchDropoutWithIndices)):
            x, keep = patch_dropout_forward(x, self.patch_drop.prob, self.num_prefix_tokens, self.patch_drop.ordered,
                                            self.training)
        elif keep is not None:
            x = keep_tokens(x, grid, keep)
        return self.norm_pre(x), kept_layout(grid, keep)

    def embed_batch(self, images) -> tuple[torch.Tensor, MixedLayout]:
        """Images of different sizes and aspect ratios -> one padded batch ``(B, T, C)`` (``T`` the longest
        sample's ``P + N_b``) and its :class:`~visionpe.grid.MixedLayout`: each image has its own grid and gets
        exactly the positions it would get alone."""
        sample = "(C, T, H, W)" if len(self.patch_embed.patch_size) == 3 else "(C, H, W)"  # a clip or an image
        if not isinstance(images, (list, tuple)) or not images:
            raise ValueError(f"images must be a non-empty list of {sample} tensors, got {type(images).__name__}")
        tokens, grids = [], []
        for i, image in enumerate(images):
            if not isinstance(image, torch.Tensor) or image.ndim != 1 + len(self.patch_embed.patch_size):
                raise ValueError(f"images[{i}] must be a {sample} tensor, got {type(image).__name__} of shape "
                                 f"{tuple(getattr(image, 'shape', ()))}")
            x, layout = self.embed(image[None], with_position=False)
            tokens.append(x[0])
            grids.append(layout.grid)
        layout = MixedLayout(tuple(grids))
        x = pad_sequence(tokens, batch_first=True)
        if self.pe_tokens is not None and self.pe_tokens.block_index == 0:
            x = layout.per_grid(x, self.pe_tokens)
        return self.norm_pre(self.pos_drop(x)), layout

    @shares_draws
    def forward_batch(self, images) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of a list of images of different sizes, run as one padded batch (padded keys
        masked, each image on its own grid). Pooling: ``"token"`` or ``"avg"`` over each image's own patches."""
        if self.training and getattr(self.patch_drop, "prob", 0.0) > 0:
            raise ValueError("patch dropout is not supported with mixed-size batches (patch_drop_rate must be 0)")
        if self.global_pool not in ("token", "avg") or self.attn_pool is not None:
            raise ValueError(f"mixed-size batches pool with global_pool 'token' or 'avg', not {self.global_pool!r}")
        x, layout = self.embed_batch(images)
        for x in self.run_blocks(x, layout):
            pass
        x = self.norm(x)
        if self.global_pool == "token":  # the prefix tokens are every sample's own: the model's head reads them
            return self.forward_head(x)
        real = layout.key_mask(x.device)
        real[:, :self.num_prefix_tokens] = getattr(self, "pool_include_prefix", False)
        pooled = (x * real[..., None]).sum(1) / real.sum(1, keepdim=True)
        return self.head(self.head_drop(self.fc_norm(pooled)))

    def run_blocks(self, x: torch.Tensor, layout: Layout | MixedLayout, attn_mask=None, blocks=None):
        """Run ``blocks`` (default all), yielding the tokens after each; a late tokens encoding (PEG after block
        0) is added before its block."""
        late = self.pe_tokens if self.pe_tokens is not None and self.pe_tokens.block_index > 0 else None
        for i, block in enumerate(self.blocks if blocks is None else blocks):
            if late is not None and i == late.block_index:
                x = add_tokens(late, x, layout)
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(with_draws(block), x, layout, attn_mask, use_reentrant=False)
            else:
                x = block(x, layout, attn_mask)
            yield x

    @shares_draws
    def forward_features(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                         grid_offset=None, time_spacing=None) -> torch.Tensor:
        check_not_causal(is_causal)
        x, layout = self.embed(x, grid_offset, time_spacing=time_spacing)
        for x in self.run_blocks(x, layout, attn_mask):
            pass
        return self.norm(x)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                grid_offset=None, time_spacing=None) -> torch.Tensor:
        return self.forward_head(self.forward_features(x, attn_mask, is_causal, grid_offset, time_spacing))

    @shares_draws
    def forward_masked(self, x: torch.Tensor, mask_ratio: float = 0.75, keep: torch.Tensor | None = None,
                       grid_offset=None, time_spacing=None) -> tuple[torch.Tensor, torch.Tensor]:
        """MAE's encoder: the blocks run on the visible patches only, each with its own position.

        Args:
            x: images ``(B, C, H, W)`` (clips ``(B, C, T, H, W)``).
            mask_ratio: fraction of patches hidden, drawn uniformly per sample as MAE does (ignored with ``keep``).
            keep: ``(B, K)`` patch indices (row-major, ``0 .. N - 1``) to keep instead of a random draw, or ``(1, K)``:
                the same patches for every sample.
        Returns:
            ``(tokens, keep)``: normed tokens ``(B, P + K, D)`` (prefix first, then the kept patches in ``keep``
            order) and the ``(B, K)`` indices.
        """
        if keep is None:
            check_number("mask_ratio", mask_ratio, minimum=0.0, maximum=1.0)
            if mask_ratio == 1.0:
                raise ValueError("mask_ratio must be < 1 (at least one visible patch), got 1.0")
            num_patches = math.prod(s // p for s, p in zip(x.shape[2:], self.patch_embed.patch_size))
            num_keep = max(1, int(num_patches * (1 - mask_ratio)))
            keep = torch.rand(x.shape[0], num_patches, device=x.device).argsort(dim=-1)[:, :num_keep]
        if self.pe_tokens is not None and self.pe_tokens.block_index > 0:
            raise ValueError(f"{type(self.pe_tokens).__name__} is added after block 0 and needs every patch; a "
                             "masked forward needs it at block_index=0")
        x, layout = self.embed(x, grid_offset, keep, time_spacing=time_spacing)
        for x in self.run_blocks(x, layout):
            pass
        return self.norm(x), layout.keep.expand(x.shape[0], -1)

    @shares_draws
    def forward_intermediates(self, x: torch.Tensor, indices=None, return_prefix_tokens: bool = False,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
                              intermediates_only: bool = False, output_dict: bool = False,
                              attn_mask: torch.Tensor | None = None, is_causal: bool = False, grid_offset=None,
                              time_spacing=None):
        """timm's ``forward_intermediates`` (same arguments and outputs), with the layout passed to each block."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r} is not supported; allowed values: 'NCHW', 'NLC'")
        check_not_causal(is_causal)
        check_block_indices(indices, len(self.blocks))
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x, layout = self.embed(x, grid_offset, time_spacing=time_spacing)
        intermediates = []
        blocks = self.blocks[:max_index + 1] if stop_early else self.blocks
        for i, x in enumerate(self.run_blocks(x, layout, attn_mask, blocks)):
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        p = self.num_prefix_tokens
        prefix_tokens = [y[:, :p] for y in intermediates] if p else None
        intermediates = [y[:, p:] for y in intermediates]
        if output_fmt == "NCHW" and getattr(layout, "keep", None) is None:
            shape = layout.grids[0].shape if isinstance(layout, MixedLayout) else layout.grid.shape  # one size
            intermediates = [y.reshape(y.shape[0], *shape, -1).movedim(-1, 1).contiguous() for y in intermediates]
        if output_dict:
            out = {"image_intermediates": intermediates}
            if prefix_tokens is not None and return_prefix_tokens:
                out["image_intermediates_prefix"] = prefix_tokens
            if not intermediates_only:
                out["image_features"] = self.norm(x)
            return out
        if return_prefix_tokens and prefix_tokens is not None:
            intermediates = list(zip(intermediates, prefix_tokens))
        return intermediates if intermediates_only else (self.norm(x), intermediates)


class TablesFromEachGrid:
    """Mixin of the patched models whose timm twin resizes its position tables in ``set_input_size`` (BEiT, the
    RelPos ViT): visionpe's encodings compute their positions from each input's grid, so a new input size changes
    the patch embedding's size and the pretrained cfg's (timm's ``update_model_input_size``, where the timm release
    has it), and no table."""

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        if update_model_input_size is not None:
            update_model_input_size(self, self.patch_embed.img_size, patch_size=patch_size)


def check_block_indices(indices, depth: int) -> None:
    """``indices`` of ``forward_intermediates`` as timm reads them: None (every block), an int ``n`` (the last ``n``
    blocks, ``1 .. depth``) or a sequence of block indices (``-depth .. depth - 1``, negative from the end)."""
    if indices is None:
        return
    if isinstance(indices, int) and not isinstance(indices, bool):
        if not 1 <= indices <= depth:
            raise ValueError(f"indices={indices} asks for the last {indices} blocks but the model has depth={depth}: "
                             f"allowed 1 .. {depth} (or a list of block indices)")
        return
    if not isinstance(indices, Sequence) or isinstance(indices, str) \
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        raise ValueError(f"indices must be None, an int (the last n blocks) or a list of block indices, got "
                         f"{indices!r}")
    outside = [i for i in indices if not -depth <= i < depth]
    if outside:
        raise ValueError(f"indices={list(indices)}: block(s) {outside} do not exist in a model of depth={depth}; "
                         f"allowed {-depth} .. {depth - 1}")


def keep_tokens(x: torch.Tensor, grid: Grid, keep: torch.Tensor) -> torch.Tensor:
    """The prefix tokens and the kept patches of each sample: ``(B, P + N, D) -> (B, P + K, D)``; ``keep`` ``(B, K)``
    or ``(1, K)`` (the same patches for every sample)."""
    if not isinstance(keep, torch.Tensor) or keep.ndim != 2 or keep.shape[0] not in (1, x.shape[0]) \
            or keep.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"keep must be a (batch={x.shape[0]} or 1, kept) integer tensor of patch indices, got "
                         f"{getattr(keep, 'dtype', type(keep).__name__)} {tuple(getattr(keep, 'shape', ()))}")
    index = Layout(grid, keep).token_index(x.device, x.shape[0])
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


def check_not_causal(is_causal: bool) -> None:
    if is_causal:
        raise ValueError("is_causal=True is not supported with positional encodings over a grid")


# The functions below read the grid from a tensor's size or take a grid: torch.fx records each as one call (torch.fx.wrap),
# run on the real tensors, so a symbolically traced model (timm's FX feature extraction, torchvision's
# create_feature_extractor) computes its positions at whatever size it is given, as the eager model does.

def token_grid(patches: torch.Tensor, prefix: int, grid_offset=None, time_spacing=None) -> Grid | MixedLayout:
    """The grid of the patch embedding's output ``patches: (B, *grid, C)`` with ``prefix`` tokens: a
    :class:`~visionpe.Grid` at ``grid_offset``, or (clips whose ``time_spacing`` differ) a
    :class:`~visionpe.grid.MixedLayout` of per-clip time steps (:func:`~visionpe.grid.time_layout`)."""
    grid = Grid(tuple(patches.shape[1:-1]), prefix=prefix, offset=grid_offset)
    return time_layout(grid, time_spacing, patches.shape[0])


def add_tokens(pe: nn.Module, x: torch.Tensor, layout: Grid | Layout | MixedLayout) -> torch.Tensor:
    """``x: (B, T, C)`` with the tokens encoding ``pe`` added on its layout (each grid of a mixed one its own)."""
    if isinstance(layout, MixedLayout):
        return layout.per_grid(x, pe)
    return pe(x, layout.unwrap() if isinstance(layout, Layout) else layout)


def kept_layout(grid: Grid | MixedLayout, keep: torch.Tensor | None) -> Layout | MixedLayout:
    """The layout the blocks get: ``grid`` with the kept patches ``keep: (B, K)`` (None: all), or a mixed one as is
    (which keeps every patch)."""
    return grid if isinstance(grid, MixedLayout) else Layout(grid, keep)


for _name in ("check_not_causal", "token_grid", "add_tokens", "kept_layout"):
    torch.fx.wrap(_name)


class VisionTransformerPE(GridTransformer, VisionTransformer):
    """timm ``VisionTransformer`` whose position comes from visionpe encodings, at any input size
    (:class:`GridTransformer`). ``torch.jit.script`` compiles its TorchScript form
    (:class:`ScriptedVisionTransformer`)."""

    def __prepare_scriptable__(self) -> "ScriptedVisionTransformer":
        return ScriptedVisionTransformer.of(self)


def scripted_encoding(pe: nn.Module | None, where: str) -> nn.Module | None:
    """The TorchScript form of the encoding ``pe`` (:meth:`~visionpe.Encoding.scriptable`; None for none); a refusal
    names where it sits in the model (``where``)."""
    if pe is None:
        return None
    try:
        return pe.scriptable()
    except TorchScriptRefusal as error:
        raise TorchScriptRefusal(f"{error.what} ({where})", error.reason) from None


def refuse_late_tokens(model: nn.Module) -> None:
    """The TorchScript forms add a tokens encoding (``model.pe_tokens``) to the patch embeddings only: one added
    before a later block (PEG after block ``i > 0``) is refused, naming it."""
    tokens = model.pe_tokens
    if tokens is not None and tokens.block_index > 0:
        raise TorchScriptRefusal(f"{type(model).__name__} with {type(tokens).__name__} after block "
                                 f"{tokens.block_index}",
                                 "the scripted forward adds a tokens encoding to the patch embeddings only")


class ScriptedBlock(nn.Module):
    """TorchScript form of a block of timm's ViT family (:class:`GridBlock`, :class:`GridResPostBlock`, Eva's blocks):
    its modules (weights shared), layer scale as a module (``ls1``, ``ls2``) or a vector (Eva's ``gamma_1``,
    ``gamma_2``), and ``attn``, its attention's TorchScript form (:class:`~visionpe.attention.ScriptedAttention`):
    ``forward(x, shape, prefix)``."""

    def __init__(self, block: nn.Module, attn: ScriptedAttention, post_norm: bool):
        super().__init__()
        self.post_norm = post_norm
        for name in ("norm1", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2"):
            setattr(self, name, getattr(block, name, None) or nn.Identity())
        self.gamma_1, self.gamma_2 = getattr(block, "gamma_1", None), getattr(block, "gamma_2", None)
        self.attn = attn

    def forward(self, x: torch.Tensor, shape: List[int], prefix: int) -> torch.Tensor:
        if self.post_norm:
            x = x + self.drop_path1(self.norm1(self.attn(x, shape, prefix)))
            return x + self.drop_path2(self.norm2(self.mlp(x)))
        x_attn = self.ls1(self.attn(self.norm1(x), shape, prefix))
        gamma_1, gamma_2 = self.gamma_1, self.gamma_2
        if gamma_1 is not None:
            x_attn = gamma_1 * x_attn
        x = x + self.drop_path1(x_attn)
        x_mlp = self.ls2(self.mlp(self.norm2(x)))
        if gamma_2 is not None:
            x_mlp = gamma_2 * x_mlp
        return x + self.drop_path2(x_mlp)


def scripted_attention(attn: nn.Module, where: str, form: type = ScriptedAttention) -> ScriptedAttention:
    """The TorchScript form ``form`` of the attention ``attn`` at ``where`` (``blocks.i.attn``), with its encodings'."""
    return form(attn, scripted_encoding(attn.rotary, f"{where}.rotary"), scripted_encoding(attn.bias, f"{where}.bias"))


class ScriptedGridForward:
    """Mixin of what ``torch.jit.script`` compiles for a :class:`GridTransformer` of timm's ViT family (a subclass of
    the timm class: :class:`ScriptedVisionTransformer`, the distilled DeiT's, Eva's): the same modules and parameters
    (shared, not copied), its blocks as :class:`ScriptedBlock` and its encodings in their TorchScript forms
    (:meth:`~visionpe.Encoding.scriptable`), and a forward that reads the patch grid ``[H, W]`` from the patch
    embedding's output (``[T, H, W]`` of a clip) and computes every position from it inside the graph: the scripted
    model serves any input size, as the eager one. timm's ``forward_head`` and pooling are compiled as they are.

    ``forward(x)``: ``(B, C, H, W)`` (a clip: ``(B, C, T, H, W)``) -> logits (the features without a head);
    ``forward_features(x)`` -> ``(B, P + N, dim)``. What the eager model's forward takes besides the image (``grid_offset``, ``time_spacing``, masks, kept
    patches) is not part of it, nor patch dropout (refused when scripting). A tokens encoding with ``block_index =
    i > 0`` (PEG) is added before block ``i``, as the eager forward adds it."""

    @classmethod
    def of(cls, model: GridTransformer) -> "ScriptedGridForward":
        """The TorchScript form of ``model`` (a new module; ``model`` is left as it is), or a
        ``NotImplementedError`` naming what has none."""
        name = type(model).__name__
        if getattr(model.patch_drop, "prob", 0.0) > 0:
            raise TorchScriptRefusal(f"{name} with patch dropout (patch_drop_rate={model.patch_drop.prob})",
                                      "the scripted forward keeps every patch")
        self = cls.__new__(cls)
        self.__dict__.update(model.__dict__)
        for key in ("_parameters", "_buffers", "_modules"):  # its own containers: scripting replaces submodules
            self.__dict__[key] = dict(model.__dict__[key])
        for token in ("dist_token", "reg_token"):  # the distillation token (distilled DeiT), register tokens
            if not hasattr(self, token):
                setattr(self, token, None)
        try:
            self.pe_tokens = scripted_encoding(model.pe_tokens, "pe_tokens")
            self.pe_tokens_block = 0 if model.pe_tokens is None else model.pe_tokens.block_index
            self.blocks = nn.ModuleList([model.scripted_block(block, f"blocks.{i}")
                                         for i, block in enumerate(model.blocks)])
        except TorchScriptRefusal as error:
            raise TorchScriptRefusal(f"{name} with {error.what}", error.reason) from None
        return self

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, *grid, C): (B, H, W, C), a clip's (B, T, H, W, C)
        shape = x.shape[1:-1]
        x = x.flatten(1, -2)
        tokens: List[torch.Tensor] = []
        if self.cls_token is not None:
            tokens.append(self.cls_token.expand(x.shape[0], -1, -1))
        if self.dist_token is not None:
            tokens.append(self.dist_token.expand(x.shape[0], -1, -1))
        if self.reg_token is not None:
            tokens.append(self.reg_token.expand(x.shape[0], -1, -1))
        x = torch.cat(tokens + [x], dim=1)  # (B, P + N, C)
        pe_tokens = self.pe_tokens
        if pe_tokens is not None and self.pe_tokens_block == 0:
            x = pe_tokens(x, shape, self.num_prefix_tokens)
        x = self.norm_pre(self.pos_drop(x))
        for i, block in enumerate(self.blocks):
            if pe_tokens is not None and self.pe_tokens_block > 0 and i == self.pe_tokens_block:
                x = pe_tokens(x, shape, self.num_prefix_tokens)  # a late tokens encoding (PEG after block 0)
            x = block(x, shape, self.num_prefix_tokens)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


class ScriptedVisionTransformer(ScriptedGridForward, VisionTransformer):
    """What ``torch.jit.script`` compiles for a :class:`VisionTransformerPE` (:class:`ScriptedGridForward`)."""


def head_dim_of(attn: nn.Module) -> int:
    """The head width of a timm attention module: ``head_dim``, or (timm releases whose ``EvaAttention`` and
    ``AttentionRope`` keep none) the output projection's input width over the heads."""
    return getattr(attn, "head_dim", None) or attn.proj.in_features // attn.num_heads


def register_count(model: nn.Module) -> int:
    """Register tokens of a timm token transformer: ``num_reg_tokens`` (VisionTransformer) or the rows of
    ``reg_token`` (Eva keeps no count)."""
    if hasattr(model, "num_reg_tokens"):
        return model.num_reg_tokens
    reg_token = getattr(model, "reg_token", None)  # (1, R, D) or None
    return 0 if reg_token is None else reg_token.shape[1]


def put_block_encodings(model: nn.Module, names: dict, kwargs: dict, patch_block) -> None:
    """What every timm token transformer (ViT, distilled DeiT, Eva) does with the encodings ``names`` (family ->
    name): its patch embedding emits ``(B, *grid, D)`` at any size, a ``learned`` table takes over ``pos_embed``
    (:func:`~visionpe.backbones.adapter.build_tokens`), and ``patch_block(block, rotary, bias)`` puts each block's
    encodings into it; weights kept."""
    if not len(model.blocks):
        raise ValueError(f"{type(model).__name__} has no blocks (depth=0): positions enter attention in the blocks; "
                         "depth must be a positive integer")
    patch_embed = model.patch_embed
    patch_embed.strict_img_size, patch_embed.flatten, patch_embed.output_fmt = False, False, Format.NHWC
    model.dynamic_img_size = True
    grid_shape = tuple(patch_embed.grid_size)
    first = model.blocks[0].attn
    context = ModelContext(grid_shape, model.embed_dim, first.num_heads, head_dim_of(first),
                           num_prefix_tokens=0 if model.no_embed_class else model.num_prefix_tokens,
                           depth=len(model.blocks), num_registers=register_count(model))
    old_table = model.pos_embed if isinstance(getattr(model, "pos_embed", None), nn.Parameter) else None
    tokens = build_tokens(names, kwargs, context, old_table, getattr(model, "pe_tokens", None))
    model.pos_embed = None
    model.pe_tokens = tokens
    encodings = EncodingSet(names, kwargs)
    for block in model.blocks:
        source = block.attn
        block_context = ModelContext(grid_shape, model.embed_dim, source.num_heads, head_dim_of(source),
                                     context.num_prefix_tokens, context.depth, context.num_registers)
        rotary = encodings.block("rotary", block_context, getattr(source, "rotary", None))
        bias = encodings.block("bias", block_context, getattr(source, "bias", None))
        patch_block(block, rotary, bias)


def grid_block(block: nn.Module, rotary, bias) -> None:
    """A timm ViT block becomes its :data:`GRID_BLOCKS` class, its attention a :class:`visionpe.Attention`."""
    base = next((b for b in GRID_BLOCKS if isinstance(block, b)), None)
    if base is None:
        raise ValueError(f"block type {type(block).__name__} is not supported; supported timm blocks: "
                         f"{', '.join(b.__name__ for b in GRID_BLOCKS)}")
    block.__class__ = GRID_BLOCKS[base]
    block.attn = Attention.from_timm(block.attn, rotary, bias)


def apply_vit(model: VisionTransformer, names: dict, kwargs: dict) -> None:
    """Put the encodings ``names`` (family -> name) into a timm ViT (or a subclass whose blocks are ViT blocks: the
    distilled DeiT) in place; weights kept."""
    put_block_encodings(model, names, kwargs, grid_block)


def any_size_vit(timm_kwargs: dict) -> dict:
    """timm's way of running a ViT/DeiT or Eva at any input size: ``dynamic_img_size=True`` (the caller's value
    wins); ``img_size`` checked against ``patch_size``, the model sizes (:func:`check_model_sizes`)."""
    timm_kwargs.setdefault("dynamic_img_size", True)
    check_img_size(timm_kwargs)
    check_model_sizes(timm_kwargs)
    return timm_kwargs


def any_size_checked(timm_kwargs: dict) -> dict:
    """A timm token transformer whose class takes no ``dynamic_img_size`` (BEiT, ``VisionTransformerRelPos``): the
    patched model runs at any size by itself; ``img_size`` checked against ``patch_size``, the model sizes
    (:func:`check_model_sizes`)."""
    check_img_size(timm_kwargs)
    check_model_sizes(timm_kwargs)
    return timm_kwargs


def native_vit(model: VisionTransformer) -> tuple[str, dict]:
    """A timm ViT's own encoding: its learned ``pos_embed`` (as timm resamples it: bicubic, antialiased), or none."""
    has_table = getattr(model, "pos_embed", None) is not None or getattr(model, "pe_tokens", None) is not None
    return ("learned" if has_table else "none"), {}


def vit_features(model: nn.Module) -> dict:
    """timm's ``feature_cfg`` of a ViT, DeiT or Eva: the intermediate-layer getter, the last block by default."""
    return {"feature_cls": "getter", "out_indices": 3}


EVA_LAYER_SCALE = re.compile(r"^blocks\.(\d+)\.gamma_([12])$")
EVA_QV_BIAS = re.compile(r"^(blocks\.\d+\.attn)\.([qv])_bias$")


def eva_keys_to_vit(state: dict, report: LoadReport) -> dict:
    """timm ``Eva`` checkpoints (rope-vit ports ``vit_*_rope_*``, timm's SBB ``vit_*_rope_reg*_gap_256``) ->
    ``VisionTransformer`` names: ``gamma_1`` -> ``ls1.gamma``, mixed ``rope.freqs (2, depth, heads, d/2)`` -> each
    block's ``attn.rotary.freqs``, separate ``q_bias``/``v_bias`` -> one ``qkv.bias`` (the key bias is zero)."""
    out = {}
    for key, value in state.items():
        match = EVA_QV_BIAS.match(key)
        if match and match.group(2) == "q" and f"{match.group(1)}.v_bias" in state:
            new_key = f"{match.group(1)}.qkv.bias"
            report.converted.append(f"{key} + {match.group(1)}.v_bias -> {new_key}")
            out[new_key] = torch.cat([value, torch.zeros_like(value), state[f"{match.group(1)}.v_bias"]])
            continue
        if match and match.group(2) == "v" and f"{match.group(1)}.q_bias" in state:
            continue
        match = EVA_LAYER_SCALE.match(key)
        if match:
            new_key = f"blocks.{match.group(1)}.ls{match.group(2)}.gamma"
            report.converted.append(f"{key} -> {new_key}")
            out[new_key] = value
        elif key == "rope.freqs" and value.ndim == 4:
            out.update(split_layer_freqs(value, report))
        else:
            out[key] = value
    return out


def split_layer_freqs(freqs: torch.Tensor, report: LoadReport) -> dict:
    """timm's mixed RoPE ``rope.freqs (2, depth, heads, d/2)`` -> each block's ``blocks.i.attn.rotary.freqs``."""
    out = {}
    for layer in range(freqs.shape[1]):
        new_key = f"blocks.{layer}.attn.rotary.freqs"
        report.converted.append(f"rope.freqs[:, {layer}] -> {new_key}")
        out[new_key] = freqs[:, layer]
    return out


VIT_RECORD = dict(any_size=any_size_vit, native=native_vit, refuses=GLOBAL_REFUSES, feature_cfg=vit_features)

register_adapter(Adapter(
    VisionTransformer, VisionTransformerPE, apply_vit, (Attention,), timm_modules=("vision_transformer", "deit"),
    unsupported={"vit_*_18x2_*": "parallel blocks (ParallelThingsBlock)",
                 "vit_*_xp_*": "parallel blocks (ParallelScalingBlock)",
                 "vit_*pwee_*": "parallel blocks (ParallelScalingBlock, DiffParallelScalingBlock)"},
    examples=("vit_tiny_patch16_224", "deit_small_patch16_224", "deit3_small_patch16_224"),
    checkpoint_hooks=(eva_keys_to_vit,), init_weights=lambda model: model.init_weights(), **VIT_RECORD))
