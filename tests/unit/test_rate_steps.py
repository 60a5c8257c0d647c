"""Open-loop pieces in isolation: slip, rate steps in the timeline, search sentences, compare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.compare.runs import compare_summaries, write_comparison
from analysis.derive.openloop import slip_and_queue_ms
from analysis.derive.windows import plan_steps
from analysis.judge.search import Probe, SearchResult, SearchSummary, result_line

T0 = 1_700_000_000_000_000_000


def frame(**columns: object) -> pd.DataFrame:
    return pd.DataFrame(columns)


def test_slip_is_send_minus_intended_minus_queue_in_exact_ns() -> None:
    intended = [T0 + 1, T0 + 1_000_000_001, T0, T0, T0 + 7]
    requests = frame(
        sent_at_ns=np.array([T0 + 2_500_001, T0 + 1_300_000_001, T0 + 5, T0 + 9, T0 + 8]),
        intended_ns=pd.array(intended[:3] + [None, T0 + 7], dtype="Int64"),
        queued_ns=pd.array([0, 300_000_000, 0, None, 0], dtype="Int64"),
    )
    dropped = np.array([False, False, False, False, True])
    slip, queued = slip_and_queue_ms(requests, dropped)
    # 2.5 ms late; 300 ms in the queue then on time; 5 ns late (a float would lose it)
    assert slip[0] == 2.5 and slip[1] == 0.0 and slip[2] == pytest.approx(5e-6, rel=1e-9)
    assert np.isnan(slip[3])  # no schedule (a concurrency step): missing, never 0
    assert np.isnan(slip[4]) and np.isnan(queued[4])  # dropped: never sent
    assert queued[:3].tolist() == [0.0, 300.0, 0.0] and np.isnan(queued[3])


def test_a_run_without_schedule_columns_has_no_slip() -> None:
    requests = frame(sent_at_ns=np.array([T0, T0 + 1]))
    slip, queued = slip_and_queue_ms(requests, np.zeros(2, bool))
    assert np.isnan(slip).all() and np.isnan(queued).all()


def requests_of(steps: list[int], rates: list[float | None]) -> pd.DataFrame:
    n = len(steps)
    return frame(
        step=steps, cold=[False] * n, concurrency=[0] * n, worker_id=["w"] * n,
        sent_at_ns=np.arange(n, dtype=np.int64) + T0,
        rate=pd.array(rates, dtype="Float64"),
    )  # fmt: skip


def test_steps_without_a_rate_are_concurrency_steps() -> None:
    manifest = {
        "steps": [
            {"step": 0, "concurrency": 4, "started_at_ns": T0, "spawned_at_ns": T0 + 5,
             "ended_at_ns": T0 + 100, "warmup_s": 0.0},  # a 1.1 manifest: no `rate` key
            {"step": 1, "concurrency": 0, "started_at_ns": T0 + 100, "spawned_at_ns": T0 + 100,
             "ended_at_ns": T0 + 200, "warmup_s": 0.0, "rate": 12.5, "arrival": "poisson",
             "max_concurrency": 0, "over_cap": "wait", "share_workers": ["w"]},
        ]
    }  # fmt: skip
    requests = requests_of([0, 1, 2], [None, 12.5, 3.0])
    plans, _ = plan_steps(manifest, requests, np.full(3, -1))
    assert [(p.step, p.mode, p.rate) for p in plans] == [
        (0, "concurrency", None),
        (1, "rate", 12.5),
        (2, "rate", 3.0),  # not in the manifest: its requests' rate
    ]
    assert plans[1].window is not None and plans[1].window.start_ns == T0 + 100


def summary(status: str, result: SearchResult | None, mode: str = "rate") -> SearchSummary:
    probe = Probe(1, 0, 2.0, "coarse", False, 120, False, ["ttft_p99 0.6 > 0.5"], False, [])
    return SearchSummary(mode, "ttft_p99=0.5", 0.05, 100, status, [probe], result)


@pytest.mark.parametrize(
    ("search", "line"),
    [
        (summary("found", SearchResult(38.0, 5, 36.5, 30.25)),
         "highest rate meeting the SLO: 38.0 requests/s (step 5), goodput 30.25 requests/s"),
        (summary("found", SearchResult(8, 3, 2.5, None), "concurrency"),
         "highest concurrency meeting the SLO: 8 users (step 3), 2.50 requests/s completed "
         "(no per-request thresholds: no goodput)"),
        (summary("lowest_failed", None),
         "even the lowest level (2.0 requests/s) missed the SLO"),
        (summary("all_passed", SearchResult(64.0, 6, 60.0, None)),
         "every level passed: capacity is above 64.0 requests/s (step 6), 60.00 requests/s "
         "completed (no per-request thresholds: no goodput)"),
        (summary("stopped", None),
         "the search did not finish (stopped) and no level met the SLO so far"),
        (summary("stopped", SearchResult(12.5, 2, None, None)),
         "the search did not finish (stopped); highest rate meeting the SLO so far: 12.5 "
         "requests/s (step 2), no throughput measured"),
    ],
)  # fmt: skip
def test_search_result_lines(search: SearchSummary, line: str) -> None:
    assert result_line(search) == line


def rate_row(rate: float, cap: int = 0, **values: float) -> dict[str, object]:
    return {"group": "step", "step": 0, "concurrency": cap, "mode": "rate", "rate": rate, **values}


def conc_row(conc: int, **values: float) -> dict[str, object]:
    return {"group": "step", "step": 0, "concurrency": conc, "mode": "concurrency",
            "rate": None, **values}  # fmt: skip


def test_rate_runs_pair_steps_by_rate() -> None:
    a = [rate_row(2.0, ttft_p99_s=0.1), rate_row(4.0, 8, ttft_p99_s=0.1),
         rate_row(8.0, ttft_p99_s=0.1)]  # fmt: skip
    b = [rate_row(2.0, ttft_p99_s=0.1), rate_row(4.0, 16, ttft_p99_s=0.2),
         rate_row(16.0, ttft_p99_s=0.1)]  # fmt: skip
    result = compare_summaries(a, b)
    ttft = {c.step: c for c in result.changes if c.metric == "ttft_p99_s"}
    assert set(ttft) == {"r=2", "r=4"}
    assert ttft["r=4"].rate == 4.0 and ttft["r=4"].regression
    assert ttft["r=4"].concurrency == 8  # A's cap
    assert result.unmatched == ["r=8 only in A", "r=16 only in B"]
    assert any("different caps" in w and "r=4 (A 8, B 16)" in w for w in result.warnings)


def test_a_rate_run_and_a_concurrency_run_pair_nothing() -> None:
    result = compare_summaries([rate_row(4.0, ttft_p99_s=0.1)], [conc_row(4, ttft_p99_s=0.1)])
    assert result.changes == []
    assert result.unmatched == ["r=4 only in A", "c=4 only in B"]
    assert result.warnings[0].startswith("A is a rate run and B a concurrency run")


def test_summaries_before_rates_still_pair_by_concurrency(tmp_path: Path) -> None:
    old = [{"group": "step", "step": 0, "concurrency": 4, "ttft_p99_s": 0.1}]  # summary 1.1
    result = compare_summaries(old, [conc_row(4, ttft_p99_s=0.1)])
    assert {c.step for c in result.changes} == {"c=4"} and result.unmatched == []
    files = write_comparison(result, tmp_path)
    csv = pd.read_csv(files["compare.csv"])
    assert list(csv.columns[:4]) == ["step", "concurrency", "rate", "metric"]
    assert csv["rate"].isna().all()
    rated = write_comparison(
        compare_summaries([rate_row(2.5, ttft_p99_s=0.1)], [rate_row(2.5, ttft_p99_s=0.1)]),
        tmp_path / "rated",
    )
    assert set(pd.read_csv(rated["compare.csv"])["rate"]) == {2.5}
