"""RoPE's conventions as small frozen records, and the one map from the flat keywords onto them.

A foundation model's RoPE differs from another's by conventions, not by mechanism (:mod:`visionpe.presets` lists
them per model). They come in four groups, each a frozen record whose fields are named as the flat keywords
(``vpe.build("rope_axial", pairs="half", ...)``, ``--pe-kwargs``, a preset's conventions), so a bad value gives the
same error, naming the keyword, whichever way it was given:

- :class:`FrequencyBands`: what the bands turn at beyond ``theta``: one spectrum per axis or one over all pairs
  (``spectrum``), DINOv3's periods, timm's pixel bands, a fixed NTK factor, p-RoPE's fraction of rotating pairs;
- :class:`ChannelLayout`: where each rotation pair sits in the head and which axis (or direction) it turns along;
- :class:`~visionpe.coords.CoordinateSystem` (shared with every coordinate-reading encoding): the coordinates and
  their train-time augmentation;
- :class:`ResolutionScaling`: how the rotation adapts to a grid other than ``ref_shape`` (PI, NTK, YaRN).

A record checks each field on its own; what needs the sizes (``head_dim``, ``ndim``, ``num_heads``) or two records
together is checked by the encoding's constructor. :class:`FlatKeywords` is the one place the flat vocabulary is
mapped onto the records: ``build``, ``for_model`` and the presets go through :meth:`FlatKeywords.from_keywords`.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from numbers import Real

from .._checks import check_bool, check_choice, check_number
from ..coords import CoordinateSystem
from .layouts import DIRECTIONS, check_rotate_fraction
from .scaling import SCALINGS

PAIRS = ("interleaved", "half")
AXIS_ORDERS = ("xy", "ij")
SPECTRA = ("axial", "mrope", "mrope_interleaved", "videorope")
SECTION_RULES = ("rest_first", "rest_unrotated")  # sections by rule: floor(pairs / ndim) per axis, the rest ...
PAIR_ORDERS = ("spectrum", "by_axis", "alternate")
CHANNEL_FREQUENCIES = ("paired", "repeated")

# record fields the variants of axial RoPE do not take (their ``refused``): the foundation-model conventions of
# fixed axial frequencies, the per-head layouts, DINOv3's periods
AXIAL_CONVENTIONS = ("spectrum", "max_res", "linear_bands", "ntk_factor", "pair_order", "channel_frequencies",
                     "inert_axes")
PER_HEAD_LAYOUTS = ("directions", "head_axes")
PERIODS = ("min_period", "max_period")


def _as_tuple(value):
    """A list given for a tuple field, as a tuple (records are hashable); anything else unchanged."""
    return tuple(value) if isinstance(value, list) else value


def field_setter(record):
    """A setter of ``record``'s (frozen) fields for its ``__post_init__``: ``set_field(name, value) -> value``."""
    def set_field(name: str, value):
        object.__setattr__(record, name, value)
        return value
    return set_field


@dataclass(frozen=True)
class FrequencyBands:
    """What the rotation pairs' bands turn at, beyond the base ``theta`` (which the encoding takes itself).

    Args:
        spectrum: ``"axial"`` (a spectrum ``1/theta^(i/n)`` per axis), ``"mrope"`` (Qwen2-VL's one spectrum over all
            pairs, cut into ``sections``), ``"mrope_interleaved"`` (Qwen3-VL: that spectrum dealt t, h, w in turn) or
            ``"videorope"`` (time on the lowest frequencies).
        min_period, max_period: DINOv3's geometric periods (both or neither, ``0 < min <= max``), in the units of
            the coordinates.
        max_res, linear_bands: timm's pixel-frequency bands (``max_res >= 2``; ``linear_bands`` needs ``max_res``).
        ntk_factor: a fixed NTK-aware factor ``>= 1`` per grid axis (one number: every axis), Cosmos'
            ``rope_scale``.
        rotate_fraction: p-RoPE's fraction ``p`` in ``[0, 1]`` of each band's highest frequencies that rotate.
    """

    spectrum: str = "axial"
    min_period: float | None = None
    max_period: float | None = None
    max_res: float | None = None
    linear_bands: bool = False
    ntk_factor: float | tuple[float, ...] | None = None
    rotate_fraction: float = 1.0

    def __post_init__(self):
        check_choice("spectrum", self.spectrum, SPECTRA)
        set_field = field_setter(self)
        if self.min_period is not None or self.max_period is not None:
            if self.min_period is None or self.max_period is None:
                raise ValueError(f"min_period and max_period go together (DINOv3's periods min * (max/min)^(i/(n-1))), "
                                 f"got min_period={self.min_period!r}, max_period={self.max_period!r}")
            low = set_field("min_period", check_number("min_period", self.min_period, minimum=0.0, inclusive=False))
            set_field("max_period", check_number("max_period", self.max_period, minimum=low))
        check_bool("linear_bands", self.linear_bands)
        if self.max_res is None and self.linear_bands:
            raise ValueError("linear_bands=True spaces timm's pixel-frequency bands, which need max_res (e.g. 224)")
        if self.max_res is not None:
            set_field("max_res", check_number("max_res", self.max_res, minimum=2.0))
        ntk = _as_tuple(self.ntk_factor)
        if ntk is not None:
            values = ntk if isinstance(ntk, tuple) else (ntk,)
            if not values or not all(isinstance(v, Real) and not isinstance(v, bool) for v in values):
                raise ValueError(f"ntk_factor={self.ntk_factor!r} must be one number >= 1 or one per grid axis")
            checked = tuple(check_number("ntk_factor", v, minimum=1.0) for v in values)
            set_field("ntk_factor", checked if isinstance(ntk, tuple) else checked[0])
        set_field("rotate_fraction", check_rotate_fraction(self.rotate_fraction))

    @property
    def periods(self) -> tuple[float, float] | None:
        """``(min_period, max_period)``, or None for ``theta``'s spectrum."""
        return None if self.min_period is None else (self.min_period, self.max_period)

    @property
    def pixel(self) -> tuple[float, bool] | None:
        """``(max_res, linear_bands)`` of timm's pixel-frequency bands, or None."""
        return None if self.max_res is None else (self.max_res, self.linear_bands)


@dataclass(frozen=True)
class ChannelLayout:
    """Where each rotation pair sits in a head and which axis (or direction) it turns along.

    Args:
        pairs: ``"interleaved"`` (channels ``(2p, 2p+1)``: rope-vit, timm) or ``"half"`` (``(p, p + d/2)``:
            GPT-NeoX's ``rotate_half``).
        sections: rotation pairs per grid axis (grid order), a rule (``"rest_first"``: the pairs left over by an
            even split to the first axis, Wan and Cosmos; ``"rest_unrotated"``: left unrotated, V-JEPA 2), or None
            (an even split).
        axis_order: which axis owns the first block of pairs: ``"xy"`` (the last grid axis, x) or ``"ij"`` (grid
            order).
        pair_order: ``"spectrum"`` (the spectrum's own order), ``"by_axis"`` (each axis's pairs together: Pixtral)
            or ``"alternate"`` (one pair of each axis in turn: MoonViT).
        channel_frequencies: ``"paired"`` (RoPE) or ``"repeated"`` (V-JEPA 2: each axis's frequencies laid out twice
            over its channels, not a rotation).
        inert_axes: leading M-RoPE axes the grid does not have (``>= 0``; their pairs stay unrotated).
        directions: ``"axial"``, ``"random"`` (RoPE-Mixed's initialisation) or ``"golden"`` (2D golden-angle
            directions).
        head_axes: one string of axis letters per head (``""``: an unrotated head), or None.
    """

    pairs: str = "interleaved"
    sections: tuple[int, ...] | int | str | None = None
    axis_order: str = "xy"
    pair_order: str = "spectrum"
    channel_frequencies: str = "paired"
    inert_axes: int = 0
    directions: str = "axial"
    head_axes: tuple[str, ...] | None = None

    def __post_init__(self):
        check_choice("pairs", self.pairs, PAIRS)
        if isinstance(self.sections, str):
            check_choice("sections", self.sections, SECTION_RULES)
        set_field = field_setter(self)
        set_field("sections", _as_tuple(self.sections))
        set_field("head_axes", _as_tuple(self.head_axes))
        check_choice("axis_order", self.axis_order, AXIS_ORDERS)
        check_choice("pair_order", self.pair_order, PAIR_ORDERS)
        check_choice("channel_frequencies", self.channel_frequencies, CHANNEL_FREQUENCIES)
        if isinstance(self.inert_axes, bool) or not isinstance(self.inert_axes, int) or self.inert_axes < 0:
            raise ValueError(f"inert_axes={self.inert_axes!r} must be an integer >= 0 (leading M-RoPE axes the grid "
                             "does not have, e.g. 1 for time on an image)")
        check_choice("directions", self.directions, DIRECTIONS)


@dataclass(frozen=True)
class ResolutionScaling:
    """How the rotation adapts to a grid other than the reference grid ``ref_shape`` (:mod:`.scaling`).

    Args:
        scaling: ``"none"`` (extrapolate), ``"pi"`` (position interpolation), ``"ntk"`` or ``"yarn"``.
        yarn_alpha, yarn_beta: YaRN's ramp (``alpha < beta``): bands below ``alpha`` rotations per reference length
            are interpolated, those above ``beta`` kept.
    """

    scaling: str = "none"
    yarn_alpha: float = 1.0
    yarn_beta: float = 32.0

    def __post_init__(self):
        check_choice("scaling", self.scaling, SCALINGS)
        set_field = field_setter(self)
        alpha = set_field("yarn_alpha", check_number("yarn_alpha", self.yarn_alpha, 0.0))
        beta = set_field("yarn_beta", check_number("yarn_beta", self.yarn_beta, 0.0))
        if alpha >= beta:
            raise ValueError(f"yarn_alpha={self.yarn_alpha!r} must be smaller than yarn_beta={self.yarn_beta!r} "
                             "(YaRN keeps bands above beta rotations and interpolates those below alpha)")


# the constructor parameter of each record, the same in every RoPE class that takes it
RECORDS = {"bands": FrequencyBands, "channels": ChannelLayout, "coordinates": CoordinateSystem,
           "resolution": ResolutionScaling}


def record_fields(record_type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(record_type))


def check_records(owner: str, refused=(), **records) -> None:
    """Each record given to ``owner`` (``name=record``, names from :data:`RECORDS`) is of its type and leaves each
    field ``owner`` does not take (``refused``) at its default: a ``ValueError`` naming the parameter or the field
    otherwise (a value set there would be silently ignored)."""
    for name, record in records.items():
        kind = RECORDS[name]
        if not isinstance(record, kind):
            raise ValueError(f"{name} must be a {kind.__name__} (or give its fields as keywords), got {record!r}")
        default = kind()
        for field in refused:
            if field in record_fields(kind) and getattr(record, field) != getattr(default, field):
                raise ValueError(f"{owner} does not take {field} (got {field}={getattr(record, field)!r}): leave "
                                 f"it at {getattr(default, field)!r}")


class FlatKeywords:
    """Mixin of the RoPE classes: their flat keyword vocabulary and its one map onto the records.

    A class's constructor takes its sizes and own settings directly and its conventions as records (the parameters
    named in :data:`RECORDS`); ``refused`` names the record fields it does not take. Its flat vocabulary
    (:meth:`keywords`) is its direct parameters, the fields of its records but the refused ones, and the record
    parameters themselves; :meth:`from_keywords` builds it from any of them, a flat keyword replacing that field of
    the record given (default: the constructor's)."""

    refused: tuple[str, ...] = ()

    @classmethod
    def _parameters(cls) -> dict:
        return {name: p for name, p in inspect.signature(cls.__init__).parameters.items() if name != "self"}

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """Every keyword the class is built with by name (``build``, ``for_model``, presets, ``pe_kwargs``)."""
        parameters = cls._parameters()
        direct = [name for name in parameters if name not in RECORDS]
        flat = [field for name, record in RECORDS.items() if name in parameters
                for field in record_fields(record) if field not in cls.refused]
        return tuple(direct + flat + [name for name in parameters if name in RECORDS])

    @classmethod
    def from_keywords(cls, **kwargs):
        """The encoding built from flat keywords (and records): each record's fields gathered into the record
        (over the one given, else the constructor's default), the rest passed as they are."""
        parameters = cls._parameters()
        for name, record in RECORDS.items():
            if name not in parameters:
                continue
            given = {field: kwargs.pop(field) for field in record_fields(record)
                     if field in kwargs and field not in cls.refused}
            if given:
                base = kwargs.get(name, parameters[name].default)
                check_records(cls.__name__, **{name: base})
                kwargs[name] = dataclasses.replace(base, **given)
        return cls(**kwargs)
