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

Locust drives the Staircase through `StepShape` (locustfiles/shape.py) and the master's
`RunCoordinator`; this module imports neither Locust nor the master.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("llmload.steps")

MSG_STEP = "llmload_step"
MSG_STEP_QUERY = "llmload_step_query"
COLD_STEP = -1
COLD_TIMEOUT_S = 120.0
SPAWN_TIMEOUT_S = 60.0
SPAWN_RATE = 100.0  # users/s: a step of up to 100 users spawns within a second


@dataclass
class StepState:
    """What a worker knows of the current step (updated by MSG_STEP)."""

    step: int = 0
    concurrency: int = 1
    cold: bool = False

    def update(self, data: dict[str, Any]) -> None:
        self.step = int(data["step"])
        self.concurrency = int(data["concurrency"])
        self.cold = bool(data["cold"])


class Staircase:
    """The master's plan and progress; `tick()` is called about once a second by the shape."""

    def __init__(
        self,
        steps: tuple[int, ...],
        duration_s: float,
        warmup_s: float,
        cold_requests: int,
        announce: Any,  # callable(step, concurrency, cold, started_at_ns)
        finished_requests: Any,  # callable() -> int
    ) -> None:
        self.steps = steps
        self.duration_ns = int(duration_s * 1e9)
        self.warmup_s = warmup_s
        self.cold_requests = cold_requests
        self._announce = announce
        self._finished_requests = finished_requests
        self.index: int | None = None  # COLD_STEP, 0.., or None before the start
        self.done = False
        self.completed = False  # every step ran its full duration
        self.started_at_ns = 0
        self.spawned_at_ns: int | None = None
        self.timeline: list[dict[str, Any]] = []  # actual steps, manifest format
        self.cold: dict[str, Any] = {"requests": 0, "concurrency": 0}

    @property
    def target(self) -> int:
        if self.index is None or self.done:
            return 0
        return 1 if self.index == COLD_STEP else self.steps[self.index]

    def _begin(self, index: int) -> None:
        previous = self.target
        self.index = index
        self.started_at_ns = time.time_ns()
        self.spawned_at_ns = None
        cold = index == COLD_STEP
        if cold:
            self.cold = {
                "requests": self.cold_requests,
                "concurrency": 1,
                "started_at_ns": self.started_at_ns,
            }
        else:
            self.timeline.append(
                {
                    "step": index,
                    "concurrency": self.steps[index],
                    "started_at_ns": self.started_at_ns,
                    "spawned_at_ns": None,
                    "ended_at_ns": None,
                    "warmup_s": self.warmup_s,
                }
            )
        log.info("llmload: step %s at concurrency %s", "cold" if cold else index, self.target)
        self._announce(index, self.target, cold, self.started_at_ns)
        if previous == self.target:  # same users as before: Locust spawns nobody, so no event
            self.on_spawned(self.target)

    def _end_current(self) -> None:
        now = time.time_ns()
        if self.index == COLD_STEP:
            self.cold["ended_at_ns"] = now
        elif self.index is not None and self.timeline:
            self.timeline[-1]["ended_at_ns"] = now

    def on_spawned(self, user_count: int) -> None:
        if (
            self.index is not None
            and not self.done
            and user_count == self.target
            and self.spawned_at_ns is None
        ):
            self.spawned_at_ns = time.time_ns()
            if self.index != COLD_STEP:
                self.timeline[-1]["spawned_at_ns"] = self.spawned_at_ns

    def tick(self) -> tuple[int, float] | None:
        if self.done:
            return None
        now = time.time_ns()
        if self.index is None:
            self._begin(COLD_STEP if self.cold_requests > 0 else 0)
        elif self.index == COLD_STEP:
            enough = self._finished_requests() >= self.cold_requests
            if enough or now - self.started_at_ns > COLD_TIMEOUT_S * 1e9:
                if not enough:
                    log.warning(
                        "llmload: cold phase timed out before %d requests", self.cold_requests
                    )
                self._end_current()
                self._begin(0)
        else:
            if self.spawned_at_ns is None and now - self.started_at_ns > SPAWN_TIMEOUT_S * 1e9:
                log.warning(
                    "llmload: step %d never reported spawning complete; timing from now", self.index
                )
                self.on_spawned(self.target)  # records spawned_at_ns in the timeline too
            if self.spawned_at_ns is not None and now - self.spawned_at_ns >= self.duration_ns:
                self._end_current()
                if self.index + 1 < len(self.steps):
                    self._begin(self.index + 1)
                else:
                    self.done = self.completed = True
                    return None
        return self.target, SPAWN_RATE

    def stop(self) -> None:
        """The run ended (finished or stopped early): close the open step."""
        if not self.done:
            self._end_current()
            self.done = True
