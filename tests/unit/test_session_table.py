"""The session table (analysis/derive/sessions.py) from hand-made runs read back through load_run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.derive.metrics import compute_request_metrics
from analysis.derive.sessions import SESSION_COLUMNS, SessionTable, turn_rows, without_history
from analysis.read.load import load_run
from tests.support.runs import T0_NS, RunBuilder, known_run, ns, session_run


def sessions_of(builder: RunBuilder, events: Path) -> SessionTable | None:
    run = load_run(builder.write(events), progress=False)
    e2e = compute_request_metrics(run.requests, run.chunks).per_request["e2e_s"]
    return SessionTable.of(run.requests, e2e.to_numpy(np.float64))


def by_id(table: SessionTable | None) -> dict[str, dict[str, object]]:
    assert table is not None
    return {r["session_id"]: r for r in table.frame.to_dict("records")}


def test_statuses_and_sums_from_known_turns(events_dir: Path) -> None:
    table = sessions_of(session_run(), events_dir)
    assert table is not None
    assert tuple(table.frame.columns) == SESSION_COLUMNS
    rows = by_id(table)
    assert list(table.frame["session_id"]) == [  # by first send
        "s-complete", "s-error", "s-cut", "s-missing", "s-no-result", "s-late",
    ]  # fmt: skip
    assert {k: r["status"] for k, r in rows.items()} == {
        "s-complete": "complete", "s-error": "error", "s-cut": "cut", "s-missing": "cut",
        "s-no-result": "cut", "s-late": "complete",
    }  # fmt: skip
    done = rows["s-complete"]
    assert (done["worker_id"], done["step"], done["turns"]) == ("w1", 0, 3)
    assert done["planned_turns"] == 2
    assert (done["ok_turns"], done["tool_rounds"]) == (3, 1)
    assert done["model_s"] == pytest.approx(0.35 + 0.25 + 0.2)
    assert done["tool_wait_s"] == pytest.approx(0.5)
    assert done["think_s"] == pytest.approx(2.0)
    # first send 1.0 s, last end 1.0 + 0.35 + 0.5 + 0.25 + 2.0 + 0.2 = 4.3 s
    assert done["session_e2e_s"] == pytest.approx(3.3, abs=1e-9)
    assert done["started_at_ns"] == T0_NS + ns(1.0)
    assert (done["prompt_tokens"], done["cached_tokens"]) == (440, 224)
    failed = rows["s-error"]
    assert (failed["turns"], failed["ok_turns"], failed["planned_turns"]) == (2, 1, 3)
    assert failed["think_s"] == pytest.approx(1.0) and failed["tool_wait_s"] == 0.0
    assert failed["session_e2e_s"] == pytest.approx(1.45)
    missing = rows["s-missing"]
    assert missing["prompt_tokens"] == 100 and pd.isna(missing["cached_tokens"])


def test_a_gap_or_a_cancelled_turn_cuts_and_a_failure_outranks_both(events_dir: Path) -> None:
    b = RunBuilder("edge")
    b.add_step(0, 1, started_s=0, spawned_s=0, ended_s=60)
    turns = [{"chunks": [(0.1, 1)]}] * 3
    lost = b.add_session("gap", started_s=1.0, turns=turns)[1]
    b.add_session("cancelled", started_s=10.0, turns=[
        {"chunks": [(0.1, 1)]}, {"status": "cancelled", "error_kind": "cancelled"},
    ])  # fmt: skip
    b.add_session("both", started_s=20.0, turns=[
        {"status": "aborted", "error_kind": "aborted"}, {"status": "error", "error_kind": "connect"},
    ])  # fmt: skip
    b.add_session("whole", started_s=30.0, turns=turns)
    # the gap's turn 1 lost (a missing part): turns 0 and 2 remain
    b.requests = [r for r in b.requests if r["request_id"] != lost]
    b.chunks = [c for c in b.chunks if c["request_id"] != lost]
    rows = by_id(sessions_of(b, events_dir))
    assert {k: r["status"] for k, r in rows.items()} == {
        "gap": "cut", "cancelled": "cut", "both": "error", "whole": "complete",
    }  # fmt: skip
    assert rows["gap"]["turns"] == 2 and rows["whole"]["turns"] == 3


def test_dropped_arrivals_start_no_session(events_dir: Path) -> None:
    b = RunBuilder("drops")
    b.add_rate_step(0, 5.0, started_s=0, ended_s=10, max_concurrency=1, over_cap="drop")
    b.add_arrival(step=0, rate=5.0, index=0, intended_s=1.0, chunks=[(0.1, 1)],
                  session_id="kept", turn=0, session_turns=1, turn_kind="user", wait_ns=0)  # fmt: skip
    b.add_arrival(step=0, rate=5.0, index=1, intended_s=1.05, dropped=True,
                  session_id="never", turn=0, session_turns=1, turn_kind="user", wait_ns=0)  # fmt: skip
    assert list(by_id(sessions_of(b, events_dir))) == ["kept"]


def test_runs_without_sessions_have_no_table(events_dir: Path) -> None:
    assert sessions_of(known_run(), events_dir) is None
    assert sessions_of(known_run("old"), events_dir / "old") is None


def test_only_prompts_without_history_are_held_against_their_length() -> None:
    frame = pd.DataFrame(
        {
            "turn": pd.array([None, 0, 1, 0, 2], dtype="Int32"),
            "turn_kind": [None, "user", "user", "tool_result", None],
        }
    )
    assert without_history(frame).tolist() == [True, True, False, False, False]
    assert without_history(pd.DataFrame(index=range(2))).tolist() == [True, True]


def test_turn_rows_pool_the_steady_requests() -> None:
    per = pd.DataFrame(
        {
            "turn": pd.array([0, 0, 1, 1, 0, None], dtype="Int32"),
            "status": ["ok", "ok", "ok", "error", "ok", "ok"],
            "steady": [True, True, True, True, False, True],
            "ttft_s": [0.1, 0.3, 0.05, math.nan, 9.0, 9.0],
            "prompt_tokens": pd.array([100, 100, 300, None, 100, 100], dtype="Int32"),
            "cached_tokens": pd.array([0, None, 240, None, 0, 0], dtype="Int32"),
        }
    )
    assert turn_rows(per) == [
        {"turn": 0, "requests": 2, "ttft_p50_s": 0.1, "ttft_p99_s": 0.3,
         "prompt_tokens_mean": 100.0, "cached_tokens_mean": 0.0, "cache_hit_pct": 0.0},
        {"turn": 1, "requests": 2, "ttft_p50_s": 0.05, "ttft_p99_s": 0.05,
         "prompt_tokens_mean": 300.0, "cached_tokens_mean": 240.0, "cache_hit_pct": 80.0},
    ]  # fmt: skip
