"""No import cycle inside the agent at run time (issue #24): imports under
``TYPE_CHECKING`` aside, the modules of ``pollux.torch`` import each other as a tree."""

from __future__ import annotations

import ast
from pathlib import Path

import pollux.torch as pt

PACKAGE = Path(pt.__file__).resolve().parent


def _under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def runtime_imports(path: Path) -> set[str]:
    """Modules of ``pollux.torch`` that ``path`` imports at run time (anywhere in it)."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if _under_type_checking(node, parents):
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("pollux.torch.") and (PACKAGE / f"{name.split('.')[2]}.py").exists():
                found.add(name.split(".")[2])
    return found


def test_the_agents_modules_import_each_other_without_a_cycle() -> None:
    graph = {path.stem: runtime_imports(path) - {path.stem}
             for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert "job" in graph["distributed"]  # the check sees function-level imports too
