"""analysis/kernel/anchor.py: one instant read on the wall clock and the monotonic counter."""

from __future__ import annotations

import time

import pytest

from analysis.kernel import anchor


def test_the_pair_lies_between_readings_taken_around_it() -> None:
    wall_before, perf_before = time.time_ns(), time.perf_counter_ns()
    wall, perf = anchor.wall_and_perf_ns()
    perf_after, wall_after = time.perf_counter_ns(), time.time_ns()
    assert wall_before <= wall <= wall_after
    assert perf_before <= perf <= perf_after


def test_a_preempted_try_is_replaced_by_a_tight_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first try's counter readings are 5 ms apart (the process lost its core between
    them); the second's 1 µs: the second is kept, its counter at the midpoint."""
    perfs = iter([0, 5_000_000, 10_000_000, 10_001_000])
    walls = iter([100, 200])
    monkeypatch.setattr(anchor, "_perf_ns", lambda: next(perfs))
    monkeypatch.setattr(anchor, "_wall_ns", lambda: next(walls))
    assert anchor.wall_and_perf_ns() == (200, 10_000_500)


def test_with_no_tight_try_the_tightest_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    perfs = iter([0, 90_000, 100_000, 130_000, 200_000, 260_000])
    walls = iter([1, 2, 3])
    monkeypatch.setattr(anchor, "_perf_ns", lambda: next(perfs))
    monkeypatch.setattr(anchor, "_wall_ns", lambda: next(walls))
    assert anchor.wall_and_perf_ns(tries=3) == (2, 115_000)
