"""What every backbone adapter shares: parsing ``pe``, routing keywords, building encodings for a model,
the input check, and the :class:`PositionalModel` mixin of the patched model classes.

An adapter (``vit.py``, ``swin.py``, ...) maps a model class to its patched subclass and knows where the
encodings go; everything about *which* encodings and *how they are built* is here, once.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..encoding import Encoding, ModelContext, constructor_keywords
from ..registry import ENCODINGS, check_keywords, check_name


def parse_pe(pe: str) -> dict[str, str]:
    """``"rope_mixed+learned"`` -> ``{"rotary": "rope_mixed", "tokens": "learned"}``; ``"none"`` -> ``{}``.

    At most one encoding per family.
    """
    if not isinstance(pe, str) or not pe:
        raise ValueError(f"pe must be a name like 'rope_mixed' or 'rope_mixed+learned', got {pe!r}")
    if pe == "none":
        return {}
    by_family: dict[str, str] = {}
    for name in pe.split("+"):
        family = check_name(name, "pe").family
        if family in by_family:
            raise ValueError(f"pe={pe!r} combines {by_family[family]!r} and {name!r}, both of family {family!r}; "
                             f"combine at most one tokens, one rotary and one bias encoding")
        by_family[family] = name
    return by_family


def route_kwargs(names: dict[str, str], pe_kwargs: dict) -> dict[str, dict]:
    """Give each keyword to every encoding of the combination whose constructor takes it."""
    if not isinstance(pe_kwargs, Mapping):
        raise ValueError(f"pe_kwargs must be a mapping of encoding keywords, got {pe_kwargs!r}")
    routed = {name: {} for name in names.values()}
    for key, value in pe_kwargs.items():
        takers = [n for n in routed if key in constructor_keywords(ENCODINGS[n])]
        if not takers:
            raise ValueError(f"pe keyword {key!r} is not taken by {' + '.join(routed) or 'none'}")
        for n in takers:
            routed[n][key] = value
    return routed


def build_for(name: str, context: ModelContext, kwargs: dict) -> Encoding:
    """The encoding ``name`` built for a model (:meth:`Encoding.for_model`), the user's ``kwargs`` winning."""
    check_keywords(name, kwargs)
    return ENCODINGS[name].for_model(context, **kwargs)


class EncodingSet:
    """Builds one model's per-block encodings; parameter-free ones (axial RoPE, ALiBi) built with the same
    keywords are one shared module, so their tables are computed once for all blocks."""

    def __init__(self, names: dict[str, str], kwargs: dict[str, dict]):
        self.names, self.kwargs = names, kwargs
        self._shared: dict = {}

    def block(self, family: str, context: ModelContext, previous: nn.Module | None = None,
              **defaults) -> Encoding | None:
        """The ``family`` encoding of one block (None when ``pe`` has none); ``defaults`` are adapter-specific
        keywords the user may override; ``previous`` (the block's encoding before a re-apply) hands over its
        learned weights when its type and shapes match."""
        name = self.names.get(family)
        if name is None:
            return None
        module = build_for(name, context, {**defaults, **self.kwargs[name]})
        if any(True for _ in module.parameters()):
            carry_over(module, previous)
            return module
        key = (name, context, tuple(sorted((k, repr(v)) for k, v in {**defaults, **self.kwargs[name]}.items())))
        return self._shared.setdefault(key, module)


def carry_over(new: nn.Module, old: nn.Module | None) -> None:
    """Re-applying an encoding to a patched model keeps its learned weights (same type and shapes)."""
    if type(old) is type(new):
        old_state, new_state = old.state_dict(), new.state_dict()
        if old_state.keys() == new_state.keys() and all(old_state[k].shape == v.shape for k, v in new_state.items()):
            new.load_state_dict(old_state)


def check_input(x, patch_size, in_chans: int, model_name: str) -> None:
    """A clear error for an input the model cannot take: ``(B, C, *spatial)`` floating, ``C = in_chans``, each
    spatial side a positive multiple of the patch (tubelet) size."""
    spatial = len(patch_size)
    if not isinstance(x, torch.Tensor) or x.ndim != 2 + spatial:
        layout = "(B, C, T, H, W)" if spatial == 3 else "(B, C, H, W)"
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        hint = f" (one {layout.replace('B, ', '')} sample? add a batch axis: x[None])" \
            if getattr(x, "ndim", 0) == 1 + spatial else ""
        raise ValueError(f"{model_name} takes a {layout} batch tensor, got {got}{hint}")
    if not x.is_floating_point():
        raise ValueError(f"{model_name} takes a floating-point image batch, got {x.dtype} (convert and normalise, "
                         f"e.g. x.float() / 255)")
    if x.shape[1] != in_chans:
        raise ValueError(f"{model_name} was built with in_chans={in_chans} but the input has {x.shape[1]} channels")
    sizes = tuple(x.shape[2:])
    if any(s % m or s < m for s, m in zip(sizes, patch_size)):
        raise ValueError(f"input size {sizes} does not fit {model_name}: each side must be a positive multiple of "
                         f"{tuple(patch_size)} (e.g. {tuple(m * 4 for m in patch_size)} or "
                         f"{tuple(m * 6 for m in patch_size)})")


class PositionalModel:
    """Mixin of the patched model classes: encoding bookkeeping shared by every backbone."""

    pe: str = "none"

    def check_input(self, x: torch.Tensor) -> None:
        check_input(x, tuple(self.patch_embed.patch_size), self.patch_embed.proj.in_channels, type(self).__name__)

    def no_weight_decay(self) -> set[str]:
        """timm's set plus what every encoding excludes (its tables, frequencies, bias MLPs; PEG nothing)."""
        names = set(super().no_weight_decay())
        for prefix, module in self.named_modules():
            if isinstance(module, Encoding):
                names |= {f"{prefix}.{n}" for n in module.no_weight_decay()}
        return names
