"""llmload's locustfile, plus a record of every module the process loaded, written when it quits.

For tests/e2e/test_worker_processes.py: a worker process that has run requests must not have
loaded pandas, duckdb, matplotlib or any report module. The list goes to the file named by
`LLMLOAD_TEST_MODULES_OUT`, one module a line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from locust import events

from locustfiles.chat import ChatUser, StepShape

__all__ = ["ChatUser", "StepShape"]


@events.init.add_listener
def _record_modules_on_quit(environment: Any, **_: Any) -> None:
    def write(**_: Any) -> None:
        Path(os.environ["LLMLOAD_TEST_MODULES_OUT"]).write_text("\n".join(sorted(sys.modules)))

    environment.events.quitting.add_listener(write)
