"""The `locustfiles` modules import each other without a cycle (issue 10 item 7)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = "locustfiles"
ROOT = Path(__file__).resolve().parents[2]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """Package modules a module imports anywhere (top level or in functions), at run time."""
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)  # the TYPE_CHECKING branch never runs
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # from pkg import mod
        stack.extend(ast.iter_child_nodes(node))
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    files = sorted((ROOT / PACKAGE).glob("*.py"))
    modules = {f"{PACKAGE}.{f.stem}" for f in files if f.stem != "__init__"}
    return {
        f"{PACKAGE}.{f.stem}": _imported(ast.parse(f.read_text()), modules)
        - {f"{PACKAGE}.{f.stem}"}
        for f in files
        if f.stem != "__init__"
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_find_cycle_sees_a_lazy_import() -> None:
    source = "def f():\n    from locustfiles.b import x\n"
    graph = {
        "locustfiles.a": _imported(ast.parse(source), {"locustfiles.b"}),
        "locustfiles.b": {"locustfiles.a"},
    }
    assert find_cycle(graph) == ["locustfiles.a", "locustfiles.b", "locustfiles.a"]


def test_locustfiles_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "locustfiles.master" in graph["locustfiles.shape"]  # the graph sees real imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_steps_does_not_import_the_master_and_chat_exports_the_shape() -> None:
    code = (
        "import sys, locustfiles.steps\n"
        "assert 'locustfiles.master' not in sys.modules, 'steps imports master'\n"
        "import locustfiles.chat, locustfiles.shape\n"
        "assert locustfiles.chat.StepShape is locustfiles.shape.StepShape\n"
        "assert 'StepShape' in locustfiles.chat.__all__\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
