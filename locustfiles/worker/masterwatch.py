"""A worker that has lost its master stops sending, flushes its events and exits non-zero.

Locust's worker gives up on a silent master only after `MASTER_HEARTBEAT_TIMEOUT` (60 s,
a constant of locust.runners, no option) and then exits 0. For that minute its users go on
loading the target at the last step they were told, after the master has ended the run
or lost the worker, and record those requests under that step. So while a run is going on
this worker (its WorkerContext made, its sink not closed), llmload watches the master's
heartbeats itself (Locust's `heartbeat_received` event, one a second) and after
MASTER_LOST_S without one:

    llmload: error: lost the master 10.0.0.10:5557 (no heartbeat for 10 s); this worker ...

on stderr, then it stops its users (requests in flight are recorded as aborted), closes its
sink (uploads go on until --finish-timeout; what cannot be uploaded stays in the spool for
`llmload upload-spool`) and exits with status EXIT_MASTER_LOST. The master marks a silent
worker missing after ~4 s; a link back within MASTER_LOST_S costs neither side the run.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Final

import gevent

log = logging.getLogger("llmload.masterwatch")

MASTER_LOST_S: Final = 10.0
"""Seconds without a heartbeat from the master after which a worker with a run gives up."""
CHECK_INTERVAL_S: Final = 1.0
EXIT_MASTER_LOST: Final = 1
"""The worker's exit status when it gave up on its master."""


class MasterWatch:
    """Watches one WorkerRunner's master (see the module docstring); `start()` once."""

    def __init__(
        self,
        environment: Any,
        context: Callable[[], Any],
        timeout_s: float = MASTER_LOST_S,
        interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.environment = environment
        self.context = context  # the worker's current WorkerContext (None: no run yet)
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.clock = clock
        self.last_heartbeat = clock()
        self.lost = False

    def start(self) -> MasterWatch:
        self.environment.events.heartbeat_received.add_listener(self._on_heartbeat)
        gevent.spawn(self._watch)  # not in the runner's group: it survives runner.quit()
        return self

    def _on_heartbeat(self, **_: Any) -> None:
        self.last_heartbeat = self.clock()

    def running(self) -> bool:
        """A run is going on this worker: its users may send, its sink is open."""
        ctx = self.context()
        return ctx is not None and ctx.sink_report is None

    def check(self, now: float) -> bool:
        """True when the master has been silent too long while a run is going."""
        return self.running() and now - self.last_heartbeat > self.timeout_s

    def _watch(self) -> None:
        previous = self.clock()
        while not self.lost:
            gevent.sleep(self.interval_s)
            now = self.clock()
            # this process stalled (GC, a busy loop): heartbeats may be waiting unread in
            # the socket; look again once the loop has run
            stalled = now - previous > 2 * self.interval_s
            previous = now
            if not stalled and self.check(now):
                self._give_up(now - self.last_heartbeat)

    def _give_up(self, silent_s: float) -> None:
        self.lost = True
        runner = self.environment.runner
        master = f"{runner.master_host}:{runner.master_port}"
        print(
            f"llmload: error: lost the master {master} (no heartbeat for {silent_s:.0f} s); "
            "this worker stops sending, flushes its events to the store and exits "
            f"{EXIT_MASTER_LOST}; check the master's host and the network to it (parts this "
            "worker cannot upload stay in its spool: llmload upload-spool)",
            file=sys.stderr,
            flush=True,
        )
        self.environment.process_exit_code = EXIT_MASTER_LOST
        runner.quit()  # stop(): users stop, test_stop closes the sink; then Locust exits
