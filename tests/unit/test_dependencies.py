"""Honest dependencies: every third-party module the packages import is declared in pyproject.toml.

A module imported by locustfiles/, analysis/ or infra/ (any import, also inside a function)
maps to its distribution (importlib.metadata.packages_distributions) and must be one of
`project.dependencies`, or of an extra other than `dev` when only an optional path imports
it, or be listed in OPTIONAL below with the reason it is not declared at all.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("locustfiles", "analysis", "infra")

OPTIONAL = {
    "torch": "only infra/engines/tiny_llama.py, which builds the real-engine suite's model in "
    "its own environment (requirements-engine.txt, `make test-engine`)",
    "transformers": "load_tokenizer tries it first where it is installed, else the `tokenizer` "
    "extra (locustfiles/request/tokenizer.py); the engine suite installs it "
    "(requirements-engine.txt)",
}
"""Modules imported only on paths a plain install never takes, and why they are not declared."""


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(specs: list[str]) -> set[str]:
    return {normalized(re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0]) for spec in specs}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def imports(tree: ast.AST) -> Iterator[tuple[str, ast.stmt]]:
    """(top-level module, node) of every absolute import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node


def sources() -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def third_party() -> dict[str, set[str]]:
    """{module: files importing it} over the three packages, stdlib and our own left out."""
    found: dict[str, set[str]] = {}
    for name, tree in sources():
        for module, _ in imports(tree):
            if module not in sys.stdlib_module_names and module not in PACKAGES:
                found.setdefault(module, set()).add(name)
    return found


def import_time_statements(body: Sequence[ast.AST]) -> Iterator[ast.AST]:
    """Statements run when the module is imported: not function bodies, not TYPE_CHECKING."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from import_time_statements(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from import_time_statements(getattr(node, field, []))


@functools.cache
def distributions_of(module: str) -> frozenset[str]:
    """Normalized distribution names of an import name (the name itself where not installed)."""
    return frozenset(normalized(d) for d in installed().get(module, [module]))


@functools.cache
def installed() -> Mapping[str, list[str]]:
    return packages_distributions()


def test_every_imported_module_is_declared() -> None:
    meta = project()
    declared = requirement_names(meta["dependencies"])
    extras = [requirement_names(v) for k, v in meta["optional-dependencies"].items() if k != "dev"]
    allowed = declared.union(*extras)
    undeclared = [
        f"{module} ({'/'.join(sorted(distributions_of(module)))}; imported by {sorted(files)})"
        for module, files in sorted(third_party().items())
        if module not in OPTIONAL and not distributions_of(module) & allowed
    ]
    assert undeclared == [], "declare these in pyproject.toml (and requirements-min.txt)"


def test_optional_modules_are_imported_only_where_a_plain_install_never_goes() -> None:
    meta = project()
    stale = sorted(set(OPTIONAL) - set(third_party()))
    assert stale == [], f"no longer imported, drop from OPTIONAL: {stale}"
    declared = requirement_names(meta["dependencies"])
    at_top = []
    for name, tree in sources():
        for node in import_time_statements(tree.body):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for module, _ in imports(node):
                    if module in OPTIONAL or (
                        module not in sys.stdlib_module_names
                        and module not in PACKAGES
                        and not distributions_of(module) & declared
                    ):
                        at_top.append(f"{name}: {module}")
    assert at_top == [], "optional modules imported at module level break a plain install"
