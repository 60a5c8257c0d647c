"""A worker's side of a run: its sink and self-monitor, and each request sent and recorded.

One WorkerContext per worker process and run, made at test_start (after Locust has handed
the master's options to the worker, after any fork). What to send comes from its
RequestBuilder (building.py); what the target is and how to speak to it, from its
TargetView (target.py: the probes before the first request). Here a request is sent, timed,
observed for the live view, checked for refusals, and its rows go to the sink.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import gevent.lock
import urllib3

from locustfiles.live.groups import Observer, Recorder
from locustfiles.options.options import ChatOptions
from locustfiles.request.client import Limits, classify_status, execute, new_pool
from locustfiles.request.errors import (
    TIMEOUT,
    describe,
    no_completion,
    refused_status,
    transport_kind,
)
from locustfiles.request.exchange import HttpStatusError
from locustfiles.request.record import RequestRecord, new_request_id
from locustfiles.request.sse import kernel_skew_ns
from locustfiles.request.validity import OutputCheck
from locustfiles.run.protocol import StepState
from locustfiles.run.secrets import redact, redact_logs, run_secrets
from locustfiles.run.service import Ask, HookFailed, Service, prepare
from locustfiles.sink.eventsink import EventSink, SinkConfig
from locustfiles.sink.warmup import (
    freeze_gc,
    pyarrow_without_pandas,
    steady_allocator,
    warm_up,
)
from locustfiles.traffic.sessions import TOOLS, Session, Turn
from locustfiles.worker.building import RequestBuilder
from locustfiles.worker.monitor import LoopMonitor
from locustfiles.worker.openloop import Arrival, Dispatcher
from locustfiles.worker.target import TargetView

log = logging.getLogger("llmload.worker")

REFUSED_AT_START = 5
"""A worker whose first this many requests were all refused as such (4xx but 408/429, and
none answered otherwise in between) stops the run: every request would be (a worker's own
API key, a dataset's requests that the preflight's short request did not show)."""

IN_FLIGHT_REPORT_S = 0.25
"""While paused, how often a worker tells the master its requests in flight."""

_perf_ns = time.perf_counter_ns


class RequestFailed(Exception):
    """Given to Locust's request event so its stats show the failure kind."""


class WorkerContext:
    def __init__(
        self,
        options: ChatOptions,
        run_id: str,
        identity: dict[str, Any],
        host: str,
        worker_index: int,
        step: StepState,
        report_probes: Callable[[list[dict[str, Any]]], None] | None = None,
        live: Observer | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        report_in_flight: Callable[[int, int], None] | None = None,
        cannot_start: Callable[[str], None] | None = None,
        services: Callable[[], Service] | None = None,
    ) -> None:
        self.options = options
        # a user's own service (run/service.py): the open loop's users come from here; the
        # built-in endpoint's probes of the target do not run
        self.services = services
        # the rows' endpoint: the built-in --endpoint's, or the service's name
        self.endpoint = (services().endpoint_name() if services is not None else None) or (
            options.endpoint
        )
        self.cannot_start = cannot_start  # the target refuses every request: the run must stop
        self.run_id = run_id
        self.identity = identity
        self.worker_id: str = identity["worker_id"]
        self.step = step
        self.build = RequestBuilder(options, worker_index)  # what to send (building.py)
        # what each answer is checked against: the format asked for, the tools offered
        offered = TOOLS if options.tool_rate > 0 else []
        self.checks = (OutputCheck(options.response_format, offered)
                       if options.response_format is not None or offered else None)  # fmt: skip
        self.limits = Limits(
            connect_timeout=options.connect_timeout,
            request_timeout=options.request_timeout,
            ttft_timeout=options.ttft_timeout,
            stall_timeout=options.stall_timeout,
            max_event_bytes=options.max_event_bytes,
        )
        self._secrets = run_secrets(options.api_key_env)
        redact_logs(self._secrets)  # this process's log, Locust's failure lines included
        self.target = TargetView(  # the probes and what they learned (target.py)
            options, host.rstrip("/"), self.worker_id, self.limits, self.build.prompts,
            self._secrets, report_probes, cannot_start, probing=services is None,
        )  # fmt: skip
        self.models = options.model_mix.sampler(options.seed, worker_index)  # each request's
        self._first_refused: int | None = 0  # refusals before any other answer; None: answered
        self.halted: str | None = None  # why this worker sends no more (the run is stopping)
        self.live: Observer = live if live is not None else Recorder()  # live.py
        self._close_lock = gevent.lock.Semaphore()
        config = SinkConfig(
            events_uri=options.events_uri,
            run_id=run_id,
            worker_id=self.worker_id,
            store_prompts=options.store_prompts,
            secret_names=(options.api_key_env,),
        )
        if options.spool_dir:
            config = dataclasses.replace(config, spool_dir=Path(options.spool_dir))
        pyarrow_without_pandas()  # before pyarrow's first array: no pandas (warmup.py)
        steady_allocator()  # before the sink makes any table (warmup.py)
        self.sink = EventSink(config)
        self.sink.start()
        try:
            # everything slow done once now, before the first measured request (warmup.py)
            seconds = warm_up(self.sink.encode_context)
            skew = kernel_skew_ns()  # measured once, before any request (sse.py)
            if skew:
                log.warning("llmload: this process's clock runs %.1f ms from the kernel's "
                            "(a user-space clock shift); kernel receive times are moved by it",
                            skew / 1e6)  # fmt: skip
            log.info("llmload: encoding and Parquet warmed up in %.2f s", seconds)
            if options.gc_freeze:
                freeze_gc()
            self.monitor = LoopMonitor(
                on_sample=lambda row: self.sink.append_row("samples", row),
                on_stall=lambda row: self.sink.append_row("stalls", row),
            ).start()
        except BaseException:  # this worker cannot start: its sink must not live on
            self.sink.close(timeout=5)
            raise
        self.sink_report: dict[str, Any] | None = None
        self.sent = 0
        self.cold_sent = 0
        self.dispatcher: Dispatcher | None = None
        if options.mode == "rate":  # open loop: this worker's share of each rate step
            self.dispatcher = Dispatcher(self, step, on_record)
        self.busy = 0  # closed-loop users in a request or a session (ChatUser.chat)
        self._report_in_flight = report_in_flight  # (pause id, in flight) to the master
        self._reporter: gevent.Greenlet | None = None
        step.listeners.append(self._on_step)

    def in_flight(self) -> int:
        """What this worker has in flight: the dispatcher's requests (an open-loop session
        counts once) and the closed-loop users busy with a request or a session."""
        return self.busy + (len(self.dispatcher.requests) if self.dispatcher is not None else 0)

    def _on_step(self) -> None:
        """A pause (a search draining a failed rate level, or the end of the last step):
        report the requests in flight to the master until it is over."""
        reporting = self._reporter is not None and not self._reporter.dead
        if self.step.paused and self._report_in_flight is not None and not reporting:
            self._reporter = gevent.spawn(self._report_while_paused)

    def _report_while_paused(self) -> None:
        assert self._report_in_flight is not None
        while self.step.paused and self.sink_report is None:
            try:
                self._report_in_flight(self.step.pause_id, self.in_flight())
            except Exception:  # Locust's RPCError: the next report tries again
                log.warning("llmload: could not report the requests in flight", exc_info=True)
            gevent.sleep(IN_FLIGHT_REPORT_S)

    def holding(self) -> bool:
        """Send nothing now: halted (the run is stopping), or in the cold phase after its
        requests were sent (wait for the master's next step)."""
        return self.halted is not None or (
            self.step.cold and self.cold_sent >= self.options.cold_requests
        )

    def ensure_ready(self, pool: urllib3.PoolManager) -> None:
        """The probes, once, before the first request (target.py; the dispatcher calls it)."""
        self.target.ensure_ready(pool)

    def probe_soon(self) -> None:
        """The probes now, in a greenlet, on a pool of their own: when the run starts, not at
        the first request. The master starts a rate step's schedule once every worker said it
        is ready (staircase.py), so the first arrivals do not wait for the probes. A request
        sent meanwhile (a closed-loop user) waits for the same probes (one lock)."""

        def probe() -> None:
            pool = new_pool()
            try:
                self.ensure_ready(pool)
            except Exception:  # the first request probes again, and says why if it fails
                log.warning("llmload: probing %s failed; the first request probes again",
                            self.target.base_url, exc_info=True)  # fmt: skip
            finally:
                pool.clear()

        gevent.spawn(probe).name = "llmload-probes"

    # -- requests ----------------------------------------------------------------------
    def run_session(self, pool: urllib3.PoolManager, arrival: Arrival | None = None,
                    on_record: Callable[[RequestRecord], None] | None = None,
                    service: Service | None = None) -> list[RequestRecord]:  # fmt: skip
        """One multi-turn session (sessions.py) on `pool`; its first turn is `arrival`'s.
        Every turn asks for the same model (one drawn per session from a --model mix) and
        goes by the same `service` (run_one)."""
        self.ensure_ready(pool)
        model = self.models.pick() or self.target.model

        def send(turn: Turn) -> RequestRecord | None:
            first = turn.index == 0
            record = self.run_one(pool, arrival if first else None, turn, model,
                                  session=None if first else arrival, service=service)  # fmt: skip
            if record is not None and on_record is not None:
                on_record(record)
            return record

        return Session(self.build, self.build.rng).run(send)

    def run_one(self, pool: urllib3.PoolManager, arrival: Arrival | None = None,
                turn: Turn | None = None, model: str | None = None,
                session: Arrival | None = None, service: Service | None = None,
                ) -> RequestRecord | None:  # fmt: skip
        """Build, send and record one request. Returns the record (None if not sent).

        `arrival`: an open-loop arrival (openloop.py): its step and schedule, not the
        current step, go on the record. `turn`: a session's turn (sessions.py): its
        messages are the prompt; `session`: a later turn's session's arrival. `model`: its
        model (None: one drawn from the --model mix). `service`: a user's own hooks (what
        to send, how to read it: run/service.py); None: the built-in --endpoint."""
        self.ensure_ready(pool)
        if self.halted is not None:  # not sent: an open-loop arrival still leaves its row
            if arrival is not None:
                self.record_dropped(arrival, self.halted)
            return None
        step = self.step
        if arrival is None and step.cold:
            self.cold_sent += 1
        spec, text = self.build.spec(arrival, turn)
        model = model or self.models.pick() or self.target.model
        record = self.build.record(step, arrival, turn, spec, text, model, session)
        request_id = record.request_id
        checks = self.checks
        if checks is not None and checks.collects_text and record.reply_parts is None:
            record.reply_parts = []  # the answer's text, for its check
        prompt = None if spec.messages is not None else text
        tools = TOOLS if turn is not None and turn.offer_tools else None
        cancel = None
        if self.options.cancel_rate and self.build.rng.random() < self.options.cancel_rate:
            cancel = self.options.cancel_after_tokens
        started = _perf_ns()
        try:
            if service is None:
                body = self.target.body(prompt, spec.messages, spec.max_tokens,
                                        self.options.stream, model=model, tools=tools)  # fmt: skip
                execute(pool, self.target.url, body, self.target.headers(request_id), record,
                        self.limits, self.build.counter, cancel)  # fmt: skip
            else:
                ask = Ask(request_id, prompt, spec.messages, spec.max_tokens, model,
                          self.options.stream, spec.scenario, spec.prompt_tokens, tools,
                          record.session_id, record.turn)  # fmt: skip
                self._send_by(service, pool, ask, record, cancel)
        finally:
            if checks is not None:
                try:  # is the answer what was asked for (validity.py)
                    checks.judge(record)
                except Exception:  # never at the cost of the request's row
                    log.exception("llmload: the output check failed on request %s", request_id)
            try:  # live statistics (live.py); first: nothing here yields
                self.live.observe(record)
            except Exception:  # never at the cost of the request's row
                log.exception("llmload: live statistics could not take request %s", request_id)
            if self.monitor.running:  # the worker's own stalls during the request
                record.worker_stall_ns = self.monitor.overlap_ns(started, _perf_ns())
            if record.error_detail:
                record.error_detail = redact(record.error_detail, self._secrets)
            self.sink.append_request(record.row())
            if self._first_refused is not None:
                self._check_refused(record)
            if record.chunk_offsets:
                self.sink.append_chunks(
                    request_id,
                    record.chunk_offsets,
                    record.chunk_tokens,
                    record.chunk_chars,
                    record.chunk_kinds,
                )
            self.sent += 1
        return record

    def _send_by(self, service: Service, pool: urllib3.PoolManager, ask: Ask,
                 record: RequestRecord, cancel: int | None) -> None:  # fmt: skip
        """One request by a service's hooks: its login (once), what to send, how to read it.
        A hook that raises fails the request as data (`hook_failure`), never the worker."""
        record.endpoint = service.endpoint_name() or record.endpoint
        base = self.target.base_url
        login_timeout = self.limits.connect_timeout + (self.limits.request_timeout or 600.0)
        try:
            request, adapter = prepare(service, pool, base, login_timeout, ask)
        except HookFailed as failed:
            record.sent_at_ns = time.time_ns()
            record.end_ns = 0
            hook_failure(record, failed.owner, failed.hook, failed.error)
            record.finish()
            return
        headers = {**self.target.headers(record.request_id), **request.headers}
        execute(pool, request.url(base), request.body, headers, record, self.limits,
                self.build.counter, cancel, adapter=adapter)  # fmt: skip

    def _check_refused(self, record: RequestRecord) -> None:
        """Until a request is answered otherwise: REFUSED_AT_START refusals stop the run (a
        refusal: a 4xx but 408/429, or a 200 with no completion in it: a page, an empty body)."""
        if not (refused_status(record.http_status) or no_completion(record)):
            if record.http_status is not None:  # answered: the server takes such requests
                self._first_refused = None
            return
        self._first_refused = refused = (self._first_refused or 0) + 1
        if refused >= REFUSED_AT_START:
            self._first_refused = None  # said once
            if no_completion(record):
                how, what = "answered", f"its first {refused} requests with no completion"
            else:
                how, what = "refused", f"its first {refused} requests"
            cause = (f"the target {how} {what} (last: {record.error_detail}); every request "
                     f"would be {how} the same way")  # fmt: skip
            self.halted = "not sent: the run is stopping (the target refused every request)"
            if self.cannot_start is not None:
                self.cannot_start(cause)
            else:
                log.error("llmload: %s", cause)

    def record_dropped(self, arrival: Arrival, why: str) -> None:
        """An open-loop arrival not sent (the cap): a `dropped` row, no response times."""
        record = RequestRecord(
            request_id=new_request_id(), step=arrival.step, concurrency=arrival.concurrency,
            cold=False, scenario="", endpoint=self.endpoint,
            model=self.models.pick() or self.target.model,
            stream=self.options.stream, prompt_tokens_requested=None, max_tokens=None,
            prompt_sha256="", sent_at_ns=time.time_ns(), status="dropped",
            error_detail=why, rate=arrival.rate, arrival_index=arrival.index,
            intended_ns=arrival.intended_ns, queued_ns=arrival.queued_ns,
        )  # fmt: skip
        self.sink.append_request(record.row())

    def close(self, timeout: float) -> dict[str, Any]:
        with self._close_lock:
            return self._close(timeout)

    def _close(self, timeout: float) -> dict[str, Any]:
        if self.sink_report is None:
            if self._on_step in self.step.listeners:
                self.step.listeners.remove(self._on_step)
            if self._reporter is not None:
                self._reporter.kill(block=False)
            if self.dispatcher is not None:  # in-flight requests recorded before the sink closes
                self.dispatcher.stop()
            self.monitor.stop()  # its last sample goes into the sink before it closes
            report = self.sink.close(timeout=timeout)
            self.sink_report = {
                **dataclasses.asdict(report),
                "spool_dir": str(report.spool_dir),
                "complete": report.complete,
            }
            log.info("llmload: worker %s flushed: %s", self.worker_id, report)
        return {**self.identity, "sink": self.sink_report, "sent": self.sent,
                "probes": list(self.target.probes)}  # fmt: skip


def hook_failure(record: RequestRecord, owner: str, hook: str, exc: Exception) -> None:
    """A service hook that raised, as the request's failure: a login refused by HTTP status
    gets that status's kind, a transport failure its kind, anything else `client_error`
    (logged with its traceback: a bug in the hook)."""
    where = f"{owner}.{hook}"
    if isinstance(exc, HttpStatusError):
        record.http_status = exc.status
        record.fail(classify_status(exc.status), f"{where}: {exc}")
        return
    kind = transport_kind(exc)
    if kind is not None:
        text = "total_timeout" if kind == TIMEOUT else "connect"
        record.fail(text, f"{where}: {describe(exc)}")
        return
    log.warning("llmload: the hook %s raised", where, exc_info=exc)
    record.fail("client_error", f"{where} raised {describe(exc)}")


def failure_for(record: RequestRecord) -> RequestFailed | None:
    if record.status == "ok":
        return None
    return RequestFailed(f"{record.error_kind}: {record.error_detail or ''}"[:200])
