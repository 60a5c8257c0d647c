"""llmload's locustfile, plus what bench/bench_master.py measures inside the master.

On the master only (workers load it too, and do nothing more):
- every worker report Locust delivers (`worker_report`): its size packed as Locust sends it
  (msgpack), and when it came;
- the master's event-loop lag: a greenlet that sleeps 50 ms and notes how late it woke (what
  makes the live tab's numbers old, beside the 3 s between a worker's reports);
- the master's CPU time and RSS, once a second;
- how long the finish handshake took (RunCoordinator.finish, timed).

Written as JSON to the file named by `LLMLOAD_BENCH_MASTER_OUT` when the master quits.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import gevent
import msgpack
import psutil
from locust import events
from locust.runners import MasterRunner

from locustfiles.chat import ChatUser, StepShape
from locustfiles.master import coordinator as coordinator_module

__all__ = ["ChatUser", "StepShape"]

LAG_SLEEP_S = 0.05


@events.init.add_listener
def _measure(environment: Any, **_: Any) -> None:
    if not isinstance(environment.runner, MasterRunner):
        return
    out: dict[str, Any] = {"reports": [], "lag_ms": [], "samples": [], "finish_s": None}
    proc = psutil.Process()

    def on_report(client_id: str, data: dict[str, Any], **_: Any) -> None:
        size = len(msgpack.packb(data, default=str, use_bin_type=True))
        out["reports"].append((time.time(), client_id, size))

    environment.events.worker_report.add_listener(on_report)

    def lag() -> None:
        while True:
            t0 = time.perf_counter()
            gevent.sleep(LAG_SLEEP_S)
            out["lag_ms"].append(((time.perf_counter() - t0) - LAG_SLEEP_S) * 1e3)

    def sample() -> None:
        while True:
            cpu = proc.cpu_times()
            out["samples"].append((time.time(), cpu.user + cpu.system, proc.memory_info().rss))
            gevent.sleep(1.0)

    gevent.spawn(lag)
    gevent.spawn(sample)
    finish = coordinator_module.RunCoordinator.finish

    def timed_finish(self: Any, *args: Any, **kwargs: Any) -> Any:
        first = self.finished_at is None
        t0 = time.perf_counter()
        try:
            return finish(self, *args, **kwargs)
        finally:
            if first:
                out["finish_s"] = time.perf_counter() - t0

    coordinator_module.RunCoordinator.finish = timed_finish  # type: ignore[method-assign]

    def write(**_: Any) -> None:
        Path(os.environ["LLMLOAD_BENCH_MASTER_OUT"]).write_text(json.dumps(out))

    environment.events.quitting.add_listener(write)
