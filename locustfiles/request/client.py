"""Send one request and read its response to the real end, timestamping every event.

Runs under gevent (inside Locust). Each user owns a keep-alive pool (`new_pool()`,
`wire.py`): for plain http a lean HTTP/1.1 exchange on a urllib3 connection (one `sendall`,
the headers parsed in place), for https and any other pool a tool passes urllib3's urlopen
(what requests and Locust's HttpSession run on, without their ~0.4 ms of per-request
overhead). The caller fires one Locust request event per request with the end-to-end time,
rather than Locust's own event, which would time only the headers.
Body bytes are read as they arrive (`sse.events`), every read gets `perf_counter_ns()`, and
the body is read past `[DONE]` to its real end so the connection goes back to the pool.
Once the headers are in, deadlines are kept by the watchdog, not by socket timeouts (a process
without gevent, `llmload check`, gives each read a timeout instead: `Limits.read_timeout`).
Transport failures are classified by `errors.transport_kind`, as everywhere in llmload.

Failures become data on the record (error kinds of schema v1); only GreenletExit (the run
is stopping) is re-raised, after the request is recorded as aborted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from gevent import GreenletExit

from analysis.kernel.anchor import wall_and_perf_ns
from analysis.kernel.schema import SHAPE_KINDS
from locustfiles.request.adapters import (
    BUILTIN_ADAPTERS,
    AdapterState,
    StreamAdapter,
    parse_adapted_body,
)
from locustfiles.request.errors import (
    CONNECT,
    TIMEOUT,
    TRANSPORT,
    TRANSPORT_ERRORS,
    describe,
    transport_kind,
)
from locustfiles.request.record import RequestRecord
from locustfiles.request.sse import MAX_EVENT_BYTES, EventTooLong, events, lines
from locustfiles.request.stream import StreamFailure, StreamState, parse_body
from locustfiles.request.tokenizer import TokenCounter
from locustfiles.request.watchdog import ReadDeadlines, Watch
from locustfiles.request.wire import UserPool, _Stamped, new_pool

__all__ = ["Limits", "Tap", "classify_status", "execute", "new_pool", "note_phases"]

_perf_ns = time.perf_counter_ns
_json_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

try:  # a tenth of the standard encoder's time on a request body; the same compact UTF-8 JSON
    import orjson

    _orjson_dumps: Callable[[Any], bytes] | None = orjson.dumps
except ImportError:  # pragma: no cover - orjson is a dependency; a bare install still works
    _orjson_dumps = None


def _body_bytes(body: dict[str, Any]) -> bytes:
    """The request body as compact UTF-8 JSON: orjson's, or the standard encoder's for what
    orjson refuses (integers beyond 64 bits, keys that are not strings, subclasses it does not
    know), so any body a workload or --extra-body gives is sent as before."""
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(body)
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            pass
    return _json_dumps(body).encode()


@dataclass(frozen=True)
class Limits:
    """Client-side limits (seconds); None disables one."""

    connect_timeout: float = 10.0
    request_timeout: float | None = 600.0
    ttft_timeout: float | None = None
    stall_timeout: float | None = 60.0
    # once the headers are in: None (the load), the watchdog keeps the deadlines above; a
    # number, each socket read has this timeout instead (a process without gevent, such as
    # `llmload check`, where the watchdog's greenlet would never run)
    read_timeout: float | None = None
    max_event_bytes: int = MAX_EVENT_BYTES  # an SSE event pending longer: malformed_event

    def headers_timeout(self, stream: bool) -> float | None:
        """Socket read timeout until the response headers (then the watchdog takes over)."""
        limits = (self.ttft_timeout, self.request_timeout) if stream else (self.request_timeout,)
        return min((t for t in limits if t), default=None)


def _release(resp: Any) -> None:
    """Give a response read to its end back to the pool, its connection marked idle."""
    conn = getattr(resp, "_connection", None)
    if isinstance(conn, _Stamped):
        conn.idle_since = _perf_ns()
    resp.release_conn()


def note_phases(record: RequestRecord, resp: Any, t0: int) -> int:
    """Rebase the record on the write: `sent_at_ns` becomes the moment the request's bytes
    were handed to the kernel, the time since deciding (`t0`) its `client_delay_ns`, with the
    connection it went on (new or reused, connect time). Returns the new time origin (`t0`
    when the connection is not a stamped one)."""
    conn = getattr(resp, "_connection", None)
    write_at = getattr(conn, "write_at", 0)
    if not isinstance(conn, _Stamped) or write_at < t0:
        return t0
    record.connect_new = conn.connected_at >= t0
    record.connect_ns = conn.connect_ns if record.connect_new else None
    record.client_delay_ns = write_at - t0
    record.sent_at_ns += write_at - t0
    return write_at


class Tap:
    """What a tool (`llmload check`) asks of one request beyond its record. The load passes
    none: a tap costs a test per request, nothing per event."""

    __slots__ = ("before_cancel", "error_body", "state")

    def __init__(self, before_cancel: Callable[[], None] | None = None) -> None:
        self.before_cancel = before_cancel  # at the cancel point, before the disconnect
        self.state: StreamState | None = None  # the stream's, once its headers are in
        self.error_body = b""  # the start of a non-200 response's body


def classify_status(status: int) -> str:
    """The error kind of a response whose status is not 200 (docs/events.md, error kinds)."""
    if status in (400, 413, 422):
        return "http_4xx_input"
    if status in (429, 503):
        return "queue_rejected"
    if 400 <= status < 500:
        return "http_4xx_other"
    if 500 <= status < 600:
        return "http_5xx"
    if 300 <= status < 400:
        return "http_3xx"  # redirects are not followed
    return "http_unexpected_status"  # 201, 204, 1xx...: not a completion


def _error_body(resp: Any) -> bytes:
    try:
        data: bytes = resp.read(2048)
    except TRANSPORT_ERRORS:  # the detail is best effort; the status is already recorded
        data = b""
    return data


def execute(
    pool: urllib3.PoolManager,  # new_pool()'s, or any urllib3 pool a tool passes
    url: str,
    body: dict[str, Any] | bytes,  # JSON, or the bytes to send as they are
    headers: dict[str, str],
    record: RequestRecord,
    limits: Limits,
    counter: TokenCounter | None = None,
    cancel_after_tokens: int | None = None,
    tap: Tap | None = None,
    adapter: StreamAdapter | None = None,
) -> RequestRecord:
    """Send `body` to `url` and fill `record`. Never raises except GreenletExit.

    `adapter`: how the response reads (a service's stream adapter, adapters.py); None: an
    OpenAI chat or completions response (`record.endpoint`), by stream.py's typed reader."""
    chat = record.endpoint == "chat"
    if adapter is None and record.endpoint in BUILTIN_ADAPTERS:
        adapter = BUILTIN_ADAPTERS[record.endpoint]()
    resp: Any = None
    watch = Watch(limits)
    payload = body if isinstance(body, bytes) else _body_bytes(body)
    hdrs = {"Content-Type": "application/json", "Accept-Encoding": "identity", **headers}
    lean = pool.target(url) if isinstance(pool, UserPool) else None
    record.sent_at_ns, t0 = wall_and_perf_ns()  # one instant on both clocks
    watch.t0 = t0
    try:
        if lean is not None:  # plain http on a user's pool: wire.py's lean exchange
            resp = pool.post(  # type: ignore[attr-defined]
                lean, payload, hdrs, limits.connect_timeout, limits.headers_timeout(record.stream)
            )
        else:
            timeout = urllib3.Timeout(
                connect=limits.connect_timeout, read=limits.headers_timeout(record.stream)
            )
            resp = pool.urlopen(
                "POST", url, body=payload, headers=hdrs, timeout=timeout, retries=False,
                redirect=False, preload_content=False, decode_content=False,
            )  # fmt: skip
        t0 = note_phases(record, resp, t0)  # from here, times count from the write
        # the lean path knows when the headers reached the kernel; urllib3's, when read
        head_at = max(resp.arrived_at, t0) if lean is not None else _perf_ns()
        record.headers_ns = head_at - t0
        record.http_status = resp.status
        record.server_request_id = resp.headers.get("x-request-id")
        if resp.status != 200:
            raw = _error_body(resp)
            if tap is not None:
                tap.error_body = raw
            text = " ".join(raw.decode("utf-8", "replace").split())[:200]
            record.fail(classify_status(resp.status), f"HTTP {resp.status}: {text}")
            record.end_ns = _perf_ns() - t0
            _close(resp)
            return record
        if not record.stream:
            data = resp.read()
            record.end_ns = _perf_ns() - t0
            _release(resp)
            if adapter is None:
                parse_body(record, data, chat, counter)
            else:
                parse_adapted_body(record, data, adapter, counter)
            return record
        state = (
            StreamState(record, chat, counter)
            if adapter is None
            else AdapterState(record, adapter, counter)
        )
        split = events if adapter is None or adapter.framing == "sse" else lines
        on_event = state.on_event
        if tap is not None:
            tap.state = state
        _set_read_timeout(resp, limits.read_timeout)
        clock: Any = watch
        if limits.read_timeout is None:
            watch.start(resp)  # from here the watchdog keeps the deadlines
        else:  # each read checks the deadlines (no watchdog in this process)
            clock = ReadDeadlines(watch, _socket_of(resp), limits.read_timeout)
            watch.progress = clock.last = _perf_ns()
        if lean is not None:  # no body byte came before the headers' kernel time
            clock.last = head_at
        for datas, arrived in split(resp, clock, limits.max_event_bytes):  # sets watch.last
            watch.progress = arrived  # a data event: the stall timer starts again
            now = arrived - t0
            if len(datas) > 1:  # events that share one read's timestamp
                record.coalesced_events += len(datas) - 1
            for data in datas:
                on_event(data, now)
            if watch.waiting_first and record.first_token_ns is not None:
                watch.waiting_first = False
            if cancel_after_tokens is not None and sum(record.chunk_tokens) >= cancel_after_tokens:
                if tap is not None and tap.before_cancel is not None:
                    tap.before_cancel()
                record.fail(
                    "cancelled",
                    f"client cancelled after {sum(record.chunk_tokens)} tokens",
                    "cancelled",
                )
                record.end_ns = _perf_ns() - t0
                _close(resp)  # disconnects: the server should free the sequence
                return record
        record.end_ns = watch.last - t0  # arrival of the read that ended the body
        if watch.expired is not None:  # cut at a clean event boundary
            raise ConnectionAbortedError(watch.expired)
        state.on_end()
        _release(resp)  # read to the real end: the connection is reusable
    except GreenletExit:
        record.end_ns = _perf_ns() - t0
        record.fail("aborted", "in flight when the run stopped", "aborted")
        _close(resp)
        raise
    except Exception as exc:  # every failure becomes data on the record
        record.end_ns = _perf_ns() - t0
        # without the watchdog, a read times out at the nearest deadline (ReadDeadlines)
        responded = resp is not None
        if responded and limits.read_timeout and transport_kind(exc, responded) == TIMEOUT:
            watch.expired = watch.expired or watch.check(_perf_ns())
        if watch.expired is not None:  # the watchdog (or a read's deadline) cut the connection
            record.fail(watch.expired, watch.detail())
        else:
            record.fail(*_failure_of(exc, resp is not None, record.stream, limits))
        _close(resp)
    finally:
        watch.stop()
        if record.error_kind in SHAPE_KINDS and resp is not None and _sse(adapter):
            _say_content_type(record, resp.headers.get("content-type") or "")
        record.finish()
    return record


def _sse(adapter: StreamAdapter | None) -> bool:
    """Whether the response is expected as SSE (or JSON when not streamed)."""
    return adapter is None or adapter.framing == "sse"


def _say_content_type(record: RequestRecord, content_type: str) -> None:
    """A stream that was no stream: its detail names the Content-Type when it was not the
    expected one (a 200 page from a proxy or a web UI, not the API)."""
    expected = "text/event-stream" if record.stream else "application/json"
    if expected not in content_type.lower():
        shown = content_type or "none"
        record.error_detail = (
            f"{record.error_detail}; the answer's Content-Type was {shown!r}, not {expected}"
        )


def _socket_of(resp: Any) -> Any:
    return getattr(getattr(resp, "_connection", None), "sock", None)


def _set_read_timeout(resp: Any, seconds: float | None) -> None:
    """Change the socket's read timeout mid-response."""
    sock = _socket_of(resp)
    if sock is not None:
        sock.settimeout(seconds)


def _close(resp: Any) -> None:
    """Drop the connection (it is in an unknown state, or the client walks away)."""
    if resp is not None:
        resp.close()  # closes the socket; the pool opens a new one for the next request
        resp.release_conn()


def _failure_of(exc: Exception, responded: bool, stream: bool, limits: Limits) -> tuple[str, str]:
    """(error kind, detail) for an exception raised while sending or reading."""
    if isinstance(exc, StreamFailure):
        return exc.kind, exc.detail
    if isinstance(exc, EventTooLong):  # not an SSE stream: cut (the caller closes it)
        return "malformed_event", f"{exc} (--max-event-bytes)"
    text = describe(exc)
    kind = transport_kind(exc, responded)
    if kind == CONNECT:
        return "connect", text
    if kind == TIMEOUT:
        name = type(exc).__name__
        if responded and stream and limits.read_timeout is not None:  # a read's own timeout
            return "stall_timeout", f"no data within {limits.read_timeout} s ({name})"
        limit = limits.headers_timeout(stream)  # else only waiting for headers has one
        kind = "ttft_timeout" if stream and limit == limits.ttft_timeout else "total_timeout"
        return kind, f"no response headers within {limit} s ({name})"
    if kind == TRANSPORT:
        # the connection broke mid-response: IncompleteRead, reset, bad chunking...
        return "stream_truncated", text
    return "client_error", text  # a bug in llmload: recorded, not raised
