"""compare_summaries: directions, thresholds, error rate in points, unmatched steps."""

from __future__ import annotations

import pytest

from analysis.compare.runs import compare_summaries
from analysis.kernel.errors import UsageError


def row(conc: int, group: str = "step", **values: float) -> dict[str, object]:
    return {"group": group, "step": 0, "concurrency": conc, **values}


def changes(result, metric: str):  # type: ignore[no-untyped-def]
    return {c.step: c for c in result.changes if c.metric == metric}


def test_latency_up_and_throughput_down_regress() -> None:
    a = [row(1, ttft_p99_s=0.10, output_tokens_per_s=100.0, error_rate=0.0)]
    b = [row(1, ttft_p99_s=0.12, output_tokens_per_s=85.0, error_rate=0.02)]
    result = compare_summaries(a, b, threshold=0.1)
    ttft = changes(result, "ttft_p99_s")["c=1"]
    assert ttft.change == pytest.approx(0.2) and ttft.regression
    tput = changes(result, "output_tokens_per_s")["c=1"]
    assert tput.change == pytest.approx(-0.15) and tput.regression
    err = changes(result, "error_rate")["c=1"]
    assert err.change == pytest.approx(0.02) and err.regression
    assert len(result.regressions) == 3


def test_improvements_and_small_changes_do_not_regress() -> None:
    a = [row(1, ttft_p99_s=0.10, output_tokens_per_s=100.0, error_rate=0.01)]
    b = [row(1, ttft_p99_s=0.105, output_tokens_per_s=150.0, error_rate=0.015)]
    assert compare_summaries(a, b).regressions == []


def test_missing_values_and_zero_baselines_give_no_change() -> None:
    a = [row(1, ttft_p99_s=float("nan"), requests_per_s=0.0)]
    b = [row(1, ttft_p99_s=0.5, requests_per_s=3.0)]
    result = compare_summaries(a, b)
    assert changes(result, "ttft_p99_s")["c=1"].change is None
    assert changes(result, "requests_per_s")["c=1"].change is None
    assert result.regressions == []


def test_steps_match_by_concurrency_cold_with_cold() -> None:
    a = [row(1, "cold", ttft_p50_s=1.0), row(2, ttft_p50_s=0.1), row(4, ttft_p50_s=0.1)]
    b = [row(1, "cold", ttft_p50_s=2.0), row(2, ttft_p50_s=0.1), row(8, ttft_p50_s=0.1)]
    result = compare_summaries(a, b)
    assert set(changes(result, "ttft_p50_s")) == {"cold", "c=2"}
    assert result.unmatched == ["c=4 only in A", "c=8 only in B"]
    assert [c.step for c in result.regressions] == ["cold"]


def test_negative_threshold_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        compare_summaries([], [], threshold=-0.1)
