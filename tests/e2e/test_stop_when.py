"""`--stop-when overloaded`: a staircase against a simulated engine that saturates at SEQS
concurrent sequences stops within two steps of saturation, and says so in the manifest and
the report.

Every decode step takes DECODE_MS whatever the batch and each request asks for OUTPUT tokens
(ignore_eos): up to SEQS users the token throughput doubles with the users and TTFT stays at
about one decode step; beyond, the throughput stays flat and the requests wait for a slot
(TTFT grows to a large part of a request's time): the rule's "throughput flat, TTFT grew".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.chat import BIN, run_locust, start_sim

pytestmark = pytest.mark.slow  # about 70 s: `make test-slow`

SEQS = 8
DECODE_MS = 10
OUTPUT = 20
SIM = ("--max-num-seqs", str(SEQS), "--decode-base-ms", str(DECODE_MS), "--decode-per-seq-us", "0",
       "--decode-per-kv-token-ns", "0", "--prefill-per-token-us", "10")  # fmt: skip
LEVELS = (1, 2, 4, 8, 16, 32, 64)
RUN = ("--workload", f"D(16,{OUTPUT})", "--steps", ",".join(map(str, LEVELS)),
       "--step-duration", "3", "--step-warmup", "0.5", "--cold-requests", "0",
       "--stop-when", "overloaded")  # fmt: skip


def test_a_staircase_stops_within_two_steps_of_saturation(tmp_path: Path) -> None:
    with start_sim(tmp_path, *SIM) as sim:
        result = run_locust(sim.url, tmp_path / "runs", *RUN, timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    run_dir = result.run_dir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    stopped = manifest["stopped"]
    assert stopped is not None, manifest["steps"]
    # saturation at level 8 (step 3): stopped after the step of level 16 or 32 at the latest
    assert stopped["level"] in (8, 16, 32), stopped
    assert stopped["after_step"] == LEVELS.index(stopped["level"])
    assert stopped["skipped_levels"] == list(LEVELS[stopped["after_step"] + 1 :])
    assert "throughput flat" in stopped["reason"] and "TTFT p50 ×" in stopped["reason"]
    assert stopped["rule"] == {"ttft_factor": 2.0, "min_growth": 0.1, "overload_rate": 0.01}
    assert [s["concurrency"] for s in manifest["steps"]] == list(
        LEVELS[: stopped["after_step"] + 1]
    )
    assert "stopped after step" in result.output

    out = tmp_path / "report"
    report = subprocess.run([str(BIN / "llmload"), "report", str(run_dir), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    line = f"stopped after step {stopped['after_step']} (concurrency {stopped['level']})"
    assert line in (out / "report.md").read_text()
    skipped = ", ".join(map(str, stopped["skipped_levels"]))
    assert f"skipped levels {skipped}" in (out / "report.md").read_text()
    assert line in (out / "report.html").read_text()
    assert json.loads((out / "summary.json").read_text())["stopped"] == stopped


def test_without_stop_when_every_step_runs(tmp_path: Path) -> None:
    with start_sim(tmp_path, *SIM) as sim:
        result = run_locust(sim.url, tmp_path / "runs", "--workload", f"D(16,{OUTPUT})",
                            "--steps", "4,16", "--step-duration", "2", "--step-warmup", "0.5",
                            "--cold-requests", "0", timeout=120)  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    manifest = json.loads((result.run_dir() / "manifest.json").read_text())
    assert manifest["stopped"] is None
    assert [s["concurrency"] for s in manifest["steps"]] == [4, 16]


def test_a_capacity_search_ends_its_coarse_phase_at_saturation(tmp_path: Path) -> None:
    # an SLO every level meets: without the rule the coarse phase would climb to 64
    args = ("--workload", f"D(16,{OUTPUT})", "--steps", "2,4,8,16,32,64", "--step-duration", "3",
            "--step-warmup", "0.5", "--cold-requests", "0", "--search", "concurrency",
            "--slo", "ttft_p99=10", "--search-min-requests", "20", "--search-precision", "0.2",
            "--stop-when", "overloaded")  # fmt: skip
    with start_sim(tmp_path, *SIM) as sim:
        result = run_locust(sim.url, tmp_path / "runs", *args, timeout=180)
    assert result.returncode == 0, result.output[-3000:]
    manifest = json.loads((result.run_dir() / "manifest.json").read_text())
    stopped, search = manifest["stopped"], manifest["search"]
    assert stopped is not None and stopped["level"] in (16, 32), search["probes"]
    assert 64 in stopped["skipped_levels"]
    probes = {p["level"]: p for p in search["probes"]}
    assert 64 not in probes
    assert probes[stopped["level"]]["passed"] is True
    assert probes[stopped["level"]]["overloaded"] == stopped["reason"]
    assert search["status"] == "found" and search["result"]["level"] < stopped["level"]
    assert "capacity search: the coarse phase stopped after step" in result.output
