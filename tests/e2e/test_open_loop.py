"""Open-loop rate steps across two real worker processes, judged by the server's truth log.

The arrival schedule is seeded, so each run's realised schedule is the same every time: the
tests compare what the server received with the schedule the workers were meant to send
(`locustfiles.arrivals.Schedule`), and with the rate and distribution asked for.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from locustfiles.arrivals import Schedule
from tests.support.chat import LocustResult, run_locust, start_sim
from tests.support.ks import cv, ks_exponential

RATE = 40.0
DURATION_S = 12.0
WARMUP_S = 1.0


def _run(
    tmp: Path, arrival: str, *extra: str
) -> tuple[LocustResult, pd.DataFrame, dict[str, Any], dict[str, Any]]:
    with start_sim(tmp, "--profile", "tiny") as sim:
        result = run_locust(
            sim.url, tmp / "runs", "--rates", str(RATE), "--arrival", arrival,
            "--step-duration", str(DURATION_S), "--step-warmup", str(WARMUP_S),
            "--cold-requests", "0", "--workload", "D(16,4)", "--seed", "0", *extra,
            workers=2, timeout=120,
        )  # fmt: skip
        truth = sim.truth()
    assert result.returncode == 0, result.output[-3000:]
    requests, _chunks, manifest = result.events()
    return result, requests, manifest, truth


def _server_arrivals(
    requests: pd.DataFrame, truth: dict[str, Any], step: dict[str, Any]
) -> list[int]:
    """Server receive times (ns) of the step's requests whose intended time is in the step."""
    rows = requests[(requests["step"] == step["step"]) & (requests["status"] != "dropped")]
    assert set(rows["request_id"]) <= set(truth)  # every request sent reached the server
    return sorted(truth[r]["arrival_unix_ns"] for r in rows["request_id"])


@pytest.fixture(scope="module")
def poisson(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return _run(tmp_path_factory.mktemp("poisson"), "poisson")


def test_two_workers_send_the_one_global_schedule(poisson: tuple[Any, ...]) -> None:
    _, requests, manifest, _ = poisson
    (step,) = manifest["steps"]
    assert step["rate"] == RATE and step["arrival"] == "poisson"
    assert len(step["share_workers"]) == 2
    rows = requests[requests["step"] == 0]
    assert rows["rate"].eq(RATE).all()
    by_worker = rows.groupby("worker_id")["arrival_index"].apply(set)
    assert len(by_worker) == 2
    for position, worker in enumerate(step["share_workers"]):
        assert all(i % 2 == position for i in by_worker[worker])  # each sent its own share
    indexes = sorted(rows["arrival_index"])
    assert indexes == list(range(len(indexes)))  # every arrival once, none missing
    # exactly the arrivals the schedule has inside the step
    length_s = (step["ended_at_ns"] - step["started_at_ns"]) / 1e9
    expected = list(itertools.takewhile(lambda a: a[1] < length_s,
                                        Schedule(RATE, "poisson", 0, 0).arrivals()))  # fmt: skip
    assert abs(len(indexes) - len(expected)) <= 1  # the last may fall either side of the end


def test_merged_arrivals_have_the_rate_and_are_poisson(poisson: tuple[Any, ...]) -> None:
    _, requests, manifest, truth = poisson
    (step,) = manifest["steps"]
    times = _server_arrivals(requests, truth, step)
    span_s = (times[-1] - times[0]) / 1e9
    rate = (len(times) - 1) / span_s
    assert rate == pytest.approx(RATE, rel=0.05)
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    d, p = ks_exponential(gaps, rate)
    assert p > 0.01, (d, p)


def test_slip_is_recorded_for_every_request(poisson: tuple[Any, ...]) -> None:
    _, requests, _, _ = poisson
    rows = requests[requests["step"] == 0]
    assert rows["intended_ns"].notna().all() and rows["queued_ns"].eq(0).all()
    slip_ms = (rows["sent_at_ns"] - rows["intended_ns"] - rows["queued_ns"]) / 1e6
    assert (slip_ms >= 0).all()  # nothing is sent before its time
    assert slip_ms.median() < 10  # a 2-core machine running the server too: loose


def test_gamma_arrivals_have_the_asked_burstiness(tmp_path: Path) -> None:
    _, requests, manifest, truth = _run(tmp_path, "gamma:2")
    (step,) = manifest["steps"]
    assert step["arrival"] == "gamma:2"
    times = _server_arrivals(requests, truth, step)
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    assert cv(gaps) == pytest.approx(2.0, rel=0.15)
    assert (len(times) - 1) / ((times[-1] - times[0]) / 1e9) == pytest.approx(RATE, rel=0.15)
