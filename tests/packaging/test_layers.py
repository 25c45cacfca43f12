"""The house rules of README's "Architecture", read from the code's own module-level imports: the library never
imports the workbench (``visionpe.train``, ``visionpe.bench``, ``visionpe.cli``, ``python -m visionpe``), and no two modules import each other in a circle."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "visionpe"
WORKBENCH = ("visionpe.train", "visionpe.bench", "visionpe.cli", "visionpe.__main__")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The visionpe modules that ``path`` imports at module level (relative imports resolved; a ``from X import
    name`` counts X, and X.name when that is a module)."""
    name, tree = module_name(path), ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m.startswith("visionpe")}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: {m for m in imported(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def test_the_library_never_imports_the_workbench():
    library = [name for name in MODULES if not name.startswith(WORKBENCH)]
    assert len(library) > 30
    wrong = {name: sorted(m for m in GRAPH[name] if m.startswith(WORKBENCH)) for name in library}
    assert not {k: v for k, v in wrong.items() if v}


def test_no_import_circle():
    """Depth-first search for a module that reaches itself through module-level imports (a package's own
    ``__init__`` re-exporting its modules is not a circle: a module importing its parent package is left out)."""
    edges = {name: {m for m in targets if not name.startswith(m + ".")} for name, targets in GRAPH.items()}
    state, stack, circles = {}, [], []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for target in sorted(edges[name]):
            if state.get(target) == "open":
                circles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name)
    assert not circles, circles[:3]
