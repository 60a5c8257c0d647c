"""Speculative decoding against the simulator's truth: `llmload sim --spec-draft-tokens 3
--spec-acceptance 0.6` drafts three tokens per decode step and sends each step's tokens in
one event. The report's tokens per event (the client's side) and acceptance rate (the
server's own counters, scraped from /metrics) match what the truth log says it did."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import build_report
from tests.support.chat import run_locust, start_sim

DRAFT, ACCEPT = 3, 0.6


def test_acceptance_rate_and_tokens_per_event_match_the_truth(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim", "--spec-draft-tokens", str(DRAFT),
                   "--spec-acceptance", str(ACCEPT)) as sim:  # fmt: skip
        result = run_locust(sim.url, tmp_path / "runs", "--steps", "4", "--step-duration", "8",
                            "--step-warmup", "1", "--cold-requests", "0",
                            "--workload", "D(16,48)", "--scrape-interval", "0.5")  # fmt: skip
        truth = sim.truth()
    assert result.returncode == 0, result.output[-3000:]
    requests, chunks, _ = result.events()
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=True)
    (row,) = [r for r in report.step_rows if r["group"] == "step"]
    # the server's side: its counters over the window against the truth of its requests
    ok = requests[requests["status"] == "ok"]
    said = [truth[rid] for rid in ok["request_id"] if rid in truth]
    drafts = sum(t["spec_drafts"] for t in said)
    accepted = sum(t["spec_accepted_tokens"] for t in said)
    assert drafts > 100
    expected_rate = accepted / (drafts * DRAFT)
    assert row["spec_acceptance_rate"] == pytest.approx(expected_rate, abs=0.03)
    # (p + p^2 + p^3) / 3 = 0.392 for p = 0.6, a little less where a sequence's end cuts drafts
    assert 0.3 < row["spec_acceptance_rate"] < 0.4
    assert row["spec_acceptance_length"] == pytest.approx(1 + accepted / drafts, abs=0.1)
    assert row["spec_draft_tokens"] > 0 and row["spec_accepted_tokens"] > 0
    # the client's side: each event carried a decode step's tokens (1 + the accepted drafts)
    assert row["max_event_tokens"] == DRAFT + 1
    assert row["tokens_per_event_mean"] == pytest.approx(1 + accepted / drafts, rel=0.1)
    assert 20 < row["multi_token_events_pct"] < 80
    per = report.per_request
    assert (per.loc[per["status"] == "ok", "max_event_tokens"] <= DRAFT + 1).all()
    assert chunks["tokens"].max() == DRAFT + 1
