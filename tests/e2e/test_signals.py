"""SIGTERM and SIGINT stop a run the normal way (issue 20 item 1): a headless run and a master
with workers end their run as `aborted` with the signal named, every worker flushes, the
final index and manifest are written, one line is printed, and the process exits 128 + the
signal. Nothing the simulator's truth log answered is missing from the events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infra.ports import free_port
from tests.support.chat import (
    BIN,
    LOCUSTFILE,
    assert_no_answered_request_lost,
    reap,
    start_sim,
    start_worker,
    wait_for,
)

ARGS = ("--steps", "2,4", "--step-duration", "60", "--step-warmup", "0", "--cold-requests", "0",
        "--workload", "D(16,64)")  # fmt: skip


def _run_and_signal(
    tmp_path: Path,
    sig: signal.Signals,
    workers: int,
    worker_first: bool = False,
    mode: tuple[str, ...] = ("--headless",),
) -> None:
    """A run signalled once `sig` (its master), after SIGTERM to its first worker if
    `worker_first`; every request the simulator answered is in the events, once."""
    events = tmp_path / "runs"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with start_sim(tmp_path / "sim", "--decode-base-ms", "5") as sim:
        cmd = [str(BIN / "locust"), "-f", str(LOCUSTFILE), *mode, "--only-summary",
               "--host", sim.url, "--events-uri", str(events),
               "--spool-dir", str(tmp_path / "spool"), *ARGS]  # fmt: skip
        procs: list[subprocess.Popen[str]] = []
        if workers:
            port = free_port()
            cmd += ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port",
                    str(port), "--expect-workers", str(workers)]  # fmt: skip
            procs = [start_worker(port, env) for _ in range(workers)]
        master = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
        out = ""
        try:
            wait_for(lambda: len(sim.truth()) >= 20, 60, "requests answered by the simulator")
            time.sleep(1)
            if worker_first:  # the worker stops its users, flushes and leaves; the run goes on
                procs[0].send_signal(signal.SIGTERM)
                procs[0].wait(30)
                answered = len(sim.truth())
                wait_for(lambda: len(sim.truth()) >= answered + 10, 60, "the other worker")
            master.send_signal(sig)
            out, _ = master.communicate(timeout=90)
        finally:
            reap(master)
            worker_codes = []
            for proc in procs:
                try:
                    proc.communicate(timeout=30)
                finally:
                    reap(proc)
                worker_codes.append(proc.returncode)
        truth = sim.truth()
    output = out or ""
    assert master.returncode == 128 + sig, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith(f"llmload: {sig.name}")]
    assert len(lines) == 1 and "stopping the run" in lines[0], output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    (run,) = [p for p in events.iterdir() if p.is_dir()]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "aborted" and manifest["stopped_by"] == sig.name
    indexes = [json.loads(p.read_text()) for p in (run / "index").glob("*.json")]
    assert len(indexes) == max(1, workers) and all(i["final"] for i in indexes)
    rows = assert_no_answered_request_lost(run, truth)
    assert set(rows["status"]) <= {"ok", "aborted"}
    assert worker_codes[worker_first:] == [0] * (workers - worker_first)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_stops_a_headless_run_and_keeps_every_answered_request(
    tmp_path: Path, sig: signal.Signals
) -> None:
    _run_and_signal(tmp_path, sig, workers=0)


@pytest.mark.slow  # long (10-20 s): `make test-slow` keeps the default suite near 10 min
def test_sigterm_on_a_master_flushes_its_workers(tmp_path: Path) -> None:
    _run_and_signal(tmp_path, signal.SIGTERM, workers=2)


def test_sigterm_on_a_worker_keeps_its_requests(tmp_path: Path) -> None:
    _run_and_signal(tmp_path, signal.SIGTERM, workers=2, worker_first=True)


def test_sigterm_on_an_autostarted_web_ui_run_ends_it_and_exits(tmp_path: Path) -> None:
    web = ("--autostart", "--web-host", "127.0.0.1", "--web-port", str(free_port()))
    _run_and_signal(tmp_path, signal.SIGTERM, workers=0, mode=web)
