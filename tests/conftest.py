"""Loads every fixture module under tests/support/ as a pytest plugin."""

from __future__ import annotations

import pkgutil
from pathlib import Path

pytest_plugins = [
    f"tests.support.{m.name}"
    for m in pkgutil.iter_modules([str(Path(__file__).parent / "support")])
]
