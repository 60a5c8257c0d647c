"""docs/architecture.md names only what exists (issue 35): every module, file, flag and Python
name in its code spans is found in the tree, and its rooms tables list each room's modules."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

import analysis
import locustfiles
from locustfiles.options.table import OPTION

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("locustfiles", "analysis", "infra")
NAME = re.compile(r"^[A-Za-z_][\w.]*(\(\.\.\.\))?$")


def code_spans(text: str) -> list[str]:
    """The inline code spans of a Markdown text (fenced blocks left out)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


def _names_in(path: Path) -> set[str]:
    """Every name a module defines or imports: functions and their parameters, classes,
    assigned names and attributes (`self.x = ...`), annotated fields, at any depth."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.arg):
            names.add(node.arg)
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    names.add(leaf.id)
                elif isinstance(leaf, ast.Attribute):
                    names.add(leaf.attr)
    return names


@cache
def modules() -> dict[str, tuple[Path, frozenset[str]]]:
    """Each module and package of the three packages (dotted) -> its file and its names."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = (path, frozenset(_names_in(path)))
    return found


def _resolves(dotted: str) -> bool:
    """A dotted name found in the tree, read from the source (nothing imported): a module
    (under any of the packages, as the page writes `live.board.Board`) and names defined in
    it; or a class or function and names defined in a module that defines it."""
    parts = dotted.split(".")
    for prefix in ("", *(f"{p}." for p in PACKAGES)):
        full = (prefix + dotted).split(".")
        for cut in range(len(full), 0, -1):
            module = modules().get(".".join(full[:cut]))
            if module is not None:
                rest = full[cut:]
                if all(name in module[1] for name in rest):
                    return True
                break
    if len(parts) == 1 and any(m.split(".")[-1] == dotted for m in modules()):
        return True  # a module by its own name, as the rooms tables give them
    return any(all(name in names for name in parts) for _, names in modules().values())


PROJECT_DIRS = ("locustfiles", "analysis", "infra", "bench", "tests", "docs", "examples")
"""Where a file a span names may lie: the project's own folders (not a venv: .venv-vllm
holds a steps.py of its own)."""


def problem(span: str) -> str | None:
    """Why a code span names nothing in the tree (None: it does, or it is not a name)."""
    if span.startswith("--"):
        flag = span.split()[0].split("=")[0]
        known = flag[2:].replace("-", "_") in OPTION
        return None if known else f"{flag}: no such option in locustfiles/options/table.py"
    if span.startswith("from ") and " import " in span:
        module, _, names = span[5:].partition(" import ")
        missing = [n for n in names.split(", ") if not _resolves(f"{module}.{n.strip()}")]
        return f"{span}: cannot import {missing}" if missing else None
    if span.startswith("/"):
        return None  # a route a server answers (/v1/models), not a file
    if "/" in span or re.search(r"\.(py|md|c)$", span):
        path = span.split(" ")[0]
        where = [ROOT / path, ROOT / "locustfiles" / path, ROOT / "analysis" / path]
        found = (any((ROOT / d).glob(f"**/{Path(path).name}")) for d in PROJECT_DIRS)
        if any(p.exists() for p in where) or any(found):
            return None
        return f"{span}: no such file or folder"
    if not NAME.match(span):
        return None  # a command, a grammar example, a key: not a name
    dotted = span.removesuffix("(...)")
    if any(ROOT.glob(f"locustfiles/*/{dotted}.c")):
        return None  # a C extension, built from its source
    if _resolves(dotted):
        return None
    return f"{span}: no such module, attribute or name"


def test_every_name_in_the_architecture_page_exists() -> None:
    spans = code_spans(DOC.read_text())
    assert len(spans) > 100
    assert [p for s in sorted(set(spans)) if (p := problem(s))] == []


@pytest.mark.parametrize(
    "span", ["EventSink.add", "analysis/steps.py", "--no-such-flag", "locustfiles.run.gone"]
)
def test_a_stale_name_is_caught(span: str) -> None:
    assert problem(span) is not None


def _table_modules(heading: str) -> dict[str, set[str]]:
    """room -> modules, from the rooms table under a heading of the page."""
    section = DOC.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    rooms = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("/`"):
            modules = {m for m in re.findall(r"`(\w+)`", cells[2]) if m != "_ssefast"}
            rooms[cells[0].strip("`/")] = modules
    return rooms


@pytest.mark.parametrize(
    ("package", "heading", "order"),
    [
        ("locustfiles", "## `locustfiles/`", locustfiles.ROOMS),
        ("analysis", "## `analysis/`", analysis.ROOMS),
    ],
)
def test_the_rooms_tables_list_every_module(
    package: str, heading: str, order: tuple[str, ...]
) -> None:
    listed = _table_modules(heading)
    assert list(listed) == list(order)
    for room, modules in listed.items():
        present = {p.stem for p in (ROOT / package / room).glob("*.py")} - {"__init__"}
        assert modules == present, room
