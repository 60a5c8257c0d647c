"""--slo parsing, step verdicts and per-request goodput thresholds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.kernel.errors import UsageError
from analysis.kernel.slo import parse_slo


def test_parse_step_objectives_and_request_thresholds() -> None:
    slo = parse_slo("ttft_p99=0.5, tpot_p50=50ms,e2e_p99=10s,error_rate=1%,ttft=1,tpot=0.1")
    assert {o.name: (o.column, o.limit) for o in slo.objectives} == {
        "ttft_p99": ("ttft_p99_s", 0.5),
        "tpot_p50": ("tpot_p50_s", 0.05),
        "e2e_p99": ("e2e_p99_s", 10.0),
        "error_rate": ("error_rate", 0.01),
    }
    assert {t.name: (t.column, t.limit) for t in slo.thresholds} == {
        "ttft": ("ttft_s", 1.0),
        "tpot": ("tpot_s", 0.1),
    }
    assert slo and not parse_slo(None) and not parse_slo("  ")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttft_p98=1", "unknown"),
        ("latency=1", "unknown"),
        ("ttft_p99", "not name=value"),
        ("ttft_p99=", "not name=value"),
        ("ttft_p99=abc", "not a number"),
        ("ttft_p99=-1", "positive duration"),
        ("error_rate=1.5", "between 0 and 1"),
        ("ttft=1,ttft=2", "twice"),
        (",", "names no objective"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_slo(spec)


def test_step_verdict_missing_value_fails() -> None:
    slo = parse_slo("ttft_p99=0.5,error_rate=0.1")
    assert slo.failures({"ttft_p99_s": 0.5, "error_rate": 0.1}) == []
    assert slo.failures({"ttft_p99_s": 0.6, "error_rate": 0.0}) == ["ttft_p99 0.6 > 0.5"]
    assert slo.failures({"ttft_p99_s": float("nan"), "error_rate": None}) == [
        "ttft_p99 missing (no data)",
        "error_rate missing (no data)",
    ]


def test_good_requests_meet_every_threshold_absent_metrics_do_not_count() -> None:
    per = pd.DataFrame(
        {
            "ttft_s": [0.1, 0.1, 0.9, 0.1, np.nan],
            "tpot_s": [0.01, 0.5, 0.01, np.nan, np.nan],
            "e2e_s": [1.0, 1.0, 1.0, 1.0, 0.1],
            "itl_mean_s": [0.01] * 5,
        }
    )
    ok = np.array([True, True, True, True, False])
    good = parse_slo("ttft=0.5,tpot=0.1").good(per, ok)
    assert good is not None and good.tolist() == [True, False, False, True, False]
    assert parse_slo("ttft_p99=1").good(per, ok) is None
