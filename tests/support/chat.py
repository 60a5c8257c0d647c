"""Helpers for end-to-end tests of the chat user: a simulator subprocess, Locust runs, results.

sim = start_sim(tmp_path, "--tokens-per-event", "1-3")     # SimProcess (context manager)
result = run_locust(sim.url, tmp_path / "runs", "--steps", "1,2", workers=2)
requests, chunks, manifest = result.events()
truth = sim.truth()                                         # {request_id: truth line}
assert_no_answered_request_lost(run_dir, truth)             # the rows a stopped run kept
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from infra.ports import free_port

ROOT = Path(__file__).parents[2]
LOCUSTFILE = ROOT / "locustfiles" / "chat.py"
BIN = Path(sys.executable).parent


def unseen_by_server(requests: pd.DataFrame, truth: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Check the events against the server's truth log, one to one; return the exceptions.

    Every request the server logged is in the events exactly once. The only event rows the
    server may lack are requests cut off by the end of the run before any response (sent in
    the last instant, they may never have been read by the server) and open-loop arrivals
    never sent (`dropped`: over the cap, or due at the stop while their worker was behind).
    """
    assert requests["request_id"].is_unique
    assert set(truth) <= set(requests["request_id"])
    unseen = requests[~requests["request_id"].isin(list(truth))]
    cut_off = unseen["status"].isin(["aborted", "dropped"])
    assert cut_off.all() and unseen["http_status"].isna().all(), unseen
    return unseen


def assert_steps_match_the_truth(
    rows: pd.DataFrame, truth: dict[str, dict[str, Any]], summary: dict[str, Any]
) -> None:
    """The report's per-step request counts (summary.json; the cold group as -1) are the
    server's: every request it logged, in its step, plus only the rows it could not have
    seen (`unseen_by_server`); steps cold, 0 and 1."""
    unseen = unseen_by_server(rows, truth)
    step_of = rows.set_index("request_id")["step"].astype(int)
    truth_per_step = Counter(int(step_of[rid]) for rid in truth) + Counter(
        unseen["step"].astype(int)
    )
    report_per_step = {(-1 if r["group"] == "cold" else int(r["step"])): r["requests_total"]
                       for r in summary["steps"]}  # fmt: skip
    assert report_per_step == truth_per_step and set(truth_per_step) == {-1, 0, 1}


def run_requests(run: Path) -> pd.DataFrame:
    """Every request row of a run in a local events folder: its requests parts, as written."""
    files = sorted((run / "requests").rglob("*.parquet"))
    return pd.concat([pq.read_table(f, partitioning=None).to_pandas() for f in files])


def assert_no_answered_request_lost(run: Path, truth: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Every request the server's truth log holds as answered (a finish reason) is a request
    row of the run, and no row is there twice; returns the rows."""
    rows = run_requests(run)
    recorded = set(rows["request_id"])
    answered = {rid for rid, row in truth.items() if row.get("finish_reason")}
    assert answered and answered <= recorded, sorted(answered - recorded)[:5]
    assert rows["request_id"].is_unique
    return rows


class SimProcess:
    """`llmload sim` on a free port with a truth log; stopped (SIGTERM) on exit."""

    def __init__(self, workdir: Path, *args: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.truth_path = workdir / "truth.jsonl"
        port_file = workdir / "sim.port"
        self.log_path = workdir / "sim.log"
        cmd = [str(BIN / "llmload"), "sim", "--port", "0", "--port-file", str(port_file),
               "--profile", "tiny", "--truth-log", str(self.truth_path), *args]  # fmt: skip
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"simulator did not start: {self.log_path.read_text()}")
            time.sleep(0.05)
        self.port = int(port_file.read_text().strip())
        self.url = f"http://127.0.0.1:{self.port}"

    def truth(self) -> dict[str, dict[str, Any]]:
        """The server's log of load requests by id (the workers' `probe-*` requests left out)."""
        return {rid: row for rid, row in self.raw_truth().items() if not rid.startswith("probe-")}

    def raw_truth(self) -> dict[str, dict[str, Any]]:
        """Every request the server logged (generation routes: POSTs), probes included. Read
        while the server runs, the last line may be half written: only whole lines count."""
        text = self.truth_path.read_text() if self.truth_path.exists() else ""
        lines = text.split("\n")[:-1]  # the piece after the last newline is not whole yet
        out: dict[str, dict[str, Any]] = {}
        for line in filter(None, lines):
            row = json.loads(line)
            out[row["request_id"]] = row
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_sim(workdir: Path, *args: str) -> SimProcess:
    return SimProcess(workdir, *args)


@dataclass
class LocustResult:
    returncode: int
    output: str
    events_dir: Path

    def run_dir(self) -> Path:
        runs = sorted(p for p in self.events_dir.iterdir() if p.is_dir())
        assert len(runs) == 1, f"expected one run in {self.events_dir}, found {runs}"
        return runs[0]

    def events(self) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
        run = self.run_dir()
        manifest = json.loads((run / "manifest.json").read_text())

        def read(table: str) -> pd.DataFrame:
            files = sorted((run / table).rglob("*.parquet")) if (run / table).exists() else []
            if not files:
                return pd.DataFrame()
            tables = [pq.read_table(f, partitioning=None).to_pandas() for f in files]
            return pd.concat(tables, ignore_index=True)

        return read("requests"), read("chunks"), manifest


def reap(proc: subprocess.Popen[str], timeout: float = 10) -> str:
    """Kill `proc` if it still runs, wait for it and close its pipes; returns what it had
    still to say. A pipe left open (a process killed, or waited for, after a failed check)
    is closed by the garbage collector at some later moment, and its ResourceWarning then
    fails whichever test is running (filterwarnings = error)."""
    if proc.poll() is None:
        proc.kill()
    out, _ = proc.communicate(timeout=timeout)
    return out or ""


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `check` every 0.1 s until it returns something true (returned), or fail after
    `timeout` s naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def start_master(
    master_port: int,
    host: str,
    work: Path,
    *args: str,
    workers: int,
    env: dict[str, str],
    cwd: Path | None = None,
) -> subprocess.Popen[str]:
    """A headless Locust master of the chat user on loopback, expecting `workers` workers:
    steps 2,4 of 60 s unless `args` say otherwise, events under work/runs, its spool in
    work/spool (stdout and stderr piped)."""
    return subprocess.Popen(
        [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--master",
         "--master-bind-host", "127.0.0.1", "--master-bind-port", str(master_port),
         "--expect-workers", str(workers), "--expect-workers-max-wait", "30", "--host", host,
         "--events-uri", str(work / "runs"), "--steps", "2,4", "--step-duration", "60",
         "--step-warmup", "1", "--cold-requests", "0", "--spool-dir", str(work / "spool"),
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
    )  # fmt: skip


def start_worker(
    master_port: int,
    env: dict[str, str],
    cwd: Path | None = None,
    locustfile: Path = LOCUSTFILE,
) -> subprocess.Popen[str]:
    """A Locust worker process of the chat user on loopback (stdout and stderr piped)."""
    return subprocess.Popen(
        [str(BIN / "locust"), "-f", str(locustfile), "--worker", "--master-host", "127.0.0.1",
         "--master-port", str(master_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
    )  # fmt: skip


def run_locust(
    host: str,
    events_dir: Path,
    *args: str,
    workers: int = 0,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    locustfile: Path = LOCUSTFILE,
) -> LocustResult:
    """A headless llmload run: local, or a master with `workers` worker processes on loopback
    (`locustfile`: the chat user's, or a user's own on llmload: docs/extending.md)."""
    base = [str(BIN / "locust"), "-f", str(locustfile), "--headless", "--only-summary",
            "--host", host, "--events-uri", str(events_dir), "--spool-dir", str(events_dir) + ".spool", *args]  # fmt: skip
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    procs: list[subprocess.Popen[str]] = []
    if workers:
        port = free_port()
        base += ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                 "--expect-workers", str(workers), "--expect-workers-max-wait", "30"]  # fmt: skip
        procs += [start_worker(port, full_env, locustfile=locustfile) for _ in range(workers)]
    try:
        out = subprocess.run(
            base,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            stdin=subprocess.DEVNULL,
        )
        output = out.stdout + out.stderr
        code = out.returncode
    finally:
        for p in procs:
            try:
                # a worker flushes and uploads before it exits: a loaded machine takes longer
                worker_out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                worker_out, _ = p.communicate()
            output += "\n--- worker ---\n" + (worker_out or "")
    return LocustResult(code, output, events_dir)


TRIP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "days"],
    "additionalProperties": False,
}  # fmt: skip
"""A small JSON Schema for `--response-format json_schema:FILE` (tests of valid outputs)."""
