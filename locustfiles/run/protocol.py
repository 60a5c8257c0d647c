"""The messages master and workers exchange, and what a worker knows of the current step.

Master -> workers: `llmload_step` (the step: index, users, cold flag, master wall time, a
rate step's schedule and each worker's share), `llmload_finish`, `llmload_clock`,
`llmload_clock_offset`. Workers -> master: `llmload_hello` (identity), `llmload_step_query`
(a late joiner asks for the step), `llmload_probes`, `llmload_in_flight` (while a search
drains), `llmload_worker_failed` (it cannot start, why), `llmload_clock_reply`,
`llmload_finished` (the sink's report). The live statistics travel in Locust's own report
(locustfiles/live). The master's side is locustfiles/master, the workers' locustfiles/worker;
chat.py registers the handlers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("llmload.steps")

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def kernel_boot_id() -> str | None:
    """This kernel's boot id (a worker's hello carries it): processes that share it read one
    wall clock, containers on one host included (None: not Linux, or unreadable)."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


MSG_STEP = "llmload_step"
MSG_STEP_QUERY = "llmload_step_query"
MSG_IN_FLIGHT = "llmload_in_flight"  # worker -> master while paused: {"pause_id", "in_flight"}
MSG_FINISH = "llmload_finish"
MSG_FINISHED = "llmload_finished"
MSG_HELLO = "llmload_hello"
MSG_WORKER_FAILED = "llmload_worker_failed"  # worker -> master: it cannot start (why)
MSG_PROBES = "llmload_probes"  # worker -> master: the probes it sent ({"probes": [...]})
MSG_CLOCK = "llmload_clock"  # master -> worker: {"t1": master time_ns}
MSG_CLOCK_REPLY = "llmload_clock_reply"  # worker -> master: {"t1": ..., "t2": worker time_ns}
MSG_CLOCK_OFFSET = "llmload_clock_offset"  # master -> worker: {"offset_ns": its best offset}

COLD_STEP = -1  # the cold phase before step 0 (one user, --cold-requests)


@dataclass
class StepState:
    """What a worker knows of the current step (updated by MSG_STEP).

    A rate step (open loop) also carries its schedule: the global `rate`, the `arrival`
    process, the cap, when the schedule starts (`starts_at_ns`, on this worker's clock: the
    master's time plus this worker's measured offset) and this worker's share of it
    (`position` of `count`). `version` counts updates; `listeners` are called after each.
    The master sends each worker its clock offset whenever it measures a better one
    (MSG_CLOCK_OFFSET), so a worker whose clock is off still sends on the master's time.
    """

    step: int = 0
    concurrency: int = 1
    cold: bool = False
    paused: bool = False  # a search drains a failed rate level: send nothing
    pause_id: int = 0
    rate: float | None = None
    arrival: str = "poisson"
    max_concurrency: int = 0
    over_cap: str = "wait"
    starts_at_master_ns: int = 0  # the schedule's start, on the master's clock
    offset_ns: int = 0  # this worker's clock minus the master's (the master measures it)
    position: int = 0
    count: int = 1
    seed: int = 0
    version: int = 0
    listeners: list[Any] = field(default_factory=list)

    @property
    def starts_at_ns(self) -> int:
        """The schedule's start on this worker's clock."""
        return self.starts_at_master_ns + self.offset_ns

    def update(self, data: dict[str, Any], client_id: str | None = None) -> None:
        self.step = int(data["step"])
        self.concurrency = int(data["concurrency"])
        self.cold = bool(data["cold"])
        self.paused = bool(data.get("paused"))
        self.pause_id = int(data.get("pause_id") or 0)
        rate = data.get("rate")
        self.rate = float(rate) if rate is not None and not self.cold and not self.paused else None
        if self.rate is not None:
            self.arrival = str(data.get("arrival") or "poisson")
            self.max_concurrency = int(data.get("max_concurrency") or 0)
            self.over_cap = str(data.get("over_cap") or "wait")
            self.seed = int(data.get("seed") or 0)
            shares: dict[str, int] = data.get("shares") or {}
            offsets: dict[str, int] = data.get("offsets") or {}
            key = client_id if client_id is not None else "local"
            self.count = max(1, int(data.get("share_count") or 1))
            self.position = int(shares.get(key, 0)) % self.count
            self.starts_at_master_ns = int(data.get("starts_at_ns") or data["wall_ns"])
            if key in offsets:
                self.offset_ns = int(offsets[key])
            if key not in shares and len(shares) > 0:
                log.warning("llmload: this worker has no share of step %d's arrivals; it sends "
                            "none until the next step", self.step)  # fmt: skip
                self.count = 0
        self.version += 1
        for listener in list(self.listeners):
            listener()
