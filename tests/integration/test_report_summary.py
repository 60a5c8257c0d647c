"""Every summary column of a hand-computed run (tests/support/runs.py `known_run`).

Nearest-rank percentiles: with n samples, p-th percentile = the ceil(p*n)-th smallest.
Per-token ITL: a chunk of k tokens arriving d after the previous one gives k samples of d/k;
a first chunk of k tokens gives k-1 samples of 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis import build_report
from analysis.derive.path import PARTS
from analysis.kernel.percentiles import STATS
from analysis.kernel.schema import ERROR_KINDS
from tests.support.runs import T0_NS, known_run, ns

SLO = "ttft_p99=0.45,error_rate=0.5,ttft=0.4,tpot=0.2"


def dist(metric: str, mean: float, p50: float, p90: float, top: float) -> dict[str, float]:
    """Columns for a small sample set whose p90..max all equal `top`."""
    values = {"mean": mean, "p50": p50, "p90": p90, "p95": top, "p99": top, "p999": top}
    values["max"] = top
    return {f"{metric}_{s}_s": values[s] for s in STATS}


def missing_latencies() -> dict[str, float]:
    nan = float("nan")
    return {f"{m}_{s}_s": nan for m in ("ttft", "ttfo", "ttfr", "tpot", "itl", "icl", "e2e")
            for s in STATS}  # fmt: skip


def no_answer_times() -> dict[str, Any]:
    """TTFO and TTFR of a run written before schema 1.5 (no first answer or first reasoning
    recorded): missing, never 0."""
    return {f"{m}_{s}_s": float("nan") for m in ("ttfo", "ttfr") for s in STATS}


def no_reasoning_counts() -> dict[str, Any]:
    """The reasoning and answer token columns of a run written before schema 1.5."""
    nan = float("nan")
    return {"reasoning_tokens_mean": nan, "answer_tokens_mean": nan, "requests_reasoning": 0}


def event_tokens(tokens: float, events: float, multi: float, most: float) -> dict[str, Any]:
    """Tokens per output event of the successful requests: `tokens` over `events`, `multi`
    of which carried more than one, `most` the most one carried."""
    nan = float("nan")
    return {"tokens_per_event_mean": tokens / events if events else nan,
            "multi_token_events_pct": 100 * multi / events if events else nan,
            "max_event_tokens": most}  # fmt: skip


def unchecked() -> dict[str, Any]:
    """No answer checked (no --response-format, no tool call), no speculative-decoding
    counters (no server metrics)."""
    nan = float("nan")
    return {"requests_checked": 0, "requests_invalid": 0, "valid_share": nan}


def no_speculation() -> dict[str, Any]:
    return {c: float("nan") for c in ("spec_draft_tokens", "spec_accepted_tokens",
                                      "spec_acceptance_rate", "spec_acceptance_length")}  # fmt: skip


def no_accelerator() -> dict[str, Any]:
    """No accelerator telemetry, no --accelerators, no price: all missing."""
    nan = float("nan")
    return {"accelerators": nan, "output_tokens_per_s_per_accelerator": nan,
            "accel_energy_j": nan, "accel_j_per_output_token": nan, "accel_power_w_mean": nan,
            "accel_util_pct_mean": nan, "accel_memory_used_mib_max": nan,
            "accel_sm_clock_mhz_mean": nan, "accel_throttled_pct": nan, "accel_simulated": None,
            "cost_per_1m_output_tokens": nan}  # fmt: skip


def errors(**counts: int) -> dict[str, int]:
    out = {f"errors_{k}": 0 for k in ERROR_KINDS}
    out["errors_other"] = 0
    out.update({f"errors_{k}": v for k, v in counts.items()})
    return out


def unmeasured(source: str | None = "usage") -> dict[str, Any]:
    """The columns of a run without worker samples (written before schema 1.1)."""
    nan = float("nan")
    return {
        "output_tokens_source": source, "requests_per_event_tokens": 0,
        "worker_cpu_max_pct": nan, "loop_lag_p99_ms": nan, "loop_lag_p90_ms": nan,
        "worker_stalls": nan,
        "requests_worker_stalled": None, "stall_moved_pct": nan, "stall_moved_figure": None,
        "coalesced_events_pct": nan,
    }  # fmt: skip


def closed_loop() -> dict[str, Any]:
    """The open-loop columns of a group that is not a rate step: missing, never 0."""
    nan = float("nan")
    return {
        "slip_p50_ms": nan, "slip_p99_ms": nan, "slip_max_ms": nan,
        "requests_queued": None, "queued_p99_ms": nan,
    }  # fmt: skip


def no_sessions() -> dict[str, Any]:
    """The session columns of a run without sessions (schema 1.3): missing, never 0; and no
    cached-token share where the server reported none."""
    nan = float("nan")
    return {
        "sessions": None, "sessions_complete": None, "sessions_error": None,
        "sessions_cut": None, "session_turns_mean": nan, "session_e2e_p50_s": nan,
        "session_e2e_p99_s": nan, "tool_wait_s_mean": nan, "think_s_mean": nan,
        "cached_tokens_pct": nan, "cached_implied_pct": nan, "cache_phase": None,
        "cache_flush": None, "cache_primed": None,
    }  # fmt: skip


def no_path() -> dict[str, Any]:
    """The request-path columns of a run written before schema 1.4, without spans: missing,
    never 0 (no new connection recorded either)."""
    nan = float("nan")
    out: dict[str, Any] = {
        "client_delay_p50_ms": nan, "client_delay_p99_ms": nan, "connections_new": 0,
        "connect_p50_ms": nan, "connect_p99_ms": nan, "span_share": nan,
    }  # fmt: skip
    out.update({f"{p}_{s}_s": nan for p in PARTS for s in ("mean", "p50", "p99")})
    return out


def window(start_s: float, end_s: float, source: str = "manifest") -> dict[str, Any]:
    return {
        "window_start_ns": T0_NS + ns(start_s),
        "window_end_ns": T0_NS + ns(end_s),
        "window_s": end_s - start_s,
        "window_source": source,
    }


COLD = {
    "group": "cold", "step": None, "concurrency": 1,
    "mode": None, "rate": None, "rate_achieved": float("nan"),
    "requests_total": 2, "requests": 2, "ok": 2, "failed": 0, "cancelled": 0, "aborted": 0,
    "requests_dropped": None, "error_rate": 0.0,
    **dist("ttft", 0.75, 0.5, 1.0, 1.0),
    **no_answer_times(),
    **dist("tpot", 0.25, 0.0, 0.5, 0.5),
    **dist("itl", 0.25, 0.0, 0.5, 0.5),
    **dist("icl", 0.5, 0.5, 0.5, 0.5),
    **dist("e2e", 1.1, 0.6, 1.6, 1.6),
    # span [0, 1.6] s: 4 tokens, 2 completions, 200 prompt tokens, no good request
    "requests_per_s": 2 / 1.6, "output_tokens_per_s": 4 / 1.6,
    "input_tokens_per_s": 200 / 1.6, "goodput_requests_per_s": 0.0, "good": 0,
    **window(0.0, 1.6, "cold"),
    "prompt_tokens_requested_mean": 100.0, "prompt_tokens_mean": float("nan"),
    "prompt_tokens_offset_mean": float("nan"),
    "output_tokens_requested_mean": 64.0, "output_tokens_mean": 2.0,
    **no_reasoning_counts(),
    # events: 1, 1 | 2: four tokens in three events, one of them two
    **event_tokens(4, 3, 1, 2),
    **unchecked(),
    **errors(),
    **unmeasured(),
    **closed_loop(),
    **no_sessions(),
    **no_path(),
    "slo_pass": None, "slo_failures": "",
    **no_speculation(),
    **no_accelerator(),
    "verdict": "valid", "verdict_reasons": "",
}  # fmt: skip

STEP0 = {
    "group": "step", "step": 0, "concurrency": 1,
    # five requests sent in the 8 s window
    "mode": "concurrency", "rate": None, "rate_achieved": 5 / 8,
    # sent 11 (before the window) is not counted; 12, 14, 16, 18 (error), 19.9 are
    "requests_total": 6, "requests": 5, "ok": 4, "failed": 1, "cancelled": 0, "aborted": 0,
    "requests_dropped": None, "error_rate": 0.2,
    # TTFT 0.5, 0.2, 0.3, 0.05
    **dist("ttft", 1.05 / 4, 0.2, 0.5, 0.5),
    **no_answer_times(),
    # TPOT 0.4/3, 0.2/3, (single token: none), 0.25
    **dist("tpot", 0.15, 0.4 / 3, 0.25, 0.25),
    # ITL samples (weight): 0.05 (2), 0.3 (1) | 0 (2), 0.2 (1) | 0.25 (1): 7 tokens
    **dist("itl", 0.85 / 7, 0.05, 0.3, 0.3),
    # ICL 0.1, 0.3 | 0.2 | 0.25
    **dist("icl", 0.85 / 4, 0.2, 0.3, 0.3),
    # E2E 1.0, 0.5, 0.4, 0.35
    **dist("e2e", 2.25 / 4, 0.4, 1.0, 1.0),
    # window [12, 20]: tokens 4 + 4 + 1 + 1 (19.95; 20.2 is out); completions at 13, 14.5,
    # 16.4; prompts with a first token inside: 110 + 90 + 100 (requested) + 130;
    # good (ttft <= 0.4, tpot <= 0.2) completed inside: 14.5 and 16.4
    "requests_per_s": 3 / 8, "output_tokens_per_s": 10 / 8,
    "input_tokens_per_s": 430 / 8, "goodput_requests_per_s": 2 / 8, "good": 2,
    **window(12.0, 20.0),
    "prompt_tokens_requested_mean": 100.0, "prompt_tokens_mean": 110.0,
    # |110 - 100|, |90 - 100|, |130 - 100| (the fourth reported no prompt_tokens)
    "prompt_tokens_offset_mean": 50 / 3,
    "output_tokens_requested_mean": 56.0, "output_tokens_mean": 2.75,
    **no_reasoning_counts(),
    # events 1, 2, 1 | 3, 1 | 1 | 1, 1: 11 tokens in 8 events, two of several
    **event_tokens(11, 8, 2, 3),
    **unchecked(),
    **errors(http_5xx=1),
    **unmeasured(),
    **closed_loop(),
    **no_sessions(),
    **no_path(),
    "slo_pass": False, "slo_failures": "ttft_p99 0.5 > 0.45",
    **no_speculation(),
    **no_accelerator(),
    "verdict": "valid", "verdict_reasons": "",
}  # fmt: skip

STEP1 = {
    "group": "step", "step": 1, "concurrency": 4,
    "mode": "concurrency", "rate": None, "rate_achieved": 4 / 8,
    "requests_total": 5, "requests": 4, "ok": 2, "failed": 1, "cancelled": 1, "aborted": 0,
    "requests_dropped": None, "error_rate": 1 / 3,
    **dist("ttft", 0.1, 0.1, 0.1, 0.1),
    **no_answer_times(),
    # TPOT 0.2/4, 0.15
    **dist("tpot", 0.1, 0.05, 0.15, 0.15),
    # ITL 0 (2), 0.1 (2) | 0.15 (1)
    **dist("itl", 0.35 / 5, 0.1, 0.15, 0.15),
    **dist("icl", 0.175, 0.15, 0.2, 0.2),
    **dist("e2e", 0.3, 0.3, 0.3, 0.3),
    # window [22, 30]: tokens 2 (sent at 21.5) + 5 + 1 (cancelled) + 2 (failed) + 1;
    # completions 22.4 and 23.3; five first tokens inside x 100 requested prompt tokens
    "requests_per_s": 2 / 8, "output_tokens_per_s": 11 / 8,
    "input_tokens_per_s": 500 / 8, "goodput_requests_per_s": 1 / 8, "good": 2,
    **window(22.0, 30.0),
    "prompt_tokens_requested_mean": 100.0, "prompt_tokens_mean": float("nan"),
    "prompt_tokens_offset_mean": float("nan"),
    "output_tokens_requested_mean": 64.0, "output_tokens_mean": 3.5,
    **no_reasoning_counts(),
    # events 3, 2 | 1, 1: 7 tokens in 4 events, two of several
    **event_tokens(7, 4, 2, 3),
    **unchecked(),
    **errors(stream_error=1, cancelled=1),
    **unmeasured(),
    **closed_loop(),
    **no_sessions(),
    **no_path(),
    "slo_pass": True, "slo_failures": "",
    **no_speculation(),
    **no_accelerator(),
    "verdict": "valid", "verdict_reasons": "",
}  # fmt: skip

STEP2 = {
    "group": "step", "step": 2, "concurrency": 8,
    "mode": "concurrency", "rate": None, "rate_achieved": 2 / 10,
    "requests_total": 2, "requests": 2, "ok": 0, "failed": 2, "cancelled": 0, "aborted": 0,
    "requests_dropped": None, "error_rate": 1.0,
    **missing_latencies(),
    # window [30, 40]: step 1's last chunk (30.05) and completion (30.1) land here
    "requests_per_s": 0.1, "output_tokens_per_s": 0.1,
    "input_tokens_per_s": 0.0, "goodput_requests_per_s": 0.1, "good": 0,
    **window(30.0, 40.0),
    "prompt_tokens_requested_mean": float("nan"), "prompt_tokens_mean": float("nan"),
    "prompt_tokens_offset_mean": float("nan"),
    "output_tokens_requested_mean": float("nan"), "output_tokens_mean": float("nan"),
    **no_reasoning_counts(),
    **event_tokens(0, 0, 0, float("nan")),
    **unchecked(),
    **errors(queue_rejected=1, connect=1),
    **unmeasured(None),
    **closed_loop(),
    **no_sessions(),
    **no_path(),
    "slo_pass": False,
    "slo_failures": "ttft_p99 missing (no data); error_rate 1 > 0.5",
    **no_speculation(),
    **no_accelerator(),
    "verdict": "server-overloaded",
    "verdict_reasons": "step 2: 1 of 2 request(s) (50.0%) were rejected (429/503) or timed out "
    "(limit 1.0%)",
}  # fmt: skip

EXPECTED = [COLD, STEP0, STEP1, STEP2]


def assert_row(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(actual) == set(expected), set(actual) ^ set(expected)
    for key, want in expected.items():
        got = actual[key]
        if isinstance(want, float) and math.isnan(want):
            assert got is None or (isinstance(got, float) and math.isnan(got)), (key, got)
        elif isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (key, got, want)
        else:
            assert got == want, (key, got, want)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("known")
    uri = known_run().write(root / "events", parts_per_worker=2)
    return build_report(uri, root / "out", slo=SLO, progress=False)


def test_every_summary_column_matches_hand_computed_values(report) -> None:  # type: ignore[no-untyped-def]
    rows = report.table.rows
    assert len(rows) == len(EXPECTED)
    for actual, expected in zip(rows, EXPECTED, strict=True):
        assert_row(actual, expected)


def test_summary_json_and_csv_carry_the_same_rows(report) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(report.files["summary.json"].read_text())
    assert doc["schema_version"] == "1.6" and doc["kind"] == "llmload.summary"
    assert doc["verdict"]["verdict"] == "server-overloaded" and doc["notes"] == []
    assert doc["simulated"] is False
    assert doc["run"]["target"]["model"] == "tiny-llama"
    assert doc["slo"]["best_concurrency"] == 4 and doc["slo"]["failed"] is True
    assert doc["completeness"]["complete"] is True
    for actual, expected in zip(doc["steps"], EXPECTED, strict=True):
        assert_row(actual, expected)
    assert doc["steps"][3]["ttft_p99_s"] is None  # missing, never 0

    csv = pd.read_csv(report.files["summary.csv"])
    assert list(csv.columns) == [*EXPECTED[0], "run_verdict"]
    assert set(csv["run_verdict"]) == {"server-overloaded"}
    assert csv["ttft_p50_s"].tolist()[:3] == pytest.approx([0.5, 0.2, 0.1])
    assert csv["ttft_p50_s"].isna().tolist() == [False, False, False, True]
    assert csv["step"].isna().tolist() == [True, False, False, False]


def test_best_concurrency_and_slo_verdict(report) -> None:  # type: ignore[no-untyped-def]
    assert report.best_concurrency == 4
    assert report.slo_failed
    md = report.files["report.md"].read_text()
    assert "highest concurrency meeting the SLO: 4" in md
    assert "SIMULATED" not in md


def test_per_request_files(report) -> None:  # type: ignore[no-untyped-def]
    per = pd.read_parquet(report.files["requests.parquet"])
    csv = pd.read_csv(report.files["requests.csv"])
    required = [
        "request_id",
        "worker_id",
        "step",
        "concurrency",
        "status",
        "error_kind",
        "cold",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "itl_mean_s",
        "output_tokens",
        "prompt_tokens",
        "prompt_tokens_requested",
    ]
    assert set(required) <= set(csv.columns)
    assert len(per) == len(csv) == 15
    by_time = per.sort_values("sent_at_ns").reset_index(drop=True)
    b = by_time.iloc[3]  # sent at 12.0 s
    assert (b["ttft_s"], b["e2e_s"], b["output_tokens"]) == pytest.approx((0.5, 1.0, 4))
    assert b["tpot_s"] == pytest.approx(0.4 / 3) and b["itl_mean_s"] == pytest.approx(0.4 / 3)
    assert bool(b["steady"]) and not bool(b["good"])
    assert by_time["steady"].sum() == 5 + 4 + 2
    single = by_time.iloc[5]  # one token: no TPOT, no ITL (missing, not 0)
    assert math.isnan(single["tpot_s"]) and math.isnan(single["itl_mean_s"])
    assert pd.isna(csv.loc[csv["request_id"] == single["request_id"], "tpot_s"]).all()


def test_prompts_off_their_requested_length_earn_a_warning(report) -> None:  # type: ignore[no-untyped-def]
    # step 0: 110, 90 and 130 tokens for 100 requested; step 1's server reported none
    offsets = [w for w in report.warnings if "tokens off the requested length" in w]
    assert offsets == [
        "step 0: prompts came out 16.7 tokens off the requested length on average (mean "
        "+10.0; 3 successful requests of 32+ tokens, server usage vs prompt_tokens_requested); "
        "give --tokenizer with the served model's tokenizer for exact prompt lengths"
    ]


def test_no_manifest_timeline_falls_back_to_request_span(events_dir: Path, tmp_path: Path) -> None:
    run = known_run("no-timeline")
    run.steps.clear()
    uri = run.write(events_dir)
    report = build_report(uri, tmp_path / "out", progress=False, html=False)
    step0 = report.table.rows[1]
    # first send 11.0 s, last end 19.9 + 0.35 s
    assert step0["window_source"] == "requests"
    assert step0["window_start_ns"] == T0_NS + ns(11.0)
    assert step0["window_end_ns"] == T0_NS + ns(19.9) + ns(0.35)
    assert step0["requests"] == step0["requests_total"] == 6
    assert any("no step timeline" in w for w in report.warnings)
