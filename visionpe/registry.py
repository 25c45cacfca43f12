"""Build any encoding by name: ``build(name, **kwargs)``, ``available() -> {name: family}``."""
from __future__ import annotations

import inspect

from torch import nn

from .bias import ALiBi, ContinuousPositionBias, RelBias, SwinBias
from .rotary import AxialRoPE, MixedRoPE
from .tokens import PEG, Learned, SinCos

ENCODINGS: dict[str, type[nn.Module]] = {
    "sincos": SinCos,
    "learned": Learned,
    "peg": PEG,
    "rope_axial": AxialRoPE,
    "rope_mixed": MixedRoPE,
    "swin_bias": SwinBias,
    "rel_bias": RelBias,
    "cpb": ContinuousPositionBias,
    "alibi": ALiBi,
}


def available() -> dict[str, str]:
    """Every encoding name with its family (``"tokens"``, ``"rotary"`` or ``"bias"``)."""
    return {name: cls.family for name, cls in ENCODINGS.items()}


def check_name(name: str, param: str = "name") -> type[nn.Module]:
    if name not in ENCODINGS:
        raise ValueError(f"{param}={name!r} is not a known encoding; available: {', '.join(ENCODINGS)}")
    return ENCODINGS[name]


def build(name: str, **kwargs) -> nn.Module:
    """Construct the encoding ``name`` with its keywords (see each class for them).

    >>> pe = build("rope_mixed", head_dim=64, num_heads=6, ndim=2)
    """
    cls = check_name(name)
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(f"{name} does not take {', '.join(map(repr, unknown))}; keywords: {', '.join(params)}")
    return cls(**kwargs)
