"""Validity verdicts of real runs against the simulator: a quiet run is valid; a worker asked
for more arrivals than one process can send is client-limited, and `--fail-on-invalid`
says so with its exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.chat import ROOT, run_locust, start_sim

SIM = ("--decode-base-ms", "5", "--decode-per-seq-us", "0", "--decode-per-kv-token-ns", "0")
SHORT = ("--step-warmup", "0.5", "--cold-requests", "0", "--workload", "D(16,4)")


def _report(run_dir: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infra", "report", str(run_dir), "--out", str(out),
                           "--quiet", "--no-html", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)  # fmt: skip


def test_a_worker_asked_for_more_than_it_can_send_is_client_limited(tmp_path: Path) -> None:
    with start_sim(tmp_path, *SIM) as server:
        # one process sent ~5,000 of these short arrivals/s at most here (4,000/s it kept up with
        # at slip p99 3-9 ms, its CPU saturated): 12,000/s is far beyond it (slip p99 ~2 s)
        result = run_locust(server.url, tmp_path / "runs", "--rates", "12000", "--arrival",
                            "constant", "--step-duration", "3", *SHORT, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    done = _report(result.run_dir(), tmp_path / "out", "--fail-on-invalid")
    assert done.returncode == 4, done.stdout + done.stderr
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    step = doc["steps"][0]
    assert doc["verdict"]["verdict"] == step["verdict"] == "client-limited", doc["verdict"]
    # the generator was late (slip) and its worker saturated: both are named
    assert "send slip p99" in step["verdict_reasons"], step["verdict_reasons"]
    assert "the run's verdict is client-limited" in done.stderr


# latencies of a small real engine: TTFT ~0.3 s (prefill), 32 tokens 20 ms apart
ENGINE = ("--prefill-per-token-us", "1000", "--decode-base-ms", "20", "--decode-per-seq-us", "0",
          "--decode-per-kv-token-ns", "0", "--prefix-cache", "off")  # fmt: skip


@pytest.mark.alone  # quiet means no other test's load beside it: its stalls would be real
def test_a_quiet_run_is_valid(tmp_path: Path) -> None:
    # The worker's loop does stall a few ms now and then (more on a VM whose CPU is slow to
    # wake), and a stall can delay a TTFT by its length; against these latencies that is
    # under the 5% `moved` limit, so the stalls are notes, and the run is valid
    with start_sim(tmp_path, *ENGINE) as server:
        result = run_locust(server.url, tmp_path / "runs", "--steps", "4", "--step-duration",
                            "6", "--step-warmup", "1", "--cold-requests", "0", "--workload",
                            "D(300,32)", timeout=120)  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    done = _report(result.run_dir(), tmp_path / "out", "--fail-on-invalid")
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert done.returncode == 0, (doc["verdict"], done.stderr)
    assert doc["verdict"]["verdict"] == "valid" and doc["verdict"]["reasons"] == []
    assert not [w for w in doc["warnings"] if "saturated" in w or "overlapped a stall" in w]
