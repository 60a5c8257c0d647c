"""The import graph: no cycle anywhere, and the rooms of both packages import one way
(locustfiles: issue 19; analysis and its shared kernel: issue 35).

Every import counts, at run time or type-only (`if TYPE_CHECKING:`), top level or inside a
function: an arrow that points the wrong way is a design question even when it never runs.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import analysis
import locustfiles

PACKAGES = ("locustfiles", "analysis", "infra")
ROOT = Path(__file__).resolve().parents[2]
# each room may import from the rooms before it; chat.py (the locustfile) wires them all
ORDER = ("", *locustfiles.ROOMS, "chat")
# analysis: the kernel at the bottom; the package's own face (`from analysis import load_run`) last
ANALYSIS_ORDER = (*analysis.ROOMS, "")
REPORT_LIBRARIES = ("pandas", "duckdb", "matplotlib")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """Project modules a module imports anywhere (top level, functions, type-only)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in (or is)
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # from pkg import mod
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    files = [f for p in PACKAGES for f in sorted((ROOT / p).rglob("*.py"))]
    modules = {module_name(f) for f in files}
    graph: dict[str, set[str]] = {}
    for f in files:
        name = module_name(f)
        tree = ast.parse(f.read_text())
        graph[name] = _imported(tree, name, f.name == "__init__.py", modules) - {name}
    return graph


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


def room(module: str) -> str:
    """The room a locustfiles module lives in ('' for the package itself, 'chat' for chat)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a room to a room after it, in either package; and any import from the
    runtime (locustfiles) into analysis beyond its shared kernel."""
    bad = []
    for module, targets in sorted(graph.items()):
        package = module.split(".")[0]
        if package not in ("locustfiles", "analysis"):
            continue
        order = ORDER if package == "locustfiles" else ANALYSIS_ORDER
        for target in sorted(t for t in targets if t.split(".")[0] == package):
            if order.index(room(target)) > order.index(room(module)):
                bad.append(f"{module} -> {target}")
        if package == "locustfiles":
            beyond = [t for t in targets if t.startswith("analysis") and room(t) != "kernel"]
            bad += [f"{module} -> {target}" for target in sorted(beyond)]
    return bad


def test_find_cycle_sees_lazy_and_type_only_imports() -> None:
    lazy = "def f():\n    from locustfiles.b import x\n"
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from locustfiles import a\n"
    modules = {"locustfiles.a", "locustfiles.b"}
    graph = {
        "locustfiles.a": _imported(ast.parse(lazy), "locustfiles.a", False, modules),
        "locustfiles.b": _imported(ast.parse(typed), "locustfiles.b", False, modules),
    }
    assert find_cycle(graph) == ["locustfiles.a", "locustfiles.b", "locustfiles.a"]


def test_relative_imports_resolve() -> None:
    modules = {"infra.simserver.api", "infra.simserver.engine"}
    tree = ast.parse("from .engine import Engine\nfrom . import api\n")
    assert _imported(tree, "infra.simserver.http", False, modules) == modules


def test_no_import_cycle_anywhere() -> None:
    graph = import_graph()
    assert "locustfiles.master.side" in graph["locustfiles.master.shape"]  # sees type-only imports
    assert "analysis.kernel.schema" in graph["analysis.read.load"]
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_rooms_import_one_way() -> None:
    graph = import_graph()
    rooms = {room(m) for m in graph if m.startswith("locustfiles")}
    assert rooms == set(ORDER), "a room missing from locustfiles.ROOMS, or one that is gone"
    assert [p.name for p in (ROOT / "locustfiles").glob("*.py")] in (
        ["__init__.py", "chat.py"],
        ["chat.py", "__init__.py"],
    ), "a module outside the rooms: put it in the room whose job it is"
    assert wrong_way(graph) == []


def test_analysis_rooms_import_one_way() -> None:
    graph = import_graph()
    rooms = {room(m) for m in graph if m.startswith("analysis")}
    assert rooms == set(ANALYSIS_ORDER), "a room missing from analysis.ROOMS, or one that is gone"
    assert [p.name for p in (ROOT / "analysis").glob("*.py")] == ["__init__.py"], (
        "a module outside analysis' rooms: put it in the room whose job it is"
    )
    assert "analysis.read.load" in graph["analysis.steps.aggregate"]  # sees the analysis graph


def test_wrong_way_names_the_arrow() -> None:
    graph = {
        "locustfiles.request.client": {"locustfiles.worker.context"},
        "analysis.derive.metrics": {"analysis.render.plots", "analysis.kernel.errors"},
        "locustfiles.master.search": {"analysis.kernel.slo", "analysis.judge.search"},
    }
    assert wrong_way(graph) == [
        "analysis.derive.metrics -> analysis.render.plots",
        "locustfiles.master.search -> analysis.judge.search",
        "locustfiles.request.client -> locustfiles.worker.context",
    ]


def run_python(code: str) -> None:
    """Run `code` in a fresh interpreter (what it imports is all it has); fail with its stderr."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_the_protocol_does_not_import_the_master_and_chat_exports_the_shape() -> None:
    code = (
        "import sys, locust, locustfiles.run.protocol, locustfiles.worker.context\n"
        "bad = [m for m in sys.modules if m.startswith('locustfiles.master')]\n"
        "assert not bad, bad\n"
        "import locustfiles.chat, locustfiles.master.shape\n"
        "assert locustfiles.chat.StepShape is locustfiles.master.shape.StepShape\n"
        "assert 'StepShape' in locustfiles.chat.__all__\n"
    )
    run_python(code)


def test_the_kernel_and_the_runtime_load_no_report_stack() -> None:
    """Every kernel module, and the locustfile with every room, loads neither pandas, duckdb
    nor matplotlib, nor any analysis room but the kernel (the worker process's own check:
    tests/e2e/test_worker_processes.py)."""
    kernel = sorted(m for m in import_graph() if m.startswith("analysis.kernel"))
    rooms = sorted(m for m in import_graph() if m.startswith("locustfiles."))
    code = (
        "import importlib, sys, locust\n"
        f"for name in {kernel + rooms!r}:\n"
        "    importlib.import_module(name)\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {REPORT_LIBRARIES!r}]\n"
        "assert not heavy, heavy[:5]\n"
        "rooms = [m for m in sys.modules if m.startswith('analysis.')\n"
        "         and not m.startswith('analysis.kernel')]\n"
        "assert not rooms, rooms\n"
    )
    run_python(code)


def test_analysis_public_face_resolves_and_rooms_hold_no_face() -> None:
    code = (
        "import importlib, locust, analysis, locustfiles\n"
        "for name in analysis.__all__:\n"
        "    getattr(analysis, name)\n"
        "for room in locustfiles.ROOMS:\n"
        "    module = importlib.import_module(f'locustfiles.{room}')\n"
        "    assert not hasattr(module, '__all__'), room\n"
    )
    run_python(code)
