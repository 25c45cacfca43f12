"""timm ``Xcit`` (XCiT: ``xcit_*``) with visionpe tokens encodings, at any input size.

timm's model is kept (its convolutional patch embedding, the cross-covariance attention blocks with their local patch
interaction, the class-attention blocks, the head); its Fourier positional encoding (``pos_embed``) gives way to a
visionpe tokens encoding on the patch grid (:class:`XcitPE`; a late one, PEG's, before its block). Only the tokens
family fits: XCiT's attention (XCA) attends across channels, a ``(head_dim, head_dim)`` map with no token pair to add
a bias to or to rotate, and its class attention lets the position-free class token read the patches, where a rotary
or bias encoding has no query position.

The architecture's own encoding (``pe="native"``): XCiT's ``PositionalEncodingFourier`` (sines and cosines of the
patch coordinates normalised to ``(0, 2 pi]``, projected by a learned ``1 x 1`` convolution) is ``fourier``
(:class:`~visionpe.tokens.Fourier`), which takes over the convolution's weights as its ``projection`` (so does any
``fourier`` of the same sizes); a model built with ``use_pos_embed=False`` is ``none``. :func:`xcit_keys` reads timm's
checkpoints (and the official ``pos_embeder.`` ones) into it through :func:`~visionpe.load_timm_checkpoint`.
"""
from __future__ import annotations

import torch
from timm.models._features import feature_take_indices
from timm.models.xcit import PositionalEncodingFourier, Xcit
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..coords import shares_draws, with_draws
from ..encoding import ModelContext
from ..grid import Grid
from ..tokens import Fourier
from ..weights.convert import LoadReport
from .._compat import ADAPTER_MIN_TIMM, timm_release
from .adapter import Adapter, PositionalModel, build_tokens, check_input, recorded_native, register_adapter
from .vit import check_block_indices, vit_features


class XcitPE(PositionalModel, Xcit):
    """timm ``Xcit`` whose position comes from a visionpe tokens encoding (``pe_tokens``), at any input size that is a
    multiple of the patch; ``xcit_native`` records the model's own encoding as timm built it."""

    pe_tokens: nn.Module | None
    attention: str = "auto"  # visionpe.set_attention's slot: XCiT's own attention holds no visionpe encoding
    xcit_native: tuple[str, dict] | str | None = None

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        groups = super().group_matcher(coarse)
        return {**groups, "stem": groups["stem"] + "|^pe_tokens"}

    def check_input(self, x: torch.Tensor) -> None:
        first = self.patch_embed.proj[0][0]  # the stem's first convolution
        patch = self.patch_embed.patch_size
        check_input(x, (patch, patch), first.in_channels, type(self).__name__, first.weight.dtype)

    def run_blocks(self, x: torch.Tensor, blocks=None):
        """Images ``(B, C, H, W)`` through the patch embedding and the XCA ``blocks`` (default all), yielding the
        tokens ``(B, N, D)`` and their grid after each."""
        self.check_input(x)
        x, grid_size = self.patch_embed(x)
        grid = Grid(tuple(grid_size))
        late = self.pe_tokens is not None and self.pe_tokens.block_index > 0
        if self.pe_tokens is not None and not late:
            x = self.pe_tokens(x, grid)
        x = self.pos_drop(x)
        for i, block in enumerate(self.blocks if blocks is None else blocks):
            if late and i == self.pe_tokens.block_index:
                x = self.pe_tokens(x, grid)
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(with_draws(block), x, *grid.shape, use_reentrant=False)
            else:
                x = block(x, *grid.shape)
            yield x, grid

    @shares_draws
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for x, _ in self.run_blocks(x):
            pass
        if self.cls_attn_blocks is not None:
            x = self.forward_cls(x)
        return self.norm(x)

    @shares_draws
    def forward_intermediates(self, x: torch.Tensor, indices=None, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False):
        """timm's ``forward_intermediates`` of XCiT (same arguments and outputs)."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r} is not supported; allowed values: 'NCHW', 'NLC'")
        check_block_indices(indices, len(self.blocks))
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        blocks = self.blocks[:max_index + 1] if stop_early else self.blocks
        intermediates = []
        for i, (x, grid) in enumerate(self.run_blocks(x, blocks)):
            if i in take_indices:
                y = self.norm(x) if norm else x
                intermediates.append(y.unflatten(1, grid.shape).movedim(-1, 1).contiguous()
                                     if output_fmt == "NCHW" else y)
        if intermediates_only:
            return intermediates
        if self.cls_attn_blocks is not None:
            x = self.forward_cls(x)
        return self.norm(x), intermediates


def native_xcit(model: Xcit) -> tuple[str, dict]:
    """``("fourier", pe_kwargs)`` for XCiT's Fourier encoding (its ``hidden_dim`` and ``temperature``), ``("none", {})``
    for an XCiT without a positional encoding. A patched model answers with what it had when it was patched."""
    recorded = recorded_native(model, "xcit_native")
    if recorded is not None:
        return recorded
    fourier = getattr(model, "pos_embed", None)
    if fourier is None:
        return "none", {}
    if not isinstance(fourier, PositionalEncodingFourier):
        raise ValueError(f"Xcit's pos_embed is a {type(fourier).__name__}, not timm's PositionalEncodingFourier; give "
                         "another pe (fourier, sincos, learned or peg)")
    kwargs = dict(hidden_dim=fourier.hidden_dim, temperature=float(fourier.temperature))
    return "fourier", kwargs if fourier.eps == 1e-6 else {**kwargs, "eps": float(fourier.eps)}


@torch.no_grad()
def take_over_fourier(tokens: nn.Module | None, fourier: nn.Module | None) -> None:
    """timm's ``token_projection`` (a ``1 x 1`` convolution, weight ``(D, 2 hidden_dim, 1, 1)``) goes into a
    ``fourier`` encoding of the same sizes as its ``projection`` (``(D, 2 hidden_dim)``)."""
    if not isinstance(tokens, Fourier) or not isinstance(fourier, PositionalEncodingFourier):
        return
    conv = fourier.token_projection
    if tokens.projection.weight.shape == conv.weight.shape[:2]:
        tokens.projection.weight.copy_(conv.weight.flatten(1))
        tokens.projection.bias.copy_(conv.bias)


def apply_xcit(model: Xcit, names: dict, kwargs: dict) -> None:
    """Put the tokens encoding of ``names`` into a timm ``Xcit`` in place: its Fourier encoding goes (a ``fourier``
    of its sizes takes over its projection); every other weight is kept."""
    try:  # what timm built, recorded before its module goes
        native = native_xcit(model)
    except ValueError as err:
        native = str(err)
    if not len(model.blocks):
        raise ValueError("Xcit has no blocks (depth=0); depth must be a positive integer")
    patch = model.patch_embed.patch_size
    grid_shape = tuple(s // patch for s in model.patch_embed.img_size)
    first = model.blocks[0].attn
    context = ModelContext(grid_shape, model.embed_dim, first.num_heads, model.embed_dim // first.num_heads,
                           depth=len(model.blocks))
    model.pe_tokens = build_tokens(names, kwargs, context, previous=getattr(model, "pe_tokens", None))
    take_over_fourier(model.pe_tokens, model.pos_embed)
    model.pos_embed, model.xcit_native = None, native


def xcit_keys(state: dict, report: LoadReport) -> dict:
    """timm XCiT checkpoints: ``pos_embed.token_projection.weight (D, C, 1, 1)`` and its bias (``pos_embeder.`` in the
    official ones) -> a ``fourier`` encoding's ``pe_tokens.projection.weight (D, C)`` and bias."""
    out = {}
    for key, value in state.items():
        prefix, _, name = key.partition(".token_projection.")
        if prefix in ("pos_embed", "pos_embeder") and name in ("weight", "bias"):
            new_key = f"pe_tokens.projection.{name}"
            out[new_key] = value.flatten(1) if name == "weight" else value
            report.converted.append(f"{key} -> {new_key}")
        else:
            out[key] = value
    return out


if timm_release() >= ADAPTER_MIN_TIMM["Xcit"]:  # older timm lacks what the adapter reads
    register_adapter(Adapter(Xcit, XcitPE, apply_xcit, (), timm_modules=("xcit",), native=native_xcit,
                             families=("tokens",), feature_cfg=vit_features, checkpoint_hooks=(xcit_keys,),
                             examples=("xcit_tiny_12_p16_224", "xcit_nano_12_p8_224")))
