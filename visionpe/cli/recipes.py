"""The training recipes shipped with visionpe: ``visionpe/configs/*.yaml``, package data (``configs/`` of a checkout is
that folder), addressable by name (``--config shapes_tiny``) as well as by path (``--config my/recipe.yaml``); and,
by name too, the benchmark's own files, ``visionpe/bench/configs/*.yaml``: the recipes its rows train with
(``bench_vit_tiny``) and its rows files (``--rows bench_rows_resolution``)."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .convention import UserError

SUFFIX = ".yaml"


def folder() -> Path:
    """The folder of the shipped recipes, wherever visionpe is installed (a wheel, an editable install, a checkout
    on ``PYTHONPATH``)."""
    return Path(str(resources.files("visionpe").joinpath("configs")))


def bench_folder() -> Path:
    """The folder of the benchmark's shipped recipes and rows files, wherever visionpe is installed."""
    return Path(str(resources.files("visionpe").joinpath("bench", "configs")))


def names(where: Path | None = None) -> list[str]:
    """The names of the shipped recipes (their file names without ``.yaml``) in ``where`` (default: the user
    recipes, :func:`folder`), sorted."""
    return sorted(p.name[:-len(SUFFIX)] for p in (where or folder()).glob(f"*{SUFFIX}"))


def recipe_path(spec, what: str = "config file") -> Path:
    """The file of a recipe: ``spec`` itself when that file exists, else the shipped recipe of that name
    (``shapes_tiny`` or ``shapes_tiny.yaml``), else the benchmark's shipped file of that name (``bench_vit_tiny``). A path with a folder in it is returned as given, for the reader to say
    what is wrong with it; a bare name that is neither a file nor a shipped recipe is a :class:`UserError` listing
    the names."""
    path = Path(spec).expanduser()
    if path.exists() or len(path.parts) != 1:
        return path
    name = path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    for shipped in (folder() / f"{name}{SUFFIX}", bench_folder() / f"{name}{SUFFIX}"):
        if shipped.is_file():
            return shipped
    raise UserError(f"{what} {str(spec)!r} does not exist, and no recipe shipped with visionpe has that name "
                    f"(shipped: {', '.join(names())}; the benchmark's: {', '.join(names(bench_folder()))})")


def shown(path) -> str:
    """How a report names a recipe: its name for a shipped one (``shapes_tiny``, ``bench_vit_tiny``: what
    ``--config`` takes, in a checkout and a wheel alike), else the path as given."""
    path = Path(path)
    for shipped in (folder() / path.name, bench_folder() / path.name):
        if shipped.is_file() and path.resolve() == shipped.resolve():
            return path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    return str(path)
