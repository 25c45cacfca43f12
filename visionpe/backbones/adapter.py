"""What every backbone adapter shares: the registry of adapters, parsing ``pe``, routing keywords, building
encodings for a model, the input check, and the :class:`PositionalModel` mixin of the patched model classes.

An adapter (``vit.py``, ``swin.py``, ...) is one :class:`Adapter` record, registered once with
:func:`register_adapter`: the model class it takes, its patched subclass, where the encodings go, which attention
modules hold them, how its models are made to run at any input size, its own (native) encoding, the encodings it
takes, the timm names it does not take and why, example names, checkpoint-key conversions and timm's feature
extraction config. :func:`~visionpe.apply`, :func:`~visionpe.create_model`, :func:`~visionpe.encodings_of`,
:func:`~visionpe.load_timm_checkpoint`, timm's ``vpe_*`` registry and ``train_vit.py --model`` (its help and
messages) ask the registry, so a new backbone is one module and one registration (a user's own too). Everything
about *which* encodings and *how they are built* is here, once.
"""
from __future__ import annotations

import fnmatch
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from .._checks import check_divisible, check_fits, check_positive_int, to_shape
from .._compat import is_autocast_enabled, refuse_torchscript
from ..encoding import Encoding, ModelContext, constructor_keywords
from ..presets import PRESET_PREFIX, conventions_of, preset_names
from ..registry import ENCODINGS, FAMILIES, check_keywords, check_name
from ..rotary.sections import video_sections
from ..sharding import built_class
from ..tokens import Learned
from ..weights.convert import LoadReport, pos_embed_tensors


@dataclass(frozen=True)
class Adapter:
    """How visionpe puts encodings into one model class.

    Args:
        base: the model class it takes (e.g. timm's ``VisionTransformer``; not its subclasses, whose own methods the
            patched class would replace).
        patched: the subclass the model's class becomes (mixes in :class:`PositionalModel`).
        put_encodings: ``put_encodings(model, names, kwargs)`` builds the encodings ``names`` (family -> encoding
            name) with their keywords (encoding name -> keywords) and puts them in place; raises ``ValueError`` for a
            family the backbone cannot take.
        attention: the attention module classes that hold a block's ``rotary`` and ``bias`` encodings.
        library: where ``base`` comes from, for messages (``"timm"``, ``"torchvision"``, ``"transformers"``).
        timm_modules: timm modules whose registered models build ``base`` (``create_model`` takes their names,
            ``train_vit.py --pe timm_unpatched`` runs them natively).
        any_size: ``any_size(timm_kwargs) -> timm_kwargs`` adding what makes such a timm model run at any input
            size the way timm does it (``dynamic_img_size``, ``strict_img_size=False``), checked.
        constructors: models by name that are not in timm's registry (e.g. torchvision's ``swin3d_t``): ``name ->
            build(**kwargs)``, called with timm's keyword names (``num_classes``, ``patch_size``, ``in_chans``,
            ``img_size``, ``drop_path_rate``) plus the user's model keywords.
        video: the models take clips ``(B, C, T, H, W)``.
        native: the encoding the architecture has itself, what ``pe="native"`` gives (:func:`~visionpe.apply`) and the
            default of its ``vpe_*`` names in timm's registry: a ``pe`` string (``"learned"``), or
            ``native(model) -> (pe, pe_kwargs)`` for a family whose models differ (timm's Eva: its RoPE variant);
            None: the family has no native encoding visionpe reproduces.
        families: the encoding families its attention takes (:data:`visionpe.registry.FAMILIES`; Swin windows:
            ``("rotary", "bias")``).
        refuses: encodings of those families it does not take, ``name -> why`` (a sentence that follows the name and
            says what to use instead, e.g. ``"needs window attention (Swin); ..."``).
        unsupported: timm names (``fnmatch`` patterns) in ``timm_modules`` whose architecture the adapter does not
            patch, ``pattern -> why``; they are left out of timm's ``vpe_*`` registry and refused by ``--model``.
        examples: model names for help texts and messages (``train_vit.py --model``).
        checkpoint_hooks: ``hook(state, report) -> state`` functions :func:`~visionpe.load_timm_checkpoint` runs on
            a checkpoint before loading it into a model of this family: they rename other layouts' keys (e.g. timm's
            Eva rope-vit ports into a ViT) and record each in ``report.converted``.
        feature_cfg: ``feature_cfg(model) -> dict``: timm's ``feature_cfg`` for ``features_only=True`` of such a
            model (as timm's own constructor of the family gives it: ``feature_cls``, default ``out_indices``, ...);
            None: no feature extraction.
        init_weights: ``init_weights(model)``, the backbone's own initialisation scheme applied to a model built on
            the meta device and materialised (:func:`visionpe.reset_parameters`; e.g. timm's ``init_weights()``);
            None where the backbone initialises inside its constructors only (such models are built on a device).
    """

    base: type
    patched: type
    put_encodings: Callable[[nn.Module, dict, dict], None]
    attention: tuple[type, ...]
    library: str = "timm"
    timm_modules: tuple[str, ...] = ()
    any_size: Callable[[dict], dict] | None = None
    constructors: Mapping[str, Callable[..., nn.Module]] = field(default_factory=dict)
    video: bool = False
    native: str | Callable[[nn.Module], tuple[str, dict]] | None = None
    families: tuple[str, ...] = FAMILIES
    refuses: Mapping[str, str] = field(default_factory=dict)
    unsupported: Mapping[str, str] = field(default_factory=dict)
    examples: tuple[str, ...] = ()
    checkpoint_hooks: tuple[Callable[[dict, LoadReport], dict], ...] = ()
    feature_cfg: Callable[[nn.Module], dict] | None = None
    init_weights: Callable[[nn.Module], None] | None = None

    @property
    def name(self) -> str:
        return f"{self.library} {self.base.__name__}"

    def encodings(self) -> list[str]:
        """The registered encodings it takes: those of its families on its grids (2D, video 3D), less
        :attr:`refuses`."""
        ndim = 3 if self.video else 2
        return [name for name, cls in ENCODINGS.items()
                if cls.family in self.families and ndim in cls.ndims and name not in self.refuses]

    def native_pe(self, model: nn.Module) -> tuple[str, dict]:
        """``(pe, pe_kwargs)`` of ``model``'s own encoding (:attr:`native`); a ``ValueError`` when there is none."""
        if self.native is None:
            raise ValueError(f"{self.name} has no native encoding in visionpe; give pe= (one of "
                             f"{', '.join(self.encodings())})")
        return (self.native, {}) if isinstance(self.native, str) else self.native(model)

    def unsupported_reason(self, timm_name: str) -> str | None:
        """Why the adapter does not take timm's ``timm_name`` (an :attr:`unsupported` pattern matches), else None."""
        return next((why for pattern, why in self.unsupported.items()
                     if fnmatch.fnmatchcase(split_tag(timm_name), pattern)), None)


ADAPTERS: dict[type, Adapter] = {}
UNAVAILABLE: dict[str, str] = {}  # library -> why its adapters are not registered (an installed release too old)
NATIVE = "native"  # pe: the architecture's own encoding (its adapter's ``native``)

# what global and window attention refuse (records of the adapters with each kind of attention)
GLOBAL_REFUSES = {"swin_bias": "needs window attention (Swin); for a ViT use rel_bias (BEiT's global table), cpb or "
                               "alibi"}
WINDOW_FAMILIES = ("rotary", "bias")  # a window is a fixed grid inside the feature map: no tokens encoding
WINDOW_REFUSES = {"rel_bias": "is a global (whole-grid) table for ViTs; in Swin windows use swin_bias"}


def register_adapter(adapter: Adapter, overwrite: bool = False) -> Adapter:
    """Make ``adapter`` the way :func:`~visionpe.apply` treats models of class ``adapter.base``."""
    if not isinstance(adapter, Adapter):
        raise TypeError(f"adapter must be a visionpe.backbones.Adapter, got {type(adapter).__name__}")
    if not (isinstance(adapter.base, type) and isinstance(adapter.patched, type)
            and issubclass(adapter.patched, adapter.base) and issubclass(adapter.patched, PositionalModel)):
        raise TypeError(f"adapter.patched must subclass both PositionalModel and adapter.base "
                        f"({getattr(adapter.base, '__name__', adapter.base)!r})")
    if adapter.base in ADAPTERS and ADAPTERS[adapter.base] != adapter and not overwrite:
        raise ValueError(f"{adapter.name} already has an adapter; pass overwrite=True to replace it")
    taken = {name for other in ADAPTERS.values() if other.base is not adapter.base for name in other.constructors}
    clash = sorted(taken & set(adapter.constructors))
    if clash:
        raise ValueError(f"model name(s) {', '.join(clash)} are already registered by another adapter")
    unknown = sorted(set(adapter.families) - set(FAMILIES))
    if unknown or not adapter.families:
        raise ValueError(f"adapter.families must name encoding families of {', '.join(FAMILIES)}, got "
                         f"{adapter.families!r}")
    ADAPTERS[adapter.base] = adapter
    registry = sys.modules.get(f"{__package__}.timm_registry")
    if registry is not None and adapter.timm_modules:  # timm's registry is live: the new names join it now
        registry.register_models()
    return adapter


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter of ``model``'s class: the class an adapter takes, or its patched subclass (also after FSDP2's
    ``fully_shard`` has swapped it for its own subclass)."""
    cls = built_class(model)
    for adapter in ADAPTERS.values():
        if cls in (adapter.base, adapter.patched):
            return adapter
    if cls.__module__.split(".")[0] in UNAVAILABLE:
        raise ValueError(f"model class {cls.__module__}.{cls.__qualname__} is not supported here: "
                         f"{UNAVAILABLE[cls.__module__.split('.')[0]]}")
    supported = ", ".join(a.name for a in ADAPTERS.values())
    near = next((a for a in ADAPTERS.values() if isinstance(model, a.base)), None)
    why = (f" (it subclasses {near.name}, whose adapter does not know what the subclass adds)" if near else "")
    raise ValueError(f"model class {cls.__module__}.{cls.__qualname__} is not supported{why}; supported: {supported} "
                     "(a new backbone: visionpe.backbones.register_adapter)")


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a patched model, in order: the outermost items of its ``ModuleList``/``Sequential``
    containers that hold exactly one attention module of its adapter (timm ViT ``blocks``, each Swin stage's
    ``blocks``, torchvision's ``encoder.layers``, transformers' ``encoder.layer``), each one unit of sharding,
    activation checkpointing or compilation. A ``ValueError`` when the model has none (not a patched model)."""
    attention = adapter_for(model).attention
    blocks, inside = [], set()
    for name, module in model.named_modules():
        if any(name.startswith(f"{outer}.") for outer in inside):
            continue
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            for index, item in enumerate(module):
                if sum(isinstance(m, attention) for m in item.modules()) == 1:
                    blocks.append(item)
                    inside.add(f"{name}.{index}" if name else str(index))
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no transformer blocks holding "
                         f"{', '.join(a.__name__ for a in attention)} in a ModuleList or Sequential")
    return blocks


def recorded_native(model: nn.Module, attr: str) -> tuple[str, dict] | None:
    """What a patched model recorded in ``attr`` of its own encoding when it was patched: ``(pe, pe_kwargs)``, None
    for a model not patched yet; a ``ValueError`` with the recorded reason where visionpe has no equivalent."""
    recorded = getattr(model, attr, None)
    if isinstance(recorded, str):
        raise ValueError(recorded)
    return recorded


def native_before_patching(model: nn.Module, native: Callable[[nn.Module], tuple[str, dict]]) -> tuple[str, dict] | str:
    """The start of an adapter's ``apply``: what timm built, recorded before the adapter's modules replace its own
    (``native(model)``'s ``(pe, pe_kwargs)``, or the text of its ``ValueError`` where visionpe has no equivalent, which
    :func:`recorded_native` raises again; another ``pe`` still replaces such an encoding), then a model without blocks
    (``depth=0``) refused, before anything is changed: positions enter attention in the blocks."""
    try:
        recorded = native(model)
    except ValueError as err:
        recorded = str(err)
    if not len(model.blocks):
        raise ValueError(f"{type(model).__name__} has no blocks (depth=0): positions enter attention in the blocks; "
                         "depth must be a positive integer")
    return recorded


def named_constructor(name: str) -> tuple[Adapter, Callable[..., nn.Module]] | None:
    """``(adapter, build)`` of a model name that an adapter constructs itself (not a timm name), else None."""
    for adapter in ADAPTERS.values():
        if name in adapter.constructors:
            return adapter, adapter.constructors[name]
    return None


def timm_adapter(name: str) -> Adapter | None:
    """The adapter whose ``timm_modules`` hold timm's model ``name``, else None (its :attr:`Adapter.unsupported`
    patterns may still refuse the name)."""
    import timm
    if not timm.is_model(name):
        return None
    return next((a for a in ADAPTERS.values() if a.timm_modules
                 and timm.models.is_model_in_modules(name, list(a.timm_modules))), None)


def adapter_of_name(name: str) -> tuple[Adapter | None, Callable[..., nn.Module] | None]:
    """``(adapter, build)`` of a model name, asked once: an adapter's own constructor of it
    (:func:`named_constructor`), else ``(adapter, None)`` for a timm model (:func:`timm_adapter`; ``(None, None)``
    when no adapter takes it or timm does not know it)."""
    named = named_constructor(name)
    return named if named is not None else (timm_adapter(name), None)


def split_tag(name: str) -> str:
    """A timm name without its pretrained tag: ``vit_small_patch16_224.augreg_in1k`` -> ``vit_small_patch16_224``."""
    return name.partition(".")[0]


def parse_pe(pe: str) -> dict[str, str]:
    """``"rope_mixed+learned"`` -> ``{"rotary": "rope_mixed", "tokens": "learned"}``; ``"none"`` -> ``{}``.

    At most one encoding per family. ``"preset:NAME"`` (:mod:`visionpe.presets`) gives the preset's encodings, with
    its conventions as their default keywords (:func:`~visionpe.presets.conventions_of`, read by
    :func:`route_kwargs`).
    """
    if not isinstance(pe, str) or not pe:
        raise ValueError(f"pe must be a name like 'rope_mixed' or 'rope_mixed+learned', got {pe!r}")
    if pe == "none":
        return {}
    if pe.startswith(PRESET_PREFIX):
        return preset_names(pe)
    by_family: dict[str, str] = {}
    for name in pe.split("+"):
        family = check_name(name, "pe").family
        if family in by_family:
            raise ValueError(f"pe={pe!r} combines {by_family[family]!r} and {name!r}, both of family {family!r}; "
                             f"combine at most one tokens, one rotary and one bias encoding")
        by_family[family] = name
    return by_family


def route_kwargs(names: dict[str, str], pe_kwargs: dict) -> dict[str, dict]:
    """Give each keyword to every encoding of the combination whose constructor takes it (over a preset's
    conventions)."""
    if not isinstance(pe_kwargs, Mapping):
        raise ValueError(f"pe_kwargs must be a mapping of encoding keywords, got {pe_kwargs!r}")
    routed = {name: dict(conventions_of(names).get(name, {})) for name in names.values()}
    for key, value in pe_kwargs.items():
        takers = [n for n in routed if key in constructor_keywords(ENCODINGS[n])]
        if not takers:
            raise ValueError(f"pe keyword {key!r} is not taken by {' + '.join(routed) or 'none'}")
        for n in takers:
            routed[n][key] = value
    return routed


def build_for(name: str, context: ModelContext, kwargs: dict) -> Encoding:
    """The encoding ``name`` built for a model (:meth:`Encoding.for_model`: words that contradict the model, e.g. a
    video preset's ``ndim`` in an image model, are a ``ValueError``), the user's ``kwargs`` winning."""
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


def check_encodings(adapter: Adapter, names: dict[str, str], model_name: str) -> None:
    """The encodings ``names`` (family -> name) fit ``adapter``'s attention: a ``ValueError`` naming what it takes
    otherwise (messages generated from the registered encodings and adapters)."""
    for family, name in names.items():
        if family not in adapter.families:
            takers = [a.name for a in ADAPTERS.values() if family in a.families and not a.video]
            shown = ", ".join(takers[:3]) + (", ..." if len(takers) > 3 else "")
            raise ValueError(f"{model_name} takes {' and '.join(adapter.families)} encodings "
                             f"({', '.join(adapter.encodings())}); {family} encodings ({name}) need another "
                             f"backbone, e.g. a ViT ({shown})")
        if name in adapter.refuses:
            raise ValueError(f"{name} {adapter.refuses[name]}")


def build_tokens(names: dict[str, str], kwargs: dict[str, dict], context: ModelContext,
                 old_table: torch.Tensor | None = None, previous: nn.Module | None = None,
                 **defaults) -> Encoding | None:
    """The tokens encoding of a ViT-style model (None when ``pe`` has none), built for ``context``.

    A ``learned`` table takes over the model's own absolute table ``old_table: (1, P + N, D)`` (``P`` =
    ``context.num_prefix_tokens`` rows for prefix tokens, then the patches of ``context.grid_shape``, resampled when
    the user builds the table for another ``grid_shape``); on a re-apply it keeps ``previous``'s weights when their
    shapes match.
    ``defaults`` are adapter-specific keywords the user may override. A ``block_index`` beyond the model's blocks
    is an error.
    """
    name = names.get("tokens")
    if name is None:
        return None
    tokens = build_for(name, context, {**defaults, **kwargs[name]})
    if isinstance(tokens, Learned) and old_table is not None and \
            old_table.shape[1] == tokens.num_prefix_tokens + math.prod(context.grid_shape):
        tokens.load_state_dict(pos_embed_tensors(tokens, old_table.detach(), context.grid_shape))
    else:
        carry_over(tokens, previous)
    if tokens.block_index >= context.depth:
        raise ValueError(f"block_index={tokens.block_index} is out of range: the model has {context.depth} blocks, "
                         f"0..{context.depth - 1}")
    return tokens


def carry_over(new: nn.Module, old: nn.Module | None) -> None:
    """Re-applying an encoding to a patched model keeps its learned weights (same type and shapes)."""
    if type(old) is type(new):
        old_state, new_state = old.state_dict(), new.state_dict()
        if old_state.keys() == new_state.keys() and all(old_state[k].shape == v.shape for k, v in new_state.items()):
            new.load_state_dict(old_state)


def check_img_size(timm_kwargs: dict) -> None:
    """``img_size`` must be a multiple of ``patch_size`` at construction, not only at the first forward."""
    img, patch = timm_kwargs.get("img_size"), timm_kwargs.get("patch_size")
    if patch is not None:
        patch = to_shape("patch_size", patch, 2)
    if img is None:
        return
    img = to_shape("img_size", img, 2)
    if patch is None:
        return
    if any(i % p for i, p in zip(img, patch)):
        raise ValueError(f"img_size={timm_kwargs['img_size']!r} must be a multiple of "
                         f"patch_size={timm_kwargs['patch_size']!r}")


def check_grid_fits(timm_kwargs: dict, num_frames: int = 1, frames_per_token: int = 1) -> None:
    """The token grid of ``img_size`` (a clip's: ``num_frames`` frames in tubelets of ``frames_per_token``) fits in
    memory at one float32 value per token and channel (``embed_dim`` where given, else 1), the least a position table
    allocates; checked before timm builds the model, so an ``img_size`` past memory is one line naming it, not an
    allocator error. The patch is ``patch_size`` where given, else 64 px, more than any timm ViT's: a lower bound.
    Sizes of another type are left to timm's checks."""
    def sides(value):
        pair = (value, value) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else ()
        return pair if len(pair) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                              for v in pair) else None
    size, patch = sides(timm_kwargs.get("img_size")), sides(timm_kwargs.get("patch_size", 64))
    if size is None or patch is None:
        return
    tokens = math.prod(max(1, s // p) for s, p in zip(size, patch)) * max(1, num_frames // frames_per_token)
    clip = f" with num_frames={num_frames}" if num_frames > 1 else ""
    width = timm_kwargs.get("embed_dim") if isinstance(timm_kwargs.get("embed_dim"), int) else 1
    check_fits(f"img_size={timm_kwargs['img_size']!r}{clip} ({tokens} tokens)", 4 * tokens * max(1, width),
               f"give a smaller img_size{' or num_frames' if clip else ''}")


def check_model_sizes(timm_kwargs: dict, stages: bool = False) -> None:
    """The sizes a user gives a timm model, checked before timm builds it (timm accepts ``num_classes=-1`` and
    ``in_chans=0`` and fails later, or deep inside, on the others): ``num_classes`` 0 (no head: pooled features, as
    timm) or more, ``in_chans`` and ``embed_dim`` positive; a ViT's ``depth`` and ``num_heads`` positive integers
    with ``embed_dim`` divisible by ``num_heads`` (when both are given); with ``stages`` (Swin) ``depths`` and
    ``num_heads`` one positive integer per stage."""
    if "num_classes" in timm_kwargs:
        value = timm_kwargs["num_classes"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"num_classes must be 0 (no head: the pooled features) or a positive integer, got "
                             f"{value!r}")
    for param in ("in_chans", "embed_dim") + (() if stages else ("depth", "num_heads")):
        if param in timm_kwargs:
            check_positive_int(param, timm_kwargs[param])
    if stages:
        for param in ("depths", "num_heads"):
            value = timm_kwargs.get(param)
            if value is not None and not (isinstance(value, (tuple, list)) and value
                                          and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                  for v in value)):
                raise ValueError(f"{param} must be one positive integer per stage, e.g. (2, 2, 6, 2), got {value!r}")
    elif "embed_dim" in timm_kwargs and "num_heads" in timm_kwargs:
        check_divisible("embed_dim", timm_kwargs["embed_dim"], timm_kwargs["num_heads"],
                        f"num_heads={timm_kwargs['num_heads']} heads of equal width")


def default_sections(name: str | None, head_dim: int) -> dict:
    """What a video backbone gives the rotary encoding ``name`` on its ``(T, H, W)`` grid: ``{"sections":
    video_sections(head_dim)}`` when the head's pairs do not split into three equal bands and the encoding splits
    channels by axis (its constructor takes ``sections``), else ``{}`` (an encoding with its own channel layout,
    such as ComRoPE's blocks or LieRE's dense generators)."""
    if name is None or not head_dim % 6 or "sections" not in constructor_keywords(ENCODINGS[name]):
        return {}
    return {"sections": video_sections(head_dim)}


def check_input(x, patch_size, in_chans: int, model_name: str, dtype: torch.dtype | None = None) -> None:
    """A clear error for an input the model cannot take: ``(B, C, *spatial)`` floating, ``C = in_chans``, each
    spatial side a positive multiple of the patch (tubelet) size, and (given the model's ``dtype``) of that dtype
    unless autocast casts it (timm raises PyTorch's "Input type and bias type should be the same")."""
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
    if dtype is not None and x.dtype != dtype and not is_autocast_enabled(x.device.type):
        raise ValueError(f"{model_name} has {dtype} weights but the input is {x.dtype}: pass x.to({dtype}), or run "
                         f"under torch.autocast")
    sizes = tuple(x.shape[2:])
    if any(s % m or s < m for s, m in zip(sizes, patch_size)):
        raise ValueError(f"input size {sizes} does not fit {model_name}: each side must be a positive multiple of "
                         f"{tuple(patch_size)} (e.g. {tuple(m * 4 for m in patch_size)} or "
                         f"{tuple(m * 6 for m in patch_size)})")


torch.fx.wrap("check_input")  # one call in a torch.fx graph, run on the real input (it reads its shape and dtype)


class PositionalModel:
    """Mixin of the patched model classes: encoding bookkeeping shared by every backbone."""

    pe: str = "none"
    __prepare_scriptable__ = refuse_torchscript  # torch.jit.script: one clear error (docs/deploy.md)

    def applied(self, pe: str, pe_kwargs: dict) -> None:
        """What :func:`~visionpe.apply` calls once the encodings are in place: records ``pe`` (an adapter whose models
        save themselves records the keywords too: the Hugging Face adapters' ``config.json`` entry)."""
        self.pe = pe

    @property
    def pe_adapter(self) -> Adapter:
        """The registered :class:`Adapter` of this model's class (what :func:`~visionpe.load_timm_checkpoint` reads
        its checkpoint hooks from)."""
        return adapter_for(self)

    def check_input(self, x: torch.Tensor) -> None:
        proj = self.patch_embed.proj
        check_input(x, tuple(self.patch_embed.patch_size), proj.in_channels, type(self).__name__, proj.weight.dtype)

    def no_weight_decay(self) -> set[str]:
        """The base model's set (timm's; none for torchvision and transformers models) plus what every encoding
        excludes (its tables, frequencies, bias MLPs; PEG nothing)."""
        base = getattr(super(), "no_weight_decay", None)
        names = set(base()) if base is not None else set()
        for prefix, module in self.named_modules():
            if isinstance(module, Encoding):
                names |= {f"{prefix}.{n}" for n in module.no_weight_decay()}
        return names
