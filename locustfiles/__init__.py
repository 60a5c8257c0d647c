"""llmload's locustfiles: the package that runs inside Locust, in rooms that import downward.

    request  ->  traffic  ->  run  ->  sink  ->  live  ->  worker  ->  master  ->  chat.py

A room imports only from rooms to its left (tests/unit/test_import_graph.py); docs/architecture.md
says what each holds and draws a request's and an event's path through them. Each room's
`__init__` names its public face; the names load on first use (no work at import time).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

ROOMS = ("request", "traffic", "run", "sink", "live", "worker", "master")


def public_face(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A room's module `__getattr__` (PEP 562): each public name from its module, on first use."""

    def __getattr__(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
