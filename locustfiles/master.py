"""The master's side of a run: run id, manifest, step broadcasts, and the end handshake.

At test_start the master picks the run id (sent to workers with the spawn message's
options), looks at the target (`/v1/models`, `/version`, headers: is it simulated?) and
writes `manifest.json` (status running). The Staircase drives the steps; every change is
broadcast and written to the manifest. At test_stop the master asks every worker to stop,
flush its events and acknowledge (`llmload_finish` → `llmload_finished` with the sink's
report), waits up to `--finish-timeout`, and writes the final manifest.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import gevent
import gevent.event
import requests

from analysis.storage import ObjectStore, open_store
from locustfiles.manifest import RunManifest, StepRecord, WorkerInfo, write_manifest
from locustfiles.options import ChatOptions
from locustfiles.server_metrics import DEFAULT_ALLOWLIST, ServerMetricsScraper
from locustfiles.steps import MSG_STEP, Staircase

log = logging.getLogger("llmload.master")

MSG_FINISH = "llmload_finish"
MSG_FINISHED = "llmload_finished"
MSG_HELLO = "llmload_hello"


def new_run_id() -> str:
    """Time-ordered and unique: 20261129T153012Z-1a2b3c."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def probe_target(host: str, api_key: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """What the master can learn of the target without load (never raises)."""
    info: dict[str, Any] = {"url": host, "model": None, "simulated": False,
                            "server_version": None, "server_header": None}  # fmt: skip
    base = host.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = requests.get(f"{base}/v1/models", headers=headers, timeout=timeout)
        info["server_header"] = resp.headers.get("server")
        if resp.headers.get("x-llmload-simulated", "").lower() == "true":
            info["simulated"] = True
        data = resp.json().get("data") or []
        if data:
            info["model"] = data[0].get("id")
    except (requests.RequestException, ValueError, AttributeError):
        log.warning("llmload: could not list models at %s/v1/models", base)
    try:
        resp = requests.get(f"{base}/version", headers=headers, timeout=timeout)
        if resp.ok:
            body = resp.json()
            info["server_version"] = str(body.get("version")) if isinstance(body, dict) else None
            if isinstance(body, dict) and body.get("simulated"):
                info["simulated"] = True
    except (requests.RequestException, ValueError):
        pass
    return info


class RunCoordinator:
    """One per run on the master (or the local runner)."""

    def __init__(self, environment: Any, options: ChatOptions, run_id: str) -> None:
        self.environment = environment
        self.options = options
        self.run_id = run_id
        self.store: ObjectStore = open_store(options.events_uri)
        runner = environment.runner
        self.staircase = Staircase(
            options.steps,
            options.step_duration,
            options.step_warmup,
            options.cold_requests,
            announce=self._announce,
            finished_requests=lambda: runner.stats.total.num_requests,
        )
        self.current: dict[str, Any] | None = None
        self.workers: dict[str, dict[str, Any]] = {}  # client id -> hello/finished data
        self.finished: dict[str, dict[str, Any]] = {}
        self._all_finished = gevent.event.Event()
        self._expected: set[str] = set()
        self.manifest = RunManifest(
            run_id, config=options.config(), target={"url": environment.host}
        )
        self._started = False
        self.finished_at: int | None = None
        self.server_metrics: ServerMetricsScraper | None = None

    # -- steps -------------------------------------------------------------------------
    def tick(self) -> tuple[int, float] | None:
        if not self._started:  # first tick, in the shape greenlet: I/O is fine here
            self._started = True
            target = probe_target(self.environment.host or "", self.options.api_key())
            if self.options.model:
                target["model"] = self.options.model
            self.manifest.target = target
            self._write()
            self._start_server_metrics()
        return self.staircase.tick()

    def _start_server_metrics(self) -> None:
        """Scrape the target's /metrics during the run (locustfiles/server_metrics.py)."""
        if self.options.scrape_interval <= 0 or not self.environment.host:
            return
        key = self.options.api_key()
        extra = os.environ.get("LLMLOAD_SERVER_METRICS_ALLOW", "")
        self.server_metrics = ServerMetricsScraper(
            self.store,
            self.run_id,
            self.environment.host.rstrip("/") + "/metrics",
            self.options.scrape_interval,
            headers={"Authorization": f"Bearer {key}"} if key else None,
            allowlist=(*DEFAULT_ALLOWLIST, *(n.strip() for n in extra.split(",") if n.strip())),
        )
        self.server_metrics.start()

    def _announce(self, step: int, concurrency: int, cold: bool, started_at_ns: int) -> None:
        self.current = {
            "step": step,
            "concurrency": concurrency,
            "cold": cold,
            "wall_ns": started_at_ns,
        }
        self.environment.runner.send_message(MSG_STEP, self.current)
        self._write()

    def on_spawning_complete(self, user_count: int) -> None:
        self.staircase.on_spawned(user_count)
        self._write()

    def answer_step_query(self, client_id: str) -> None:
        if self.current is not None:
            self.environment.runner.send_message(MSG_STEP, self.current, client_id=client_id)

    # -- workers -----------------------------------------------------------------------
    def on_hello(self, client_id: str, data: dict[str, Any]) -> None:
        self.workers[client_id] = data

    def on_finished(self, client_id: str, data: dict[str, Any]) -> None:
        self.finished[client_id] = data
        self.workers.setdefault(client_id, data)
        if self._expected and self._expected <= set(self.finished):
            self._all_finished.set()

    def finish(self, local_report: dict[str, Any] | None = None) -> dict[str, Any]:
        """End handshake (distributed) then the final manifest. Returns it."""
        runner = self.environment.runner
        self.staircase.stop()
        if self.server_metrics is not None:
            self.server_metrics.stop()
        if local_report is not None:
            self.finished["local"] = local_report
            self.workers.setdefault("local", local_report)
        else:
            self._expected = {c.id for c in runner.clients.all if c.state != "missing"}
            runner.send_message(MSG_FINISH, {"run_id": self.run_id})
            if self._expected and not self._expected <= set(self.finished):
                self._all_finished.wait(self.options.finish_timeout)
            for data in self.finished.values():
                log.info("llmload: worker %s events: %s", data.get("worker_id"), data.get("sink"))
            missing = self._expected - set(self.finished)
            if missing:
                log.error(
                    "llmload: %d worker(s) did not confirm their events: %s",
                    len(missing),
                    sorted(missing),
                )
        status = "finished" if self.staircase.completed else "aborted"
        self.manifest.finish(status)
        self._write()
        self.finished_at = time.time_ns()
        return self.manifest.to_dict()

    # -- manifest ----------------------------------------------------------------------
    def _write(self) -> None:
        m = self.manifest
        m.steps = [StepRecord(**s) for s in self.staircase.timeline]
        m.cold_start = dict(self.staircase.cold)
        m.workers = [
            WorkerInfo(str(d.get("worker_id")), str(d.get("host")), int(d.get("pid", 0)))
            for d in self.workers.values()
            if d.get("worker_id")
        ]
        m.hosts = sorted({socket.gethostname(), *(w.host for w in m.workers)})
        try:
            write_manifest(self.store, m)
        except Exception:  # never lose the run over a manifest write: log and carry on
            log.exception("llmload: could not write the manifest of run %s", self.run_id)


def begin_run(environment: Any) -> RunCoordinator | None:
    """A new run on the master: options validated, run id chosen (and handed to workers)."""
    from analysis.errors import UsageError
    from locustfiles.options import from_parsed

    environment.llmload_coordinator = None
    try:
        options = from_parsed(environment.parsed_options)
    except UsageError as exc:
        log.error("llmload: %s", exc)
        return None
    used: set[str] = getattr(environment, "llmload_run_ids", set())
    run_id = options.run_id or new_run_id()
    if run_id in used:
        run_id = f"{run_id}-{len(used) + 1}"
    used.add(run_id)
    environment.llmload_run_ids = used
    environment.parsed_options.run_id = run_id  # travels to workers with the spawn message
    coordinator = RunCoordinator(environment, options, run_id)
    environment.llmload_coordinator = coordinator
    log.info("llmload: run %s -> %s", run_id, options.events_uri)
    return coordinator


def worker_identity() -> dict[str, Any]:
    host = socket.gethostname()
    safe = "".join(c if c.isalnum() or c in "-." else "-" for c in host)[:40]
    return {"worker_id": f"{safe}-{os.getpid()}-{uuid.uuid4().hex[:4]}", "host": host,
            "pid": os.getpid(), "started_at_ns": time.time_ns()}  # fmt: skip
