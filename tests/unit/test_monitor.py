"""The worker's measure of itself (locustfiles/worker/monitor.py) on a real gevent hub."""

from __future__ import annotations

import time
from typing import Any

import gevent
import pytest

from locustfiles.worker.monitor import LoopMonitor


def busy(seconds: float) -> None:
    """Hold the loop (and the CPU) without yielding, as a long encode or an import would."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def make() -> tuple[LoopMonitor, list[dict[str, Any]], list[dict[str, Any]]]:
    samples: list[dict[str, Any]] = []
    stalls: list[dict[str, Any]] = []
    monitor = LoopMonitor(samples.append, stalls.append, tick_s=0.002, sample_s=0.05)
    return monitor.start(), samples, stalls


def test_a_stall_is_recorded_with_its_length_and_flags_overlapping_requests() -> None:
    monitor, samples, stalls = make()
    try:
        gevent.sleep(0.03)
        before = time.perf_counter_ns()
        gevent.sleep(0.01)
        cpu_before = time.process_time_ns()
        busy(0.04)
        busy_cpu = time.process_time_ns() - cpu_before  # less than 40 ms on a shared core
        gevent.sleep(0.03)
        after = time.perf_counter_ns()
    finally:
        monitor.stop()
    # ours: the one stall of 35 ms or more (a loaded machine may add short ones of its own)
    (ours,) = [s for s in stalls if s["length_ns"] >= 35e6]
    assert ours["length_ns"] <= 60e6, stalls
    assert abs(ours["started_at_ns"] - time.time_ns()) < 5e9  # a wall-clock time
    assert 35e6 <= monitor.overlap_ns(before, after) <= 60e6
    assert monitor.overlap_ns(after, after + 10**9) == 0  # a later request was not touched
    # samples: CPU% of this process (the busy loop is CPU), every probe's lag
    assert samples and all(s["interval_ns"] > 0 for s in samples)
    # CPU% of the process over each interval: the busy loop (no tick runs during it) is all in
    # one sample, with the CPU the machine gave it (less than 40 ms on a shared core)
    cpu_ns = [s["cpu_percent"] / 100 * s["interval_ns"] for s in samples]
    assert max(cpu_ns) >= 0.9 * busy_cpu > 0, (cpu_ns, busy_cpu)
    lags = [lag for s in samples for lag in s["loop_lag_us"]]
    assert max(lags) >= 35_000 and min(lags) < 5_000


def test_a_stall_still_going_on_counts_for_a_request_that_ends_first() -> None:
    monitor, _, stalls = make()
    try:
        gevent.sleep(0.02)
        start = time.perf_counter_ns()
        busy(0.03)
        # the request ends now, before the late timer has had a chance to run
        overlap = monitor.overlap_ns(start, time.perf_counter_ns())
    finally:
        monitor.stop()
    assert 20e6 <= overlap <= 40e6
    assert len(stalls) == 1  # recorded once, when the loop came back


@pytest.mark.alone  # another test's load beside it stalls this loop for real
def test_a_quiet_loop_records_no_stall() -> None:
    monitor, samples, stalls = make()
    try:
        gevent.sleep(0.2)
    finally:
        monitor.stop()
    assert stalls == []
    assert len(samples) >= 3
    assert not monitor.running
