"""Argument checks shared by every encoding: one clear ``ValueError`` per mistake.

Each message names the parameter, the value received and what is allowed, so a user who mistypes a
keyword sees at once how to fix it.
"""
from __future__ import annotations

import math
import os
import reprlib
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


def check_module(param: str, value) -> None:
    """``value`` is a ``torch.nn.Module`` (a model): a ``TypeError`` naming ``param`` and what it got otherwise."""
    if not isinstance(value, torch.nn.Module):
        shown = "" if value is None else f" {reprlib.repr(value)}"
        raise TypeError(f"{param} must be a torch.nn.Module, got {type(value).__name__}{shown}")


def check_path(param: str, value) -> None:
    """``value`` is a file path (``str`` or ``os.PathLike``): a ``TypeError`` naming ``param`` otherwise."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{param} must be a file path (str or os.PathLike), got {type(value).__name__}")


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
    return device_angle_dtype(torch.device(device if device is not None else "cpu"))


def device_angle_dtype(device: torch.device) -> torch.dtype:
    """:func:`angle_dtype` of a ``torch.device`` (a TorchScript function: the scripted models' tables)."""
    return torch.float32 if device.type == "mps" else torch.float64


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
    if any(isinstance(s, bool) or not isinstance(s, (int, torch.SymInt)) or s <= 0 for s in shape):
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


# -- memory: sizes checked before anything is allocated --------------------------------------------------------------

def machine_memory() -> int:
    """The memory this process may use, in bytes: the machine's physical memory, lowered to the address-space limit
    (``ulimit -v``, ``RLIMIT_AS``) and the container's limit (cgroup ``memory.max``) where one is set; 0 when the
    system does not say."""
    try:
        limits = [int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))]
    except (AttributeError, ValueError, OSError):
        return 0
    try:
        import resource  # POSIX only
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    except (ImportError, ValueError, OSError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limits.append(int(f.read().strip()))  # "max" (no limit) is not an int
        except (OSError, ValueError):
            continue
    return min(limits)


def gib(num_bytes: float) -> str:
    """A size for messages: GiB, or TiB from 1 TiB on."""
    return f"{num_bytes / 2**40:.3g} TiB" if num_bytes >= 2**40 else f"{num_bytes / 2**30:.3g} GiB"


FITS_ANYWHERE = 2**26  # smaller sizes are not checked: reading the system's limits would cost more than they do


def check_fits(what: str, num_bytes: int, advice: str) -> None:
    """``num_bytes`` (what ``what``, a phrase naming the parameter and its value, needs) fit in
    :func:`machine_memory`; otherwise a ``ValueError`` giving both sizes and ``advice``. Called before the allocation,
    so a size that cannot fit is one clear line instead of an allocator error (or a process the system kills)."""
    if num_bytes <= FITS_ANYWHERE:
        return
    memory = machine_memory()
    if memory and num_bytes > memory:
        raise ValueError(f"{what} needs {gib(num_bytes)}, more than the {gib(memory)} of memory this process may use; "
                         f"{advice}")


# -- the shared constructor vocabulary -----------------------------------------------------------------------------

SIZE_WORDS = ("dim", "head_dim", "num_heads")  # widths: positive integers
SHAPE_WORDS = ("grid_shape", "ref_shape", "window_size")  # grids: an int per axis (an int alone where ndim is known)


def check_vocabulary(owner: str, words: dict, ndims: tuple[int, ...] = (1, 2, 3)) -> None:
    """The shared constructor vocabulary (``dim``, ``head_dim``, ``num_heads``, ``ndim``, ``grid_shape``,
    ``ref_shape``, ``window_size``, ``num_prefix_tokens``; one meaning each) among ``words``, the arguments an
    encoding ``owner`` (defined on grids of ``ndims`` axes) was called with: each of the right type and range, every
    shape with ``ndim`` axes, and each size within memory (one float32 value per channel of a token, ``dim`` or
    ``num_heads x head_dim``, and per patch of a grid: the least any use of the size allocates). An integer ``ndim``
    outside ``ndims`` is left to the encoding's own message (checked after it, if it has none)."""
    for name in SIZE_WORDS:
        if name in words:
            check_positive_int(name, words[name])
    if "num_prefix_tokens" in words:
        check_nonnegative_int("num_prefix_tokens", words["num_prefix_tokens"])
    ndim = words.get("ndim")
    if "ndim" in words and (isinstance(ndim, bool) or not isinstance(ndim, int) or ndim not in (1, 2, 3)):
        raise ValueError(f"ndim={ndim!r} is not supported by {owner}; allowed values: {', '.join(map(str, ndims))}")
    widths = [(name, words[name], f"channel of {'a token' if name == 'dim' else 'a head'}")
              for name in ("dim", "head_dim") if name in words]
    if "num_heads" in words:
        per_head = words.get("head_dim", 1)
        widths.append(("num_heads", words["num_heads"] * per_head,
                       "head" if per_head == 1 else "channel of a token's query, num_heads * head_dim"))
    for name, count, unit in widths:
        check_fits(f"{owner} with {name}={words[name]!r} (one float32 value per {unit}: {count})", 4 * count,
                   f"give a smaller {name}")
    for name in SHAPE_WORDS:
        if words.get(name) is not None:
            shape = check_axes(name, to_shape(name, words[name], ndim), words[name])
            check_fits(f"{owner} with {name}={words[name]!r} (one float32 value per patch: {math.prod(shape)} "
                       "patches)", 4 * math.prod(shape), f"give a smaller {name}")
