"""Argument checks shared by every encoding: one clear ``ValueError`` per mistake.

Each message names the parameter, the value received and what is allowed, so a user who mistypes a
keyword sees at once how to fix it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from numbers import Real

import torch


def check_choice(param: str, value, allowed: Iterable) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{param}={value!r} is not supported; allowed values: {', '.join(map(repr, allowed))}")


def check_positive_int(param: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{param} must be a positive integer, got {value!r}")
    return value


def check_generator(generator) -> None:
    """``generator`` is a ``torch.Generator`` or None (the random initialisation's stream)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")


def check_nonnegative_int(param: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{param} must be 0 or a positive integer, got {value!r}")
    return value


def check_number(param: str, value, minimum: float | None = None, inclusive: bool = True,
                 maximum: float | None = None) -> float:
    """A finite real number (not a bool or a string), optionally bounded below and above; returned as float."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{param} must be a finite number, got {value!r}")
    if minimum is not None and (value < minimum or (not inclusive and value == minimum)):
        raise ValueError(f"{param} must be {'>=' if inclusive else '>'} {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{param} must be <= {maximum}, got {value!r}")
    return float(value)


def check_bool(param: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{param} must be True or False, got {value!r}")
    return value


def angle_dtype(device) -> torch.dtype:
    """float64 for position x frequency products (exact angles on long axes), float32 where the device has no
    float64 (MPS)."""
    return torch.float32 if torch.device(device if device is not None else "cpu").type == "mps" else torch.float64


def check_ndim(ndim) -> int:
    if isinstance(ndim, bool) or not isinstance(ndim, int) or ndim not in (1, 2, 3):
        raise ValueError(f"ndim={ndim!r} is not supported; allowed values: 1, 2, 3")
    return ndim


def to_shape(param: str, value, ndim: int | None = None) -> tuple[int, ...]:
    """Turn an int or a sequence of ints into a shape tuple, checking every size is positive.

    An int is repeated ``ndim`` times (``window_size=7`` with ``ndim=2`` is ``(7, 7)``).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if ndim is None:
            raise ValueError(f"{param} must be a sequence of positive integers, got {value!r}")
        value = (value,) * ndim
    if not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"{param} must be a sequence of positive integers, got {value!r}")
    shape = tuple(value)
    if any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in shape):
        raise ValueError(f"{param} must contain positive integers only, got {value!r}")
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{param}={value!r} has {len(shape)} axes but ndim={ndim}")
    return shape


def check_axes(param: str, shape: tuple[int, ...], value=None) -> tuple[int, ...]:
    """A grid or window shape has 1, 2 or 3 axes."""
    if len(shape) > 3:
        raise ValueError(f"{param}={value if value is not None else shape!r} has {len(shape)} axes; "
                         "allowed: 1, 2 or 3")
    return shape


def check_divisible(param: str, value: int, divisor: int, why: str) -> None:
    if value % divisor:
        raise ValueError(f"{param}={value} must be divisible by {divisor} ({why})")


def check_grid_ndim(grid, ndim: int, who: str) -> None:
    if grid.ndim != ndim:
        raise ValueError(f"grid has {grid.ndim} axes (shape {grid.shape}) but {who} was built with ndim={ndim}")
