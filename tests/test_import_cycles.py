"""No import circles in the package, ``TYPE_CHECKING`` imports included.

Every ``import`` and ``from ... import`` of a ``pollux`` module counts, at module level or
inside a function (a deferred import still runs, and a circle of them means two modules
that cannot be read apart), and so do the imports under ``if TYPE_CHECKING:``: they do not
run, but a circle through them is two modules that know each other all the same (the
parts of a circle know each other by a protocol or a record in a neutral module below
them instead). A package is entered through its ``__init__``; the implicit import of a
parent package when a submodule loads is not an edge (it would make every package a
circle).

The run-time graph is checked on its own too, so that a circle there is named as such.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pollux

PACKAGE = Path(pollux.__file__).parent

def _modules(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


@functools.cache
def _parse(text: str, filename: str) -> ast.Module:
    """The tree of a module's text (each text parsed once for all the tests)."""
    return ast.parse(text, filename)


def _imports(name: str, path: Path, modules: dict[str, Path],
             type_checking: bool) -> set[str]:
    tree = _parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if (not type_checking and isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test)):
            skipped.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    edges: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[:len(package) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    edges.add(full)
                elif base in modules:
                    edges.add(base)
    return edges


def import_cycles(root: Path, *, type_checking: bool = False,
                  within: str | None = None) -> list[frozenset[str]]:
    """The strongly connected sets (two modules or more) of the run-time import graph of
    the package at ``root`` (Tarjan's algorithm, iterative); with ``type_checking``, of
    the graph with the imports under ``if TYPE_CHECKING:`` too; with ``within`` (a
    dotted package name), of the graph among that package's modules only."""
    modules = _modules(root)
    if within is not None:
        modules = {name: path for name, path in modules.items()
                   if name == within or name.startswith(within + ".")}
    graph = {name: sorted(_imports(name, path, modules, type_checking))
             for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(graph[node]):
                work.append((node, i + 1))
                nxt = graph[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(frozenset(component))
    return cycles


def _names(cycles: list[frozenset[str]]) -> str:
    return "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_no_import_cycles_at_run_time() -> None:
    cycles = import_cycles(PACKAGE)
    assert not cycles, "import circles: " + _names(cycles)


def test_no_import_cycles_with_type_checking_imports() -> None:
    cycles = import_cycles(PACKAGE, type_checking=True)
    assert not cycles, "import circles (TYPE_CHECKING imports included): " + _names(cycles)


def test_the_check_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.a import A\n")
    (pkg / "sub" / "a.py").write_text("A = 1\ndef f():\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nfrom pkg.sub import a\n"
                              "if TYPE_CHECKING:\n    from pkg.c import C\nB = 2\n")
    (pkg / "c.py").write_text("from .b import B\n")
    assert import_cycles(pkg) == [frozenset({"pkg.sub.a", "pkg.b"})]
    (pkg / "c.py").write_text("from .b import B\nfrom pkg.sub.a import A\n")
    assert import_cycles(pkg, type_checking=True) == [
        frozenset({"pkg.sub.a", "pkg.b", "pkg.c"})]
    assert import_cycles(pkg, type_checking=True, within="pkg.sub") == []
