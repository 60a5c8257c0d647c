"""The engine's spans during a run: an OTLP/HTTP trace receiver on the master (--otlp-listen).

    receiver = OtlpReceiver("127.0.0.1", 4318, linger=6.0)
    receiver.start()                       # a gevent WSGI server (the master runs under gevent)
    receiver.begin_run(store, run_id, spool_root)
    ...                                    # the engine POSTs /v1/traces; parts every ~2 s
    record = receiver.end_run()            # linger for late batches, write the last part
    receiver.stop()

An engine that traces (vLLM `--otlp-traces-endpoint http://MASTER:4318/v1/traces`) POSTs
ExportTraceServiceRequests, protobuf or JSON (`Content-Encoding: gzip` allowed); each span
becomes a row of analysis.kernel.schema.SPANS_SCHEMA (analysis/kernel/spans.py) and the rows become
Parquet parts `<run_id>/spans/part-otlp-<seq>.parquet`. Each part is written to the local
spool first (fsync), then put; a part the store refused stays in the spool, retried at the
next flush and named in one error line at the run's end. Spans that arrive while no run is
going are kept for the next run.

Answers: 200 with an empty ExportTraceServiceResponse in the request's encoding; 415 for
another Content-Type, 400 for a body that is not an OTLP export (counted), 404 elsewhere.
Nothing here raises into the run.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from analysis.kernel.layout import SPANS_FOLDER, parse_spans_key, run_key, spans_key
from analysis.kernel.spans import (
    CONTENT_TYPES,
    START_UP_SPANS,
    SpansFormatError,
    decode_export,
    rows_table,
    span_rows,
)
from analysis.kernel.spans import start_up_record as engine_start_up
from analysis.kernel.storage import ObjectStore
from locustfiles.sink.spool import upload_part, write_atomic, write_parquet

log = logging.getLogger("llmload.otlp")

SOURCE = "otlp"
TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 64 * 1024 * 1024  # one export at most (decompressed too)
LINGER_CAP = 3.0  # the linger ends at this many times --otlp-linger, spans or not

_Response = tuple[str, str, bytes]


class _Run:
    """The run the receiver writes for now: where parts go and what it counted."""

    def __init__(self, store: ObjectStore, run_id: str, spool_root: Path, seq: int) -> None:
        self.store = store
        self.run_id = run_id
        self.spool_root = Path(spool_root)
        self.seq = seq
        self.received = 0
        self.stored = 0
        self.parts = 0
        self.rejected = 0
        self.pending: list[tuple[str, Path, int]] = []  # (store key, spool file, rows) unput
        self.unspooled: list[dict[str, Any]] = []  # rows neither spooled nor put (memory)
        self.failure: str | None = None  # why the latest put failed
        self.start_up: list[dict[str, Any]] = []  # rows of engine start-up spans


class OtlpReceiver:
    """OTLP/HTTP traces on `host:port` (port 0: any free one; `port` holds the bound one)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        linger: float = 6.0,
        flush_every: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.port = port
        self.linger = linger
        self.flush_every = flush_every
        self.clock = clock
        self.run: _Run | None = None
        self._rows: list[dict[str, Any]] = []  # received, not yet in a part
        self._received = 0  # spans received since the last run began (or ever, before one)
        self._rejected = 0
        self._last_span_at: float | None = None
        self._server: Any = None
        self._flusher: Any = None
        self._stopping: Any = None

    @property
    def listen(self) -> str:
        """The address it listens on, HOST:PORT (the bound port once started)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Listen (OSError when the address cannot be bound); the port is then the bound one."""
        from gevent.pywsgi import WSGIServer

        self._server = WSGIServer((self.host, self.port), self._app, log=None, error_log=log)
        self._server.start()
        self.port = int(self._server.address[1])
        log.info("llmload: OTLP traces receiver on http://%s%s", self.listen, TRACES_PATH)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout=1)

    def begin_run(self, store: ObjectStore, run_id: str, spool_root: Path) -> None:
        """Write the spans of run `run_id` from now on (those kept since go with it)."""
        import gevent
        import gevent.event

        if self.run is not None:
            self.end_run(linger=False)
        seq = 0
        try:
            folder = run_key(run_id, SPANS_FOLDER) + "/"
            parsed = [parse_spans_key(o.key.removeprefix(f"{run_id}/")) for o in store.list(folder)]
            seq = max((p[1] for p in parsed if p is not None and p[0] == SOURCE), default=-1) + 1
        except Exception as exc:  # the first put names the store's trouble; never lose a span
            log.debug("llmload: could not list the run's spans parts: %s", exc)
        self.run = _Run(store, run_id, spool_root, seq)
        self.run.received, self._received = self._received, 0
        self.run.rejected, self._rejected = self._rejected, 0
        self._stopping = gevent.event.Event()
        self._flusher = gevent.spawn(self._flush_loop)

    def end_run(self, *, linger: bool = True) -> dict[str, Any]:
        """Wait for late batches (`linger` s with no new span, at most LINGER_CAP times that),
        write the last part; the manifest's `spans` record (`engine`: start-up spans, if any)."""
        run = self.run
        if run is None:
            return {}
        if linger and self.linger > 0:
            self._linger()
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            self._stopping.set()
            flusher.join(10)
            flusher.kill(block=True, timeout=1)
        self.flush()
        self.run = None
        if run.pending or run.unspooled:
            rows = sum(n for _, _, n in run.pending)
            said = []
            if run.pending:
                paths = ", ".join(str(p) for _, p, _ in run.pending)
                said.append(f"{rows} span(s) wait in the spool: {paths}")
            if run.unspooled:
                said.append(f"{len(run.unspooled)} span(s) could not be spooled and are lost")
            print(f"llmload: error: run {run.run_id}: spans are missing from the events store "
                  f"({run.failure}): {'; '.join(said)}", file=sys.stderr, flush=True)  # fmt: skip
        log.info("llmload: spans: %d received, %d stored in %d part(s), %d body(ies) rejected",
                 run.received, run.stored, run.parts, run.rejected)  # fmt: skip
        record: dict[str, Any] = {
            "listen": self.listen,
            "received": run.received,
            "stored": run.stored,
            "parts": run.parts,
            "rejected_bodies": run.rejected,
        }
        engine = engine_start_up(run.start_up)
        if engine is not None:
            record["engine"] = engine
        return record

    def _linger(self) -> None:
        import gevent

        began = self.clock()
        while True:
            now = self.clock()
            quiet_since = max(began, self._last_span_at or began)
            if now - quiet_since >= self.linger or now - began >= LINGER_CAP * self.linger:
                return
            gevent.sleep(min(0.1, self.linger / 10))

    def _flush_loop(self) -> None:
        while not self._stopping.wait(self.flush_every):
            self.flush()

    # -- parts -------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the buffered rows as the next part of the run (none going: kept); retry the
        parts the store refused before. Never raises."""
        run = self.run
        if run is None:
            return
        for pending in list(run.pending):
            if self._put(run, *pending):
                run.pending.remove(pending)
        rows, self._rows = self._rows, []
        if not rows:
            return
        for row in rows:
            row["run_id"] = run.run_id
        run.start_up.extend(r for r in rows if r["name"] in START_UP_SPANS)
        rows, run.unspooled = run.unspooled + rows, []
        key = run_key(run.run_id, spans_key(SOURCE, run.seq))
        path = run.spool_root / key
        run.seq += 1
        table = rows_table(rows)  # checked as received: it converts
        try:
            write_atomic(path, lambda fh: write_parquet(table, fh))
        except OSError as exc:  # no spool (a full disk): straight to the store, else kept
            if not self._put_bytes(run, key, _parquet(table), len(rows), f"no spool: {exc}"):
                run.unspooled = rows  # in memory, tried again at the next flush
            return
        if not self._put(run, key, path, len(rows)):
            run.pending.append((key, path, len(rows)))

    def _put(self, run: _Run, key: str, path: Path, rows: int) -> bool:
        """Put a spooled part; off the spool once the store has it."""
        try:
            data = path.read_bytes()
        except OSError as exc:
            run.failure = f"its spool file cannot be read: {exc}"
            return False
        if not self._put_bytes(run, key, data, rows):
            return False
        with contextlib.suppress(OSError):
            path.unlink()
        return True

    def _put_bytes(self, run: _Run, key: str, data: bytes, rows: int, why: str = "") -> bool:
        try:
            upload_part(run.store, key, data)
        except Exception as exc:  # kept (spool or memory), tried again, named at the end
            reason = "; ".join(x for x in (why, (str(exc) or type(exc).__name__)[:200]) if x)
            if reason != run.failure:  # once per cause, not at every flush
                log.error("llmload: could not write spans part %s (%s); it is kept and tried "
                          "again", key, reason)  # fmt: skip
            run.failure = reason
            return False
        run.stored += rows
        run.parts += 1
        return True

    # -- HTTP --------------------------------------------------------------------------
    def receive(self, body: bytes, content_type: str, content_encoding: str = "") -> _Response:
        """One POST /v1/traces: (status, content type, body) of the answer."""
        encoding = CONTENT_TYPES.get(content_type.split(";")[0].strip().lower())
        if encoding is None:
            return _text("415 Unsupported Media Type",
                         f"Content-Type {content_type or 'none'!r}: send "
                         f"{' or '.join(CONTENT_TYPES)}")  # fmt: skip
        try:
            if content_encoding.strip().lower() == "gzip":
                body = _gunzip(body)
            elif content_encoding.strip().lower() not in ("", "identity"):
                raise SpansFormatError(f"Content-Encoding {content_encoding!r} is not gzip")
            rows = list(span_rows(decode_export(body, encoding), "", SOURCE))
            rows_table(rows)  # a span Arrow cannot hold (a time past int64): the body is refused
        except (ValueError, OverflowError, OSError, EOFError, zlib.error, pa.ArrowException) as exc:
            self._count_rejected()
            return _text("400 Bad Request", str(exc)[:300])
        self._add(rows)
        ctype = "application/json" if encoding == "json" else "application/x-protobuf"
        answer = b"{}" if encoding == "json" else ExportTraceServiceResponse().SerializeToString()
        return "200 OK", ctype, answer

    def _count_rejected(self) -> None:
        if self.run is not None:
            self.run.rejected += 1
        else:
            self._rejected += 1

    def _add(self, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        self._last_span_at = self.clock()
        self._rows.extend(rows)
        if self.run is not None:
            self.run.received += len(rows)
        else:
            self._received += len(rows)

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        try:
            status, ctype, body = self._answer(environ)
        except Exception as exc:  # never into the run: a 500, logged
            log.exception("llmload: OTLP receiver failed on a request")
            status, ctype, body = _text("500 Internal Server Error", type(exc).__name__)
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]

    def _answer(self, environ: dict[str, Any]) -> _Response:
        if environ.get("PATH_INFO") != TRACES_PATH:
            return _text("404 Not Found", f"OTLP traces go to POST {TRACES_PATH}")
        if environ.get("REQUEST_METHOD") != "POST":
            return _text("405 Method Not Allowed", f"POST {TRACES_PATH}")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        # the cap holds whatever the framing: a chunked body (no Content-Length) is read up to
        # one byte past it, never whole (1.2 GB of it took the master to 1.3 GB before)
        body = b"" if length > MAX_BODY_BYTES else environ["wsgi.input"].read(MAX_BODY_BYTES + 1)
        if length > MAX_BODY_BYTES or len(body) > MAX_BODY_BYTES:
            self._count_rejected()
            return _text("413 Payload Too Large", f"at most {MAX_BODY_BYTES} bytes")
        return self.receive(
            body, environ.get("CONTENT_TYPE") or "", environ.get("HTTP_CONTENT_ENCODING") or ""
        )


def split_listen(text: str) -> tuple[str, int]:
    """(host, port) of a checked --otlp-listen HOST:PORT ([v6 host]:PORT too)."""
    host, _, port = text.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _text(status: str, message: str) -> _Response:
    return status, "text/plain; charset=utf-8", (message + "\n").encode()


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    write_parquet(table, sink)
    return sink.getvalue()


def _gunzip(body: bytes) -> bytes:
    out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body, MAX_BODY_BYTES + 1)
    if len(out) > MAX_BODY_BYTES:
        raise SpansFormatError(f"a gzip body over {MAX_BODY_BYTES} bytes decompressed")
    return out
