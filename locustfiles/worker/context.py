"""A worker's side of a run: its sink, its workload stream, probes, and request recording.

One WorkerContext per worker process and run, made at test_start (after Locust has handed
the master's options to the worker, after any fork). Probes run once, lazily, behind a lock,
before the first request: the model id (`/v1/models`), whether the server accepts
`ignore_eos` and continuous usage stats, and the prompt-length calibration. Every probe has
its own `probe-<hex>` id and is listed, whatever its outcome, for the manifest's `probes`: it
goes to the master right after probing (`report_probes`) and again with the finish report.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent.lock
import urllib3

from analysis.kernel.schema import TIMEOUT_KINDS
from locustfiles.live.groups import Observer, Recorder
from locustfiles.request.client import Limits, execute
from locustfiles.request.errors import (
    TIMEOUT,
    TRANSPORT_ERRORS,
    refused_status,
    root_cause,
    transport_kind,
)
from locustfiles.request.record import RequestRecord, new_request_id
from locustfiles.request.sse import kernel_skew_ns
from locustfiles.request.tokenizer import TokenCounter, load_tokenizer
from locustfiles.run.body import request_body
from locustfiles.run.manifest import ProbeRecord
from locustfiles.run.options import ChatOptions
from locustfiles.run.probe import (
    PROBE_TIMEOUT_S,
    probe_headers,
    send_probe,
    send_stream_probe,
    served_models,
)
from locustfiles.run.protocol import StepState
from locustfiles.run.secrets import redact, secret_values
from locustfiles.sink.eventsink import EventSink, SinkConfig
from locustfiles.sink.warmup import (
    freeze_gc,
    pyarrow_without_pandas,
    steady_allocator,
    warm_up,
)
from locustfiles.traffic.prompts import PromptBuilder, prompt_hash
from locustfiles.traffic.sessions import TOOLS, Session, Turn
from locustfiles.traffic.workloads import RequestSpec
from locustfiles.worker.monitor import LoopMonitor
from locustfiles.worker.openloop import Arrival, Dispatcher

log = logging.getLogger("llmload.worker")

REFUSED_AT_START = 5
"""A worker whose first this many requests were all refused as such (4xx but 408/429, and
none answered otherwise in between) stops the run: every request would be (a worker's own
API key, a dataset's requests that the preflight's short request did not show)."""

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
    ) -> None:
        self.options = options
        self.cannot_start = cannot_start  # a start-up probe timed out: the run must stop
        self.run_id = run_id
        self.identity = identity
        self.worker_id: str = identity["worker_id"]
        self.base_url = host.rstrip("/")
        self.url = self.base_url + options.path
        self.step = step
        self.counter: TokenCounter | None = (
            load_tokenizer(options.tokenizer) if options.tokenizer else None
        )
        self.prompts = PromptBuilder(
            options.seed, self.counter, options.prefix_tokens, options.prefix_groups
        )
        self.sampler = options.workload.sampler(options.seed, worker_index)
        followup = options.followup_workload or options.workload
        self.followup_sampler = followup.sampler(options.seed + 1_000_003, worker_index)
        self.rng = random.Random(f"llmload-worker:{options.seed}:{worker_index}")
        self.limits = Limits(
            connect_timeout=options.connect_timeout,
            request_timeout=options.request_timeout,
            ttft_timeout=options.ttft_timeout,
            stall_timeout=options.stall_timeout,
            max_event_bytes=options.max_event_bytes,
        )
        mix = options.model_mix
        self.model: str | None = mix.first  # probes' model (None: learned from /v1/models)
        self.models = mix.sampler(options.seed, worker_index)  # each request's model
        self.ignore_eos = options.ignore_eos == "on"
        self.continuous_usage = options.continuous_usage == "on"
        self._ready = False
        self._first_refused: int | None = 0  # refusals before any other answer; None: answered
        self.halted: str | None = None  # why this worker sends no more (the run is stopping)
        self.probes: list[dict[str, Any]] = []  # ProbeRecord dicts, for the manifest
        self.report_probes = report_probes
        self.live: Observer = live if live is not None else Recorder()  # live.py
        self._lock = gevent.lock.Semaphore()
        self._close_lock = gevent.lock.Semaphore()
        self._secrets = secret_values(os.environ)
        self._api_key = options.api_key()  # read once: os.environ costs µs per request
        config = SinkConfig(
            events_uri=options.events_uri,
            run_id=run_id,
            worker_id=self.worker_id,
            store_prompts=options.store_prompts,
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
            self.dispatcher = Dispatcher(self, step, on_record, report_in_flight)

    def holding(self) -> bool:
        """Send nothing now: halted (the run is stopping), or in the cold phase after its
        requests were sent (wait for the master's next step)."""
        return self.halted is not None or (
            self.step.cold and self.cold_sent >= self.options.cold_requests
        )

    # -- headers and bodies ------------------------------------------------------------
    def headers(self, request_id: str) -> dict[str, str]:
        return probe_headers(request_id, self._api_key)

    def body(self, prompt: str | None, messages: list[dict[str, Any]] | None, max_tokens: int | None,
             stream: bool, probe: bool = False, model: str | None = None) -> dict[str, Any]:  # fmt: skip
        return request_body(self.options, model or self.model, prompt, messages, max_tokens,
                            stream=stream, continuous_usage=self.continuous_usage,
                            ignore_eos=self.ignore_eos and not probe)  # fmt: skip

    # -- probes ------------------------------------------------------------------------
    def _note_probe(self, probe: ProbeRecord) -> None:
        """List a probe for the manifest (every probe, whatever its outcome)."""
        self.probes.append(dataclasses.asdict(probe))

    def _probe_json(self, pool: urllib3.PoolManager, purpose: str, method: str, url: str,
                    body: dict[str, Any] | None = None) -> tuple[int, Any]:  # fmt: skip
        """One probe exchange, noted whatever its outcome; I/O errors are re-raised."""
        sent = send_probe(pool, purpose, method, url, body=body, api_key=self.options.api_key(),
                          timeout=PROBE_TIMEOUT_S, worker_id=self.worker_id,
                          secrets=self._secrets)  # fmt: skip
        self._note_probe(sent.record)
        reply = sent.reply
        if reply.error is not None:
            raise reply.error
        assert reply.status is not None
        return reply.status, reply.json()

    def _post(
        self, pool: urllib3.PoolManager, body: dict[str, Any], purpose: str
    ) -> tuple[int, Any]:
        return self._probe_json(pool, purpose, "POST", self.url, body)

    def ensure_ready(self, pool: urllib3.PoolManager) -> None:
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            try:
                self._probe(pool)
            except TRANSPORT_ERRORS as exc:
                # answered, but a probe did not end within its bound: requests would not either
                if transport_kind(exc, True) == TIMEOUT and self.cannot_start is not None:
                    self.cannot_start(f"probing {self.base_url}: {root_cause(exc)}")  # stops
                else:
                    log.warning("llmload: probing %s failed (%s); sending requests anyway",
                                self.base_url, type(exc).__name__)  # fmt: skip
            self._ready = True
            if self.report_probes is not None and self.probes:
                self.report_probes(list(self.probes))  # to the master's manifest

    def _probe(self, pool: urllib3.PoolManager) -> None:
        if self.model is None:
            status, doc = self._probe_json(pool, "models", "GET", self.base_url + "/v1/models")
            served = served_models(doc) if status == 200 else []
            self.model = served[0] if served else None
            log.info("llmload: model %s (from /v1/models)", self.model)
        tiny = self.prompts.text(4, random.Random(1))
        if self.options.ignore_eos == "auto":
            body = self.body(tiny, None, 2, stream=False, probe=True)
            body["ignore_eos"] = True
            status, _ = self._post(pool, body, "ignore_eos")
            self.ignore_eos = status == 200
            log.info(
                "llmload: ignore_eos %s (probe: HTTP %d)",
                "on" if self.ignore_eos else "off",
                status,
            )
        if self.options.continuous_usage == "auto" and self.options.stream:
            # on only if the server really puts usage in every event (some ignore the field)
            body = self.body(tiny, None, 4, stream=True, probe=True)
            body["stream_options"]["continuous_usage_stats"] = True
            rec, probe = send_stream_probe(
                pool, "continuous_usage", self.url, body, self.limits,
                endpoint=self.options.endpoint, model=self.model,
                api_key=self.options.api_key(), worker_id=self.worker_id, secrets=self._secrets,
            )  # fmt: skip
            self._note_probe(probe)
            if rec.error_kind in TIMEOUT_KINDS:
                raise TimeoutError(f"the streamed probe failed: {probe.outcome}")
            self.continuous_usage = rec.status == "ok" and rec.output_tokens_source == "usage"
            log.info("llmload: continuous usage %s (probe: HTTP %s, token counts from %s)",
                     "on" if self.continuous_usage else "off", rec.http_status,
                     rec.output_tokens_source)  # fmt: skip

        def prompt_tokens(text: str) -> int | None:
            body = self.body(text, None, 1, stream=False, probe=True)
            status, doc = self._post(pool, body, "calibration")
            usage = (doc.get("usage") if isinstance(doc, dict) else None) or {}
            value = usage.get("prompt_tokens") if status == 200 else None
            return value if isinstance(value, int) else None

        calibration = self.prompts.calibrate(prompt_tokens)
        log.info("llmload: prompt calibration %s", calibration)

    # -- requests ----------------------------------------------------------------------
    def run_session(self, pool: urllib3.PoolManager, arrival: Arrival | None = None,
                    on_record: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:  # fmt: skip
        """One multi-turn session (sessions.py) on `pool`; its first turn is `arrival`'s.
        Every turn asks for the same model (one drawn per session from a --model mix)."""
        self.ensure_ready(pool)
        model = self.models.pick() or self.model

        def send(turn: Turn) -> RequestRecord | None:
            record = self.run_one(pool, arrival if turn.index == 0 else None, turn, model)
            if record is not None and on_record is not None:
                on_record(record)
            return record

        return Session(self, self.rng).run(send)

    def run_one(self, pool: urllib3.PoolManager, arrival: Arrival | None = None,
                turn: Turn | None = None, model: str | None = None) -> RequestRecord | None:  # fmt: skip
        """Build, send and record one request. Returns the record (None if not sent).

        `arrival`: an open-loop arrival (openloop.py): its step and schedule, not the
        current step, go on the record. `turn`: a session's turn (sessions.py): its
        messages are the prompt. `model`: its model (None: one drawn from the --model mix)."""
        self.ensure_ready(pool)
        if self.halted is not None:  # not sent: an open-loop arrival still leaves its row
            if arrival is not None:
                self.record_dropped(arrival, self.halted)
            return None
        step = self.step
        if arrival is None and step.cold:
            self.cold_sent += 1
        if turn is not None:
            spec = RequestSpec(turn.scenario, turn.new_tokens, turn.max_tokens,
                               messages=turn.messages)  # fmt: skip
            text = json.dumps(turn.messages, sort_keys=True)
        else:
            trace = self.options.workload.trace  # a trace's arrival i sends its row i
            if trace is not None and arrival is not None:
                spec = trace.spec(arrival.index)
            else:
                spec = self.sampler.sample()
            if spec.messages is not None:
                text = json.dumps(spec.messages, sort_keys=True)
            elif spec.prompt_text is not None:
                text = spec.prompt_text
            else:
                text = self._prompt(spec)
        request_id = new_request_id()
        model = model or self.models.pick() or self.model
        record = RequestRecord(
            request_id=request_id,
            step=step.step if arrival is None else arrival.step,
            concurrency=step.concurrency if arrival is None else arrival.concurrency,
            cold=step.cold and arrival is None,
            scenario=spec.scenario,
            endpoint=self.options.endpoint,
            model=model,
            stream=self.options.stream,
            prompt_tokens_requested=spec.prompt_tokens,
            max_tokens=spec.max_tokens,
            prompt_sha256=prompt_hash(text),
            prompt_text=text if self.options.store_prompts else None,
        )
        if turn is not None:
            turn.apply(record)
            if arrival is None and step.rate is not None:
                record.rate = step.rate  # a later turn of an open-loop session
        if arrival is not None:
            record.rate = arrival.rate
            record.arrival_index = arrival.index
            record.intended_ns = arrival.intended_ns
            record.queued_ns = arrival.queued_ns
        prompt = None if spec.messages is not None else text
        body = self.body(prompt, spec.messages, spec.max_tokens, self.options.stream, model=model)
        if turn is not None and turn.offer_tools:
            body["tools"] = TOOLS
        cancel = None
        if self.options.cancel_rate and self.rng.random() < self.options.cancel_rate:
            cancel = self.options.cancel_after_tokens
        started = _perf_ns()
        try:
            execute(
                pool,
                self.url,
                body,
                self.headers(request_id),
                record,
                self.limits,
                self.counter,
                cancel,
            )
        finally:
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

    def _prompt(self, spec: RequestSpec) -> str:
        """A built prompt of the spec's length (a trace's: beginning with its prefix blocks)."""
        if spec.prefix_blocks:
            return self.prompts.build_blocks(spec.prompt_tokens or 1, self.rng,
                                             spec.prefix_blocks, spec.block_tokens)  # fmt: skip
        return self.prompts.build(spec.prompt_tokens or 1, self.rng)

    def _check_refused(self, record: RequestRecord) -> None:
        """Until a request is answered otherwise: REFUSED_AT_START refusals stop the run."""
        if not refused_status(record.http_status):
            if record.http_status is not None:  # answered: the server takes such requests
                self._first_refused = None
            return
        self._first_refused = refused = (self._first_refused or 0) + 1
        if refused >= REFUSED_AT_START:
            self._first_refused = None  # said once
            cause = (f"the target refused its first {refused} requests (last: "
                     f"{record.error_detail}); every request would be refused the same way")  # fmt: skip
            self.halted = "not sent: the run is stopping (the target refused every request)"
            if self.cannot_start is not None:
                self.cannot_start(cause)
            else:
                log.error("llmload: %s", cause)

    def record_dropped(self, arrival: Arrival, why: str) -> None:
        """An open-loop arrival not sent (the cap): a `dropped` row, no response times."""
        record = RequestRecord(
            request_id=new_request_id(), step=arrival.step, concurrency=arrival.concurrency,
            cold=False, scenario="", endpoint=self.options.endpoint,
            model=self.models.pick() or self.model,
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
                "probes": list(self.probes)}  # fmt: skip


def failure_for(record: RequestRecord) -> RequestFailed | None:
    if record.status == "ok":
        return None
    return RequestFailed(f"{record.error_kind}: {record.error_detail or ''}"[:200])
