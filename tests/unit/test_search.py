"""The capacity search's plan and the staircase that runs it (rate and concurrency)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from analysis.kernel.slo import parse_slo
from locustfiles.live.stats import GroupStats
from locustfiles.master.search import MAX_BISECTIONS, CapacitySearch, FixedLevels, judge
from locustfiles.master.staircase import RATE_LEAD_S, Staircase
from locustfiles.request.record import RequestRecord


def stats(ttft_s: float, n: int = 200, errors: int = 0) -> GroupStats:
    """A step's live statistics: `n` ok requests with TTFT `ttft_s`, `errors` failed ones."""
    group = GroupStats()
    for i in range(n + errors):
        r = RequestRecord(f"r{i}", 0, 1, False, "s", "chat", "m", True, 8, 4, "")
        r.first_token_ns = r.first_content_ns = int(ttft_s * 1e9)
        r.end_ns = int(ttft_s * 1e9) + 1000
        if i >= n:
            r.fail("http_5xx", "boom")
        group.observe(r)
    return group


def test_judge_reads_the_live_answer_times_and_valid_share() -> None:
    """TTFO and TTFR sketches and the valid share, live, as the report names them; a
    worker's delta merged on the master holds them whole."""
    worker = GroupStats()
    for i in range(100):
        r = RequestRecord(f"r{i}", 0, 1, False, "s", "chat", "m", True, 8, 4, "")
        r.first_token_ns = r.first_reasoning_ns = 100_000_000
        r.first_answer_ns = 300_000_000
        r.end_ns = 400_000_000
        r.output_valid = i % 10 != 0  # one answer in ten invalid
        worker.observe(r)
    group = GroupStats()
    group.merge_wire(worker.to_wire(("step", 0)))
    assert group.valid_share == pytest.approx(0.9)
    slo = parse_slo("ttfo_p99=0.5,ttfr_p50=0.2,valid_share=0.95")
    passed, failures, values = judge(slo, group)
    assert values["ttfo_p99_s"] == pytest.approx(0.3, rel=0.02)
    assert values["ttfr_p50_s"] == pytest.approx(0.1, rel=0.02)
    assert failures == ["valid_share 0.9 < 0.95"] and not passed
    assert judge(parse_slo("valid_share=0.9"), group)[0]
    assert judge(parse_slo("valid_share=0.9"), stats(0.1))[1] == ["valid_share missing (no data)"]


def drive(search: CapacitySearch, capacity: float) -> list[float]:
    """Run the search against a server that meets the SLO up to `capacity`."""
    levels = [search.first()]
    index = 0
    while True:
        ttft = 0.1 if levels[-1] <= capacity else 2.0
        nxt = search.next_level(index, stats(ttft), 200)
        if nxt is None:
            return levels
        levels.append(nxt)
        index += 1


def test_judge_reads_the_live_sketches() -> None:
    slo = parse_slo("ttft_p99=0.5,error_rate=0.1")
    passed, failures, values = judge(slo, stats(0.2, n=95, errors=5))
    assert passed and failures == []
    assert values["ttft_p99_s"] == pytest.approx(0.2, rel=0.02)
    assert values["error_rate"] == pytest.approx(0.05)
    passed, failures, _ = judge(slo, stats(0.7, n=80, errors=20))
    assert not passed and len(failures) == 2 and failures[0].startswith("ttft_p99 0.7")
    passed, failures, _ = judge(slo, None)
    assert not passed and "no data" in failures[0]


def test_concurrency_search_bisects_to_the_capacity() -> None:
    search = CapacitySearch((1, 2, 4, 8, 16), "concurrency", "ttft_p99=0.5", 0.05, 100)
    levels = drive(search, capacity=11)
    assert levels[:5] == [1, 2, 4, 8, 16]
    assert levels[5:] == [12, 10, 11]  # 8 pass, 16 fail: 12 F, 10 P, 11 P -> gap 1
    doc = search.to_dict()
    assert doc is not None
    assert doc["status"] == "found" and doc["result"] == {"level": 11, "step": 7}
    assert [p["phase"] for p in doc["probes"]] == ["coarse"] * 5 + ["bisect"] * 3
    assert [p["passed"] for p in doc["probes"]] == [True] * 4 + [False, False, True, True]


def test_rate_search_stops_at_the_precision() -> None:
    search = CapacitySearch((5.0, 10.0, 20.0, 40.0), "rate", "ttft_p99=0.5", 0.05, 100)
    drive(search, capacity=27.3)
    doc = search.to_dict()
    assert doc is not None and doc["status"] == "found"
    low = doc["result"]["level"]
    failing = min(p["level"] for p in doc["probes"] if not p["passed"])
    assert low <= 27.3 < failing and failing - low <= 0.05 * low


def test_lowest_level_failing_ends_the_search() -> None:
    search = CapacitySearch((2.0, 4.0), "rate", "ttft_p99=0.5", 0.05, 100)
    assert drive(search, capacity=1.0) == [2.0]
    doc = search.to_dict()
    assert doc is not None and doc["status"] == "lowest_failed" and doc["result"] is None


def test_every_level_passing_says_the_capacity_is_above() -> None:
    search = CapacitySearch((2.0, 4.0), "rate", "ttft_p99=0.5", 0.05, 100)
    assert drive(search, capacity=100.0) == [2.0, 4.0]
    doc = search.to_dict()
    assert doc is not None and doc["status"] == "all_passed" and doc["result"]["level"] == 4.0


def test_bisection_is_bounded() -> None:
    search = CapacitySearch((1.0, 1000.0), "rate", "ttft_p99=0.5", 1e-9, 100)
    levels = drive(search, capacity=1.0000001)
    assert len(levels) == 2 + MAX_BISECTIONS and search.status == "found"


def test_few_requests_are_flagged() -> None:
    search = CapacitySearch((1.0, 2.0), "rate", "ttft_p99=0.5", 0.05, 100)
    search.first()
    search.next_level(0, stats(0.1, n=10), 10)
    assert search.probes[0]["few_requests"] is True


# -- the staircase ------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr("locustfiles.master.staircase.time", SimpleNamespace(time_ns=c))
    return c


def test_rate_steps_announce_a_future_start_and_one_user_per_worker(clock: Clock) -> None:
    announced: list[tuple[Any, ...]] = []
    staircase = Staircase(
        (1,), 10.0, 2.0, 0, announce=lambda *a: announced.append(a), finished_requests=lambda: 0,
        plan=FixedLevels((5.0, 10.0)), mode="rate",
        open_loop={"arrival": "gamma:2", "max_concurrency": 8, "over_cap": "drop"},
        workers=lambda: 3,
    )  # fmt: skip
    assert staircase.tick() == (3, 100.0)
    lead = int(RATE_LEAD_S * 1e9)
    (step, concurrency, cold, started, entry) = announced[0]
    assert (step, concurrency, cold, started) == (0, 8, False, clock.now + lead)
    assert entry["rate"] == 5.0 and entry["arrival"] == "gamma:2" and entry["over_cap"] == "drop"
    assert entry["spawned_at_ns"] == entry["started_at_ns"] == clock.now + lead
    clock.now += lead + 10 * 10**9
    staircase.tick()
    first, second = staircase.timeline
    assert second["rate"] == 10.0 and second["started_at_ns"] == clock.now + lead
    assert first["ended_at_ns"] == second["started_at_ns"]  # no gap between the schedules
    clock.now += lead + 10 * 10**9
    assert staircase.tick() is not None and not staircase.done  # its requests in flight end
    assert staircase.tick() is None and staircase.completed  # (none here)


def test_a_search_step_waits_for_its_requests(clock: Clock) -> None:
    finished = {"n": 0}
    search = CapacitySearch((4.0, 8.0), "rate", "ttft_p99=0.5", 0.05, 100)
    staircase = Staircase(
        (1,), 10.0, 2.0, 0, announce=lambda *a: None, finished_requests=lambda: 0,
        plan=search, mode="rate", workers=lambda: 1,
        step_stats=lambda step: (stats(0.1, n=max(finished["n"], 1)), finished["n"]),
    )  # fmt: skip
    staircase.tick()
    clock.now += int(RATE_LEAD_S * 1e9) + 10 * 10**9
    staircase.tick()
    assert staircase.index == 0  # 0 of 100 requests: the step goes on
    finished["n"] = 100
    staircase.tick()
    assert staircase.index == 1 and staircase.level == 8.0
    finished["n"] = 3
    clock.now += int(RATE_LEAD_S * 1e9) + 40 * 10**9  # 4x the duration: judged anyway
    staircase.tick()  # the last level: its requests in flight end (none here)
    assert staircase.tick() is None
    assert search.status == "all_passed" and search.probes[1]["few_requests"] is True


def test_concurrency_levels_are_whole_users_in_the_manifest() -> None:
    search = CapacitySearch((1, 2), "concurrency", "ttft_p99=0.5", 0.05, 100)
    drive(search, capacity=5)
    doc = search.to_dict()
    assert doc is not None
    assert [type(p["level"]) for p in doc["probes"]] == [int, int]


def test_a_failed_rate_level_drains_before_the_next(clock: Clock) -> None:
    """Over capacity, an open-loop level leaves a queue: the next level waits for it."""
    in_flight: dict[str, int | None] = {"n": 50}
    paused: list[int] = []
    search = CapacitySearch((10.0, 20.0), "rate", "ttft_p99=0.5", 0.05, 1)
    ttft = {"s": 0.1}
    staircase = Staircase(
        (1,), 10.0, 2.0, 0, announce=lambda *a: None, finished_requests=lambda: 0,
        plan=search, mode="rate", workers=lambda: 2,
        step_stats=lambda step: (stats(ttft["s"]), 200),
        pause=paused.append, in_flight=lambda: in_flight["n"], drain_timeout_s=60.0,
    )  # fmt: skip
    lead = int(RATE_LEAD_S * 1e9)
    staircase.tick()
    clock.now += lead + 10 * 10**9
    staircase.tick()  # 10/s passed: 20/s follows at once
    assert staircase.level == 20.0 and paused == []
    ttft["s"] = 2.0
    clock.now += lead + 10 * 10**9
    staircase.tick()  # 20/s failed: bisect at 15/s, after the queue drained
    assert paused == [1] and staircase.index == 1
    failed_end = staircase.timeline[1]["ended_at_ns"]
    clock.now += 5 * 10**9
    in_flight["n"] = None  # a worker has not reported yet
    staircase.tick()
    assert staircase.index == 1
    in_flight["n"] = 0
    staircase.tick()
    assert staircase.index == 2 and staircase.level == 15.0
    assert staircase.timeline[1]["ended_at_ns"] == failed_end  # the pause is in no step
    assert staircase.timeline[2]["started_at_ns"] == clock.now + lead


def _one_rate_step_at_its_end(
    clock: Clock, in_flight: dict[str, int | None], paused: list[int]
) -> Staircase:
    """A run of one 10 s rate step (two workers), ticked to the end of that step: the drain
    has begun."""
    staircase = Staircase(
        (1,), 10.0, 0.0, 0, announce=lambda *a: None, finished_requests=lambda: 0,
        plan=FixedLevels((5.0,)), mode="rate", workers=lambda: 2,
        pause=paused.append, in_flight=lambda: in_flight["n"], drain_timeout_s=60.0,
    )  # fmt: skip
    staircase.tick()
    clock.now += int(RATE_LEAD_S * 1e9) + 10 * 10**9
    assert staircase.tick() is not None and not staircase.done
    return staircase


def test_the_last_rate_step_lets_its_requests_in_flight_finish(clock: Clock) -> None:
    """The run's end would cut the requests in flight, the longest ones most often (a trace's
    last rows): the last open-loop step pauses the workers and waits, at most the drain
    bound, before the run ends; the step's window still ends at its duration."""
    in_flight: dict[str, int | None] = {"n": 7}
    paused: list[int] = []
    staircase = _one_rate_step_at_its_end(clock, in_flight, paused)
    assert paused == [0]
    ended = staircase.timeline[0]["ended_at_ns"]
    assert ended == clock.now
    clock.now += 3 * 10**9
    in_flight["n"] = None  # a worker has not said yet
    assert staircase.tick() is not None and not staircase.done
    in_flight["n"] = 0
    assert staircase.tick() is None and staircase.completed
    staircase.stop()
    assert staircase.timeline[0]["ended_at_ns"] == ended  # the drain is in no step
    # requests that never end: the run ends after the bound, saying so
    in_flight["n"] = 3
    staircase = _one_rate_step_at_its_end(clock, in_flight, paused)
    clock.now += 59 * 10**9
    assert staircase.tick() is not None
    clock.now += 2 * 10**9
    assert staircase.tick() is None and staircase.completed
    # stopped while draining (a signal): the step keeps the end it had
    staircase = _one_rate_step_at_its_end(clock, in_flight, paused)
    ended = staircase.timeline[0]["ended_at_ns"]
    clock.now += 5 * 10**9
    staircase.stop()
    assert staircase.done and staircase.timeline[0]["ended_at_ns"] == ended


def test_the_last_concurrency_step_lets_its_requests_in_flight_finish(clock: Clock) -> None:
    """Closed loop too: the run's end cut the last step's requests in flight (`aborted`, the
    longest ones), which biased its E2E tail low. Its users now start nothing new (paused)
    and the run ends once their requests have ended, at most the drain bound."""
    in_flight: dict[str, int | None] = {"n": 4}
    paused: list[int] = []
    staircase = Staircase(
        (2, 4), 10.0, 0.0, 0, announce=lambda *a: None, finished_requests=lambda: 0,
        pause=paused.append, in_flight=lambda: in_flight["n"], drain_timeout_s=60.0,
    )  # fmt: skip
    staircase.tick()
    staircase.on_spawned(2)
    clock.now += 10 * 10**9 + 1
    staircase.tick()  # step 0 ended: step 1 at once, no pause between closed-loop steps
    assert staircase.index == 1 and paused == []
    staircase.on_spawned(4)
    clock.now += 10 * 10**9 + 1
    users = staircase.tick()
    assert users is not None and users[0] == 4  # the users stay, paused
    assert paused == [1] and not staircase.done
    ended = staircase.timeline[1]["ended_at_ns"]
    clock.now += 2 * 10**9
    in_flight["n"] = 0
    assert staircase.tick() is None and staircase.completed
    assert staircase.timeline[1]["ended_at_ns"] == ended  # the drain is in no step
