"""A worker process's side of the protocol: start a run's WorkerContext, follow the steps,
answer the master's clock exchanges, flush and acknowledge at the end.

chat.py makes one `WorkerSide` per Environment (workers and the local runner) and registers
its handlers for the messages of locustfiles/run/protocol.py. What a worker keeps between
messages lives here, passed explicitly, not on Locust's `environment`.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import gevent
from locust.exception import RPCError
from locust.runners import MasterRunner, WorkerRunner

from analysis.kernel.errors import LlmloadError
from locustfiles.live.groups import Observer
from locustfiles.options import options as chat_options
from locustfiles.request import sse
from locustfiles.request.record import RequestRecord
from locustfiles.run.protocol import (
    MSG_CLOCK_REPLY,
    MSG_FINISHED,
    MSG_HELLO,
    MSG_IN_FLIGHT,
    MSG_PROBES,
    MSG_STEP_QUERY,
    MSG_WORKER_FAILED,
    StepState,
    kernel_boot_id,
)
from locustfiles.run.service import Service
from locustfiles.sink.checks import check_store_reachable
from locustfiles.worker.context import WorkerContext

log = logging.getLogger("llmload")


def worker_identity() -> dict[str, Any]:
    host = socket.gethostname()
    safe = "".join(c if c.isalnum() or c in "-." else "-" for c in host)[:40]
    return {"worker_id": f"{safe}-{os.getpid()}-{uuid.uuid4().hex[:4]}", "host": host,
            "pid": os.getpid(), "started_at_ns": time.time_ns(),
            "sse_reader": sse.implementation(), "boot_id": kernel_boot_id()}  # fmt: skip


class WorkerSide:
    """One Environment's worker state: the step it follows and the run's WorkerContext.

    `observer`: where each finished request goes for the live statistics; `on_record`:
    Locust's request event for it; `local_probes`: in one process (the local runner), where
    the worker's probes go (the master's coordinator), instead of a message.
    """

    def __init__(
        self,
        environment: Any,
        observer: Observer | None,
        on_record: Callable[[RequestRecord], None],
        local_probes: Callable[[list[dict[str, Any]]], None] | None = None,
        services: Callable[[], Service] | None = None,
    ) -> None:
        self.environment = environment
        self.observer = observer
        self.on_record = on_record
        self.local_probes = local_probes
        self.services = services  # a user's own service (run/service.py), else None
        self.step = StepState()
        self.context: WorkerContext | None = None

    @property
    def runner(self) -> Any:
        return self.environment.runner

    # -- a run's start and end ---------------------------------------------------------
    def start(self) -> None:
        """test_start: this worker's context for the run (options from the spawn message)."""
        runner = self.runner
        identity = worker_identity()
        parsed = self.environment.parsed_options
        try:
            options = chat_options.from_parsed(parsed)
            run_id = parsed.run_id
            check_store_reachable(options, run_id)
            ctx = WorkerContext(
                options,
                run_id,
                identity,
                self.environment.host or "",
                getattr(runner, "worker_index", 0) or 0,
                self.step,
                report_probes=self._probe_reporter(),
                live=self.observer,
                on_record=self.on_record,
                report_in_flight=self._in_flight_reporter(),
                cannot_start=lambda cause: self._cannot_start(identity, cause),
                services=self.services,
            )
        except LlmloadError as exc:  # this worker cannot send: the run must not go on without it
            self._cannot_start(identity, str(exc))
            return
        except Exception as exc:  # e.g. its spool directory: the same, with the exception named
            # one line names the cause (_cannot_start); the traceback only at debug level
            log.debug("llmload: worker start-up failed", exc_info=True)
            self._cannot_start(identity, f"{type(exc).__name__}: {exc}")
            return
        self.context = ctx
        if isinstance(runner, WorkerRunner):
            runner.send_message(MSG_HELLO, ctx.identity)
            runner.send_message(MSG_STEP_QUERY, {})
        ctx.probe_soon()  # now, not at the first request: a rate step's clock waits for it

    def _cannot_start(self, identity: dict[str, Any], cause: str) -> None:
        """Tell the master (or, in one process, stop the run) and exit non-zero."""
        runner = self.runner
        line = f"worker {identity['worker_id']} on {identity['host']} cannot start: {cause}"
        print(f"llmload: error: {line}", file=sys.stderr, flush=True)
        self.environment.process_exit_code = 2
        if isinstance(runner, WorkerRunner):
            try:
                runner.send_message(MSG_WORKER_FAILED, {**identity, "error": cause})
            except RPCError:
                log.error("llmload: could not tell the master that this worker cannot start")
        gevent.spawn_later(0.2, runner.quit)

    def close(self) -> dict[str, Any] | None:
        """Stop sending, flush the events; the sink's report (None: no run was started).
        Events not all in the store (left in the spool, or lost): this process exits 1."""
        ctx = self.context
        if ctx is None:
            return None
        report = ctx.close(ctx.options.finish_timeout)
        sink = report.get("sink") or {}
        if not sink.get("complete", True) and not getattr(
            self.environment, "process_exit_code", None
        ):
            self.environment.process_exit_code = 1
        return report

    def on_quitting(self) -> None:
        """The process is quitting (a SIGTERM to a worker, its master gone, Locust's own SIGTERM
        handler on a local run): stop the users first, so their requests in flight are
        recorded `aborted` before the sink flushes (appended after its close, they would be
        dropped: a local autostarted run lost a request's rows so, now and then)."""
        runner = self.runner
        if not isinstance(runner, MasterRunner) and runner.state not in (
            "stopped",
            "ready",
            "cleanup",
        ):
            runner.stop()  # its test_stop closes the sink (chat.py); close() then returns that
        self.close()

    def in_flight(self) -> int:
        """Requests in flight (the local runner's master asks while it drains)."""
        return self.context.in_flight() if self.context is not None else 0

    def _probe_reporter(self) -> Callable[[list[dict[str, Any]]], None]:
        """Where this worker's probes go: to the master by message, or straight to the run."""
        runner = self.runner
        if not isinstance(runner, WorkerRunner):
            return self.local_probes or (lambda probes: None)

        def send(probes: list[dict[str, Any]]) -> None:
            try:  # "ready": its probes are done (the master starts a rate step's clock then)
                runner.send_message(MSG_PROBES, {"probes": probes, "ready": True})
            except RPCError:  # they travel again with the finish report
                log.warning("llmload: could not send the probes to the master")

        return send

    def _in_flight_reporter(self) -> Callable[[int, int], None] | None:
        """A worker's report of its requests in flight while the master drains a pause (the
        local runner's master asks its context directly)."""
        runner = self.runner
        if not isinstance(runner, WorkerRunner):
            return None
        return lambda pause_id, n: runner.send_message(
            MSG_IN_FLIGHT, {"pause_id": pause_id, "in_flight": n}
        )

    # -- message handlers (Locust's register_message signature) ------------------------
    def on_step(self, environment: Any, msg: Any, **_: Any) -> None:
        runner = self.runner  # a worker's share of a rate step is keyed by its client id
        client_id = runner.client_id if isinstance(runner, WorkerRunner) else None
        self.step.update(msg.data, client_id)

    def on_clock(self, environment: Any, msg: Any, **_: Any) -> None:
        """Answer the master's clock exchange with this worker's wall time at receipt."""
        t2 = time.time_ns()
        data = msg.data if isinstance(msg.data, dict) else {}
        try:
            self.runner.send_message(MSG_CLOCK_REPLY, {"t1": data.get("t1"), "t2": t2})
        except RPCError:
            log.warning("llmload: could not answer the master's clock exchange")

    def on_clock_offset(self, environment: Any, msg: Any, **_: Any) -> None:
        """The master's best estimate of this worker's clock offset (open-loop starts)."""
        data = msg.data if isinstance(msg.data, dict) else {}
        if isinstance(data.get("offset_ns"), int):
            self.step.offset_ns = data["offset_ns"]

    def on_finish(self, environment: Any, msg: Any, **_: Any) -> None:
        """The master is ending the run: stop users, flush events, acknowledge."""
        runner = self.runner
        if runner.state not in ("stopped", "ready", "cleanup"):
            runner.stop()
        report = self.close() or {"worker_id": None, "sink": None}
        runner.send_message(MSG_FINISHED, report)
