"""Loads every fixture module under tests/support/ as a pytest plugin."""

from __future__ import annotations

import pkgutil
import signal
from pathlib import Path

pytest_plugins = [
    f"tests.support.{m.name}"
    for m in pkgutil.iter_modules([str(Path(__file__).parent / "support")])
]


def pytest_configure() -> None:
    """A suite started as a background job of a non-interactive shell inherits SIGINT ignored,
    and so would every process it starts: tests that stop a run with SIGINT would then wait
    in vain. Give SIGINT its default back (an exec'd child then gets SIG_DFL)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
