"""One command-line convention for every script (train_vit.py, visionpe sweep, visionpe visualize,
visionpe benchmark).

- A user mistake (a bad flag or value, a missing file, data that is not there, a damaged run directory) is a
  :class:`UserError`. :func:`run` prints it as ONE line ``prog: error: ...`` on stderr and exits with status 2;
  under torchrun only rank 0 prints (every rank exits 2). ``--debug`` shows the traceback instead.
- :class:`Parser` is an ``argparse.ArgumentParser`` whose errors are ``UserError`` s (so they take the same path).
- :func:`user_errors` turns a library's ``ValueError`` (bad encoding name, bad ``pe_kwargs``, bad model keywords)
  into a ``UserError`` at the boundary where the value came from the user; elsewhere a ``ValueError`` is a bug
  and keeps its traceback.
- :func:`import_user_code` imports a user's modules (``--import MODULE_OR_FILE``) before anything is built, so
  their ``@visionpe.register`` encodings, ``@register_dataset`` data sets and ``register_adapter`` backbones work
  with ``--pe``, ``--data`` and ``--model``.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path


class UserError(Exception):
    """A mistake in the settings or the environment: reported on one line, exit status 2."""


def one_line(text) -> str:
    return " ".join(str(text).split())


class Parser(argparse.ArgumentParser):
    """argparse whose errors are :class:`UserError` (one line, status 2 through :func:`run`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UserError(message)

    def add_debug(self, group=None) -> None:
        """``--debug``: show the traceback of an error instead of one line (read by :func:`run`)."""
        (group or self).add_argument("--debug", action="store_true",
                                     help="on an error, show the full traceback instead of one line")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=30, width=110)


@contextlib.contextmanager
def user_errors(prefix: str = "", types=(ValueError, TypeError)):
    """Re-raise ``types`` raised inside the block as :class:`UserError` (``prefix: message``)."""
    try:
        yield
    except UserError:
        raise
    except types as err:
        raise UserError(f"{prefix}: {one_line(err)}" if prefix else one_line(err)) from err


def import_target(spec: str) -> str:
    """How an ``--import`` entry is recorded: a ``.py`` file as its absolute path (so a resumed run or a sweep from
    another folder imports the same file), a module name as given."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"--import takes a module name or a .py file, got {spec!r}")
    spec = spec.strip()
    return str(Path(spec).expanduser().resolve()) if spec.endswith(".py") else spec


def import_user_code(specs) -> list[str]:
    """Import each of ``specs`` (dotted module names or paths to ``.py`` files) once, in order; returns them as
    recorded (:func:`import_target`). A module that cannot be imported, or that registers a name which exists
    already, is a :class:`UserError` naming it and why."""
    targets = [import_target(s) for s in specs or ()]
    for target in targets:
        what = f"--import {target}"
        try:
            if target.endswith(".py"):
                path = Path(target)
                if not path.is_file():
                    raise UserError(f"{what}: no such file")
                name = f"visionpe_user_{path.stem}_{hashlib.sha1(target.encode()).hexdigest()[:8]}"
                if name in sys.modules:
                    continue
                module_spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                try:
                    module_spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(name, None)
                    raise
            else:
                importlib.import_module(target)
        except UserError:
            raise
        except ImportError as err:
            raise UserError(f"{what}: cannot import it ({one_line(err)})") from err
        except (ValueError, TypeError) as err:  # a registry refusing a name that exists, a bad registration
            raise UserError(f"{what}: {one_line(err)}") from err
        except SyntaxError as err:
            raise UserError(f"{what}: syntax error at line {err.lineno}: {err.msg}") from err
        except Exception as err:
            raise UserError(f"{what}: importing it raised {type(err).__name__}: {one_line(err)[:200]}") from err
    return targets


def add_import(parser: argparse.ArgumentParser, group=None) -> None:
    """``--import MODULE_OR_FILE`` (repeatable)."""
    (group or parser).add_argument(
        "--import", dest="imports", action="append", metavar="MODULE_OR_FILE",
        help="user code to import first (repeatable): a dotted module name or a path to a .py file whose "
             "@visionpe.register encodings, register_dataset data sets and register_adapter backbones become "
             "available to --pe, --data and --model; a run records it, so --resume, the sweep and visualize import "
             "it again")


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def run(main, prog: str, argv=None):
    """``main(argv)``; a :class:`UserError` becomes ``prog: error: ...`` on stderr (rank 0 only) and exit status 2.

    Returns what ``main`` returned. With ``--debug`` in ``argv`` the error propagates with its traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return main(argv)
    except UserError as err:
        if "--debug" in argv:
            raise
        if is_rank0():
            print(f"{prog}: error: {one_line(err)}", file=sys.stderr, flush=True)
        _close_process_group()
        sys.exit(2)


def _close_process_group() -> None:
    """Leave a torchrun process group cleanly (every rank raised the same error at the same point)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
