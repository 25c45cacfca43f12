"""What every encoding is: a module of one family that builds itself for a model and describes itself.

The three family bases (:class:`~visionpe.tokens.TokenEncoding`, :class:`~visionpe.rotary.RotaryEncoding`,
:class:`~visionpe.bias.BiasEncoding`) derive from :class:`Encoding`; so does a user's own encoding, which
:func:`visionpe.register` then makes available to ``build``, ``create_model``, the CLI and visualization.

One constructor vocabulary: a model offers a :class:`ModelContext` (``grid_shape``, its training patch grid;
``ndim``; ``dim``, the token width; ``num_heads``; ``head_dim``; ``num_prefix_tokens``; ``num_registers``), and
:meth:`Encoding.for_model` passes each encoding the words its constructor names. Classes whose native grid has a more specific name map it in
:meth:`Encoding.model_defaults` (``window_size`` of a window bias, ``ref_shape`` of RoPE scaling).
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ._checks import FITS_ANYWHERE, check_fits, check_vocabulary
from ._compat import TorchScriptRefusal, is_compiling, refuse_torchscript
from .grid import Grid, Layout, as_grid
from .sharding import assign_, reset_module


@dataclass(frozen=True)
class ModelContext:
    """What a model offers the encodings built into it (one block's view for per-block encodings).

    ``grid_shape``: the training patch grid (a Swin block's window); ``dim``: token width; ``num_heads`` and
    ``head_dim`` of the attention; ``num_prefix_tokens``: prefix tokens that own a position vector (timm's
    ``pos_embed`` rows for class/register tokens; 0 with ``no_embed_class``); ``depth``: number of blocks;
    ``num_registers``: how many of a grid's prefix tokens are register tokens, the last ones (timm's ``reg_tokens``,
    after the class token), which an encoding may place on a grid of their own (ViT-5's ``vit5_rope``).
    """

    grid_shape: tuple[int, ...]
    dim: int
    num_heads: int
    head_dim: int
    num_prefix_tokens: int = 0
    depth: int = 1
    num_registers: int = 0

    @property
    def ndim(self) -> int:
        return len(self.grid_shape)

    def words(self) -> dict:
        """The shared constructor vocabulary with this model's values."""
        return dict(grid_shape=tuple(self.grid_shape), ndim=self.ndim, dim=self.dim, num_heads=self.num_heads,
                    head_dim=self.head_dim, num_prefix_tokens=self.num_prefix_tokens, depth=self.depth,
                    num_registers=self.num_registers)


class Knob(NamedTuple):
    """The one constructor keyword an encoding offers for tuning at a test size (LookHere's protocol: one parameter
    per method, chosen per test resolution on held-out training images; ``visionpe sweep --tune``).

    ``name``: the keyword (read back from the built encoding as the attribute of that name); ``values``: the
    candidates, factors on the trained value when ``relative`` (a number), else the values themselves. Changing it
    changes no parameter or persistent buffer, so trained weights load into the tuned encoding unchanged."""
    name: str
    values: tuple
    relative: bool = False


MODEL_WORDS = ("dim", "head_dim", "num_heads", "ndim")  # what a model fixes for the encodings built into it


class Encoding(nn.Module):
    """Base of every positional encoding. Subclasses set ``family`` and implement ``forward``.

    What visualization, the sweep and the optimizer ask of an encoding are methods here, overridden
    where an encoding differs: :meth:`no_weight_decay`, :meth:`adapt`, :meth:`similarity_label`,
    :meth:`similarity_note` (and per family ``position_vectors`` or ``pair_map``).
    """

    family: str = ""
    ndims: tuple[int, ...] = (1, 2, 3)  # grid axes it is defined for (LookHere is 2D, VideoRoPE 3D by definition)
    masks_pairs: bool = False  # some token pairs are masked (-inf bias: a directional encoding such as LookHere)
    reads_spacing: bool = True  # reads a grid's spacing (absolute time); False: indexes tables by integer positions
    initialised_by_backbone: bool = False  # its weights were taken over from the model (Swin-V2's CPB MLP)
    knob: Knob | None = None  # the keyword tuned per test size (visionpe sweep --tune); None: nothing to tune
    __prepare_scriptable__ = refuse_torchscript  # torch.jit.script: one clear error (docs/deploy.md)

    def __init_subclass__(cls, **kwargs):
        """Every encoding's constructor checks the shared vocabulary and what it allocates
        (:func:`checked_constructor`): a new encoding gets the checks by subclassing."""
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = checked_constructor(cls.__init__)

    # -- building for a model -----------------------------------------------------------------------
    @classmethod
    def model_defaults(cls, context: ModelContext) -> dict:
        """Constructor keywords this encoding takes from a model: the words of :meth:`ModelContext.words` that
        its ``__init__`` names."""
        return {k: v for k, v in context.words().items() if k in constructor_keywords(cls)}

    @classmethod
    def for_model(cls, context: ModelContext, **kwargs) -> "Encoding":
        """Build for a model; ``kwargs`` (the user's) override the model's defaults, except the words the model
        fixes (:data:`MODEL_WORDS`), which must agree with it (``num_heads=1``: one set shared by the heads)."""
        words = context.words()
        for key in MODEL_WORDS:
            if key in kwargs and kwargs[key] != words[key] and not (key == "num_heads" and kwargs[key] == 1):
                axes = (f" (ndim={kwargs[key]!r} is for {kwargs[key]}-axis grids, but the model's grid "
                        f"{tuple(context.grid_shape)} has {context.ndim} axes)" if key == "ndim" else "")
                raise ValueError(f"pe keyword {key}={kwargs[key]!r} contradicts the model, whose {key} is "
                                 f"{words[key]}{axes}: leave it out (the model gives it)"
                                 f"{', or pass 1 for one set shared by the heads' if key == 'num_heads' else ''}")
        return cls.from_keywords(**{**cls.model_defaults(context), **kwargs})

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """The keywords this encoding is built with by name (``build``, :meth:`for_model`, presets, ``pe_kwargs``):
        its constructor's. A class whose constructor takes records (RoPE's conventions) lists their fields too."""
        return init_keywords(cls)

    @classmethod
    def from_keywords(cls, **kwargs) -> "Encoding":
        """The encoding built from :meth:`keywords` (the registry's and :meth:`for_model`'s one way in)."""
        return cls(**kwargs)

    # -- initialising itself (meta-device builds, sharded models) ------------------------------------
    def derived_buffers(self) -> dict:
        """The buffers this encoding computes from its settings (frequency bands, slopes, masks, bases): ``{name:
        float32 CPU tensor or None}``, registered non-persistent (never in a state dict). Default: none."""
        return {}

    def register_derived_buffers(self) -> None:
        """Register :meth:`derived_buffers` (the constructor's call)."""
        for name, value in self.derived_buffers().items():
            self.register_buffer(name, value, persistent=False)

    def reset_buffers(self) -> None:
        """Recompute the derived buffers on the module's device, float32 (after ``to_empty`` they hold garbage).
        Runs after every ``to()``/``to_empty()``/``half()`` of the module, so a cast or a meta-device build never leaves
        them stale or in a low precision."""
        if type(self).derived_buffers is Encoding.derived_buffers:
            return
        with torch.device("cpu"):  # even inside a `with torch.device("meta")` block
            values = self.derived_buffers()
        for name, value in values.items():
            old = self._buffers.get(name)
            device = old.device if old is not None else next(self.parameters(), torch.empty(0)).device
            self._buffers[name] = None if value is None else value.to(device)

    def initial_parameters(self, generator=None) -> dict:
        """The values the constructor gives this encoding's own parameters (not its submodules'), ``{name: tensor}``,
        drawn from ``generator`` (default torch's global RNG) in the constructor's order. Default: none."""
        return {}

    def reset_parameters(self) -> None:
        """Re-initialise the parameters as the constructor does, drawing from torch's global RNG (submodules such as
        an MLP's ``Linear`` layers by their own ``reset_parameters``, in order, then the encoding's own), and
        recompute the derived buffers: after ``with torch.device("meta")`` and ``to_empty``, the module equals one built
        eagerly from the same RNG state. Sharded (FSDP) parameters get their shard of the values
        (:func:`visionpe.sharding.assign_`, a collective)."""
        self.reset_buffers()
        for module in self.modules():
            if module is not self and not isinstance(module, Encoding) and hasattr(module, "reset_parameters"):
                reset_module(module)
        self.fill_parameters()

    def fill_parameters(self, generator=None) -> None:
        """Write :meth:`initial_parameters` into the encoding's own parameters (the constructor's and
        :meth:`reset_parameters`' step)."""
        for name, value in self.initial_parameters(generator).items():
            assign_(self.get_parameter(name), value)

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        self.reset_buffers()  # a move, a cast or to_empty: the derived buffers recomputed, float32
        return self

    # -- memory -------------------------------------------------------------------------------------
    def table_bytes(self, grid: Grid) -> int:
        """Bytes of the tables this encoding builds for ``grid`` (what :meth:`check_table` compares with memory);
        0 where none grows faster than the tokens themselves."""
        return 0

    def check_table(self, grid, num_bytes: int | None = None, what: str = "tables",
                    advice: str = "use a smaller grid") -> None:
        """The tables of ``grid`` (``num_bytes``, default :meth:`table_bytes`) fit in memory: a ``ValueError`` naming
        the grid and the size otherwise, raised before they are built (not checked while ``torch.compile`` traces,
        where the sizes are the graph's)."""
        if is_compiling():
            return
        grid = grid.grid if isinstance(grid, Layout) else as_grid(grid)  # a Layout's tables are its grid's at most
        check_fits(f"grid={grid.shape} with prefix={grid.prefix} ({grid.num_tokens} tokens): the {what} of "
                   f"{type(self).__name__}", self.table_bytes(grid) if num_bytes is None else num_bytes, advice)

    def check_spacing(self, grid) -> None:
        """A ``ValueError`` for a grid with a spacing (:attr:`Grid.spacing`: absolute time) when this encoding cannot
        read one (``reads_spacing = False``: a table indexed by integer positions or offsets would silently drop it)."""
        spacing = getattr(grid, "spacing", None)
        refusal = None if spacing is None else self.spacing_refusal()
        if refusal is not None:
            raise ValueError(f"{type(self).__name__} {refusal}, so it cannot place tokens at the grid's spacing "
                             f"{spacing} (absolute time: time_spacing=)")

    def spacing_refusal(self) -> str | None:
        """Why this encoding cannot read a grid's spacing (absolute time), or None when it reads it: a table indexed
        by integer positions or offsets (``reads_spacing = False``), or normalised coordinates (every axis mapped
        onto ``[-1, 1]`` whatever its step)."""
        if not self.reads_spacing:
            return ("indexes a table by integer positions or offsets (an encoding that reads coordinates takes any "
                    "spacing; or keep index time, without time_spacing)")
        if getattr(getattr(self, "coordinates", None), "normalized", False):
            return ("reads normalised coordinates, which map every axis onto [-1, 1] whatever its step (build it with "
                    "coords='index')")
        return None

    # -- TorchScript -----------------------------------------------------------------------------------
    def scriptable(self) -> nn.Module:
        """This encoding's TorchScript form, sharing its parameters and buffers, for a scripted model
        (``torch.jit.script`` of a visionpe ViT): the grid arrives as the patch shape ``List[int]`` and the prefix
        count read from each input, and the tables are computed from them inside the graph (tokens:
        ``forward(x, shape, prefix) -> x``; rotary: ``forward(q, k, shape, prefix) -> (q, k)``; bias:
        ``forward(shape, prefix) -> (heads, P + N, P + N)``). A ``NotImplementedError`` naming the encoding where it
        has none (the default) or where a setting has none (:func:`~visionpe._compat.TorchScriptRefusal`)."""
        raise TorchScriptRefusal(type(self).__name__, "it has no TorchScript form")

    def check_scriptable_class(self, *classes: type) -> None:
        """A TorchScript form computes what the classes it was written for compute: an instance of another class (a
        subclass, which may compute its tables otherwise) is a ``NotImplementedError`` (such a class scripts by
        overriding :meth:`scriptable`)."""
        if type(self) not in classes:
            raise TorchScriptRefusal(type(self).__name__, f"it has no TorchScript form (the form of its base class "
                                                          f"is written for {', '.join(c.__name__ for c in classes)})")

    def check_scriptable_coordinates(self, normalized: bool = False) -> None:
        """The TorchScript forms read integer patch positions (``normalized=True``: a form that reads normalised ones
        too, :func:`~visionpe.coords.patch_positions`): other coordinates or a coordinate augmentation
        (:attr:`coordinates`) are a ``NotImplementedError`` naming the setting."""
        coordinates = getattr(self, "coordinates", None)
        if coordinates is not None and ((coordinates.normalized and not normalized) or coordinates.augments):
            reads = "patch positions (any coords" if normalized else "integer patch positions (coords='index'"
            raise TorchScriptRefusal(f"{type(self).__name__} with {coordinates.describe()}",
                                     f"its TorchScript form reads {reads}, no coordinate augmentation)")

    # -- describing itself --------------------------------------------------------------------------
    def no_weight_decay(self) -> set[str]:
        """Names (relative to this module) of parameters the optimizer must not decay: all of them by default,
        since position tables, frequencies and bias MLPs are position parameters."""
        return {name for name, _ in self.named_parameters()}

    def adapt(self, shape, new_shape, scaling: str | None = None) -> tuple["Encoding", str]:
        """The encoding as it runs on ``new_shape`` after its own adaptation from its native grid ``shape``, and a
        label naming that adaptation. ``self`` is never modified (a copy is adapted when needed)."""
        if scaling not in (None, "none"):
            raise ValueError(f"scaling={scaling!r} applies to rotary encodings only, not to {type(self).__name__}")
        return self, "native grid" if tuple(shape) == tuple(new_shape) else self.adaptation_label()

    def adaptation_label(self) -> str:
        """How this encoding meets a grid other than its native one (figure labels)."""
        return "evaluated on the new grid"

    def similarity_label(self, head: int | None = None) -> str:
        """What :func:`visionpe.viz.similarity` shows for this encoding (colour-bar label)."""
        raise NotImplementedError

    def similarity_note(self) -> str:
        """One phrase on how the similarity map is defined for this encoding (figure titles); may be empty."""
        return ""


def constructor_keywords(cls: type) -> tuple[str, ...]:
    """The keywords an encoding class is built with by name (:meth:`Encoding.keywords`; for any other class, those
    of ``cls.__init__`` without ``self``)."""
    return cls.keywords() if isinstance(cls, type) and issubclass(cls, Encoding) else init_keywords(cls)


def init_keywords(cls: type) -> tuple[str, ...]:
    """The parameter names of ``cls.__init__`` without ``self``."""
    return tuple(p for p in inspect.signature(cls.__init__).parameters if p != "self")


def checked_constructor(init):
    """An encoding's ``__init__`` that, called for the class being built (not through ``super()``), checks the shared
    vocabulary among its arguments first (:func:`~visionpe._checks.check_vocabulary`), runs under
    :class:`AllocationGuard` (a parameter or buffer too large for memory is refused before it is allocated), and
    then checks that ``ndim`` is one of the class's ``ndims``."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if getattr(type(self).__init__, "__wrapped__", None) is not init:
            return init(self, *args, **kwargs)  # a base class's constructor, called through super()
        try:
            bound = signature.bind_partial(self, *args, **kwargs)  # a missing argument: Python's message, after these
        except TypeError:
            return init(self, *args, **kwargs)  # Python's own message (an unknown argument)
        bound.apply_defaults()
        words = dict(list(bound.arguments.items())[1:])  # every argument by name, without self
        for name, parameter in signature.parameters.items():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                words.update(words.pop(name, {}))
        owner, ndims = type(self).__name__, type(self).ndims
        check_vocabulary(owner, words, ndims)
        with AllocationGuard(owner, words):
            init(self, *args, **kwargs)
        if "ndim" in words and words["ndim"] not in ndims:
            raise ValueError(f"ndim={words['ndim']!r} is not supported by {owner}; allowed values: "
                             f"{', '.join(map(str, ndims))}")

    return __init__


# the tensor factories a constructor makes parameters and buffers with (nn.Linear's and nn.Conv's torch.empty too),
# each with the number of elements its arguments ask for
_SHAPED = {f: None for f in (torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn)}
FACTORIES = {
    **_SHAPED,
    torch.full: lambda size, *rest, **kw: math.prod(size),
    torch.empty_strided: lambda size, *rest, **kw: math.prod(size),
    torch.randint: lambda *args, size=None, **kw: math.prod(size if size is not None else args[-1]),
    torch.arange: lambda *args, **kw: _arange_numel(*args, **kw),
    torch.linspace: lambda start, end, steps, *rest, **kw: steps,
    torch.logspace: lambda start, end, steps, *rest, **kw: steps,
    torch.eye: lambda n, m=None, *rest, **kw: n * (n if m is None else m),
    torch.randperm: lambda n, *rest, **kw: n,
    torch.tril_indices: lambda row, col, *rest, **kw: 2 * row * col,
    torch.triu_indices: lambda row, col, *rest, **kw: 2 * row * col,
}


def _arange_numel(start, end=None, step=1, **kwargs) -> int:
    start, end = (0, start) if end is None else (start, end)
    return max(0, math.ceil((end - start) / step))


def factory_numel(func, args, kwargs) -> int:
    """The number of elements the factory call ``func(*args, **kwargs)`` creates (0 where its arguments are not plain
    numbers, e.g. tensors, or are ones torch refuses: its own call says why)."""
    try:
        count = FACTORIES[func]
        if count is None:  # torch.zeros(2, 3), torch.zeros((2, 3)), torch.zeros(size=(2, 3))
            size = kwargs.get("size", args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args)
            return math.prod(size)
        return int(count(*args, **kwargs))
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return 0


class AllocationGuard(TorchFunctionMode):
    """Within it, a tensor factory (:data:`FACTORIES`) whose tensor would not fit in memory is a ``ValueError`` naming
    ``owner`` and its size arguments (``words``), raised before anything is allocated (elements times 8 bytes, the
    widest dtype a factory makes by default, checked from :data:`~visionpe._checks.FITS_ANYWHERE` on)."""

    def __init__(self, owner: str, words: dict):
        super().__init__()
        self.owner, self.words = owner, words

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            numel = factory_numel(func, args, kwargs)
            if numel * 8 > FITS_ANYWHERE:
                dtype = kwargs.get("dtype") or (torch.int64 if func in (torch.arange, torch.randint, torch.randperm)
                                                else torch.get_default_dtype())
                sizes = ", ".join(f"{k}={v!r}" for k, v in self.words.items() if _is_size(v))
                check_fits(f"{self.owner}({sizes}): a tensor of {numel} {dtype} values it creates",
                           numel * torch.empty((), dtype=dtype).element_size(), "give smaller sizes")
        return func(*args, **kwargs)


def _is_size(value) -> bool:
    """An int or a tuple of ints (a size or a shape), not a bool."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    return bool(values) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
