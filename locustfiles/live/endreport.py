"""The report at the end of a run, built on the master from the stored events.

After the coordinator's finish (every worker has flushed its events and the final manifest
is written), the master:
- headless: prints the `llmload report <run_uri>` command and, with `--report-dir DIR`,
  builds the report into DIR before Locust exits;
- web UI: builds it in the background into `--report-dir DIR/<run_id>` (or a temporary
  directory) and serves it at `/llmload/report` (locustfiles/live/webtab.py).

The build is `llmload report RUN_URI --out DIR` (analysis.build_report) in a child process:
the master's event loop keeps answering the web UI and the workers' heartbeats while pandas
and matplotlib work, and nothing of the analysis runs under gevent's monkey-patching.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.kernel.storage import join_uri
from locustfiles.live.board import Board

log = logging.getLogger("llmload.endreport")

STDERR_KEPT = 2000  # characters of a failed build's output shown as its error


@dataclass
class ReportJob:
    """One run's report build: status building, done or failed (with the error)."""

    run_id: str
    run_uri: str
    out_dir: Path
    status: str = "pending"
    error: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    proc: Any = field(default=None, repr=False)

    @property
    def command(self) -> str:
        return f"llmload report {self.run_uri}"

    @property
    def html(self) -> Path:
        return self.out_dir / "report.html"

    def run(self) -> None:
        """Build (blocks the calling greenlet only: the child process does the work)."""
        self.status, self.started_at = "building", time.time()
        cmd = [sys.executable, "-m", "infra", "report", self.run_uri,
               "--out", str(self.out_dir), "--quiet"]  # fmt: skip
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
            output, _ = self.proc.communicate()
        except OSError as exc:
            self._end("failed", f"could not start the report build: {exc}")
            return
        text = output.decode("utf-8", "replace").strip()
        if self.proc.returncode == 0 and self.html.exists():
            self._end("done", None)
        else:
            self._end("failed", text[-STDERR_KEPT:] or f"exit status {self.proc.returncode}")

    def _end(self, status: str, error: str | None) -> None:
        self.status, self.error, self.ended_at = status, error, time.time()
        if status == "done":
            log.info("llmload: report of run %s written to %s", self.run_id, self.out_dir)
        else:
            log.error("llmload: the report of run %s failed: %s", self.run_id, error)

    def to_dict(self) -> dict[str, Any]:
        now = self.ended_at or time.time()
        return {
            "run_id": self.run_id,
            "run_uri": self.run_uri,
            "status": self.status,
            "error": self.error,
            "out_dir": str(self.out_dir),
            "command": self.command,
            "elapsed_s": round(now - self.started_at, 1) if self.started_at else None,
        }


def new_job(coordinator: Any, report_dir: str, per_run: bool, *, build: bool = True) -> ReportJob:
    """The job of a finished coordinator's run; `per_run`: a folder per run under report_dir.
    Without a report_dir, a job to `build` gets a temporary folder; one only printed gets
    none (`llmload report`'s default folder, not made here)."""
    run_id = coordinator.run_id
    run_uri = join_uri(coordinator.options.events_uri, run_id)
    if report_dir:
        out = Path(report_dir) / run_id if per_run else Path(report_dir)
    elif build:
        out = Path(tempfile.mkdtemp(prefix=f"llmload-report-{run_id}-"))
    else:
        out = Path(f"llmload-report-{run_id}")
    return ReportJob(run_id, run_uri, out)


class Reports:
    """The reports built on this master, by run id (the web UI serves them)."""

    def __init__(self) -> None:
        self.jobs: dict[str, ReportJob] = {}
        self.latest: str | None = None

    def get(self, run_id: str | None = None) -> ReportJob | None:
        """The report of `run_id`, or of the latest run (None: no report yet)."""
        return self.jobs.get(run_id or self.latest or "")

    def add(self, job: ReportJob) -> None:
        self.jobs[job.run_id] = job
        self.latest = job.run_id

    def stop_building(self) -> None:
        """The master is quitting: end a report build still running (never leave it behind)."""
        for job in self.jobs.values():
            proc = job.proc
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


def _finished_run(board: Board) -> Any:
    run = board.run
    if run is None or run.finished_at is None:
        return None  # the run never began (bad options), or its finish did not run
    return run


def on_run_end_headless(board: Board) -> ReportJob | None:
    """Headless: print the command; with --report-dir build the report now, before exiting."""
    coordinator = _finished_run(board)
    if coordinator is None:
        return None
    report_dir = coordinator.options.report_dir
    job = new_job(coordinator, report_dir, per_run=False, build=bool(report_dir))
    print(f"llmload: make the report with: {job.command}", flush=True)
    if not report_dir:
        return None
    job.run()
    if job.status == "done":
        print(f"llmload: report written to {job.out_dir}/report.html", flush=True)
    else:
        print(f"llmload: error: the report could not be built: {job.error}", file=sys.stderr,
              flush=True)  # fmt: skip
    return job


def on_run_end_web(board: Board, reports: Reports) -> ReportJob | None:
    """Web UI: build the report in the background; /llmload/report serves its status, then it."""
    import gevent

    coordinator = _finished_run(board)
    if coordinator is None:
        return None
    job = new_job(coordinator, coordinator.options.report_dir, per_run=True)
    reports.add(job)
    job.status = "building"
    gevent.spawn(job.run)
    return job


def _headless_end(environment: Any, board: Board) -> None:
    """A report that --report-dir asked for and that could not be built fails the run (exit
    1, unless it already has a status): its error line alone left exit 0 before."""
    job = on_run_end_headless(board)
    if (
        job is not None
        and job.status != "done"
        and not getattr(environment, "process_exit_code", None)
    ):
        environment.process_exit_code = 1


def register(environment: Any, board: Board, reports: Reports) -> None:
    """Master: after the run's finish (register after chat.py's test_stop listener)."""
    if getattr(environment, "web_ui", None) is not None:
        environment.events.test_stop.add_listener(lambda **_: on_run_end_web(board, reports))
    else:
        environment.events.test_stop.add_listener(lambda **_: _headless_end(environment, board))
    environment.events.quitting.add_listener(lambda **_: reports.stop_building())
