"""The report of a run with sessions and tool rounds (schema 1.3), hand-computed.

The run is tests/support/runs.py `session_run`: five sessions start in step 0 (one complete
with a tool round, one failed, three cut), one in step 1. Nearest-rank percentiles.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis import build_report
from analysis.derive.sessions import SESSION_COLUMNS, STEP_SESSION_COLUMNS, TURN_COLUMNS
from analysis.report.summary import Report
from tests.support.runs import RunBuilder, known_run, ns, session_run

STEP0_SESSIONS = {
    "sessions": 5, "sessions_complete": 1, "sessions_error": 1, "sessions_cut": 3,
    # over the complete session only: s-complete
    "session_turns_mean": 3.0, "session_e2e_p50_s": 3.3, "session_e2e_p99_s": 3.3,
    "tool_wait_s_mean": 0.5, "think_s_mean": 2.0,
    # successful requests reporting both: 100+140+200+100+100+100 prompt, 0+96+128 cached
    "cached_tokens_pct": 100 * 224 / 740,
}  # fmt: skip
STEP1_SESSIONS = {
    "sessions": 1, "sessions_complete": 1, "sessions_error": 0, "sessions_cut": 0,
    "session_turns_mean": 1.0, "session_e2e_p50_s": 0.3, "session_e2e_p99_s": 0.3,
    "tool_wait_s_mean": 0.0, "think_s_mean": 0.0, "cached_tokens_pct": 64.0,
}  # fmt: skip
TURNS = [
    # TTFT 0.2 (tool call), 0.3, 0.1, 0.4, 0.2 (tool call), 0.25; s-missing reported no cache
    {"turn": 0, "requests": 6, "ttft_p50_s": 0.2, "ttft_p99_s": 0.4, "prompt_tokens_mean": 100.0,
     "cached_tokens_mean": 64 / 5, "cache_hit_pct": 100 * 64 / 500},
    # the tool_result turn (ok), s-error's failure, s-cut's aborted turn
    {"turn": 1, "requests": 3, "ttft_p50_s": 0.1, "ttft_p99_s": 0.1, "prompt_tokens_mean": 140.0,
     "cached_tokens_mean": 96.0, "cache_hit_pct": 100 * 96 / 140},
    {"turn": 2, "requests": 1, "ttft_p50_s": 0.05, "ttft_p99_s": 0.05,
     "prompt_tokens_mean": 200.0, "cached_tokens_mean": 128.0, "cache_hit_pct": 64.0},
]  # fmt: skip


def assert_close(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, want in expected.items():
        got = actual[key]
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (key, got, want)
        else:
            assert got == want, (key, got, want)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    root = tmp_path_factory.mktemp("sessions")
    uri = session_run().write(root / "events", parts_per_worker=2)
    return build_report(uri, root / "out", progress=False)


def test_per_step_session_columns(report: Report) -> None:
    step0, step1 = report.step_rows
    assert step0["requests"] == 9 and step0["rate_achieved"] == pytest.approx(5 / 20)
    assert_close(step0, STEP0_SESSIONS)
    assert_close(step1, STEP1_SESSIONS)
    summary = pd.read_csv(report.files["summary.csv"])
    assert summary["sessions"].tolist() == [5, 1]
    assert summary["sessions_cut"].tolist() == [3, 0]


def test_sessions_files(report: Report) -> None:
    csv = pd.read_csv(report.files["sessions.csv"])
    parquet = pd.read_parquet(report.files["sessions.parquet"])
    assert list(csv.columns) == list(parquet.columns) == list(SESSION_COLUMNS)
    assert csv["session_id"].tolist() == [
        "s-complete", "s-error", "s-cut", "s-missing", "s-no-result", "s-late",
    ]  # fmt: skip
    assert csv["status"].tolist() == ["complete", "error", "cut", "cut", "cut", "complete"]
    assert csv["step"].tolist() == [0, 0, 0, 0, 0, 1]
    assert csv["turns"].tolist() == [3, 2, 2, 1, 1, 1]
    assert csv["tool_rounds"].tolist() == [1, 0, 0, 0, 0, 0]
    assert csv["model_s"].tolist() == pytest.approx([0.8, 0.45, 0.4, 0.5, 0.3, 0.3])
    assert pd.isna(csv.loc[3, "cached_tokens"])  # s-missing: never reported, not 0
    assert pd.api.types.is_integer_dtype(parquet["planned_turns"])  # not float: exact, nullable


def test_turns_table_in_summary_and_reports(report: Report) -> None:
    assert [list(r) for r in report.turns] == [list(TURN_COLUMNS)] * 3
    for actual, expected in zip(report.turns, TURNS, strict=True):
        assert_close(actual, expected)
    doc = json.loads(report.files["summary.json"].read_text())
    assert doc["schema_version"] == "1.6"
    for actual, expected in zip(doc["turns"], TURNS, strict=True):
        assert_close(actual, expected)
    assert_close(doc["steps"][0], STEP0_SESSIONS)
    md = report.files["report.md"].read_text()
    assert "## Sessions" in md and "### By turn" in md
    assert "| 1 | 3 | 100 | 100 | 140.0 | 96.0 | 68.6% |" in md
    html = report.files["report.html"].read_text()
    assert 'id="plot-turns"' in html and 'id="sessions"' in html and 'id="turns"' in html


def test_tool_call_chunks_are_output_and_the_first_token(report: Report) -> None:
    per = report.per_request
    call = per[(per["session_id"] == "s-complete") & (per["turn"] == 0)].iloc[0]
    # two tool_call chunks: 3 tokens at 0.2 s, 2 at 0.3 s; no visible content
    assert call["ttft_s"] == pytest.approx(0.2)
    assert call["output_tokens"] == 5 and call["chunk_tokens"] == 5
    assert call["tpot_s"] == pytest.approx(0.025) and call["itl_mean_s"] == pytest.approx(0.025)
    step0 = report.step_rows[0]
    assert step0["ttft_p50_s"] == pytest.approx(0.2) and step0["ttft_p99_s"] == pytest.approx(0.4)
    # 11 + 2 + 3 + 1 + 2 tokens in [0, 20] s, 7 of them tool-call arguments
    assert step0["output_tokens_per_s"] == pytest.approx(19 / 20)


def test_requests_table_carries_the_turns(report: Report) -> None:
    csv = pd.read_csv(report.files["requests.csv"])
    rows = csv[csv["session_id"] == "s-complete"].sort_values("turn")
    assert rows["turn"].tolist() == [0, 1, 2]
    assert rows["turn_kind"].tolist() == ["user", "tool_result", "user"]
    assert rows["wait_ns"].tolist() == [0, 500_000_000, 2_000_000_000]
    assert rows["tool_calls"].tolist() == [1, 0, 0]
    assert rows["cached_tokens"].tolist() == [0, 96, 128]
    assert rows["history_tokens"].tolist() == [0, 50, 100]
    assert rows["session_turns"].tolist() == [2, 2, 2]


def test_history_stays_out_of_the_prompt_length_check(report: Report) -> None:
    # later turns came out 40 and 100 tokens over the 100 new tokens asked: their history
    assert report.step_rows[0]["prompt_tokens_offset_mean"] == 0.0
    assert not any("tokens off the requested length" in w for w in report.warnings)


def test_warnings(report: Report) -> None:
    cached = [w for w in report.warnings if "cached prompt tokens" in w]
    assert cached == [
        "the server reported cached prompt tokens (usage.prompt_tokens_details.cached_tokens) "
        "for 7 of 8 successful requests with usage; cached_tokens_pct and the by-turn cache "
        "figures cover only those that reported them"
    ]
    # step 0's error rate (1 of 8) already says it; cut sessions are normal
    assert [w for w in report.warnings if "step 0: error rate" in w]
    assert not any("session" in w and "ended in error" in w for w in report.warnings)
    assert not any("cut" in w for w in report.warnings)


def test_a_failed_session_under_the_error_rate_threshold_is_named(
    events_dir: Path, tmp_path: Path
) -> None:
    b = RunBuilder("one-failure")
    b.add_step(0, 1, started_s=0, spawned_s=0, ended_s=100)
    turns: list[dict[str, Any]] = [{"chunks": [(0.1, 1)], "wait_s": 0.1}] * 24
    turns.append({"status": "error", "error_kind": "stream_error"})
    b.add_session("long", started_s=1.0, turns=turns)
    report = build_report(b.write(events_dir), tmp_path / "out", progress=False, html=False)
    assert report.step_rows[0]["error_rate"] == pytest.approx(1 / 25)
    assert [w for w in report.warnings if "session" in w] == [
        "step 0: 1 of 1 session(s) ended in error (a failed turn ends its session: its later "
        "turns were never sent; sessions.csv names them)"
    ]


def test_a_schema_1_2_run_still_reports(events_dir: Path, tmp_path: Path) -> None:
    uri = known_run("old").write(events_dir, schema_version="1.2")
    report = build_report(uri, tmp_path / "out", progress=False)
    assert report.sessions is None and report.turns == []
    assert "sessions.csv" not in report.files
    assert not (tmp_path / "out" / "sessions.csv").exists()
    for row in report.table.rows:
        for column in STEP_SESSION_COLUMNS:
            value = row[column]
            assert value is None or math.isnan(value), (column, value)
        assert math.isnan(row["cached_tokens_pct"])
    assert report.step_rows[0]["requests"] == 5  # as in the 1.3 known run
    csv = pd.read_csv(report.files["requests.csv"])
    assert csv["session_id"].isna().all() and csv["turn"].isna().all()
    assert json.loads(report.files["summary.json"].read_text())["turns"] == []
    assert "## Sessions" not in report.files["report.md"].read_text()
    assert "plot-turns" not in report.files["report.html"].read_text()
    assert not any("cached prompt tokens" in w for w in report.warnings)


def test_arrivals_of_a_rate_step_are_sessions(events_dir: Path, tmp_path: Path) -> None:
    b = RunBuilder("rate-sessions")
    b.add_rate_step(0, 1.0, started_s=0, ended_s=4)
    for index, start in enumerate((0.5, 1.5, 2.5, 3.5)):
        sid = f"s{index}"
        b.add_arrival(step=0, rate=1.0, index=index, intended_s=start, slip_s=0.001,
                      chunks=[(0.05, 1)], session_id=sid, turn=0, session_turns=3,
                      turn_kind="user", wait_ns=0)  # fmt: skip
        for turn in (1, 2):  # later turns: the session's, not the schedule's
            b.add_request(sent_s=start + 0.2 * turn, step=0, chunks=[(0.05, 1)], rate=1.0,
                          session_id=sid, turn=turn, session_turns=3, turn_kind="user",
                          wait_ns=ns(0.1))  # fmt: skip
    report = build_report(b.write(events_dir), tmp_path / "out", progress=False, html=False)
    step = report.step_rows[0]
    assert step["requests"] == 12 and step["sessions"] == 4
    assert step["rate_achieved"] == pytest.approx(4 / 4)  # sessions started, not requests
    assert step["slip_p99_ms"] == pytest.approx(1.0)  # first turns only
    assert not any("intended rate" in w for w in report.warnings)
