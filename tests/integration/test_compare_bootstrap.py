"""`llmload compare --method bootstrap` on runs of known requests: intervals and verdicts.

Each run is one step of concurrency 8 whose requests have lognormal latencies drawn from a
seeded generator; B is A's distribution scaled (a slower build) or a second draw of it (a
repeat of the same build).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.compare import bootstrap
from analysis.compare.runs import (
    COMPARISON_SCHEMA_VERSION,
    NOT_ENOUGH_DATA,
    REGRESSION,
    Comparison,
    compare_reports,
    compare_runs,
    compare_summaries,
    write_comparison,
)
from analysis.kernel.errors import UsageError
from analysis.read.load import load_run
from analysis.report.summary import Report, summarize_run
from infra.cli import main
from tests.support.runs import RunBuilder

TOKENS = 8  # output tokens per request, in 4 chunks of 2


def lognormal_run(run_id: str, requests: int, *, seed: int, slower: float = 1.0) -> RunBuilder:
    """One step (c=8) of `requests` requests sent across 100 s; TTFT and the gap between
    chunks lognormal around 50 ms and 10 ms, times `slower`."""
    rng = np.random.default_rng(seed)
    b = RunBuilder(run_id)
    b.add_step(0, 8, started_s=0, spawned_s=0, ended_s=102)
    sent = np.sort(rng.uniform(0.5, 100.0, requests))
    ttft = 0.05 * slower * rng.lognormal(0.0, 0.5, requests)
    gaps = 0.01 * slower * rng.lognormal(0.0, 0.3, (requests, 3))
    for i in range(requests):
        offsets = ttft[i] + np.concatenate([[0.0], np.cumsum(gaps[i])])
        chunks = [(float(t), TOKENS // 4) for t in offsets]
        b.add_request(sent_s=float(sent[i]), step=0, concurrency=8, chunks=chunks)
    return b


def changes(result: Comparison, method: str = "bootstrap") -> dict[str, Any]:
    return {c.metric: c for c in result.changes if c.step == "c=8" and c.method == method}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """base and repeat: two draws of one build; slower: 8% slower; small: 150 requests."""
    events = tmp_path_factory.mktemp("events")
    return {
        "base": lognormal_run("base", 2000, seed=1).write(events),
        "repeat": lognormal_run("repeat", 2000, seed=2).write(events),
        "slower": lognormal_run("slower", 2000, seed=3, slower=1.08).write(events),
        "small": lognormal_run("small", 150, seed=4).write(events),
        "small_slower": lognormal_run("small_slower", 150, seed=5, slower=1.3).write(events),
    }


@pytest.fixture(scope="module")
def reports(runs: dict[str, str]) -> dict[str, Report]:
    """The large runs summarised once, with their chunks (as compare_runs does)."""
    return {
        name: summarize_run(load_run(runs[name], progress=False))
        for name in ("base", "repeat", "slower")
    }


def test_an_8_percent_slower_median_over_many_requests_is_a_regression(
    reports: dict[str, Report],
) -> None:
    result = compare_reports(reports["base"], reports["slower"], threshold=0.05)
    assert result.method == "bootstrap" and result.resamples == bootstrap.RESAMPLES
    by = changes(result)
    for metric in ("ttft_p50_s", "e2e_p50_s", "tpot_p50_s", "ttft_mean_s"):
        change = by[metric]
        assert change.verdict == REGRESSION and change.regression, change
        assert 0 < change.ci_low < change.change < change.ci_high, change
    # the threshold rule at its default 10% lets the same 8% pass
    rows = [reports[name].table.rows for name in ("base", "slower")]
    assert not changes(compare_summaries(*rows), "threshold")["e2e_p50_s"].regression


def test_a_repeat_of_the_same_build_is_no_regression(reports: dict[str, Report]) -> None:
    result = compare_reports(reports["base"], reports["repeat"], threshold=0.05)
    assert result.regressions == []
    by = changes(result)
    assert by["e2e_p50_s"].verdict == "no significant change"
    assert by["e2e_p50_s"].ci_low < 0 < by["e2e_p50_s"].ci_high


def test_identical_inputs_give_no_significant_change(reports: dict[str, Report]) -> None:
    result = compare_reports(reports["base"], reports["base"], threshold=0.0)
    assert result.regressions == []
    decided = [c for c in changes(result).values() if c.verdict != NOT_ENOUGH_DATA]
    assert decided and all(c.change == 0 for c in decided)
    assert {c.verdict for c in decided} == {"no significant change"}


def test_a_p99_over_150_requests_is_not_enough_data(runs: dict[str, str]) -> None:
    result = compare_runs(runs["small"], runs["small_slower"], threshold=0.05)
    by = changes(result)
    for metric in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s"):  # ITL: 8 samples a request
        change = by[metric]
        assert change.verdict == NOT_ENOUGH_DATA and not change.regression
        assert "p99 needs 500+ samples" in change.why and change.ci_low is None
        assert change.change is not None  # the observed change is still shown
    # 150 requests are enough for a median: a 30% slower one is found
    assert by["e2e_p50_s"].verdict == REGRESSION


def test_the_same_seed_gives_the_same_intervals(runs: dict[str, str]) -> None:
    def intervals(seed: int) -> list[tuple[object, object]]:
        result = compare_runs(runs["small"], runs["small_slower"], seed=seed, resamples=200)
        return [(c.ci_low, c.ci_high) for c in result.changes if c.method == "bootstrap"]

    first = intervals(7)
    assert first == intervals(7)
    assert first != intervals(8)


def test_files_record_the_method_and_the_intervals(runs: dict[str, str], tmp_path: Path) -> None:
    result = compare_runs(runs["small"], runs["small_slower"], threshold=0.05, seed=3)
    files = write_comparison(result, tmp_path)
    doc = json.loads(files["compare.json"].read_text())
    assert doc["schema_version"] == COMPARISON_SCHEMA_VERSION == "1.1"
    assert (doc["method"], doc["resamples"], doc["seed"], doc["confidence"]) == (
        "bootstrap", bootstrap.RESAMPLES, 3, bootstrap.CONFIDENCE,
    )  # fmt: skip
    assert doc["verdicts"][REGRESSION] == len(result.regressions) == doc["regressions"]
    csv = pd.read_csv(files["compare.csv"])
    assert list(csv.columns[-5:]) == ["method", "ci_low", "ci_high", "verdict", "why"]
    assert set(csv["method"]) == {"bootstrap", "threshold"}
    threshold_rows = csv[csv["method"] == "threshold"]
    assert set(threshold_rows["metric"]) == {"error_rate"}
    md = files["compare.md"].read_text()
    assert "bootstrap, 1000 resamples (seed 3)" in md and "95% interval" in md
    assert "not enough data (A and B: p99 needs 500+ samples (5 beyond it); 150 request(s))" in md


def test_report_directories_need_the_threshold_method(runs: dict[str, str], tmp_path: Path,
                                                      capsys) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    a, b = tmp_path / "a", tmp_path / "b"
    for uri, out in ((runs["small"], a), (runs["small_slower"], b)):
        assert main(["report", uri, "--out", str(out), "--no-html", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--method threshold" in err[0] and "RUN_URI" in err[0]
    assert main(["compare", str(a), str(b), "--method", "threshold"]) == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"resamples": 10}, "--resamples must be >= 100"),
        ({"seed": -1}, "--seed must be >= 0"),
        ({"method": "vibes"}, "--method must be one of bootstrap, threshold"),
    ],
)
def test_bad_bootstrap_options_are_usage_errors(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        compare_runs("nowhere/a", "nowhere/b", **options)  # type: ignore[arg-type]


def test_the_cli_defaults_are_the_library_defaults() -> None:
    from analysis.compare import runs as compare
    from infra.commands import compare as command

    assert command.METHODS == compare.METHODS and command.METHODS[0] == compare.DEFAULT_METHOD
    assert (bootstrap.RESAMPLES, bootstrap.SEED) == (1000, 0)  # as --help says
