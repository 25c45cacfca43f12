"""Encodings by name: ``build(name, **kwargs)``, ``available() -> {name: family}``, ``register(name, cls)``."""
from __future__ import annotations

from .bias import (FIRE, ALiBi, BucketedBias, ContinuousPositionBias, DecomposedRelPos, LookHere, PaPE, PaPERI,
                   RelBias, SwinBias)
from .encoding import Encoding, constructor_keywords
from .rotary import (MHRoPE, V2PE, AxialRoPE, CircleRoPE, ComRoPE, DyPE, GeoPE, HARoPE, HoPE, LieRE, MixedRoPE,
                     RegisterRoPE, RIFLEx, SphericalRoPE, SpiralRoPE, StringRoPE, VideoRoPE)
from .tokens import PEG, Fourier, Learned, SinCos

FAMILIES = ("tokens", "rotary", "bias")

ENCODINGS: dict[str, type[Encoding]] = {
    "sincos": SinCos,
    "learned": Learned,
    "peg": PEG,
    "fourier": Fourier,
    "rope_axial": AxialRoPE,
    "rope_mixed": MixedRoPE,
    "mhrope": MHRoPE,
    "videorope": VideoRoPE,
    "string": StringRoPE,
    "comrope": ComRoPE,
    "liere": LieRE,
    "spiral_rope": SpiralRoPE,
    "harope": HARoPE,
    "vit5_rope": RegisterRoPE,
    "riflex": RIFLEx,
    "v2pe": V2PE,
    "circle_rope": CircleRoPE,
    "hope": HoPE,
    "dype": DyPE,
    "spherical_rope": SphericalRoPE,
    "geope": GeoPE,
    "swin_bias": SwinBias,
    "rel_bias": RelBias,
    "cpb": ContinuousPositionBias,
    "alibi": ALiBi,
    "bucket_bias": BucketedBias,
    "lookhere": LookHere,
    "fire": FIRE,
    "pape": PaPE,
    "pape_ri": PaPERI,
    "decomposed_rel_pos": DecomposedRelPos,
}

BUILTIN: dict[str, type[Encoding]] = dict(ENCODINGS)


def available() -> dict[str, str]:
    """Every encoding name with its family (``"tokens"``, ``"rotary"`` or ``"bias"``)."""
    return {name: cls.family for name, cls in ENCODINGS.items()}


def register(name: str, cls: type[Encoding] | None = None, overwrite: bool = False):
    """Make a user's encoding class available under ``name`` to :func:`build`, ``create_model``/``apply``
    (also in ``+`` combinations), ``train_vit.py --pe`` and visualization.

    ``cls`` subclasses one of the family bases (``visionpe.TokenEncoding``, ``RotaryEncoding``,
    ``BiasEncoding``) and names its constructor keywords from the shared vocabulary (``grid_shape``, ``ndim``,
    ``dim``, ``num_heads``, ``head_dim``, ``num_prefix_tokens``) so that a model can build it. Usable as a
    decorator: ``@register("my_pe")`` above the class. Returns ``cls``.
    """
    if cls is None:
        return lambda c: register(name, c, overwrite)
    if not isinstance(name, str) or not name.isidentifier() or name == "none":
        raise ValueError(f"name={name!r} must be an identifier (letters, digits, _) other than 'none'")
    if not (isinstance(cls, type) and issubclass(cls, Encoding) and cls.family in FAMILIES):
        raise ValueError(f"cls={cls!r} must subclass visionpe.TokenEncoding, RotaryEncoding or BiasEncoding "
                         f"(family one of {', '.join(FAMILIES)})")
    if name in ENCODINGS and ENCODINGS[name] is not cls and not overwrite:
        raise ValueError(f"name={name!r} is already registered to {ENCODINGS[name].__name__}; pass overwrite=True "
                         "to replace it")
    ENCODINGS[name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a user's encoding; a built-in name overwritten by :func:`register` gets its built-in class back (the
    built-in encodings themselves cannot be removed)."""
    check_name(name)
    if name in BUILTIN:
        if ENCODINGS[name] is BUILTIN[name]:
            raise ValueError(f"name={name!r} is a built-in encoding and cannot be unregistered; built-in: "
                             f"{', '.join(BUILTIN)}")
        ENCODINGS[name] = BUILTIN[name]
        return
    ENCODINGS.pop(name)


def check_name(name: str, param: str = "name") -> type[Encoding]:
    if not isinstance(name, str) or name not in ENCODINGS:
        raise ValueError(f"{param}={name!r} is not a known encoding; available: {', '.join(ENCODINGS)}")
    return ENCODINGS[name]


def check_keywords(name: str, kwargs: dict) -> None:
    """Every keyword must be one the encoding's constructor takes."""
    params = constructor_keywords(ENCODINGS[name])
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(f"{name} does not take {', '.join(map(repr, unknown))}; keywords: {', '.join(params)}")


def build(name: str, **kwargs) -> Encoding:
    """Construct the encoding ``name`` with its keywords (see each class for them).

    >>> pe = build("rope_mixed", head_dim=64, num_heads=6, ndim=2)
    """
    cls = check_name(name)
    check_keywords(name, kwargs)
    return cls.from_keywords(**kwargs)
