"""OTLP trace export (`--otlp-traces-endpoint`): vLLM's `llm_request` span per request, with
the simulator's true times, and an `Overall Loading` span for its own start.

The request path only appends a small record to a bounded queue (`SpanExporter.add`: full
means dropped and counted). A task on the server's event loop wakes every `interval` seconds,
or as soon as `batch_size` records wait, builds the spans with the official
`opentelemetry-proto` messages (in slices, yielding to the loop between them) and POSTs them
as OTLP/HTTP protobuf over a non-blocking connection. A failed export is counted, reported
once on stderr, and never stops the server; `close` flushes what is left on shutdown.

Times (docs/simserver.md, "Traces"): all `time.perf_counter_ns()` readings, offsets from the
request's arrival (`Request.received_ns`, the instant the truth log counts from); the span
starts at the arrival's wall clock (`received_unix_ns`, the truth log's `arrival_unix_ns`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, TextIO
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from analysis.kernel.errors import UsageError

REQUEST_SPAN: Final = "llm_request"  # analysis.kernel.spans.REQUEST_SPAN
START_UP_SPAN: Final = "Overall Loading"  # one of analysis.kernel.spans.START_UP_SPANS
SCOPE: Final = "llmload.simserver"
DEFAULT_SERVICE_NAME: Final = "llmload-sim"

_HEX = frozenset("0123456789abcdef")


@dataclass
class SpanStats:
    """Spans exported, dropped (queue full) and failed (the export did not succeed)."""

    exported: int = 0
    dropped: int = 0
    failed: int = 0


@dataclass(frozen=True)
class Endpoint:
    """An OTLP/HTTP traces endpoint: the URL as given, `/v1/traces` when it has no path."""

    url: str
    host: str
    port: int
    path: str
    tls: bool

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Raises UsageError naming `--otlp-traces-endpoint`."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise UsageError(f"--otlp-traces-endpoint {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(
                f"--otlp-traces-endpoint must be an http(s) URL such as "
                f"http://127.0.0.1:4318/v1/traces (OTLP/HTTP protobuf), not {url!r}"
            )
        tls = parts.scheme == "https"
        path = parts.path if parts.path not in ("", "/") else "/v1/traces"
        if parts.query:
            path += "?" + parts.query
        return cls(url, parts.hostname, port or (443 if tls else 80), path, tls)


def parse_traceparent(header: str | None) -> tuple[bytes, bytes] | None:
    """(trace id, parent span id) of a W3C `traceparent`, None when absent or invalid."""
    if not header:
        return None
    parts = header.strip().lower().split("-")
    if len(parts) < 4:
        return None
    version, trace_id, span_id, flags = parts[:4]
    if (
        len(version) != 2
        or version == "ff"
        or (version == "00" and len(parts) != 4)
        or len(trace_id) != 32
        or len(span_id) != 16
        or len(flags) != 2
        or not _HEX.issuperset(version + trace_id + span_id + flags)
        or trace_id == "0" * 32
        or span_id == "0" * 16
    ):
        return None
    return bytes.fromhex(trace_id), bytes.fromhex(span_id)


def _double(key: str, value: float) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(double_value=value))


def _int(key: str, value: int) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(int_value=value))


def _str(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _ids(rng: random.Random, traceparent: str | None) -> tuple[bytes, bytes, bytes]:
    """(trace id, span id, parent span id): the request's trace, else a fresh one."""
    context = parse_traceparent(traceparent)
    span_id = (rng.getrandbits(64) or 1).to_bytes(8, "big")
    if context is not None:
        return context[0], span_id, context[1]
    return (rng.getrandbits(128) or 1).to_bytes(16, "big"), span_id, b""


@dataclass(slots=True)
class RequestRecord:
    """What one request's span needs, queued when the request ends. `*_ns` are
    `time.perf_counter_ns()` readings; 0: the request never got there."""

    traceparent: str | None
    request_id: str  # gen_ai.request.id: chatcmpl-<X-Request-Id> (cmpl- for completions)
    model: str
    arrival_unix_ns: int
    arrival_ns: int
    scheduled_ns: int  # admitted to the running batch
    first_token_ns: int
    end_ns: int  # last token, or when the request failed or was cancelled
    prompt_tokens: int | None
    completion_tokens: int
    max_tokens: int | None
    error: str | None = None  # None: finished; else an outcome or reject reason

    def fill(self, span: Span, rng: random.Random) -> None:
        """Write this request's span (vLLM's attributes and names) into `span`."""
        span.trace_id, span.span_id, span.parent_span_id = _ids(rng, self.traceparent)
        span.name = REQUEST_SPAN
        span.kind = Span.SPAN_KIND_SERVER
        arrival, end = self.arrival_ns, self.end_ns
        span.start_time_unix_nano = self.arrival_unix_ns
        span.end_time_unix_nano = self.arrival_unix_ns + end - arrival
        attrs = [
            _str("gen_ai.request.id", self.request_id),
            _str("gen_ai.response.model", self.model),
            _int("gen_ai.usage.completion_tokens", self.completion_tokens),
        ]
        if self.prompt_tokens is not None:
            attrs.append(_int("gen_ai.usage.prompt_tokens", self.prompt_tokens))
        if self.max_tokens is not None:
            attrs.append(_int("gen_ai.request.max_tokens", self.max_tokens))
        scheduled, first = self.scheduled_ns, self.first_token_ns
        # In the queue until admitted (or, never admitted, until the request ended).
        attrs.append(_double("gen_ai.latency.time_in_queue", ((scheduled or end) - arrival) / 1e9))
        if scheduled:
            prefill_end = first or end
            attrs.append(
                _double("gen_ai.latency.time_in_model_prefill", (prefill_end - scheduled) / 1e9)
            )
            attrs.append(_double("gen_ai.latency.time_in_model_inference", (end - scheduled) / 1e9))
        if first:
            attrs.append(_double("gen_ai.latency.time_to_first_token", (first - arrival) / 1e9))
            attrs.append(_double("gen_ai.latency.time_in_model_decode", (end - first) / 1e9))
        attrs.append(_double("gen_ai.latency.e2e", (end - arrival) / 1e9))
        if self.error is not None:
            attrs.append(_str("error.type", self.error))
            span.status.code = Status.STATUS_CODE_ERROR
            span.status.message = self.error
        span.attributes.extend(attrs)


@dataclass(slots=True)
class StartUpRecord:
    """The simulator's own start: from SimServer's creation until it listened."""

    start_unix_ns: int
    end_unix_ns: int
    profile: str
    model: str

    def fill(self, span: Span, rng: random.Random) -> None:
        span.trace_id, span.span_id, _ = _ids(rng, None)
        span.name = START_UP_SPAN
        span.kind = Span.SPAN_KIND_INTERNAL
        span.start_time_unix_nano = self.start_unix_ns
        span.end_time_unix_nano = self.end_unix_ns
        span.attributes.extend(
            [_str("gen_ai.response.model", self.model), _str("llmload.sim.profile", self.profile)]
        )


Record = RequestRecord | StartUpRecord


class ExportError(Exception):
    """One export that did not succeed (connection, timeout or HTTP status)."""


class SpanExporter:
    """Queues records on the event loop's thread and exports them from a task on it."""

    def __init__(
        self,
        endpoint: Endpoint,
        service_name: str,
        stats: SpanStats,
        *,
        interval: float = 0.5,
        batch_size: int = 512,
        max_queue: int = 8192,
        timeout: float = 5.0,
        slice_size: int = 64,
        err: TextIO | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.service_name = service_name
        self.stats = stats
        self.interval = interval
        self.batch_size = batch_size
        self.max_queue = max_queue
        self.timeout = timeout
        self.slice_size = slice_size
        self._err = err
        self._queue: deque[Record] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()  # ids only: never the server's seeded generator
        self._warned = False
        self._ssl = ssl.create_default_context() if endpoint.tls else None

    # --- the request path -------------------------------------------------------------------
    def add(self, record: Record) -> None:
        """Queue one span's record; a full queue drops it (counted)."""
        queue = self._queue
        if len(queue) >= self.max_queue or self._closing and self._task is None:
            self.stats.dropped += 1
            return
        queue.append(record)
        if len(queue) == self.batch_size:
            self._wake.set()

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="llmload-sim-span-export")

    async def close(self, timeout: float = 5.0) -> None:
        """Export what is queued (for up to `timeout` s, then count the rest as failed)."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task, timeout)
        left = len(self._queue)
        if left:
            self._fail(left, f"{left} spans still queued at shutdown")
            self._queue.clear()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            while self._queue:
                await self._export_batch()
            if self._closing:
                return

    # --- export -------------------------------------------------------------------------------
    async def _export_batch(self) -> None:
        queue = self._queue
        count = min(len(queue), self.batch_size)
        records = [queue.popleft() for _ in range(count)]
        try:
            body = await self._encode(records)
            await asyncio.wait_for(self._post(body), self.timeout)
        except asyncio.CancelledError:
            self._fail(count, "shutdown before the export ended")
            raise
        except TimeoutError:
            self._fail(count, f"no answer within {self.timeout:g} s")
        except (OSError, ExportError, ValueError) as exc:
            self._fail(count, str(exc) or type(exc).__name__)
        else:
            self.stats.exported += count

    async def _encode(self, records: list[Record]) -> bytes:
        """One ExportTraceServiceRequest, built `slice_size` spans at a time."""
        export = ExportTraceServiceRequest()
        resource_spans = export.resource_spans.add()
        resource_spans.resource.attributes.extend(
            [_str("service.name", self.service_name), _str("llmload.simulated", "true")]
        )
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = SCOPE
        spans = scope_spans.spans
        rng = self._rng
        for i, record in enumerate(records):
            if i and i % self.slice_size == 0:
                await asyncio.sleep(0)  # let the loop serve requests between slices
            record.fill(spans.add(), rng)
        return export.SerializeToString()

    async def _post(self, body: bytes) -> None:
        ep = self.endpoint
        reader, writer = await asyncio.open_connection(
            ep.host, ep.port, ssl=self._ssl, server_hostname=ep.host if ep.tls else None
        )
        try:
            head = (
                f"POST {ep.path} HTTP/1.1\r\nHost: {ep.host}:{ep.port}\r\n"
                "Content-Type: application/x-protobuf\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n"
                "User-Agent: llmload-sim\r\n\r\n"
            ).encode("latin-1")
            writer.write(head + body)
            await writer.drain()
            line = await reader.readline()
            fields = line.split(None, 2)
            if len(fields) < 2 or not fields[0].startswith(b"HTTP/"):
                raise ExportError(f"not an HTTP answer: {line[:80]!r}")
            status = int(fields[1])
            if not 200 <= status < 300:
                raise ExportError(f"HTTP {status}")
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()

    def _fail(self, count: int, reason: str) -> None:
        self.stats.failed += count
        if not self._warned:
            self._warned = True
            print(
                f"llmload sim: cannot export spans to {self.endpoint.url} ({reason}); "
                "counting them in llmload_sim_spans_failed_total (reported once)",
                file=self._err or sys.stderr,
                flush=True,
            )


def start_up_record(start_unix_ns: int, profile: str, model: str) -> StartUpRecord:
    """The `Overall Loading` record of a start that began at `start_unix_ns` and ends now."""
    return StartUpRecord(start_unix_ns, time.time_ns(), profile, model)
