"""The global arrival schedule: its rate and distribution, and how workers share it."""

from __future__ import annotations

import itertools

import pytest

from locustfiles.traffic.arrivals import Schedule, worker_cap
from tests.support.ks import cv, ks_exponential


def _gaps(schedule: Schedule, n: int) -> list[float]:
    times = [t for _, t in itertools.islice(schedule.arrivals(), n)]
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


def test_poisson_gaps_are_exponential_at_the_rate() -> None:
    gaps = _gaps(Schedule(40.0, "poisson", seed=3, step=0), 4000)
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 40, rel=0.05)
    _, p = ks_exponential(gaps, 40.0)
    assert p > 0.01


def test_constant_gaps_fail_the_exponential_test() -> None:
    gaps = _gaps(Schedule(40.0, "constant", seed=3, step=0), 500)
    assert gaps == pytest.approx([1 / 40] * 500)
    assert ks_exponential(gaps, 40.0)[1] < 0.01  # the test can tell


@pytest.mark.parametrize("target", [0.5, 2.0, 4.0])
def test_gamma_has_the_asked_coefficient_of_variation(target: float) -> None:
    gaps = _gaps(Schedule(10.0, f"gamma:{target:g}", seed=1, step=2), 20000)
    assert cv(gaps) == pytest.approx(target, rel=0.1)
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)


def test_one_schedule_per_seed_and_step() -> None:
    def first(seed: int, step: int) -> list[tuple[int, float]]:
        return list(itertools.islice(Schedule(5.0, "poisson", seed, step).arrivals(), 20))

    assert first(0, 1) == first(0, 1)
    assert first(0, 1) != first(0, 2)
    assert first(0, 1) != first(1, 1)


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shares_partition_the_schedule(count: int) -> None:
    schedule = Schedule(20.0, "gamma:2", seed=9, step=4)
    whole = list(itertools.islice(schedule.arrivals(), 300))
    merged = sorted(
        arrival
        for position in range(count)
        for arrival in itertools.islice(schedule.share(position, count), 300 // count + 1)
        if arrival[0] < 300
    )
    assert merged == whole


def test_a_share_outside_the_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="share position 2"):
        next(Schedule(1.0, "poisson", 0, 0).share(2, 2))


@pytest.mark.parametrize(
    ("cap", "count", "expected"),
    [(0, 3, [0, 0, 0]), (10, 3, [4, 3, 3]), (9, 3, [3, 3, 3]), (2, 3, [1, 1, 1])],
)
def test_the_cap_is_split_over_workers(cap: int, count: int, expected: list[int]) -> None:
    assert [worker_cap(cap, k, count) for k in range(count)] == expected
