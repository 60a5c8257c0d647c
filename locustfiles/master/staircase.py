"""The concurrency staircase: the master's plan, its step messages, and the run's timeline.

Only the master knows the step. On every change it broadcasts `llmload_step` (step index,
target users, cold flag, master wall time) to the workers, before spawning the new users
(messages to a worker arrive in order). A worker that joins late sends `llmload_step_query`
and gets the current step back. The master records the actual timeline in the manifest:
when each step started, when its users had all spawned (`spawning_complete`), and when it
ended. A step lasts `--step-duration` seconds counted from spawning complete; its steady
window is `[spawned_at + warmup, ended_at]`.

Before step 0 an optional cold phase (step -1, one user) runs until `--cold-requests`
requests have finished (or COLD_TIMEOUT_S passed); its requests are flagged `cold`.

Locust drives the Staircase through `StepShape` (locustfiles/master/shape.py) and the master's
`RunCoordinator`; this module imports neither Locust nor the master.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from locustfiles.options.rules import SPAWN_RATE, SPAWN_TIMEOUT_S  # what --steps may ask
from locustfiles.run.protocol import COLD_STEP

log = logging.getLogger("llmload.steps")

COLD_TIMEOUT_S = 120.0
RATE_LEAD_S = 0.25  # a rate step's schedule starts this long after its announcement
READY_WAIT_S = 30.0  # how long the first rate step waits for every worker to be ready


class Staircase:
    """The master's plan and progress; `tick()` is called about once a second by the shape.

    `plan` (locustfiles/master/search.py) gives each step's level: a concurrency (closed loop: the
    target users) or a rate (open loop: one dispatching user per worker, `workers()` of
    them, sending its share of the step's arrival schedule). A rate step starts
    RATE_LEAD_S after it is announced, so that every worker has the message (and its
    dispatching user) when its schedule begins; the step before it runs until then.

    In a rate search, a level that missed the SLO leaves a queue at the server that would
    fail the next level as well: the workers are paused (`pause`) until their requests in
    flight (`in_flight`) have ended, at most `drain_timeout_s`, before the next level starts.
    After the last step (rate or concurrency) the same pause and wait come before the run
    ends, so that its requests in flight are not cut (the longest ones, most often).
    """

    def __init__(
        self,
        steps: tuple[int, ...],
        duration_s: float,
        warmup_s: float,
        cold_requests: int,
        announce: Any,  # callable(step, concurrency, cold, started_at_ns, timeline entry)
        finished_requests: Any,  # callable() -> int
        plan: Any = None,  # search.FixedLevels / CapacitySearch; default: the steps in order
        mode: str = "concurrency",
        open_loop: dict[str, Any] | None = None,  # arrival, max_concurrency, over_cap
        workers: Any = lambda: 1,  # callable() -> workers sharing a rate step
        step_stats: Any = None,  # callable(step) -> (live stats or None, finished requests)
        not_ready: Any = lambda: [],  # callable() -> the workers not ready for a schedule
        pause: Any = lambda step: None,  # callable(step): tell workers to send nothing
        in_flight: Any = lambda: 0,  # callable() -> requests in flight (None: unknown)
        drain_timeout_s: float = 600.0,
        before_step: Any = lambda step: None,  # callable(step) -> the cache phase's record
    ) -> None:
        from locustfiles.master.search import FixedLevels

        self.steps = steps
        self.plan = plan if plan is not None else FixedLevels(tuple(float(s) for s in steps))
        self.mode = mode
        self.open_loop = dict(open_loop or {})
        self.duration_ns = int(duration_s * 1e9)
        self.warmup_s = warmup_s
        self.cold_requests = cold_requests
        self._announce = announce
        self._finished_requests = finished_requests
        self._workers = workers
        self._step_stats = step_stats or (lambda step: (None, 0))
        self._not_ready = not_ready
        self._pause = pause
        self._in_flight = in_flight
        self.drain_timeout_s = drain_timeout_s
        self._before_step = before_step
        self._draining: tuple[float | None, int] | None = None  # (next level or None: the
        # run ends, since) while the requests in flight drain
        self._first_tick_ns: int | None = None
        self.min_requests = int(getattr(self.plan, "min_requests", 0) or 0)
        self.index: int | None = None  # COLD_STEP, 0.., or None before the start
        self.level: float | None = None  # the current step's concurrency or rate
        self.done = False
        self.completed = False  # every step ran its full duration (or the search ended)
        self.started_at_ns = 0
        self.spawned_at_ns: int | None = None
        self.timeline: list[dict[str, Any]] = []  # actual steps, manifest format
        self.cold: dict[str, Any] = {"requests": 0, "concurrency": 0}

    @property
    def rate_mode(self) -> bool:
        return self.mode == "rate"

    @property
    def target(self) -> int:
        if self.index is None or self.done:
            return 0
        if self.index == COLD_STEP:
            return 1
        if self.rate_mode:
            return max(1, int(self._workers()))
        return int(self.level or 0)

    def _begin(self, index: int, level: float | None = None, after_pause: bool = False) -> None:
        previous = self.target
        cold = index == COLD_STEP
        # the cache phase (cachephase.py) runs before the step begins: not in its time
        cache_phase = None if cold else self._before_step(index)
        self.index = index
        self.level = level
        now = time.time_ns()
        rate = None if cold or not self.rate_mode else level
        self.started_at_ns = now + (int(RATE_LEAD_S * 1e9) if rate is not None else 0)
        self.spawned_at_ns = None
        if self.timeline and rate is not None and not after_pause:
            self.timeline[-1]["ended_at_ns"] = self.started_at_ns  # it ran until this one began
        if cold:
            self.cold = {
                "requests": self.cold_requests,
                "concurrency": 1,
                "started_at_ns": self.started_at_ns,
            }
            entry: dict[str, Any] | None = None
        else:
            entry = {
                "step": index,
                "concurrency": int(level or 0) if rate is None else
                int(self.open_loop.get("max_concurrency") or 0),
                "started_at_ns": self.started_at_ns,
                "spawned_at_ns": None,
                "ended_at_ns": None,
                "warmup_s": self.warmup_s,
            }  # fmt: skip
            if cache_phase is not None:
                entry["cache_phase"] = cache_phase
            if rate is not None:
                entry.update(rate=rate, arrival=self.open_loop.get("arrival", "poisson"),
                             max_concurrency=int(self.open_loop.get("max_concurrency") or 0),
                             over_cap=self.open_loop.get("over_cap", "wait"),
                             spawned_at_ns=self.started_at_ns)  # fmt: skip
            self.timeline.append(entry)
        log.info("llmload: step %s at %s", "cold" if cold else index,
                 f"{rate:g} requests/s" if rate is not None else f"concurrency {self.target}")  # fmt: skip
        self._announce(index, self.target if rate is None else (entry or {})["concurrency"],
                       cold, self.started_at_ns, entry)  # fmt: skip
        if rate is not None:
            self.spawned_at_ns = self.started_at_ns  # no ramp: the schedule starts then
        elif previous == self.target:  # same users as before: Locust spawns nobody, no event
            self.on_spawned(self.target)

    def _end_current(self) -> None:
        now = time.time_ns()
        if self.index == COLD_STEP:
            self.cold["ended_at_ns"] = now
        elif self.index is not None and self.timeline and self.timeline[-1]["ended_at_ns"] is None:
            self.timeline[-1]["ended_at_ns"] = now  # (once: a stop while draining is later)

    def on_spawned(self, user_count: int) -> None:
        if (
            self.index is not None
            and not self.done
            and not (self.rate_mode and self.index != COLD_STEP)
            and user_count == self.target
            and self.spawned_at_ns is None
        ):
            self.spawned_at_ns = time.time_ns()
            if self.index != COLD_STEP:
                self.timeline[-1]["spawned_at_ns"] = self.spawned_at_ns

    def _step_over(self, now: int) -> bool:
        """The current step ran its duration (and, searching, has its requests or ran long)."""
        if self.spawned_at_ns is None:
            return False
        elapsed = now - self.spawned_at_ns
        if elapsed < self.duration_ns:
            return False
        if self.min_requests <= 0:
            return True
        from locustfiles.master.search import MAX_STRETCH

        _, finished = self._step_stats(self.index)
        return finished >= self.min_requests or elapsed >= MAX_STRETCH * self.duration_ns

    def _may_start(self, now: int) -> bool:
        """Rate steps begin once every worker is ready to meet their schedule: its clock
        offset known (schedules start on the master's time) and its probes done (models,
        calibration: otherwise the first arrivals wait for them and are late). After
        READY_WAIT_S they begin anyway, saying who was not ready."""
        if not self.rate_mode:
            return True
        late = self._not_ready()
        if not late:
            return True
        waited = now - (self._first_tick_ns or now)
        if waited < READY_WAIT_S * 1e9:
            return False
        log.warning("llmload: %d worker(s) not ready after %.0f s (clock offset unmeasured or "
                    "probes not done: %s); the rate steps start anyway, and their first "
                    "arrivals may be late (slip_ms says by how much)", len(late), READY_WAIT_S,
                    ", ".join(late))  # fmt: skip
        return True

    def tick(self) -> tuple[int, float] | None:
        if self.done:
            return None
        now = time.time_ns()
        if self._first_tick_ns is None:
            self._first_tick_ns = now
        if self.index is None:
            if self.cold_requests > 0:
                self._begin(COLD_STEP)
            elif self._may_start(now):
                self._begin(0, self.plan.first())
            else:
                return 0, SPAWN_RATE
        elif self.index == COLD_STEP:
            enough = self._finished_requests() >= self.cold_requests
            if (enough or now - self.started_at_ns > COLD_TIMEOUT_S * 1e9) and self._may_start(now):
                if not enough:
                    log.warning(
                        "llmload: cold phase timed out before %d requests", self.cold_requests
                    )
                self._end_current()
                self._begin(0, self.plan.first())
        else:
            if self.spawned_at_ns is None and now - self.started_at_ns > SPAWN_TIMEOUT_S * 1e9:
                log.warning(
                    "llmload: step %d never reported spawning complete; timing from now", self.index
                )
                self.on_spawned(self.target)  # records spawned_at_ns in the timeline too
            if self._draining is not None:
                waiting_level, since = self._draining
                drained = self._in_flight() == 0
                if drained or now - since > self.drain_timeout_s * 1e9:
                    final = waiting_level is None
                    if not drained:
                        log.warning("llmload: requests of step %d still in flight after %.0f s; "
                                    "%s anyway", self.index, self.drain_timeout_s,
                                    "the run ends" if final else f"step {self.index + 1} starts")  # fmt: skip
                    self._draining = None
                    if final:
                        self.done = self.completed = True
                        return None
                    self._begin(self.index + 1, waiting_level, after_pause=True)
                return self.target, SPAWN_RATE
            if self._step_over(now):
                stats, finished = self._step_stats(self.index)
                ran_s = (now - self.started_at_ns) / 1e9  # the step's requests ran in it
                level = self.plan.next_level(self.index, stats, finished, elapsed_s=ran_s)
                self._end_current()
                if level is None:
                    # the last step: its requests in flight finish (bounded), rather than
                    # being cut by the run's end (the longest ones, biasing the tail); closed
                    # loop too: its users start nothing new while paused (chat.py)
                    self._draining = (None, now)
                    self._pause(self.index)
                    log.info("llmload: step %d ended; waiting for its requests in flight "
                             "before the run ends", self.index)  # fmt: skip
                    return self.target, SPAWN_RATE
                if self.rate_mode and self.plan.last_failed:
                    # an open-loop level over capacity leaves a backlog at the server that
                    # would fail the next level too: send nothing until it has drained
                    self._draining = (level, now)
                    self._pause(self.index)
                    log.info("llmload: step %d missed the SLO; waiting for its requests to "
                             "drain before step %d", self.index, self.index + 1)  # fmt: skip
                    return self.target, SPAWN_RATE
                self._begin(self.index + 1, level)
        return self.target, SPAWN_RATE

    def stop(self) -> None:
        """The run ended (finished or stopped early): close the open step."""
        if not self.done:
            self._end_current()
            self.done = True
        self.plan.stop()
