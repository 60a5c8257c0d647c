"""One run on the master: the manifest, step broadcasts, and the end handshake.

At test_start the master picks the run id (sent to workers with the spawn message's
options), looks at the target (`/v1/models`, `/version`, headers: is it simulated?) and
writes `manifest.json` (status running). The Staircase drives the steps; every change is
broadcast and written to the manifest. At test_stop the master asks every worker to stop,
flush its events and acknowledge (`llmload_finish` → `llmload_finished` with the sink's
report), waits up to `--finish-timeout`, and writes the final manifest.

Worker clocks are measured by WorkerClocks (locustfiles/master/clocks.py); the run id is chosen
by MasterSide (locustfiles/master/side.py); the target is looked at by probe_target
(locustfiles/master/target.py).
Probes (the master's and the workers', `llmload_probes`) are listed under `probes`.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import gevent.event

from analysis.kernel.storage import ObjectExistsError, ObjectStore, open_store
from locustfiles.live.board import Board
from locustfiles.master.accelerator import AcceleratorScraper
from locustfiles.master.cachephase import CachePhase
from locustfiles.master.clocks import WorkerClocks
from locustfiles.master.otlp import OtlpReceiver
from locustfiles.master.search import plan_for
from locustfiles.master.server_metrics import DEFAULT_ALLOWLIST, ServerMetricsScraper
from locustfiles.master.staircase import Staircase
from locustfiles.master.target import probe_target
from locustfiles.options.options import ChatOptions
from locustfiles.options.rules import DRAIN_TIMEOUT_S
from locustfiles.run.manifest import (
    ProbeRecord,
    RunManifest,
    StepRecord,
    WorkerInfo,
    write_manifest,
)
from locustfiles.run.probe import PROBE_TIMEOUT_S
from locustfiles.run.protocol import MSG_FINISH, MSG_STEP, kernel_boot_id
from locustfiles.sink.checks import store_reason
from locustfiles.sink.eventsink import default_spool_dir
from locustfiles.traffic.workloads import WorkloadKind

log = logging.getLogger("llmload.master")

FINISH_MARGIN_S = 5.0
"""Beyond --finish-timeout (a worker sink's own bound to flush), how long the master waits
for a worker's finish report to arrive."""

SINK_ERRORS_KEPT = 5  # first messages of a worker's sink report kept in the manifest


class RunCoordinator:
    """One per run on the master (or the local runner)."""

    def __init__(
        self,
        environment: Any,
        options: ChatOptions,
        run_id: str,
        board: Board | None = None,
        local_in_flight: Callable[[], int] | None = None,
        *,
        manifest_stored: bool = False,
        otlp: OtlpReceiver | None = None,
    ) -> None:
        """`manifest_stored`: the preflight created this run's manifest (the first write
        replaces it); otherwise the first write creates it and never replaces another run's.
        `otlp`: the master's receiver of the engine's spans (--otlp-listen), if any."""
        self.environment = environment
        self.board = board if board is not None else Board()  # what the live views read
        self.local_in_flight = local_in_flight  # one process: its dispatcher's requests
        self.options = options
        self.run_id = run_id
        self.store: ObjectStore = open_store(options.events_uri)
        runner = environment.runner
        self.plan = plan_for(options)
        self.staircase = Staircase(
            options.steps,
            options.step_duration,
            options.step_warmup,
            options.cold_requests,
            announce=self._announce,
            finished_requests=lambda: runner.stats.total.num_requests,
            plan=self.plan,
            mode=options.mode,
            open_loop={
                "arrival": options.arrival,
                "max_concurrency": options.max_concurrency,
                "over_cap": options.over_cap,
            },  # fmt: skip
            workers=self._sharing_clients_count,
            step_stats=self._step_stats,
            not_ready=self._not_ready,
            pause=self._pause,
            in_flight=self._in_flight,
            drain_timeout_s=min(options.request_timeout, DRAIN_TIMEOUT_S),
            before_step=self._cache_phase,
        )  # fmt: skip
        self.cache_phase = CachePhase(options, environment.host or "",
                                      model=lambda: self.manifest.target.get("model"),
                                      note=self.add_probes)  # fmt: skip
        self._pause_id = 0
        self._in_flight_reports: dict[str, tuple[int, int]] = {}  # client -> (pause id, n)
        self.current: dict[str, Any] | None = None
        self.workers: dict[str, dict[str, Any]] = {}  # client id -> hello/finished data
        self.ready: set[str] = set()  # clients whose probes are done ("local": one process)
        self.finished: dict[str, dict[str, Any]] = {}
        self._all_finished = gevent.event.Event()
        self._expected: set[str] = set()
        self._failed: set[str] = set()  # workers that could not start (they quit on their own)
        self.manifest = RunManifest(
            run_id, config=options.config(), target={"url": environment.host}
        )
        self.manifest.stored = manifest_stored
        self._foreign_manifest = False  # the id's manifest is another run's: never written
        self._manifest_failure: str | None = None  # why the latest manifest write failed
        self._started = False
        self.finished_at: int | None = None
        self.server_metrics: ServerMetricsScraper | None = None
        self.accelerator_metrics: AcceleratorScraper | None = None
        self.otlp = otlp
        self.engine_cold: dict[str, Any] | None = None  # the engine's start-up spans
        self.worker_clocks = WorkerClocks(runner.send_message)
        self.boot_id = kernel_boot_id()  # the master's kernel: a worker's hello may share it
        self.probes: dict[str, ProbeRecord] = {}  # request id -> probe (master's and workers')

    # -- steps -------------------------------------------------------------------------
    def tick(self) -> tuple[int, float] | None:
        if not self._started:  # first tick, in the shape greenlet: I/O is fine here
            self._started = True
            probes: list[ProbeRecord] = []
            target = probe_target(self.environment.host or "", self.options.api_key(),
                                  probes=probes)  # fmt: skip
            self.add_probes(probes)
            if self.options.model:
                target["model"] = self.options.model
                if self.options.model_mix.several:
                    target["models"] = self.options.model_mix.shares()
            self.manifest.target = target
            self._write()
            self._start_server_metrics()
            self._start_accelerator_metrics()
            if self.otlp is not None:
                spool = self.options.spool_dir
                self.otlp.begin_run(self.store, self.run_id,
                                    Path(spool) if spool else default_spool_dir())  # fmt: skip
                self.manifest.spans = {"listen": self.otlp.listen}
            if self.distributed:
                self.worker_clocks.start(lambda: self.workers)
        return self.staircase.tick()

    def _start_server_metrics(self) -> None:
        """Scrape the target's /metrics during the run (locustfiles/master/server_metrics.py)."""
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

    def _start_accelerator_metrics(self) -> None:
        """Scrape the accelerators' telemetry during the run (locustfiles/master/accelerator.py):
        --accelerator-metrics, every --scrape-interval (2 s where that is 0: off for the
        target's own metrics only)."""
        source = self.options.accelerator_metrics
        if not source:
            return
        if source == "target":  # the target serves the series on its own /metrics
            if not self.environment.host:
                return
            source = self.environment.host.rstrip("/") + "/metrics"
        interval = self.options.scrape_interval or 2.0
        self.accelerator_metrics = AcceleratorScraper(self.store, self.run_id, source, interval)
        self.accelerator_metrics.start()
        self.manifest.accelerator = {"source": source, "kind": self.accelerator_metrics.kind,
                                     "interval_s": interval}  # fmt: skip

    def _announce(self, step: int, concurrency: int, cold: bool, started_at_ns: int,
                  entry: dict[str, Any] | None = None) -> None:  # fmt: skip
        ended = self.current
        if ended is not None:  # e.g. the console's step line (locustfiles/live/console.py)
            self.board.end_step(ended)
        self.current = {
            "step": step,
            "concurrency": concurrency,
            "cold": cold,
            "wall_ns": started_at_ns,
        }
        if entry is not None and entry.get("rate") is not None:
            # open loop: the schedule, and who sends which share of it (arrival i goes to
            # the client at position i % count); each worker moves the start onto its clock
            clients = self._sharing_clients()
            entry["share_workers"] = clients  # client ids; the manifest names the workers
            self.current.update(
                rate=entry["rate"], arrival=entry["arrival"], over_cap=entry["over_cap"],
                max_concurrency=entry["max_concurrency"], starts_at_ns=started_at_ns,
                seed=self.options.seed, share_count=len(clients),
                shares={c: i for i, c in enumerate(clients)},
                offsets={c: self.clocks[c][0] for c in clients if c in self.clocks},
            )  # fmt: skip
        self.environment.runner.send_message(MSG_STEP, self.current)
        self._write()

    def _cache_phase(self, step: int) -> dict[str, Any] | None:
        """Flush and/or prime the engine's prefix cache before `step` (--cache-phase)."""
        return self.cache_phase.run(step)

    def _pause(self, step: int) -> None:
        """Workers send nothing new (a rate search drains a failed level, or the last step
        ended) until the next step or the run's end; their requests in flight finish."""
        self._pause_id += 1
        self.current = {"step": step, "concurrency": 0, "cold": False, "paused": True,
                        "pause_id": self._pause_id, "wall_ns": time.time_ns()}  # fmt: skip
        self.environment.runner.send_message(MSG_STEP, self.current)
        self._write()

    def on_in_flight(self, client_id: str, data: dict[str, Any]) -> None:
        try:
            self._in_flight_reports[client_id] = (int(data["pause_id"]), int(data["in_flight"]))
        except (KeyError, TypeError, ValueError):
            log.warning("llmload: ignored a malformed in-flight report from %s", client_id)

    def _in_flight(self) -> int | None:
        """Requests still in flight during a pause (None: not every worker said)."""
        if not self.distributed:  # one process: ask its dispatcher
            return self.local_in_flight() if self.local_in_flight is not None else 0
        total = 0
        for client in self._sharing_clients():
            pause_id, n = self._in_flight_reports.get(client, (-1, -1))
            if pause_id != self._pause_id:
                return None
            total += n
        return total

    def _sharing_clients(self) -> list[str]:
        """The clients that share a rate step's arrivals, in share order ("local": one process)."""
        clients = getattr(self.environment.runner, "clients", None)
        if clients is None:
            return ["local"]
        return sorted(c.id for c in clients.all if c.state != "missing")

    def _not_ready(self) -> list[str]:
        """The sharing clients not yet ready for a rate step's schedule: their clock offset
        unmeasured (a worker process) or their probes not done (`ready`, MSG_PROBES)."""
        return [c for c in self._sharing_clients()
                if (c != "local" and c not in self.clocks) or c not in self.ready]  # fmt: skip

    def _sharing_clients_count(self) -> int:
        return len(self._sharing_clients())

    def _step_stats(self, step: int | None) -> tuple[Any, int]:
        """A step's live statistics (what the search judges) and its finished requests."""
        live = self.board.stats
        if live is None or step is None:
            return None, 0
        live.step_summary(step)  # merges what the workers reported
        group = live.groups.get(("step", int(step)))
        if group is None:
            return None, 0
        return group, group.count("ok") + group.count("error")

    def on_spawning_complete(self, user_count: int) -> None:
        self.staircase.on_spawned(user_count)
        self._write()

    def answer_step_query(self, client_id: str) -> None:
        if self.current is not None:
            self.environment.runner.send_message(MSG_STEP, self.current, client_id=client_id)

    # -- workers -----------------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        """A master with workers (not the local runner, whose worker shares its clock)."""
        return hasattr(self.environment.runner, "clients")

    def on_hello(self, client_id: str, data: dict[str, Any]) -> None:
        self.workers[client_id] = data
        if data.get("boot_id") and data["boot_id"] == self.boot_id:
            self.worker_clocks.same_kernel.add(client_id)  # one wall clock (clocks.py)
        gevent.spawn(self.worker_clocks.burst, client_id)  # handlers must return at once

    def stop_for_signal(self, name: str) -> None:
        """A signal asks the run to stop: the run ends at the next tick, as `aborted`, with the
        signal in the manifest; the finish handshake then flushes every worker's events."""
        self.manifest.stopped_by = name
        self.staircase.stop()

    def waiting_for(self) -> str:
        """What the run's end is waiting for (a second signal prints it)."""
        if self.finished_at is not None:
            return "nothing: the run is finished; the process is exiting"
        pending = sorted(self._expected - set(self.finished))
        if pending:
            names = ", ".join(self._describe(c) for c in pending)
            return f"{len(pending)} worker(s) to flush their events and confirm: {names}"
        if not self.distributed:
            return "this process's users to stop and its event sink to flush to the store"
        return "the step to end and the workers to be asked for their events"

    def worker_failed(self, client_id: str) -> None:
        """A worker cannot start: the run ends at the next tick (the shape's end does the
        finish handshake before any worker is told to quit); that worker quits on its own,
        so its confirmation is not awaited."""
        self._failed.add(client_id)
        self.staircase.stop()

    def on_finished(self, client_id: str, data: dict[str, Any]) -> None:
        self.finished[client_id] = data
        self.workers.setdefault(client_id, data)
        self.add_probes(data.get("probes") or [])
        if self._expected and self._expected <= set(self.finished):
            self._all_finished.set()

    def add_probes(self, probes: list[Any]) -> None:
        """Probes for the manifest (ProbeRecords or their dicts); a probe listed twice counts once."""
        for probe in probes:
            try:
                record = probe if isinstance(probe, ProbeRecord) else ProbeRecord.from_dict(probe)
            except (AttributeError, TypeError):
                log.warning("llmload: ignored a malformed probe report: %r", probe)
                continue
            self.probes.setdefault(record.request_id, record)

    # -- worker clocks -----------------------------------------------------------------
    @property
    def clocks(self) -> dict[str, tuple[int, int]]:
        """Each worker's best (offset, round trip) in ns (locustfiles/master/clocks.py)."""
        return self.worker_clocks.best

    def on_clock_reply(self, client_id: str, data: dict[str, Any], t4: int | None = None) -> None:
        self.worker_clocks.on_reply(client_id, data, t4)

    def finish(self, local_report: dict[str, Any] | None = None) -> dict[str, Any]:
        """End handshake (distributed) then the final manifest. Returns it (once: a second
        call, e.g. Locust's test_stop after llmload finished the run on quitting, only
        returns it)."""
        if self.finished_at is not None:
            return self.manifest.to_dict()
        runner = self.environment.runner
        self.staircase.stop()
        if self.server_metrics is not None:
            self.server_metrics.stop()
        if self.accelerator_metrics is not None:
            scraper = self.accelerator_metrics
            scraper.stop()
            self.manifest.accelerator = {**(self.manifest.accelerator or {}),
                                         "samples": scraper.samples, "failures": scraper.failures,
                                         "parts": scraper.parts, "absent": scraper.absent}  # fmt: skip
        self.worker_clocks.stop()
        if local_report is not None:
            self.finished["local"] = local_report
            self.workers.setdefault("local", local_report)
            self.clocks["local"] = (0, 0)  # one process, one clock
            self.add_probes(local_report.get("probes") or [])
        else:
            clients = {c.id for c in runner.clients.all if c.state != "missing"}
            self._expected = clients - self._failed
            runner.send_message(MSG_FINISH, {"run_id": self.run_id})
            if self._expected and not self._expected <= set(self.finished):
                # a worker's sink may take all of --finish-timeout, then its report travels
                self._all_finished.wait(self.options.finish_timeout + FINISH_MARGIN_S)
            for data in self.finished.values():
                log.info("llmload: worker %s events: %s", data.get("worker_id"), data.get("sink"))
            # also those that took part and went missing (no heartbeat) before the end
            missing = sorted((self._expected | set(self.workers)) - set(self.finished))
            if missing:
                log.error(
                    "llmload: %d worker(s) did not confirm their events: %s",
                    len(missing),
                    ", ".join(self._describe(c) for c in missing),
                )
        if self.otlp is not None and self.otlp.run is not None:
            spans = self.otlp.end_run()  # lingers for the engine's late batches
            self.engine_cold = spans.pop("engine", None)
            self.manifest.spans = spans
        status = "finished" if self.staircase.completed else "aborted"
        # not when the run already failed for a cause it named (a worker that cannot start)
        stopped_for = getattr(self.environment, "process_exit_code", None)
        if local_report is None and self.workers and not self.finished and not stopped_for:
            # No worker confirmed its events: all lost (Locust then stops the run as if
            # asked to) or none flushed in time. A failure (exit 1), not an early stop.
            lost = ", ".join(self._describe(c) for c in sorted(self.workers))
            self._fail(
                f"no worker confirmed its events ({lost}); they were lost or did not flush "
                "within --finish-timeout: the report is incomplete until their spools are "
                "uploaded (llmload upload-spool)"
            )
        elif local_report is None and not self.workers and not stopped_for:
            # Workers connected (Locust counted them ready) but none began the run: all went
            # missing before their hello, e.g. too many processes for the cores (each
            # worker's start is CPU work; a heartbeat lapsed for Locust's 3 s)
            gone = len(getattr(runner.clients, "missing", []) or [])
            self._fail(
                f"no worker began the run ({gone} went missing: no heartbeat for 3 s) and "
                "no request was sent; a machine whose cores are all busy starves its workers' "
                "heartbeats: run one worker process per core (docs/campaigns.md, Sizing)"
            )
        sent = sum(int(d.get("sent") or 0) for d in self.finished.values())
        if self.finished and not sent and not stopped_for:
            # e.g. start-up probes of a slow target outlasting the steps: not a run to report
            self._fail(self._nothing_sent())
        # Workers whose events did not all reach the store (a full disk, the store down at
        # their close): the run is incomplete, a failure too (exit 1) unless one is named.
        for data in self.finished.values():
            if left := events_left_behind(data):
                self._fail(left)
        if getattr(self.plan, "status", None) == "lowest_failed":
            log.error("llmload: capacity search: even the lowest level (%g) missed the SLO %s",
                      self.options.levels[0], self.options.slo)  # fmt: skip
            self.environment.process_exit_code = 3
        self.manifest.finish(status)
        self._write()
        if self._manifest_failure is not None:
            self._fail(
                f"its final manifest is not in the events store {self.options.events_uri} "
                f"({self._manifest_failure}); the report reads the parts without it (the "
                "run's steps and status as of the last manifest written)"
            )
        self.finished_at = time.time_ns()
        return self.manifest.to_dict()

    def _nothing_sent(self) -> str:
        """Why no request was sent: the workers still starting (reading a large workload,
        then probing) when the steps ended, or probes that outlasted the steps."""
        starting = [c for c in sorted(self.finished) if c not in self.ready]
        workload = self.options.workload
        if starting and workload.kind is not WorkloadKind.LENGTHS:
            return (f"no request was sent before the steps ended: {len(starting)} of "
                    f"{len(self.finished)} worker(s) had not finished starting (reading the "
                    f"workload {workload.spec}, then probing the target): give a smaller "
                    "file or trace window (--trace-duration), or longer steps "
                    "(--step-duration)")  # fmt: skip
        return (
            "no request was sent before the steps ended (each worker first probes the "
            f"target, up to {PROBE_TIMEOUT_S:g} s a probe: see the manifest's probes); give "
            "longer steps (--step-duration) or check that the target answers promptly"
        )

    def _fail(self, why: str) -> None:
        """The run failed for `why`: one `llmload: error:` line, and exit 1 unless the run
        already has an exit status (a cause named before)."""
        print(f"llmload: error: run {self.run_id}: {why}", file=sys.stderr, flush=True)
        if not getattr(self.environment, "process_exit_code", None):
            self.environment.process_exit_code = 1

    def _describe(self, client_id: str) -> str:
        """A worker as a person finds it: its id and host, and whether the master lost it."""
        hello = self.workers.get(client_id) or {}
        name = f"{hello.get('worker_id') or client_id} on {hello.get('host') or '?'}"
        if client_id in self._expected:
            return name
        missing = {c.id for c in self.environment.runner.clients.missing}
        return f"{name} ({'lost: no heartbeat' if client_id in missing else 'left the run'})"

    # -- manifest ----------------------------------------------------------------------
    def _write(self) -> None:
        m = self.manifest
        m.steps = [StepRecord(**self._named(s)) for s in self.staircase.timeline]
        m.cold_start = dict(self.staircase.cold)
        if self.engine_cold is not None:
            m.cold_start["engine"] = self.engine_cold
        m.workers = [
            self._worker_info(client_id, d)
            for client_id, d in self.workers.items()
            if d.get("worker_id")
        ]
        m.probes = list(self.probes.values())
        m.search = self.plan.to_dict()
        m.stopped = self.plan.stopped  # --stop-when overloaded skipped the levels left
        m.hosts = sorted({socket.gethostname(), *(w.host for w in m.workers)})
        if self._foreign_manifest:
            return
        try:
            write_manifest(self.store, m)
        except ObjectExistsError:  # a run id names one run: leave the other run's manifest
            self._foreign_manifest = True
            log.error("llmload: error: run %s already exists in the events store %s; its "
                      "manifest is left as it is: choose another --run-id, or leave --run-id "
                      "out for a generated one", self.run_id, self.options.events_uri)  # fmt: skip
        except Exception as exc:  # never lose the run over a manifest write: say it, carry on
            reason = store_reason(exc)
            log.debug("llmload: manifest write failed", exc_info=True)
            if reason != self._manifest_failure:  # once per cause, not at every step
                log.error("llmload: could not write the manifest of run %s to %s (%s); it is "
                          "written again at the next step and at the end", self.run_id,
                          self.options.events_uri, reason)  # fmt: skip
            self._manifest_failure = reason
        else:
            if self._manifest_failure is not None:
                log.warning("llmload: the manifest of run %s is written again", self.run_id)
            self._manifest_failure = None

    def _named(self, step: dict[str, Any]) -> dict[str, Any]:
        """A timeline entry with its share clients named by worker id (known after hello)."""
        clients = step.get("share_workers")
        if not clients:
            return step
        names = [str(self.workers.get(c, {}).get("worker_id") or c) for c in clients]
        return {**step, "share_workers": names}

    def _worker_info(self, client_id: str, hello: dict[str, Any]) -> WorkerInfo:
        clock = self.clocks.get(client_id)
        sink = (self.finished.get(client_id) or {}).get("sink")
        sink = sink if isinstance(sink, dict) else None
        errors = sink.get("errors") if sink else None
        return WorkerInfo(
            str(hello.get("worker_id")),
            str(hello.get("host")),
            int(hello.get("pid", 0)),
            clock_offset_ms=round(clock[0] / 1e6, 3) if clock else None,
            clock_rtt_ms=round(clock[1] / 1e6, 3) if clock else None,
            rows_rejected=int(sink.get("rejected_rows") or 0) if sink else None,
            rows_dropped=int(sink.get("dropped_rows") or 0) if sink else None,
            sink_errors=tuple(str(e) for e in errors[:SINK_ERRORS_KEPT]) if errors else (),
            sse_reader=str(hello["sse_reader"]) if hello.get("sse_reader") else None,
        )


def events_left_behind(finished: dict[str, Any]) -> str | None:
    """What a worker's finish report says did not reach the store, in a sentence (None: its
    events are all there): parts waiting in its spool, rows lost before they were spooled."""
    sink = finished.get("sink")
    if not isinstance(sink, dict):
        return None
    parts = int(sink.get("pending_parts") or 0)
    memory = sink.get("memory_rows") if sink.get("closed") else None
    lost = {t: n for t, n in (memory or {}).items() if n}
    if not parts and not lost:
        return None
    spool = sink.get("spool_dir")
    said = []
    if parts:
        rows = sum((sink.get("spool_rows") or {}).values())
        said.append(f"{rows} rows in {parts} parts wait in its spool {spool}: send them with "
                    f"`llmload upload-spool {spool} --events-uri {sink.get('events_uri') or 'URI'}`")  # fmt: skip
    if lost:
        counts = ", ".join(f"{n} {table} rows" for table, n in lost.items())
        said.append(f"{counts} were lost (never written to its spool {spool})")
    worker = finished.get("worker_id") or "?"
    return f"worker {worker}'s events are incomplete in the store: {'; '.join(said)}"
