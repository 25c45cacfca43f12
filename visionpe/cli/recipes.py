"""The training recipes shipped with visionpe: ``visionpe/configs/*.yaml``, package data (``configs/`` of a checkout is
that folder), addressable by name (``--config shapes_tiny``) as well as by path (``--config my/recipe.yaml``)."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .convention import UserError

SUFFIX = ".yaml"


def folder() -> Path:
    """The folder of the shipped recipes, wherever visionpe is installed (a wheel, an editable install, a checkout
    on ``PYTHONPATH``)."""
    return Path(str(resources.files("visionpe").joinpath("configs")))


def names() -> list[str]:
    """The names of the shipped recipes (their file names without ``.yaml``), sorted."""
    return sorted(p.name[:-len(SUFFIX)] for p in folder().glob(f"*{SUFFIX}"))


def recipe_path(spec, what: str = "config file") -> Path:
    """The file of a recipe: ``spec`` itself when that file exists, else the shipped recipe of that name
    (``shapes_tiny`` or ``shapes_tiny.yaml``). A path with a folder in it is returned as given, for the reader to say
    what is wrong with it; a bare name that is neither a file nor a shipped recipe is a :class:`UserError` listing
    the names."""
    path = Path(spec).expanduser()
    if path.exists() or len(path.parts) != 1:
        return path
    name = path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    shipped = folder() / f"{name}{SUFFIX}"
    if shipped.is_file():
        return shipped
    raise UserError(f"{what} {str(spec)!r} does not exist, and no recipe shipped with visionpe has that name "
                    f"(shipped: {', '.join(names())})")


def shown(path) -> str:
    """How a report names a recipe: ``configs/NAME.yaml`` for a shipped one (the folder of a checkout and of the
    package alike), else the path as given."""
    path = Path(path)
    shipped = folder() / path.name
    if shipped.is_file() and path.resolve() == shipped.resolve():
        return f"configs/{path.name}"
    return str(path)
