"""Open-loop sending: one dispatcher per worker sends its share of each rate step's arrivals.

The dispatcher runs beside Locust's users (which idle in rate steps): when a rate step's
message arrives (`StepState`), it walks the step's global schedule (locustfiles/traffic/arrivals.py)
and, at each of its arrivals' intended times, starts a greenlet that sends the request
whatever the server is doing. Each request records its step, the step's rate, the arrival's
index, its intended send time and, under `--max-concurrency`, how long it waited for a slot
(`--over-cap wait`); with `--over-cap drop` an arrival that finds every slot taken is
recorded as `dropped` and not sent. Slip (sent_at - intended - queued) is then the
generator's own lateness, which the report checks.

A trace replay's step (`arrival` "trace", `--workload trace:PATH`) walks the trace's own
schedule (locustfiles/traffic/trace.py), which ends: after its last arrival the dispatcher
waits for the next step or the end of the run, and arrival i sends the trace's row i.

A step that follows a rate step begins RATE_LEAD_S after its announcement (steps.py): the
old schedule's arrivals due before that keep their old step; then the new schedule starts.
Requests still in flight at a step change finish under their own step. A capacity search
pauses the workers after a rate level that missed the SLO (`StepState.paused`), and so does
the end of the last step: nothing new is sent, and each worker reports its requests in
flight (`WorkerContext.in_flight`) until the master starts the next level (or ends the run)
once they have all ended. At the end of the
run (`stop`), requests in flight are recorded `aborted`, and arrivals waiting for a slot
`dropped`, before the sink closes; so are the arrivals already due that this worker had
not yet sent (behind its schedule, e.g. on a busy CPU, when the stop came): every arrival
due before the stop has its row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.event
import gevent.lock
import gevent.pool
from gevent import GreenletExit

from locustfiles.request.client import new_pool
from locustfiles.request.record import RequestRecord
from locustfiles.run.protocol import StepState
from locustfiles.run.service import Service
from locustfiles.traffic.arrivals import Schedule, worker_cap

log = logging.getLogger("llmload.openloop")

_perf_ns = time.perf_counter_ns
STOP_TIMEOUT_S = 10.0
"""How long `stop` waits for killed requests to record themselves."""
BEHIND_NS = 1_000_000
"""An arrival more than this late makes the dispatcher yield before the next one."""
DUE_AT_STOP = "due but not yet sent when the run stopped (this worker was behind its schedule)"


@dataclass(slots=True)
class Arrival:
    """One arrival of a rate step, as the request records it."""

    step: int
    rate: float
    concurrency: int  # the step's cap (0: none)
    index: int
    intended_ns: int  # wall ns, this worker's clock
    queued_ns: int = 0


@dataclass(frozen=True)
class _Plan:
    """A snapshot of the step a schedule belongs to (the StepState changes under it)."""

    version: int
    step: int
    rate: float
    arrival: str
    seed: int
    max_concurrency: int
    over_cap: str
    starts_at_ns: int
    position: int
    count: int


class Dispatcher:
    """Sends this worker's share of every rate step; `ctx` is the WorkerContext."""

    def __init__(
        self,
        ctx: Any,
        step: StepState,
        on_record: Callable[[RequestRecord], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.step = step
        self.on_record = on_record
        self.requests = gevent.pool.Group()
        # idle clients, reused: a keep-alive connection pool and its service (a user's own
        # hooks, logged in once; None: the built-in endpoint)
        self._pools: list[tuple[Any, Service | None]] = []
        self._changed = gevent.event.Event()
        self._loop: gevent.Greenlet | None = None
        # the arrival the schedule waits for: (plan, the rest of the share, index, intended)
        self._next: tuple[_Plan, Iterator[tuple[int, float]], int, int] | None = None
        self._unstarted: dict[tuple[int, int], Arrival] = {}  # spawned, not yet running
        self.stopped = False
        self.sent = 0
        self.dropped = 0
        step.listeners.append(self._on_step)
        self._on_step()

    # -- lifecycle ---------------------------------------------------------------------
    def _on_step(self) -> None:
        self._changed.set()
        rate_step = self.step.rate is not None and not self.step.cold
        if rate_step and not self.stopped and (self._loop is None or self._loop.dead):
            self._loop = gevent.spawn(self._run)
            self._loop.name = "llmload-dispatcher"

    def stop(self) -> None:
        """End of the run: no more arrivals; requests in flight become `aborted` rows, and
        arrivals due by now but not sent (waiting for a slot, or not yet reached) `dropped`."""
        stopped_at = time.time_ns()
        self.stopped = True
        if self.step.listeners and self._on_step in self.step.listeners:
            self.step.listeners.remove(self._on_step)
        if self._loop is not None:
            self._loop.kill(block=True, timeout=STOP_TIMEOUT_S)
        self._drop_due(stopped_at)
        self.requests.kill(block=True, timeout=STOP_TIMEOUT_S)
        for arrival in list(self._unstarted.values()):  # killed before they ran
            self._drop(arrival, DUE_AT_STOP)
        self._unstarted.clear()
        for pool, _ in self._pools:
            pool.clear()
        self._pools.clear()

    def _drop_due(self, stopped_at: int) -> None:
        """The arrivals the schedule had not reached that were due by `stopped_at`."""
        if self._next is None:
            return
        plan, rest, index, intended = self._next
        self._next = None
        while intended <= stopped_at:
            if self.step.version != plan.version:
                following = self._snapshot()
                if following is None or intended >= following.starts_at_ns:
                    return  # the next step's time: its arrivals, not these
            self._drop(Arrival(plan.step, plan.rate, plan.max_concurrency, index, intended),
                       DUE_AT_STOP)  # fmt: skip
            following_arrival = next(rest, None)
            if following_arrival is None:  # a trace's schedule ends
                return
            index, offset_s = following_arrival
            intended = plan.starts_at_ns + int(offset_s * 1e9)

    # -- the schedule ------------------------------------------------------------------
    def _snapshot(self) -> _Plan | None:
        s = self.step
        if s.rate is None or s.cold:
            return None
        return _Plan(s.version, s.step, s.rate, s.arrival, s.seed, s.max_concurrency,
                     s.over_cap, s.starts_at_ns, s.position, s.count)  # fmt: skip

    def _run(self) -> None:
        plan = self._snapshot()
        while plan is not None and not self.stopped:
            self._changed.clear()
            self.ctx.ensure_ready(self._take_pool_for_probe())
            nxt = self._follow(plan)
            plan = nxt

    def _take_pool_for_probe(self) -> Any:
        if not self._pools:
            self._pools.append(self._new_client())
        return self._pools[0][0]

    def _new_client(self) -> tuple[Any, Service | None]:
        services = self.ctx.services
        return new_pool(), None if services is None else services()

    def _follow(self, plan: _Plan) -> _Plan | None:
        """Send `plan`'s arrivals until a new step takes over; returns that step's plan."""
        if plan.count <= 0:  # no share of this step: wait for the next one
            while self.step.version == plan.version and not self.stopped:
                self._changed.wait()
                self._changed.clear()
            return self._snapshot()
        cap = worker_cap(plan.max_concurrency, plan.position, plan.count)
        slots = gevent.lock.BoundedSemaphore(cap) if cap else None
        # intended times are wall ns on this worker's clock; the waits use the monotonic clock
        perf_origin = _perf_ns() - time.time_ns()
        share = self._schedule(plan)
        for index, offset_s in share:
            intended = plan.starts_at_ns + int(offset_s * 1e9)
            self._next = (plan, share, index, intended)
            while True:
                if self.step.version != plan.version:
                    following = self._snapshot()
                    if following is None or intended >= following.starts_at_ns:
                        self._next = None
                        return following
                delay_ns = intended + perf_origin - _perf_ns()
                if delay_ns <= 0:
                    break
                if self.step.version != plan.version:  # the old step's last arrivals
                    gevent.sleep(delay_ns / 1e9)
                else:
                    self._changed.wait(delay_ns / 1e9)
                    self._changed.clear()
            self._next = None
            arrival = Arrival(plan.step, plan.rate, plan.max_concurrency, index, intended)
            self._unstarted[(plan.step, index)] = arrival
            self.requests.spawn(self._send, arrival, slots, plan.over_cap)
            if delay_ns < -BEHIND_NS:
                # behind the schedule: let the arrival (and every greenlet ready) run before
                # the next, so that a worker asked for more than it can send sends late
                # (slip, which the report judges) instead of piling up greenlets it cannot
                # run, which would starve everything else, the run's stop included
                try:
                    gevent.sleep(0)
                except GreenletExit:  # the stop: make the schedule's next arrival `_next`,
                    pending = next(share, None)  # so that the stop records the due ones
                    if pending is not None:
                        self._next = (plan, share, pending[0],
                                      plan.starts_at_ns + int(pending[1] * 1e9))  # fmt: skip
                    raise
        # a trace's schedule ends: wait for the next step (or the end of the run)
        while self.step.version == plan.version and not self.stopped:
            self._changed.wait()
            self._changed.clear()
        return self._snapshot()

    def _schedule(self, plan: _Plan) -> Iterator[tuple[int, float]]:
        """This worker's share of the step's arrivals: a trace's own (`--workload trace:`),
        else the drawn schedule of the step's rate and arrival process."""
        if plan.arrival == "trace":
            trace = self.ctx.options.workload.trace
            assert trace is not None and trace.replay is not None, "a trace step without a trace"
            return trace.replay.share(plan.position, plan.count)
        return Schedule(plan.rate, plan.arrival, plan.seed, plan.step).share(
            plan.position, plan.count
        )

    # -- one arrival -------------------------------------------------------------------
    def _send(self, arrival: Arrival, slots: gevent.lock.BoundedSemaphore | None,
              over_cap: str) -> None:  # fmt: skip
        self._unstarted.pop((arrival.step, arrival.index), None)  # it records itself now
        if slots is not None:
            if over_cap == "drop":
                if not slots.acquire(blocking=False):
                    self._drop(arrival, "over --max-concurrency (--over-cap drop)")
                    return
            else:
                waited_from = _perf_ns()
                try:
                    slots.acquire()
                except GreenletExit:
                    self._drop(
                        arrival, "waiting for a slot under --max-concurrency when the run stopped"
                    )
                    raise
                arrival.queued_ns = _perf_ns() - waited_from
        pool, service = self._pools.pop() if self._pools else self._new_client()
        try:
            if self.ctx.options.sessions:  # an arrival starts a session (sessions.py)
                self.ctx.run_session(pool, arrival, self.on_record, service)
            else:
                record = self.ctx.run_one(pool, arrival, service=service)
                if record is not None and self.on_record is not None:
                    self.on_record(record)
            self.sent += 1
        finally:
            self._pools.append((pool, service))
            if slots is not None:
                slots.release()

    def _drop(self, arrival: Arrival, why: str) -> None:
        self.dropped += 1
        self.ctx.record_dropped(arrival, why)
