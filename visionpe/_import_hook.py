"""Run a function right after a module is imported, without importing it: a post-import hook.

``import visionpe`` registers its timm models this way (:mod:`visionpe.backbones.timm_registry`): timm is
imported only by whoever uses it, and ``timm.create_model("vpe_...")`` works whether timm or visionpe came first.
"""
from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from types import ModuleType


def when_imported(name: str, callback: Callable[[ModuleType], object]) -> None:
    """Call ``callback(module)`` once the top-level module ``name`` is imported: now if it already is, else right
    after its import has finished. An exception in ``callback`` becomes a ``RuntimeWarning``, so the import of
    ``name`` itself never fails because of it."""
    if sys.modules.get(name) is not None:
        _run(callback, sys.modules[name])
    elif name not in sys.modules:  # a None entry marks a module that must not be imported: no callback then
        sys.meta_path.insert(0, _Finder(name, callback))


def _run(callback: Callable[[ModuleType], object], module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as err:  # a broken hook must not break the user's import
        warnings.warn(f"{getattr(callback, '__qualname__', callback)!s} failed after importing {module.__name__}: "
                      f"{type(err).__name__}: {err}", RuntimeWarning, stacklevel=3)


class _Finder:
    """A ``sys.meta_path`` finder: finds ``name`` with the other finders and gives its spec a loader that runs the
    callback once the module has executed, and only then leaves ``sys.meta_path`` (an availability probe,
    ``importlib.util.find_spec(name)``, finds a spec that is never executed). No importlib.abc base: the import
    system needs only the methods, and importing importlib.abc would cost ``import visionpe`` time."""

    def __init__(self, name: str, callback: Callable[[ModuleType], object]):
        self.name, self.callback, self.done = name, callback, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None  # not installed: the import fails as it would without the hook, which stays for a retry
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader, self)
        return spec

    def imported(self, module: ModuleType) -> None:
        """The module has executed: leave ``sys.meta_path`` and run the callback (once)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if not self.done:
            self.done = True
            _run(self.callback, module)


class _CallbackLoader:
    """A loader: the module's own loader, then the finder's callback; the module and its spec keep the original
    loader."""

    def __init__(self, loader, finder: _Finder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.finder.imported(module)

    def __getattr__(self, attr):
        return getattr(self.loader, attr)
