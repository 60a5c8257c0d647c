"""The workers' clocks as the master measures them (NTP-style), for open-loop starts and the
manifest.

At each worker's hello (a burst of CLOCK_BURST exchanges) and then every CLOCK_INTERVAL_S,
the master sends `llmload_clock` with its wall time t1; the worker answers
`llmload_clock_reply` with t1 and its own wall time t2 at receipt; the master notes t4 at
receipt. offset = t2 - (t1 + t4) / 2, round trip = t4 - t1; the sample with the smallest
round trip is kept, sent to the worker (`llmload_clock_offset`: it sends open-loop arrivals
on the master's time) and written to the manifest (`workers[].clock_offset_ms`,
`clock_rtt_ms`).

A worker on the master's own kernel (its hello's boot id is the master's: the same host,
containers included) reads the same wall clock: its offset is 0. The exchange still runs,
and a sample further from 0 than half its round trip (more than the exchange's own error:
a clock faked for the process, as libfaketime does) is kept as measured. Before, such
workers got offsets of 0.05-0.37 ms that were only the exchange's error (round trips of
0.6-1.4 ms), which moved their send times and made request-path parts negative.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import gevent

from locustfiles.run.protocol import MSG_CLOCK, MSG_CLOCK_OFFSET

log = logging.getLogger("llmload.master")

CLOCK_BURST = 5  # exchanges right after a worker's hello
CLOCK_BURST_GAP_S = 0.02  # between them: one exchange at a time, none queued behind another
CLOCK_INTERVAL_S = 10.0  # then one exchange per worker this often while the run goes


class WorkerClocks:
    """Each worker's best (offset, round trip) in ns, by client id ("local": one process).

    `send`: the runner's send_message(msg_type, data, client_id=...)."""

    def __init__(self, send: Callable[..., Any]) -> None:
        self.send = send
        self.best: dict[str, tuple[int, int]] = {}
        self.same_kernel: set[str] = set()  # clients whose hello had the master's boot id
        self._loop: gevent.Greenlet | None = None

    def ping(self, client_id: str) -> None:
        """One exchange: the worker answers with its time at receipt (on_reply)."""
        self.send(MSG_CLOCK, {"t1": time.time_ns()}, client_id=client_id)

    def on_reply(self, client_id: str, data: dict[str, Any], t4: int | None = None) -> None:
        """NTP-style: offset = t2 - (t1 + t4) / 2; keep the sample with the smallest round trip.

        `t4`: the master's wall time when the reply arrived (now, if not given)."""
        t4 = time.time_ns() if t4 is None else t4
        try:
            t1, t2 = int(data["t1"]), int(data["t2"])
        except (KeyError, TypeError, ValueError):
            return
        rtt = t4 - t1
        if rtt < 0:
            return  # the master's clock stepped back during the exchange
        offset = t2 - (t1 + t4) // 2
        if client_id in self.same_kernel and abs(offset) <= rtt // 2:
            offset = 0  # one clock: what the exchange saw is its own error
        best = self.best.get(client_id)
        if best is None or rtt < best[1]:
            self.best[client_id] = (offset, rtt)
            try:  # the worker sends open-loop arrivals on the master's time (run.protocol)
                self.send(MSG_CLOCK_OFFSET, {"offset_ns": self.best[client_id][0]},
                          client_id=client_id)  # fmt: skip
            except Exception:  # Locust's RPCError: the next better sample sends it again
                log.warning("llmload: could not send worker %s its clock offset", client_id)

    def burst(self, client_id: str) -> None:
        """A new worker: a few exchanges in a row (run in a greenlet of its own)."""
        for i in range(CLOCK_BURST):
            if i:
                gevent.sleep(CLOCK_BURST_GAP_S)
            self._ping_safely(client_id)

    def start(self, clients: Callable[[], Iterable[str]]) -> None:
        """One exchange with each of `clients()` every CLOCK_INTERVAL_S until stop()."""
        self._loop = gevent.spawn(self._measure_periodically, clients)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.kill(block=False)

    def _measure_periodically(self, clients: Callable[[], Iterable[str]]) -> None:
        while True:
            gevent.sleep(CLOCK_INTERVAL_S)
            for client_id in list(clients()):
                self._ping_safely(client_id)

    def _ping_safely(self, client_id: str) -> None:
        try:
            self.ping(client_id)
        except Exception:  # Locust's RPCError (importing locust here would monkey-patch):
            # a lost exchange is only a missing sample, never a reason to stop measuring
            log.warning("llmload: clock exchange with worker %s failed", client_id, exc_info=True)
