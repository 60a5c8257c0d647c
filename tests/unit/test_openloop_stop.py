"""The end of an open-loop run: every arrival due before a worker stops has its row.

A worker on a busy CPU can be behind its schedule when the stop comes: arrivals whose time
had come were not sent yet (the schedule had not reached them, or their greenlets had not
run). They are recorded `dropped`, so the rows still account for the whole schedule.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import gevent
import pytest
from gevent import GreenletExit

from locustfiles.run.protocol import StepState
from locustfiles.traffic.arrivals import Schedule
from locustfiles.worker import openloop
from locustfiles.worker.openloop import DUE_AT_STOP, Arrival, Dispatcher

RATE = 200.0


class FakeContext:
    """A worker's side as the dispatcher sees it: each request takes a second, and one
    killed in flight records itself as `aborted` (as locustfiles/request/client.py does)."""

    def __init__(self) -> None:
        self.options = type("Options", (), {"sessions": False})()
        self.services = None  # the built-in endpoint (no user's own hooks)
        self.rows: list[tuple[int, str, str]] = []  # (arrival index, status, detail)

    def ensure_ready(self, pool: Any) -> None:
        pass

    def run_one(self, pool: Any, arrival: Arrival, service: Any = None) -> None:
        try:
            gevent.sleep(1)
        except GreenletExit:
            self.rows.append((arrival.index, "aborted", "in flight when the run stopped"))
            raise

    def record_dropped(self, arrival: Arrival, why: str) -> None:
        self.rows.append((arrival.index, "dropped", why))


def _run_behind(behind: Any) -> tuple[FakeContext, int, int]:
    """A rate step sent on schedule for 0.2 s, then `behind()` while arrivals fall due;
    then the stop. Returns the worker's rows, the step's start and a time before the stop."""
    ctx = FakeContext()
    step = StepState()
    dispatcher = Dispatcher(ctx, step)
    started = time.time_ns()
    step.update({"step": 0, "concurrency": 0, "cold": False, "rate": RATE,
                 "arrival": "constant", "wall_ns": started, "starts_at_ns": started})  # fmt: skip
    gevent.sleep(0.2)  # on schedule: about 40 sent
    behind()  # about 20 more fall due, none sent
    due_by = time.time_ns()
    dispatcher.stop()
    return ctx, started, due_by


def _greenlets_not_run() -> None:
    time.sleep(0.1)  # the process gets no CPU: the due arrivals' greenlets never start


def _schedule_not_reached(monkeypatch: pytest.MonkeyPatch) -> Any:
    def behind() -> None:
        frozen = time.perf_counter_ns()  # the schedule's waits never end: it falls behind
        monkeypatch.setattr(openloop, "_perf_ns", lambda: frozen)
        gevent.sleep(0.1)

    return behind


@pytest.mark.parametrize("how", ["greenlets not run", "schedule not reached"])
def test_arrivals_due_but_not_sent_when_the_run_stops_are_recorded_dropped(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    behind = (
        _greenlets_not_run if how == "greenlets not run" else _schedule_not_reached(monkeypatch)
    )
    ctx, started, due_by = _run_behind(behind)
    arrivals = Schedule(RATE, "constant", 0, 0).arrivals()
    due = list(itertools.takewhile(lambda a: started + a[1] * 1e9 < due_by, arrivals))
    indexes = sorted(index for index, _, _ in ctx.rows)
    assert indexes == list(range(len(indexes)))  # each arrival once
    assert len(indexes) >= len(due)  # every arrival due before the stop has its row
    dropped = [why for _, status, why in ctx.rows if status == "dropped"]
    assert len(dropped) >= 10 and set(dropped) == {DUE_AT_STOP}  # the ~20 late ones
    assert {status for _, status, _ in ctx.rows} == {"aborted", "dropped"}
