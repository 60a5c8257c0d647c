"""The workers' own health in the report: CPU, loop lag, stalls, per-event token counts.

A hand-made run (tests/support/runs.py) with known worker samples and stalls: every value
below is computed by hand from them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from analysis import build_report
from tests.support.runs import RunBuilder


def health_run() -> RunBuilder:
    b = RunBuilder("health", workers=("w1", "w2", "w3"))
    b.manifest_extra["workers"] = [
        {"worker_id": "w1", "host": "a", "pid": 1, "clock_offset_ms": 0.0, "clock_rtt_ms": 0.2},
        {"worker_id": "w2", "host": "b", "pid": 2, "clock_offset_ms": 250.0, "clock_rtt_ms": 0.4},
        {"worker_id": "w3", "host": "c", "pid": 3, "clock_offset_ms": 0.0, "clock_rtt_ms": 0.2},
    ]
    b.add_step(0, 2, started_s=0, spawned_s=1, ended_s=10, warmup_s=1)  # window [2, 10]
    b.add_step(1, 4, started_s=10, spawned_s=10, ended_s=20, warmup_s=1)  # window [11, 20]
    chunks = [(0.1, 1), (0.2, 1), (0.3, 1)]
    for i in range(6):  # step 0, worker w1; one overlapped a stall of 12 ms
        stall = 12_000_000 if i == 2 else 0
        b.add_request(step=0, concurrency=2, sent_s=2.5 + i, chunks=chunks, worker="w1",
                      worker_stall_ns=stall, coalesced_events=0)  # fmt: skip
    for i in range(6):  # step 1, worker w2 (clock +250 ms): tokens counted per event
        b.add_request(step=1, concurrency=4, sent_s=12.25 + i, chunks=chunks, worker="w2",
                      worker_stall_ns=0, output_tokens_source="events" if i < 4 else "usage")  # fmt: skip
    for second in range(3, 11):  # w1: calm, 40% CPU, lags 0.1 ms with one 0.2 ms probe
        b.add_sample("w1", at_s=second, cpu=40.0 if second != 6 else 55.0,
                     lags_us=[100] * 199 + [200])  # fmt: skip
    b.add_stall("w1", start_s=5.0, length_s=0.012)
    for second in range(12, 21):  # w2 (its clock +250 ms): 95% CPU once, lags of 8 ms
        b.add_sample("w2", at_s=second + 0.25, cpu=95.0 if second == 15 else 60.0,
                     lags_us=[8000] * 10 + [100] * 190)  # fmt: skip
    b.add_stall("w2", start_s=20.1, length_s=0.02)  # worker clock 20.1 = master 19.85
    for second in range(12, 21):  # w3 (cut off from its master, flushing) sent nothing in
        b.add_sample("w3", at_s=second, cpu=99.0, lags_us=[20000] * 200)  # step 1: not its
    return b


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("health")
    uri = health_run().write(root / "events")
    return build_report(uri, root / "out", progress=False)


def test_step_columns_from_the_workers_own_samples(report) -> None:  # type: ignore[no-untyped-def]
    step0, step1 = report.table.rows
    assert step0["worker_cpu_max_pct"] == 55.0
    # 8 samples x 200 probes, 8 of them (0.5%) at 0.2 ms: the p99 is 0.1 ms
    assert step0["loop_lag_p99_ms"] == pytest.approx(0.1)
    assert step0["worker_stalls"] == 1 and step0["requests_worker_stalled"] == 1
    assert step1["worker_cpu_max_pct"] == 95.0
    assert step1["loop_lag_p99_ms"] == pytest.approx(8.0)  # 5% of probes at 8 ms
    assert step1["loop_lag_p90_ms"] == pytest.approx(0.1)  # ... not a tenth of them
    # the stall at worker time 20.1 s is 19.85 s on the master's clock: inside step 1
    assert step1["worker_stalls"] == 1 and step1["requests_worker_stalled"] == 0
    assert step0["output_tokens_source"] == "usage" and step0["requests_per_event_tokens"] == 0
    assert step1["output_tokens_source"] == "events" and step1["requests_per_event_tokens"] == 4
    # step 0's requests recorded 0 coalesced events of 3 each; step 1's recorded nothing
    assert step0["coalesced_events_pct"] == 0.0 and math.isnan(step1["coalesced_events_pct"])


def test_saturated_worker_and_per_event_counts_are_warned(report) -> None:  # type: ignore[no-untyped-def]
    saturated = [w for w in report.warnings if "saturated" in w]
    assert len(saturated) == 1, report.warnings
    assert saturated[0].startswith("step 1: worker w2 was saturated (CPU max 95%")
    # the stall moved no percentile: a note (analysis/judge/verdict.py), not a warning
    assert any(
        n.startswith("step 0: 1 request(s) (16.7%) overlapped a stall") for n in report.notes
    )
    assert any("per event (inter-chunk)" in w and w.startswith("step 1") for w in report.warnings)
    markdown = report.files["report.md"].read_text()
    html = report.files["report.html"].read_text()
    for text in (markdown, html):
        assert "worker w2 was saturated" in text
        assert "per event (inter-chunk)" in text


def test_request_rows_carry_the_flags(report) -> None:  # type: ignore[no-untyped-def]
    per = report.per_request.set_index("request_id")
    assert per["worker_stall_ns"].tolist().count(12_000_000) == 1
    assert set(per["output_tokens_source"]) == {"usage", "events"}


def test_a_run_without_samples_has_missing_health_not_zero(tmp_path: Path) -> None:
    b = RunBuilder("old")
    b.add_step(0, 1, started_s=0, spawned_s=0, ended_s=10)
    b.add_request(sent_s=1.0, chunks=[(0.1, 1), (0.2, 1)])
    out = build_report(b.write(tmp_path / "events"), tmp_path / "out", progress=False)
    row = out.table.rows[0]
    assert math.isnan(row["worker_cpu_max_pct"]) and math.isnan(row["loop_lag_p99_ms"])
    assert row["requests_worker_stalled"] is None
    assert not [w for w in out.warnings if "saturated" in w]
