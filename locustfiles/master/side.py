"""The master process's side across runs: run ids, the run now going, the workers' messages.

chat.py makes one `MasterSide` per Environment (master and local runner) with the live
Board it shares with the views (locustfiles/live/board.py). Each shape start begins a run
(`begin_run`: options validated, run id chosen and handed to the workers, a RunCoordinator
pinned on the board); the handlers pass the workers' messages of locustfiles/run/protocol.py
to the coordinator of the run now going. Nothing is kept on Locust's `environment`.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import gevent

from analysis.kernel.errors import UsageError
from locustfiles.live.board import Board
from locustfiles.master.coordinator import RunCoordinator
from locustfiles.master.otlp import OtlpReceiver, split_listen
from locustfiles.options.options import from_parsed
from locustfiles.run.manifest import ProbeRecord

log = logging.getLogger("llmload.master")


RUN_ID_TRIES = 100
"""How many ids `choose_run_id` tries before it gives up and lets the preflight refuse one."""


def new_run_id() -> str:
    """Time-ordered and unique: 20261129T153012Z-1a2b3c."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


class MasterSide:
    """One Environment's master state; `coordinator` is the run now going (or the last)."""

    def __init__(
        self, environment: Any, board: Board, local_in_flight: Callable[[], int] | None = None
    ) -> None:
        self.environment = environment
        self.board = board
        self.local_in_flight = local_in_flight
        self.coordinator: RunCoordinator | None = None
        self.run_ids: set[str] = set()  # the runs of this process
        self.next_run_id: str | None = None  # the id a preflight wrote the first manifest under
        self.pending_probes: list[ProbeRecord] = []  # the preflight's, for that run's manifest
        self.otlp: OtlpReceiver | None = None  # the engine's spans, across runs (--otlp-listen)

    def start_otlp(self) -> None:
        """Receive the engine's spans (--otlp-listen) from now on, across runs; one error
        line and exit 2 when the address is not valid or cannot be bound."""
        parsed = self.environment.parsed_options
        listen = str(getattr(parsed, "otlp_listen", "") or "")
        if not listen or self.otlp is not None:
            return
        try:
            options = from_parsed(parsed)
            host, port = split_listen(options.otlp_listen)
            receiver = OtlpReceiver(host, port, linger=options.otlp_linger)
            receiver.start()
        except UsageError as exc:
            print(f"llmload: error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
        except OSError as exc:
            print(f"llmload: error: --otlp-listen {listen}: cannot listen there ({exc}); give "
                  "a free port on this host, e.g. --otlp-listen 0.0.0.0:4318", file=sys.stderr,
                  flush=True)  # fmt: skip
            sys.exit(2)
        self.otlp = receiver

    def choose_run_id(self, requested: str, taken: Callable[[str], bool] = lambda _: False) -> str:
        """The id of the next run in this process: `requested` (--run-id) or a new one.

        A new id skips ids `taken` in the events store; a requested one already used by this
        process (a web UI started twice with one --run-id) gets a suffix, -2, -3, ..., that
        neither this process nor the store holds. A requested id another process's run holds
        is returned as it is: the preflight refuses it (a run id names one run)."""
        if not requested:
            run_id = new_run_id()
            for _ in range(RUN_ID_TRIES):
                if run_id not in self.run_ids and not taken(run_id):
                    break
                run_id = new_run_id()
            return run_id
        if requested not in self.run_ids:
            return requested
        n = len(self.run_ids) + 1
        while n < len(self.run_ids) + RUN_ID_TRIES and (
            f"{requested}-{n}" in self.run_ids or taken(f"{requested}-{n}")
        ):
            n += 1
        return f"{requested}-{n}"

    def prepared(self, run_id: str, probes: list[ProbeRecord]) -> None:
        """A preflight passed for the next run (it created the manifest): its id and probes."""
        self.run_ids.add(run_id)  # this process's, even if the run never begins
        self.next_run_id = run_id
        self.pending_probes = probes

    def begin_run(self) -> RunCoordinator | None:
        """A new run: options validated, run id chosen (and handed to workers)."""
        environment = self.environment
        self.coordinator = self.board.run = None
        try:
            options = from_parsed(environment.parsed_options)
        except UsageError as exc:
            log.error("llmload: %s", exc)
            return None
        prepared = self.next_run_id  # its preflight created the manifest
        run_id = prepared or self.choose_run_id(options.run_id)
        self.next_run_id = None
        self.run_ids.add(run_id)
        environment.parsed_options.run_id = run_id  # travels to workers with the spawn message
        coordinator = RunCoordinator(environment, options, run_id, self.board,
                                     self.local_in_flight,
                                     manifest_stored=prepared is not None,
                                     otlp=self.otlp)  # fmt: skip
        coordinator.add_probes(self.pending_probes)
        self.pending_probes = []
        self.coordinator = coordinator
        self.board.run = coordinator
        log.info("llmload: run %s -> %s", run_id, options.events_uri)
        return coordinator

    def distributed(self) -> bool:
        """A master with workers (not the local runner)."""
        return hasattr(self.environment.runner, "clients")

    def with_coordinator(self, fn: Callable[[RunCoordinator], Any]) -> None:
        if self.coordinator is not None:
            fn(self.coordinator)

    def add_probes(self, probes: list[Any]) -> None:
        self.with_coordinator(lambda c: c.add_probes(probes))

    # -- the run's end -----------------------------------------------------------------
    def finish(self, local_report: dict[str, Any] | None) -> None:
        self.with_coordinator(lambda c: c.finish(local_report))

    # -- message handlers (Locust's register_message signature) ------------------------
    def on_step_query(self, environment: Any, msg: Any, **_: Any) -> None:
        self.with_coordinator(lambda c: c.answer_step_query(msg.node_id))

    def on_in_flight(self, environment: Any, msg: Any, **_: Any) -> None:
        data = msg.data if isinstance(msg.data, dict) else {}
        self.with_coordinator(lambda c: c.on_in_flight(msg.node_id, data))

    def on_hello(self, environment: Any, msg: Any, **_: Any) -> None:
        self.with_coordinator(lambda c: c.on_hello(msg.node_id, msg.data))

    def on_finished(self, environment: Any, msg: Any, **_: Any) -> None:
        self.with_coordinator(lambda c: c.on_finished(msg.node_id, msg.data))

    def on_clock_reply(self, environment: Any, msg: Any, **_: Any) -> None:
        t4 = time.time_ns()
        data = msg.data if isinstance(msg.data, dict) else {}
        self.with_coordinator(lambda c: c.on_clock_reply(msg.node_id, data, t4))

    def on_probes(self, environment: Any, msg: Any, **_: Any) -> None:
        data = msg.data if isinstance(msg.data, dict) else {}
        self.add_probes(data.get("probes") or [])
        if data.get("ready"):
            self.with_coordinator(lambda c: c.ready.add(msg.node_id))

    def local_ready(self, probes: list[Any]) -> None:
        """One process: its worker side's probes are done (the local runner's "ready")."""
        self.add_probes(probes)
        self.with_coordinator(lambda c: c.ready.add("local"))

    def on_worker_failed(self, environment: Any, msg: Any, **_: Any) -> None:
        """A worker cannot start (its tokenizer, dataset or store): stop the run."""
        data = msg.data if isinstance(msg.data, dict) else {}
        print(
            f"llmload: error: worker {data.get('worker_id', msg.node_id)} on "
            f"{data.get('host', '?')} cannot start: {data.get('error', 'unknown cause')}; "
            "the run is stopped",
            file=sys.stderr,
            flush=True,
        )
        self.environment.process_exit_code = 2
        runner = self.environment.runner
        shape = getattr(runner, "shape_greenlet", None)
        if self.coordinator is None or shape is None:  # no run going: nothing to finish
            gevent.spawn(runner.quit)
            return
        # End the run through the shape, whose next tick returns None: Locust then stops it in
        # the shape greenlet, and the finish handshake runs before any worker is told to quit.
        # Quitting from here would kill the shape greenlet; Locust's main would then send every
        # worker `quit` before the handshake, and the master would wait --finish-timeout for
        # confirmations that never come.
        self.coordinator.worker_failed(msg.node_id)
        if not getattr(self.environment.parsed_options, "headless", False):
            shape.link(lambda _: gevent.spawn(runner.quit))  # the shape only stops a web UI run
