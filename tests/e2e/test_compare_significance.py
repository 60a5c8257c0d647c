"""Issue 24, done when: `llmload compare` finds a simulator made 10% slower significantly
slower at concurrency 8, and no regression between two repeats of the same build (10 pairs:
at most one false alarm).

The simulator's steps are long enough (20 ms a decode step) that the client's own overhead
is a small part of every latency, and the requests' lengths vary (U(..)/(..)) so that the 8
closed-loop users do not march in step with the engine's decode steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.cli import main
from tests.support.chat import run_locust, start_sim

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,
]  # long (10-35 s a test), timing statistics: `make test-slow`

SIM = ("--decode-base-ms", "20", "--prefill-per-token-us", "50", "--decode-per-seq-us", "0",
       "--decode-per-kv-token-ns", "0", "--prefix-cache", "off")  # fmt: skip
RUN = ("--steps", "8", "--step-duration", "4", "--step-warmup", "0.5", "--cold-requests", "0",
       "--workload", "U(32,96)/(8,24)")  # fmt: skip
THRESHOLD = "0.05"


def _run(work: Path, *sim: str) -> str:
    """One run of one step (c=8) against a fresh simulator; its RUN_URI."""
    with start_sim(work / "sim", *SIM, *sim) as server:
        result = run_locust(server.url, work / "runs", *RUN, timeout=90)
    assert result.returncode == 0, result.output[-3000:]
    return str(result.run_dir())


def _compare(base: str, candidate: str, out: Path) -> tuple[int, dict[str, Any]]:
    code = main(["compare", base, candidate, "--threshold", THRESHOLD, "--out", str(out),
                 "--fail-on-regression"])  # fmt: skip
    return code, json.loads((out / "compare.json").read_text())


def _regressions(doc: dict[str, Any]) -> list[str]:
    return [
        f"{c['step']} {c['metric']} {c['change']:+.1%} [{c['ci_low']}, {c['ci_high']}] {c['method']}"
        for c in doc["changes"]
        if c["regression"]
    ]


def test_a_simulator_10_percent_slower_is_significantly_slower(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    base = _run(tmp_path / "base")
    slower = _run(tmp_path / "slower", "--time-scale", "1.1")  # every engine duration x1.1
    code, doc = _compare(base, slower, tmp_path / "cmp")
    capsys.readouterr()
    assert code == 3, doc["verdicts"]
    found = {c["metric"]: c for c in doc["changes"] if c["step"] == "c=8"}
    slower_p50 = [found[m] for m in ("tpot_p50_s", "e2e_p50_s") if found[m]["regression"]]
    assert slower_p50, [found[m] for m in ("tpot_p50_s", "e2e_p50_s")]
    for change in slower_p50:
        assert change["method"] == "bootstrap" and change["ci_low"] > 0
        assert 0.05 < change["change"] < 0.2
    assert doc["method"] == "bootstrap" and doc["resamples"] == 1000 and doc["seed"] == 0


@pytest.mark.slow  # twenty runs, about three minutes: `make test-slow`
def test_repeats_of_the_same_build_are_no_regression(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    alarms: dict[int, list[str]] = {}
    for pair in range(10):
        a = _run(tmp_path / f"a{pair}")
        b = _run(tmp_path / f"b{pair}")
        code, doc = _compare(a, b, tmp_path / f"cmp{pair}")
        capsys.readouterr()
        if code:
            assert code == 3
            alarms[pair] = _regressions(doc)
    assert len(alarms) <= 1, alarms
