"""Open-loop (rate) steps and the capacity search in the report, from a hand-made run.

Three rate steps, every value below computed by hand (nearest-rank percentiles: with n
samples the p-th percentile is the ceil(p*n)-th smallest):

- step 0, 5 requests/s, no cap, window [1, 3] s (warmup 1 s): one arrival in the warmup,
  ten in the window sent late by 2, 4, ..., 20 ms;
- step 1, 6 requests/s, cap 2 with --over-cap drop, window [3, 5] s: twelve arrivals, four
  of them dropped, the rest sent 0.5 ms late;
- step 2, 8 requests/s, cap 1 with --over-cap wait, window [5, 7] s: sixteen arrivals, the
  k-th waited max(0, k - 3) x 100 ms for a slot and was sent 1 ms after that; ten were sent
  inside the window (k = 0..9), six of those after a wait; its TTFT is 0.2 s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis import build_report, compare_runs, load_run, summarize_run
from analysis.report.summary import Report
from tests.support.runs import T0_NS, RunBuilder, known_run, ns

SEARCH_SLO = "ttft_p99=0.1,ttft=0.1"
FAST = [(0.05, 1), (0.1, 1)]  # TTFT 50 ms, end 120 ms
SLOW = [(0.2, 1), (0.25, 1)]  # TTFT 200 ms


def rate_run(run_id: str = "rates", *, search: dict[str, Any] | None = None) -> RunBuilder:
    b = RunBuilder(run_id)
    b.add_rate_step(0, 5.0, started_s=0, ended_s=3, warmup_s=1)
    b.add_rate_step(1, 6.0, started_s=3, ended_s=5, max_concurrency=2, over_cap="drop")
    b.add_rate_step(2, 8.0, started_s=5, ended_s=7, max_concurrency=1, over_cap="wait")
    b.add_arrival(step=0, rate=5.0, index=0, intended_s=0.5, slip_s=0.001, chunks=FAST, end_s=0.12)
    for k in range(10):
        b.add_arrival(step=0, rate=5.0, index=k + 1, intended_s=1.1 + 0.2 * k,
                      slip_s=0.002 * (k + 1), chunks=FAST, end_s=0.12)  # fmt: skip
    for k in range(12):
        b.add_arrival(step=1, rate=6.0, index=k, intended_s=3 + (k + 0.5) / 6, slip_s=0.0005,
                      max_concurrency=2, dropped=k in (1, 4, 7, 10), chunks=FAST, end_s=0.12)  # fmt: skip
    for k in range(16):
        b.add_arrival(step=2, rate=8.0, index=k, intended_s=5.0625 + 0.125 * k,
                      queued_s=0.1 * max(0, k - 3), slip_s=0.001, max_concurrency=1,
                      chunks=SLOW, end_s=0.27)  # fmt: skip
    b.manifest_extra["config"] = {"rates": [5.0, 6.0, 8.0], "slo": SEARCH_SLO}
    if search is not None:
        b.manifest_extra["search"] = search
    return b


def probe(step: int, level: float, passed: bool, phase: str = "coarse") -> dict[str, Any]:
    failures = [] if passed else ["ttft_p99 0.2 > 0.1"]
    return {"step": step, "level": level, "phase": phase, "passed": passed, "requests": 10,
            "few_requests": False, "failures": failures, "values": {"ttft_p99_s": 0.05}}  # fmt: skip


def search_block(**changes: Any) -> dict[str, Any]:
    block = {
        "mode": "rate", "slo": SEARCH_SLO, "precision": 0.05, "min_requests": 10,
        "status": "found",
        # step 1 judged FAIL live (its sketch saw the warmup), the events say pass
        "probes": [probe(0, 5.0, True), probe(1, 6.0, False), probe(2, 8.0, False, "bisect")],
        "result": {"level": 5.0, "step": 0},
    }  # fmt: skip
    block.update(changes)
    return block


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    root = tmp_path_factory.mktemp("rates")
    uri = rate_run(search=search_block()).write(root / "events")
    return build_report(uri, root / "out", progress=False)


def steps(report: Report) -> list[dict[str, Any]]:
    return report.step_rows


def test_rate_steps_are_open_loop_rows(report: Report) -> None:
    s0, s1, s2 = steps(report)
    assert [r["mode"] for r in (s0, s1, s2)] == ["rate"] * 3
    assert [r["rate"] for r in (s0, s1, s2)] == [5.0, 6.0, 8.0]
    assert [r["concurrency"] for r in (s0, s1, s2)] == [0, 2, 1]  # the cap
    assert s0["window_start_ns"] == T0_NS + ns(1.0) and s0["window_s"] == pytest.approx(2.0)


def test_slip_percentiles_and_achieved_rate(report: Report) -> None:
    s0 = steps(report)[0]
    # slips 2, 4, ..., 20 ms: p50 is the 5th (10 ms), p99 the 10th (20 ms)
    assert s0["slip_p50_ms"] == pytest.approx(10.0, abs=1e-9)
    assert s0["slip_p99_ms"] == pytest.approx(20.0, abs=1e-9)
    assert s0["slip_max_ms"] == pytest.approx(20.0, abs=1e-9)
    assert s0["rate_achieved"] == pytest.approx(10 / 2)  # the warmup arrival is not counted
    assert s0["requests_total"] == 11 and s0["requests"] == 10
    assert s0["requests_queued"] == 0 and s0["queued_p99_ms"] == 0.0
    assert s0["requests_dropped"] == 0


def test_dropped_arrivals_are_counted_apart(report: Report) -> None:
    s1 = steps(report)[1]
    assert s1["requests_dropped"] == 4
    # the dropped never count as requests: 8 sent, all ok, no error rate from drops
    assert (s1["requests_total"], s1["requests"], s1["ok"], s1["failed"]) == (8, 8, 8, 0)
    assert s1["error_rate"] == 0.0
    assert s1["rate_achieved"] == pytest.approx(8 / 2)
    assert s1["slip_p50_ms"] == pytest.approx(0.5) and s1["slip_max_ms"] == pytest.approx(0.5)
    assert s1["ttft_p99_s"] == pytest.approx(0.05)
    assert sum(r["errors_other"] for r in steps(report)) == 0


def test_cap_waits_are_not_slip(report: Report) -> None:
    s2 = steps(report)[2]
    # sent inside [5, 7]: k = 0..9; waits 0, 0, 0, 0, 100, ..., 600 ms
    assert (s2["requests_total"], s2["requests"]) == (16, 10)
    assert s2["requests_queued"] == 6
    assert s2["queued_p99_ms"] == pytest.approx(600.0)
    assert s2["slip_p50_ms"] == pytest.approx(1.0) and s2["slip_max_ms"] == pytest.approx(1.0)
    assert s2["rate_achieved"] == pytest.approx(5.0)


def test_open_loop_warnings_name_their_cause(report: Report) -> None:
    slip = [w for w in report.warnings if "send slip p99" in w]
    assert slip == [
        "step 0 (rate 5/s): send slip p99 20 ms > 10 ms: the load generator, not the server, "
        "limited the arrival schedule; add workers or lower the rate"
    ]
    short = {w.split(":", 1)[0]: w for w in report.warnings if "under the intended rate" in w}
    assert set(short) == {"step 1 (rate 6/s)", "step 2 (rate 8/s)"}
    assert "achieved 4 requests/s, 33.3% under" in short["step 1 (rate 6/s)"]
    assert "4 arrival(s) were dropped at the concurrency cap" in short["step 1 (rate 6/s)"]
    assert "6 request(s) waited for a cap slot (queued p99 600 ms" in short["step 2 (rate 8/s)"]
    assert "dropped" not in short["step 2 (rate 8/s)"]


def test_per_request_table_has_the_schedule(report: Report) -> None:
    per = pd.read_parquet(report.files["requests.parquet"])
    csv = pd.read_csv(report.files["requests.csv"])
    assert len(per) == len(csv) == 11 + 12 + 16
    for column in ("rate", "arrival_index", "intended_ns", "queued_ns", "slip_ms"):
        assert column in per.columns and column in csv.columns
    first = per[(per["step"] == 0) & (per["arrival_index"] == 1)].iloc[0]
    assert first["intended_ns"] == T0_NS + ns(1.1)  # exact: no float detour
    assert first["slip_ms"] == pytest.approx(2.0, abs=1e-9)
    dropped = per[per["status"] == "dropped"]
    assert len(dropped) == 4 and dropped["slip_ms"].isna().all()
    assert dropped["steady"].all() and dropped["ttft_s"].isna().all()
    waited = per[(per["step"] == 2) & (per["arrival_index"] == 9)].iloc[0]
    assert waited["queued_ns"] == ns(0.6) and waited["slip_ms"] == pytest.approx(1.0)


def test_best_rate_under_the_runs_own_slo(report: Report) -> None:
    # no --slo given: the run's own (manifest config `slo`) judges the steps
    assert report.slo_source == "run" and report.slo.spec == SEARCH_SLO
    assert [r["slo_pass"] for r in steps(report)] == [True, True, False]
    assert report.best_rate == 6.0
    assert report.best_concurrency is None  # a rate step's concurrency is its cap
    md = report.files["report.md"].read_text()
    assert f"SLO: `{SEARCH_SLO}` (the run's own, from its manifest" in md
    assert "highest rate meeting the SLO: 6.0 requests/s" in md


def test_search_block_with_exact_verdicts(report: Report) -> None:
    doc = json.loads(report.files["summary.json"].read_text())
    assert doc["slo"]["best_rate"] == 6.0 and doc["slo"]["source"] == "run"
    search = doc["search"]
    assert (search["mode"], search["status"], search["slo"]) == ("rate", "found", SEARCH_SLO)
    probes = search["probes"]
    assert [p["passed"] for p in probes] == [True, False, False]  # live, as recorded
    assert [p["passed_exact"] for p in probes] == [True, True, False]
    assert probes[2]["failures_exact"] == ["ttft_p99 0.2 > 0.1"]
    assert probes[0]["values"] == {"ttft_p99_s": 0.05}  # live, as recorded
    # step 0: good requests that ended inside [1, 3] s: k = 0..8 (k = 9 ends at 3.04 s)
    assert search["result"]["level"] == 5.0 and search["result"]["step"] == 0
    assert search["result"]["goodput_requests_per_s"] == pytest.approx(9 / 2)
    assert search["result"]["requests_per_s"] == pytest.approx(9 / 2)
    assert search["result_exact"] == {"level": 6.0, "step": 1}


def test_live_and_exact_disagreement_is_a_warning(report: Report) -> None:
    differ = [w for w in report.warnings if w.startswith("capacity search, step")]
    assert differ == [
        "capacity search, step 1 (6.0 requests/s): the search judged it FAIL (ttft_p99 0.2 > "
        "0.1) on live statistics, the events say pass: the search judged on live sketches (1% "
        "accuracy, warmup included), the report on the exact steady window; the search's "
        "result may be one level off"
    ]


def test_report_md_and_html_show_the_search(report: Report) -> None:
    md = report.files["report.md"].read_text()
    section = md.split("## Capacity search", 1)[1].split("\n## ", 1)[0]
    assert (
        "- highest rate meeting the SLO: 5.0 requests/s (step 0), goodput 4.50 requests/s"
        in section
    )
    assert "| order | step | level | phase | live verdict | exact verdict | requests |" in section
    assert "| 2 | 1 | 6.0 requests/s | coarse | FAIL (ttft_p99 0.2 > 0.1) | pass | 10 |" in section
    assert "differ in step(s) 1" in section
    assert (
        "- by the exact verdicts, the highest level meeting the SLO is 6.0 requests/s (step 1)"
        in section
    )
    html = report.files["report.html"].read_text()
    assert 'id="capacity-search"' in html and "highest rate meeting the SLO: 5.0" in html
    # rate runs plot against the rate; the concurrency plots would only show the cap
    assert 'id="plot-latency-rate"' in html and 'id="plot-goodput-rate"' in html
    assert 'id="plot-latency"' not in html and 'id="plot-throughput"' not in html


def test_step_table_shows_the_rates(report: Report) -> None:
    md = report.files["report.md"].read_text()
    steps_md = md.split("## Steps", 1)[1]
    assert (
        "| step | rate req/s | achieved req/s | slip p99 ms | queued | dropped | "
        "max concurrency | requests |" in steps_md
    )
    assert "| 0 | 5 | 5 | 20.00 | 0 | 0 | none | 10 |" in steps_md
    assert "| 1 | 6 | 4 | 0.50 | 0 | 4 | 2 | 8 |" in steps_md


def test_a_different_slo_leaves_the_search_judged_by_its_own(
    events_dir: Path, tmp_path: Path
) -> None:
    uri = rate_run("other-slo", search=search_block()).write(events_dir)
    report = build_report(uri, tmp_path / "out", slo="ttft_p99=1", progress=False, html=False)
    assert report.slo_source == "option"
    assert [r["slo_pass"] for r in report.step_rows] == [True, True, True]
    assert report.best_rate == 8.0
    assert report.step_rows[0]["goodput_requests_per_s"] is None or math.isnan(
        report.step_rows[0]["goodput_requests_per_s"]
    )
    assert report.search is not None
    assert [p.passed_exact for p in report.search.probes] == [True, True, False]
    assert report.search.result is not None
    # goodput under the search's thresholds (ttft <= 0.1), not the report's (none)
    assert report.search.result.goodput_requests_per_s == pytest.approx(4.5)
    md = report.files["report.md"].read_text()
    assert "the run's own" not in md


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"status": "lowest_failed", "result": None,
          "probes": [probe(0, 5.0, False)]},
         "even the lowest level (5.0 requests/s) missed the SLO"),
        # step 2's TTFT misses ttft=0.1; step 1's last request (good) ends at 5.04 s inside it
        ({"status": "all_passed", "result": {"level": 8.0, "step": 2}},
         "every level passed: capacity is above 8.0 requests/s (step 2), goodput 0.50 "
         "requests/s"),
    ],
)  # fmt: skip
def test_search_outcomes_read_as_sentences(
    events_dir: Path, tmp_path: Path, changes: dict[str, Any], line: str
) -> None:
    uri = rate_run("outcome", search=search_block(**changes)).write(events_dir)
    report = build_report(uri, tmp_path / "out", progress=False, html=False)
    assert f"- {line}" in report.files["report.md"].read_text()


def test_no_search_no_section(events_dir: Path, tmp_path: Path) -> None:
    uri = rate_run("plain").write(events_dir)
    report = build_report(uri, tmp_path / "out", progress=False, html=False)
    assert report.search is None
    assert json.loads(report.files["summary.json"].read_text())["search"] is None
    assert "## Capacity search" not in report.files["report.md"].read_text()


def test_a_schema_1_1_run_still_reports(events_dir: Path, tmp_path: Path) -> None:
    uri = known_run("old").write(events_dir, schema_version="1.1")
    run = load_run(uri, progress=False)
    for column in ("rate", "arrival_index", "intended_ns", "queued_ns"):
        assert run.requests[column].isna().all(), column
    report = summarize_run(run)
    assert [r["mode"] for r in report.step_rows] == ["concurrency"] * 3
    assert all(math.isnan(r["slip_p99_ms"]) for r in report.step_rows)
    assert all(r["requests_dropped"] is None for r in report.step_rows)
    assert report.step_rows[0]["requests"] == 5  # as in the 1.2 known run
    assert report.per_request["slip_ms"].isna().all()
    assert not any("slip" in w or "intended rate" in w for w in report.warnings)


def test_dropped_arrivals_are_never_in_flight(report: Report) -> None:
    bins = report.table.timeline_bins()  # the timeline plot's
    assert bins.sent == 11 + 8 + 16  # the 4 dropped arrivals are not drawn
    assert bins.in_flight.min() >= 0 and bins.in_flight[-1] == 0  # every sent one ended


def test_compare_pairs_rate_runs_by_rate(events_dir: Path, tmp_path: Path) -> None:
    base = rate_run("base").write(events_dir)
    other = rate_run("other")
    other.manifest_extra["config"] = {"slo": "ttft_p99=0.3"}
    result = compare_runs(base, other.write(events_dir))
    assert {c.step for c in result.changes} == {"r=5", "r=6", "r=8"}
    assert {c.rate for c in result.changes} == {5.0, 6.0, 8.0}
    assert result.unmatched == [] and result.regressions == []
    # each run judged by its own SLO: goodput differs in meaning, and the comparison says so
    assert any("different SLOs" in w for w in result.warnings)
    closed = compare_runs(base, known_run("closed").write(events_dir))
    assert closed.changes == [] and "A is a rate run and B a concurrency run" in closed.warnings[0]
