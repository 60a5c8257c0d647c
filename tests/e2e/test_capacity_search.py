"""Capacity search against a simulated engine whose saturation point follows from its parameters.

The engine runs at most SEQS sequences; every decode step takes DECODE_MS whatever the batch,
and each request asks for OUTPUT tokens (ignore_eos): a request holds a slot for about
OUTPUT * DECODE_MS, so the engine saturates at SEQS concurrent requests, or at
SEQS / (OUTPUT * DECODE_MS) requests/s. Beyond that, requests queue for a slot and TTFT jumps
from one decode step to a large part of a request's time: an SLO on TTFT p99 well between the
two finds the saturation point.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.chat import run_locust, start_sim

pytestmark = pytest.mark.slow  # about 80 s: `make test-slow`

SEQS = 8
DECODE_MS = 10
OUTPUT = 20
SIM = ("--max-num-seqs", str(SEQS), "--decode-base-ms", str(DECODE_MS), "--decode-per-seq-us", "0",
       "--decode-per-kv-token-ns", "0", "--prefill-per-token-us", "10")  # fmt: skip
SLO = "ttft_p99=0.08"  # one decode step meets it; waiting for a slot (up to 200 ms) does not
RUN = ("--workload", f"D(16,{OUTPUT})", "--step-duration", "3", "--step-warmup", "0.5",
       "--cold-requests", "0", "--slo", SLO, "--search-min-requests", "40")  # fmt: skip


def _search(tmp: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    with start_sim(tmp, *SIM) as sim:
        result = run_locust(sim.url, tmp / "runs", *RUN, *args, timeout=240)
    manifest = json.loads((result.run_dir() / "manifest.json").read_text())
    return result.returncode, manifest, result.output


def test_a_concurrency_search_finds_the_engines_batch_limit(tmp_path: Path) -> None:
    code, manifest, output = _search(tmp_path, "--search", "concurrency", "--steps", "2,4,16")
    assert code == 0, output[-3000:]
    search = manifest["search"]
    assert search["mode"] == "concurrency" and search["slo"] == SLO
    assert search["status"] == "found", search
    # at SEQS + 1 users the one without a slot waits for the first of 8 staggered requests to
    # end: often less than the SLO's 80 ms, so that level may pass too; beyond it, never
    assert search["result"]["level"] in (SEQS, SEQS + 1), search["probes"]
    phases = [p["phase"] for p in search["probes"]]
    assert phases[:3] == ["coarse"] * 3 and set(phases[3:]) == {"bisect"}
    # every probe is a step of the run's timeline, at its level
    steps = {s["step"]: s for s in manifest["steps"]}
    assert [steps[p["step"]]["concurrency"] for p in search["probes"]] == [
        p["level"] for p in search["probes"]
    ]
    assert manifest["config"]["slo"] == SLO


def test_a_rate_search_finds_the_engines_saturation_rate(tmp_path: Path) -> None:
    capacity = SEQS / (OUTPUT * DECODE_MS / 1000)  # 40 requests/s
    code, manifest, output = _search(
        tmp_path, "--search", "rate", "--rates", "10,20,80", "--arrival", "constant"
    )
    assert code == 0, output[-3000:]
    search = manifest["search"]
    assert search["status"] == "found", search
    assert search["result"]["level"] == pytest.approx(capacity, rel=0.10), search["probes"]
    steps = {s["step"]: s for s in manifest["steps"]}
    assert all(steps[p["step"]]["rate"] == p["level"] for p in search["probes"])
    # the report: the run's own SLO, exact verdicts beside the live ones, the result's goodput
    from analysis import build_report

    runs = tmp_path / "runs"
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    report = build_report(str(run_dir), tmp_path / "report", progress=False, html=True)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["slo"]["source"] == "run" and summary["slo"]["spec"] == SLO
    found = summary["search"]
    assert found["result"]["level"] == search["result"]["level"]
    assert found["result"]["requests_per_s"] > 0
    assert all(isinstance(p["passed_exact"], bool) for p in found["probes"])
    assert report.best_rate is not None
    assert "Capacity search" in (tmp_path / "report" / "report.md").read_text()


def test_even_the_lowest_level_failing_exits_3(tmp_path: Path) -> None:
    code, manifest, output = _search(tmp_path, "--search", "rate", "--rates", "80,160")
    assert code == 3, output[-3000:]
    assert manifest["search"]["status"] == "lowest_failed"
    assert [p["level"] for p in manifest["search"]["probes"]] == [80.0]
    assert manifest["search"]["result"] is None
    assert "even the lowest level (80) missed the SLO" in output
