"""`llmload campaign` and `llmload demo` end to end: real processes, a real S3 store.

The campaign test holds the report against the simulated engine's truth log: every request
the server saw is counted in the report, in the step its request row names. The demo tests
watch every process the demo starts and check that none outlives it, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import psutil
import pytest

from analysis import load_run
from tests.support.chat import reap, start_sim, unseen_by_server
from tests.support.store import S3Target

LLMLOAD = str(Path(sys.executable).parent / "llmload")


def _campaign_file(path: Path, url: str, events_uri: str) -> Path:
    path.write_text(
        f"""
name: e2e
target: {{url: "{url}"}}
workload: "0.5*D(24,12)+0.5*U(8,40)/(4,20)"
steps: [1, 2]
step_duration: 2.5
step_warmup: 0.5
cold_requests: 2
workers: 2
worker_wait: 30
events_uri: {events_uri}
slo: ttft_p99=10,ttft=10
engine:
  hardware: "loopback test box"
  revision: "r123"
"""
    )
    return path


@pytest.mark.slow  # long (10-20 s): `make test-slow` keeps the default suite near 10 min
def test_campaign_report_counts_every_request_the_engine_saw(
    tmp_path: Path, s3_target: S3Target
) -> None:
    with start_sim(tmp_path / "sim", "--tokens-per-event", "1-3") as sim:
        config = _campaign_file(tmp_path / "c.yaml", sim.url, s3_target.uri)
        out = subprocess.run(
            [LLMLOAD, "campaign", str(config), "--out", str(tmp_path / "reports")],
            capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        truth = sim.truth()
    assert out.returncode == 0, out.stdout + out.stderr
    (run_dir,) = (tmp_path / "reports").iterdir()
    run_id = run_dir.name
    assert run_id.startswith("e2e-")
    assert (
        "SIMULATED" in out.stdout and f"report: {run_dir.resolve() / 'report.html'}" in out.stdout
    )
    # The events' request rows map each truth id to its step.
    run = load_run(f"{s3_target.uri}/{run_id}", progress=False)
    assert run.manifest["status"] == "finished" and run.manifest["target"]["simulated"]
    assert len(run.manifest["workers"]) == 2
    config = run.manifest["config"]
    assert (config["hardware"], config["revision"], config["campaign"]) == (
        "loopback test box", "r123", "e2e",
    )  # fmt: skip
    step_of = run.requests.set_index("request_id")["step"].astype(int)
    unseen = unseen_by_server(run.requests, truth)  # cut off at the end before the server read them
    truth_per_step = Counter(int(step_of[rid]) for rid in truth) + Counter(
        unseen["step"].astype(int)
    )
    assert set(truth_per_step) == {-1, 0, 1}
    # The report: per step, its rows (requests.parquet) and its summary count match the truth.
    per_request = pd.read_parquet(run_dir / "requests.parquet")
    assert Counter(per_request["step"].astype(int)) == truth_per_step
    summary = json.loads((run_dir / "summary.json").read_text())
    report_per_step = {
        (-1 if row["group"] == "cold" else int(row["step"])): row["requests_total"]
        for row in summary["steps"]
    }
    assert report_per_step == truth_per_step
    assert sum(report_per_step.values()) == len(truth) + len(unseen) == len(per_request)
    assert summary["simulated"] is True and summary["slo"]["failed"] is False


def test_invalid_campaign_exits_2_with_one_line_and_starts_nothing(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "target: {url: 'http://127.0.0.1:9'}\nworkload: 'D(8,4)'\n"
        f"events_uri: {tmp_path / 'runs'}\nreport_dir: {tmp_path / 'reports'}\nworkers: lots\n"
    )
    out = subprocess.run(
        [LLMLOAD, "campaign", str(config)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1
    assert "key 'workers' must be a number of local worker processes >= 1, 'auto'" in out.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "reports").exists()


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_a_bad_workers_option_exits_2_with_one_line(tmp_path: Path, value: str) -> None:
    out = subprocess.run(
        [LLMLOAD, "campaign", str(Path(__file__).parents[2] / "examples" / "sim-campaign.yaml"), "--workers", value],
        capture_output=True, text=True, timeout=30, cwd=tmp_path,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.count("\n") == 1 and "--workers must be 'auto'" in out.stderr
    assert f"not {value!r}" in out.stderr and not (tmp_path / "runs").exists()


class _Watcher:
    """Every descendant of a process, recorded while it runs (they may exit at any time)."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.seen: dict[int, tuple[float, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                children = self.root.children(recursive=True)
            except psutil.Error:
                children = []
            # One child exiting mid-look must not hide the others, and a child is looked at
            # again on every pass: one caught between fork and exec still shows its parent's
            # command line (CI once recorded the demo's weed process as "llmload demo").
            for child in children:
                with contextlib.suppress(psutil.Error):
                    self.seen[child.pid] = (child.create_time(), " ".join(child.cmdline()))
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def kinds(self) -> str:
        return " ".join(cmd for _, cmd in self.seen.values())

    def alive(self) -> list[str]:
        out = []
        for pid, (created, cmd) in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{pid}: {cmd}")
            except psutil.NoSuchProcess:
                pass
        return out


def _demo(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], _Watcher]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [LLMLOAD, "demo", "--out", str(tmp_path / "demo"), "--profile", "tiny", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, _Watcher(proc.pid)


def test_demo_prints_the_summary_and_stops_everything_it_started(tmp_path: Path) -> None:
    proc, watcher = _demo(
        tmp_path, "--steps", "1,2", "--step-duration", "2", "--step-warmup", "0.5",
        "--cold-requests", "1",
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        reap(proc)
        watcher.stop()
    assert proc.returncode == 0, stdout + stderr
    for kind in ("weed", " sim ", "--master", "--worker"):
        assert kind in watcher.kinds(), f"no {kind!r} process seen: {watcher.kinds()}"
    assert not watcher.alive()
    assert "SIMULATED" in stdout.splitlines()[0]
    assert "| step | concurrency | requests |" in stdout and "| cold | 1 |" in stdout
    (run_dir,) = (tmp_path / "demo").iterdir()
    assert f"report: {run_dir.resolve() / 'report.html'}" in stdout
    assert (run_dir / "report.html").is_file()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("llmload-demo-")]
    assert not leftovers  # the store's data and the spool went with it


@pytest.mark.slow  # 20 s each: `make test-slow`
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_demo_interrupted_stops_everything_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    proc, watcher = _demo(tmp_path, "--steps", "1,2", "--step-duration", "60")
    try:
        deadline = time.monotonic() + 30
        while "--worker" not in watcher.kinds() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # the run is under way
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=45)
    finally:
        reap(proc)
        watcher.stop()
    assert proc.returncode == 130, stdout + stderr
    assert "--worker" in watcher.kinds()
    assert not watcher.alive()
    assert "interrupted" in stderr


def test_demo_with_a_bad_option_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [LLMLOAD, "demo", "--out", str(tmp_path / "demo"), "--steps", "0,2"],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "key 'steps' must be a list of integers" in out.stderr
    assert list(tmp_path.iterdir()) == []
