"""What a preset is: a foundation model's positional scheme as a composition of visionpe encodings with the model's
exact conventions, and how it is built standalone (:func:`preset`) or named in a backbone (``pe="preset:NAME"``).

A preset never implements an encoding: each family it uses is a registered encoding (``learned``, ``sincos``,
``rope_axial``, ...) built with the keywords that reproduce the model (its *conventions*). The same conventions
serve both ways in: :func:`preset` builds them for the published model's own sizes (``native``), and a backbone
patched with ``pe="preset:NAME"`` builds them for its own sizes (:func:`preset_names` is what
:func:`visionpe.backbones.adapter.parse_pe` returns for such a name).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .._checks import check_nonnegative_int, check_positive_int, to_shape
from ..encoding import Encoding, ModelContext, constructor_keywords
from ..grid import Grid, Layout, as_grid
from ..registry import ENCODINGS

PRESET_PREFIX = "preset:"
CONTEXT_WORDS = ("grid_shape", "dim", "num_heads", "head_dim", "num_prefix_tokens", "depth")
FAMILY_ORDER = ("tokens", "rotary", "bias")


@dataclass(frozen=True)
class Preset:
    """One foundation model's positional scheme.

    Args:
        name: the preset's name (``vpe.preset(name)``, ``pe="preset:NAME"``).
        model: the model (family) it reproduces, e.g. ``"SigLIP 2 (NaFlex)"``.
        summary: one line: what the scheme is.
        encodings: family -> ``(encoding name, conventions)``: the registered encoding of each family and the
            constructor keywords that give the model's conventions (interpolation, ``align_corners``, theta, pair
            layout, sections, ...). Sizes are not conventions: they come from the model the preset is built for.
        native: the published model's sizes (:class:`~visionpe.ModelContext` words: ``grid_shape``, ``dim``,
            ``num_heads``, optionally ``head_dim`` and ``num_prefix_tokens``), used by :func:`preset`.
        reference: the model's own code the preset equals (module and function, or repository, path and commit).
        patch_size: the model's patch (tubelet) size in pixels (frames), for the docs.
        notes: every difference from visionpe's defaults and from the model, stated (never silently fixed).
        architecture: parts of the model's scheme that are architecture rather than position (window attention,
            patch merging); stated, not implemented.
        token_order: the model's token order when it is not visionpe's (:mod:`visionpe.presets.orders`), or None.
    """

    name: str
    model: str
    summary: str
    encodings: Mapping[str, tuple[str, Mapping]]
    native: Mapping
    reference: str
    patch_size: tuple[int, ...]
    notes: tuple[str, ...] = ()
    architecture: str = ""
    token_order: Callable[[Grid], torch.Tensor] | None = None

    def __post_init__(self):
        for family, (encoding, conventions) in self.encodings.items():
            cls = ENCODINGS[encoding]
            if cls.family != family:
                raise ValueError(f"preset {self.name!r}: {encoding} is a {cls.family} encoding, listed as {family!r}")
            unknown = sorted(set(conventions) - set(constructor_keywords(cls)))
            if unknown:
                raise ValueError(f"preset {self.name!r}: {encoding} does not take {', '.join(unknown)}")

    @property
    def composition(self) -> str:
        """The encodings as a ``pe`` combination would name them, e.g. ``"learned+rope_axial"``."""
        return "+".join(self.encodings[f][0] for f in FAMILY_ORDER if f in self.encodings)

    def line(self) -> str:
        """``"Model: summary"``, the one line :func:`presets` lists."""
        return f"{self.model}: {self.summary}"

    def build(self, context: ModelContext, **keywords) -> "PresetScheme":
        """The scheme built for a model offering ``context`` (as a backbone builds ``pe="preset:NAME"``): each
        encoding through :meth:`~visionpe.Encoding.for_model`, the conventions over the model's words, ``keywords``
        over both (each to the encodings that take it; one none takes is a ``ValueError``)."""
        taken = {k for encoding, _ in self.encodings.values() for k in keywords
                 if k in constructor_keywords(ENCODINGS[encoding])}
        unknown = sorted(set(keywords) - taken)
        if unknown:
            raise ValueError(f"preset {self.name!r} ({self.composition}) takes no keyword "
                             f"{', '.join(map(repr, unknown))}; sizes: {', '.join(CONTEXT_WORDS)}, or a keyword of "
                             f"its encodings")
        built = {}
        for family, (encoding, conventions) in self.encodings.items():
            cls = ENCODINGS[encoding]
            mine = {k: v for k, v in keywords.items() if k in constructor_keywords(cls)}
            built[family] = cls.for_model(context, **{**conventions, **mine})
        return PresetScheme(self, built)


class PresetNames(dict):
    """``{family: encoding name}`` of a ``"preset:NAME"`` (what ``parse_pe`` returns for any ``pe``) that also
    carries the preset's conventions, ``{encoding name: keywords}``: the defaults the user's keywords override."""

    def __init__(self, record: Preset):
        super().__init__({family: encoding for family, (encoding, _) in record.encodings.items()})
        self.preset = record
        self.conventions = {encoding: dict(conventions) for encoding, conventions in record.encodings.values()}


def conventions_of(names: Mapping) -> dict[str, dict]:
    """The default keywords a parsed ``pe`` carries per encoding: a preset's conventions, else none."""
    return getattr(names, "conventions", {})


class PresetScheme(nn.Module):
    """A preset built: its encodings as submodules ``tokens``, ``rotary``, ``bias`` (None where the model has none),
    each called as every visionpe encoding of its family is, plus the model's token order.

    ``x = scheme.tokens(x, grid)``; ``q, k = scheme.rotary(q, k, grid)``; ``scheme.layout(grid)``: the layout whose
    tokens are in the model's order (a :class:`~visionpe.Layout` keeping every patch in that order), to feed
    tensors taken from the model's own code.
    """

    def __init__(self, record: Preset, encodings: Mapping[str, Encoding]):
        super().__init__()
        self.preset = record
        self.tokens = encodings.get("tokens")
        self.rotary = encodings.get("rotary")
        self.bias = encodings.get("bias")

    @property
    def encodings(self) -> dict[str, Encoding]:
        """``{family: encoding}`` of the families the model uses."""
        return {f: getattr(self, f) for f in FAMILY_ORDER if getattr(self, f) is not None}

    def token_order(self, grid) -> torch.Tensor | None:
        """``(P + N,)``: the visionpe token index of each of the model's tokens (None when the model's order is
        visionpe's): ``x_model = x[:, order]``."""
        order = self.preset.token_order
        return None if order is None else order(as_grid(grid))

    def layout(self, grid) -> Layout:
        """The :class:`~visionpe.Layout` of tokens in the model's order: prefix tokens first and every patch kept in
        the model's order (``keep``), so each encoding gives each token of a model-ordered tensor its own position.
        A ``ValueError`` where the model moves prefix tokens (Llama 4: reorder with :meth:`token_order`)."""
        grid = as_grid(grid)
        order = self.token_order(grid)
        if order is None:
            return Layout(grid)
        if not torch.equal(order[:grid.prefix], torch.arange(grid.prefix)):
            raise ValueError(f"{self.preset.model} puts its prefix tokens elsewhere than first; a Layout keeps them "
                             f"first: reorder the tokens with token_order(grid) instead")
        return Layout(grid, (order[grid.prefix:] - grid.prefix)[None])

    def extra_repr(self) -> str:
        return f"preset={self.preset.name!r} ({self.preset.model})"


PRESETS: dict[str, Preset] = {}


def add_preset(record: Preset) -> Preset:
    """Put ``record`` in the catalogue (:data:`PRESETS`) under its name."""
    if record.name in PRESETS:
        raise ValueError(f"preset {record.name!r} is already in the catalogue")
    PRESETS[record.name] = record
    return record


def presets() -> dict[str, str]:
    """Every preset's name with one line: the model and what its scheme is."""
    return {name: record.line() for name, record in PRESETS.items()}


def get_preset(name: str) -> Preset:
    """The catalogue entry ``name``; a ``ValueError`` listing the presets for another name."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"preset {name!r} is not known; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def preset_names(pe: str) -> PresetNames:
    """``"preset:NAME"`` -> its :class:`PresetNames` (a ``pe`` naming a preset stands alone: no ``+``)."""
    name = pe[len(PRESET_PREFIX):]
    if "+" in name:
        raise ValueError(f"pe={pe!r}: a preset is a whole scheme and combines with nothing; use pe='preset:NAME' "
                         f"alone, or name the encodings themselves (e.g. 'learned+rope_axial') with pe_kwargs")
    return PresetNames(get_preset(name))


def _check_sizes(record: Preset, sizes: Mapping) -> None:
    """The size overrides of :func:`preset` are the model's words: positive integers (``num_prefix_tokens`` may be
    0), ``grid_shape`` a tuple of as many positive integers as the preset's grid has axes; a ValueError naming the
    word otherwise."""
    for word in ("dim", "num_heads", "head_dim", "depth"):
        if word in sizes:
            check_positive_int(word, sizes[word])
    if "num_prefix_tokens" in sizes:
        check_nonnegative_int("num_prefix_tokens", sizes["num_prefix_tokens"])
    if "grid_shape" in sizes:
        value, axes = sizes["grid_shape"], len(record.native["grid_shape"])
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
            raise ValueError(f"grid_shape must be a tuple of {axes} positive integers (e.g. "
                             f"{tuple(record.native['grid_shape'])}), got {value!r}")
        to_shape("grid_shape", value)
        if len(value) != axes:
            raise ValueError(f"grid_shape={tuple(value)!r} has {len(value)} axes; preset {record.name!r} is a "
                             f"{axes}-axis scheme (its grid {tuple(record.native['grid_shape'])}): give {axes} "
                             f"positive integers")


def preset(name: str, **overrides) -> PresetScheme:
    """The positional scheme of the foundation model ``name`` (:func:`presets` lists them) as visionpe encodings with
    the model's exact conventions, built for the published model's sizes.

    ``overrides`` change what the preset gives: a size (``grid_shape``, ``dim``, ``num_heads``, ``head_dim``,
    ``num_prefix_tokens``, ``depth``; ``head_dim`` follows ``dim // num_heads`` unless given) or any keyword of its
    encodings (``theta=...``, ``interpolation=...``: given to each encoding of the preset that takes it, replacing
    the convention). A size that is also a convention replaces it too: ``grid_shape`` of a preset with a fixed table
    grid (SigLIP 2's 16x16) is that table's grid. A keyword none of them takes is a ``ValueError``.
    :meth:`Preset.build` builds for a model's :class:`~visionpe.ModelContext` instead, as a backbone does.

    >>> scheme = preset("qwen3_vl")
    >>> scheme.tokens, scheme.rotary  # learned 48x48 grid (bilinear, align_corners=True), 2D RoPE
    """
    record = get_preset(name)
    native = dict(record.native)
    sizes = {k: v for k, v in overrides.items() if k in CONTEXT_WORDS}
    _check_sizes(record, sizes)
    if "head_dim" not in sizes and {"dim", "num_heads"} & set(sizes):
        native.pop("head_dim", None)
    native.update(sizes)
    uses_heads = bool({"rotary", "bias"} & set(record.encodings))  # a tokens-only scheme reads no head width
    if uses_heads and "head_dim" not in native and native["dim"] % native["num_heads"]:
        raise ValueError(f"preset {name!r}: num_heads={native['num_heads']} does not divide dim={native['dim']}, so "
                         f"head_dim = dim // num_heads is not whole; give a num_heads that divides dim, or head_dim")
    native.setdefault("head_dim", native["dim"] // native["num_heads"])
    context = ModelContext(**{k: (tuple(v) if k == "grid_shape" else v) for k, v in native.items()})
    conventions = {k for _, c in record.encodings.values() for k in c}
    return record.build(context, **{k: v for k, v in overrides.items() if k not in CONTEXT_WORDS or k in conventions})


__all__ = ["CONTEXT_WORDS", "PRESETS", "PRESET_PREFIX", "Preset", "PresetNames", "PresetScheme", "add_preset",
           "conventions_of", "get_preset", "preset", "preset_names", "presets"]
