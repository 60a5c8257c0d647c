"""EventSink: a worker's request and chunk rows → Parquet parts in object storage, nothing lost.

The request path only appends references to in-memory buffers (no I/O, no conversion, no
exception). Everything after that is the sink's `SinkPipeline` (locustfiles/sink/pipeline.py),
one background task (a greenlet under gevent, a thread otherwise) that encodes the buffers
every quarter second and seals the encoded rows into Parquet parts when a table reaches
`part_rows` rows or every `part_seconds`, writes each part to a local spool with fsync,
uploads it without overwriting, deletes it from the spool only once the store has it, and
keeps `index/worker=<id>.json` up to date. A store outage only makes parts wait in the
spool (uploads retry with capped exponential backoff and jitter, forever while running); a
crashed worker's spool is uploaded later by `llmload upload-spool`. See docs/reliability.md.

Use (a Locust worker; issue 5's ChatUser):

    config = SinkConfig(events_uri="s3://bench/runs", run_id=run_id, worker_id=worker_id)
    sink = EventSink(config)
    sink.start()                                 # on test_start, after any fork
    ...
    sink.append_request(row)                     # one dict per request, REQUESTS_SCHEMA columns
    sink.append_chunks(request_id, offsets_ns, tokens, chars, "content")  # lists, one per column
    ...
    report = sink.close(timeout=60)              # on test_stop/quitting: flush, upload, report
    log.info("%s", report)                       # rows, parts, bytes, anything left in the spool

Rows may leave out `run_id` and `worker_id` (the sink fills them in). Hand the sink row dicts
you will not modify afterwards: it keeps references until they are encoded. Chunk columns are
copied at once into a compact form (int64 bytes: `encode.compact_chunks`), so a saturated
worker's backlog costs 8 bytes a value and nothing for the garbage collector to walk. Bad rows are
rejected when the part is built, counted in the report and logged; append never raises.
`prompt_text` is dropped unless `store_prompts=True`; values of secret-named environment
variables are redacted from `error_detail`.

Tables are named in `ENCODERS` (name → the encoder the pipeline runs on its buffer). A new
table needs its schema in `analysis.kernel.schema.TABLES`, an encoder in `ENCODERS`, and an
`append_*` method that calls `_append(name, item, rows)`; buffers, row counts, parts and
report counters follow the name.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.kernel.storage import ObjectStore, S3Store, open_store
from locustfiles.run.secrets import secret_values
from locustfiles.sink.encode import (
    EncodeContext,
    compact_chunks,
    encode_chunks,
    encode_requests,
    encode_rows,
)
from locustfiles.sink.pipeline import Backoff, Encoder, PipelineStats, SinkPipeline, Waiter
from locustfiles.sink.runtime import Runtime, Task, Waitable, pick_runtime
from locustfiles.sink.spool import Spool

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_PART_ROWS",
    "DEFAULT_PART_SECONDS",
    "ENCODERS",
    "Backoff",
    "EventSink",
    "SinkConfig",
    "SinkReport",
    "default_spool_dir",
]

log = logging.getLogger("llmload.sink")

DEFAULT_PART_ROWS = 100_000
"""Rows per part and table: ~1,000 requests of 100 chunk rows, ~1-2 MB of Parquet."""
DEFAULT_PART_SECONDS = 10.0
"""Longest a row waits in memory: bounds what a SIGKILL can lose and how stale the store is."""
DEFAULT_CLOSE_TIMEOUT = 60.0

ENCODERS: Mapping[str, Encoder] = {
    "requests": encode_requests,
    "chunks": encode_chunks,
    "samples": functools.partial(encode_rows, "samples"),  # the worker's CPU% and loop lag
    "stalls": functools.partial(encode_rows, "stalls"),  # the worker's event-loop stalls
}
"""The sink's tables, in sealing order: name → how the pipeline encodes its buffered items."""


def default_spool_dir() -> Path:
    return Path(tempfile.gettempdir()) / "llmload-spool"


@dataclass(frozen=True)
class SinkConfig:
    """Where and how a worker's sink writes. All sizes documented in docs/reliability.md."""

    events_uri: str
    run_id: str
    worker_id: str
    spool_dir: Path = field(default_factory=default_spool_dir)
    part_rows: int = DEFAULT_PART_ROWS
    part_seconds: float = DEFAULT_PART_SECONDS
    store_prompts: bool = False
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    runtime: str = "auto"  # auto | gevent | threads
    secret_names: tuple[str, ...] = ()  # variables whose values are secrets (--api-key-env)

    def __post_init__(self) -> None:
        if self.part_rows < 1:
            raise ValueError(f"part_rows must be at least 1, not {self.part_rows}")
        if self.part_seconds <= 0:
            raise ValueError(f"part_seconds must be positive, not {self.part_seconds}")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError("backoff must satisfy 0 < backoff_initial_s <= backoff_max_s")


@dataclass(frozen=True)
class SinkReport:
    """What a sink wrote, and what it could not (yet)."""

    rows: dict[str, int]  # rows uploaded, per table
    parts: int  # parts uploaded
    bytes: int  # bytes uploaded (parts only)
    pending_parts: int  # parts still in the spool
    pending_rows: int  # rows not in the store: in the spool, unspooled or still buffered
    rejected_rows: int  # bad rows dropped at encode time
    dropped_rows: int  # rows appended after close
    collisions: int  # parts whose key held other bytes (kept in the spool)
    upload_failures: int  # failed upload attempts (each retried)
    index_written: bool  # the store's index is up to date (final after close)
    spool_dir: Path
    errors: tuple[str, ...] = ()
    events_uri: str = ""
    spool_parts: dict[str, int] = field(default_factory=dict)  # per table: parts in the spool
    spool_rows: dict[str, int] = field(default_factory=dict)  # per table: rows in those parts
    # per table: rows not yet in the spool (buffered, encoded, or refused by a full spool);
    # after close they are lost when the process ends
    memory_rows: dict[str, int] = field(default_factory=dict)
    write_failures: tuple[str, ...] = ()  # "<where>: <why> (N failed writes)", each kind once
    closed: bool = False  # close() was called: rows still in memory are lost at exit

    @property
    def complete(self) -> bool:
        """Everything appended reached the store, and nothing was rejected or dropped."""
        return not (
            self.pending_parts
            or self.pending_rows
            or self.collisions
            or self.rejected_rows
            or self.dropped_rows
            or not self.index_written
        )

    @property
    def lost_rows(self) -> dict[str, int]:
        """Per table, rows that never reached the spool or the store, once closed (lost when
        the process ends); {} before close() or when there are none."""
        if not self.closed:
            return {}
        return {table: n for table, n in self.memory_rows.items() if n}

    def __str__(self) -> str:
        rows = ", ".join(f"{n} {t} rows" for t, n in self.rows.items())
        text = f"event sink wrote {self.parts} parts ({rows}, {self.bytes} bytes)"
        if self.pending_parts:
            kept = "".join(
                f"; {table}: {_count(n, 'part')}, {_count(self.spool_rows.get(table, 0), 'row')}"
                for table, n in self.spool_parts.items()
                if n
            )
            uri = self.events_uri or "URI"
            rows_kept = sum(self.spool_rows.values())
            text += (
                f"; NOT UPLOADED: {rows_kept} rows in {self.pending_parts} parts kept in the "
                f"spool {self.spool_dir} ({kept[2:]}): send them with `llmload upload-spool "
                f"{self.spool_dir} --events-uri {uri}`"
            )
        in_memory = {table: n for table, n in self.memory_rows.items() if n}
        if in_memory:
            counts = ", ".join(f"{n} {table} rows" for table, n in in_memory.items())
            if self.closed:
                text += f"; LOST at exit: {counts}, never written to the spool"
            else:
                text += f"; not yet in the spool: {counts}"
        if self.write_failures:
            text += f"; write failures: {', '.join(self.write_failures)}"
        if self.rejected_rows:
            text += f"; {self.rejected_rows} bad rows rejected"
        if self.dropped_rows:
            text += f"; {self.dropped_rows} rows appended after close dropped"
        if self.collisions:
            text += f"; {self.collisions} key collisions (parts kept in the spool)"
        return text


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class EventSink:
    """Buffers a worker's rows for its `SinkPipeline` (see the module docstring)."""

    def __init__(
        self,
        config: SinkConfig,
        *,
        store: ObjectStore | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        self.config = config
        self._store = store
        self._rt = runtime
        self._spool = Spool(config.spool_dir, config.run_id, config.worker_id)
        self._lock = threading.Lock()
        # per table (ENCODERS' names): buffered items, and the rows they hold
        self._buffers: dict[str, list[Any]] = {name: [] for name in ENCODERS}
        self._buffered: dict[str, int] = dict.fromkeys(ENCODERS, 0)
        self._wake: Waitable | None = None
        self._wake_sent = False
        self._waiters: list[Waiter] = []  # flush() callers the pipeline has not taken yet
        self._pipeline: SinkPipeline | None = None
        self._task: Task | None = None
        self._stopping = False
        self._deadline = 0.0
        self._closed = False
        self._ctx = EncodeContext(config.run_id, config.worker_id, config.store_prompts)
        self._dropped = 0

    # -- the request path: appends only ------------------------------------------------------

    def append_request(self, row: Mapping[str, Any]) -> None:
        """Buffer one request row (REQUESTS_SCHEMA column names). Never raises, never blocks."""
        self._append("requests", row, 1)

    def append_chunks(
        self,
        request_id: str,
        offset_ns: Sequence[int],
        tokens: Sequence[int],
        chars: Sequence[int],
        kind: str | Sequence[str] = "content",
    ) -> None:
        """Buffer one request's chunk rows column-wise (`seq` is the position). Never raises.
        The columns are copied into the sink's compact form (`compact_chunks`)."""
        try:
            n = len(offset_ns)
        except TypeError:
            n = 0
        self._append("chunks", compact_chunks(request_id, offset_ns, tokens, chars, kind), n)

    def append_row(self, table: str, row: Mapping[str, Any]) -> None:
        """Buffer one row of a small table (`samples`, `stalls`). Never raises."""
        if table in self._buffers:
            self._append(table, row, 1)
        else:
            with self._lock:
                self._drop(1)

    def _append(self, table: str, item: Any, rows: int) -> None:
        """Buffer one item of `table` holding `rows` rows; wake the pipeline when it is full."""
        with self._lock:
            if self._closed:
                self._drop(rows)
                return
            self._buffers[table].append(item)
            self._buffered[table] += rows
            if self._buffered[table] >= self.config.part_rows:
                self._kick()

    def _kick(self) -> None:  # called with the lock held
        if not self._wake_sent and self._wake is not None:
            self._wake_sent = True
            self._wake.set()

    def _drop(self, rows: int) -> None:
        if not self._dropped:
            log.warning("event sink is closed: rows appended now are dropped (and counted)")
        self._dropped += rows

    # -- control -------------------------------------------------------------------------

    def start(self) -> EventSink:
        """Start the background pipeline (after any fork: it makes the store's client)."""
        if self._task is not None:
            return self
        if self._rt is None:
            self._rt = pick_runtime(self.config.runtime)
        if self._store is None:
            self._store = open_store(self.config.events_uri)
        self._ctx = EncodeContext(
            self.config.run_id,
            self.config.worker_id,
            self.config.store_prompts,
            secret_values(os.environ, self.config.secret_names),
        )
        store = self._store
        if isinstance(store, S3Store):  # its client costs ~0.3 s of CPU: now, not mid-run
            try:
                store.client  # noqa: B018
            except Exception as exc:  # the pipeline retries and reports it
                log.warning("event store %s: cannot make its client yet: %s", store.uri, exc)
        self._wake = self._rt.event()
        self._pipeline = SinkPipeline(
            self,
            ENCODERS,
            spool=self._spool,
            store=self._store,
            runtime=self._rt,
            wake=self._wake,
            context=self._ctx,
            part_rows=self.config.part_rows,
            part_seconds=self.config.part_seconds,
            backoff=Backoff(self.config.backoff_initial_s, self.config.backoff_max_s),
        )
        self._task = self._rt.spawn(self._pipeline.run, f"llmload-sink-{self.config.worker_id}")
        return self

    @property
    def encode_context(self) -> EncodeContext:
        """How this sink encodes rows (run, worker, secrets): for warming the encoders up."""
        return self._ctx

    def __enter__(self) -> EventSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self, timeout: float | None = 30.0, *, upload: bool = True) -> bool:
        """Seal what is buffered now; wait until it is in the store (or only in the spool).

        Returns False when `timeout` passed first (the rows are not lost: they wait in the
        spool and uploads go on).
        """
        if self._rt is None or self._wake is None:
            raise RuntimeError("flush() before start()")
        done = self._rt.event()
        with self._lock:
            if self._closed:
                return False
            self._waiters.append((done, upload))
            self._wake.set()
        return bool(done.wait(timeout))

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> SinkReport:
        """Seal everything, upload for up to `timeout` s, write the final index, report.

        Parts the store did not take stay in the spool (never deleted): the report says how
        many, and `llmload upload-spool` sends them later.
        """
        with self._lock:
            if self._closed:
                return self.stats()
            self._closed = True
            self._stopping = True
            self._deadline = time.monotonic() + timeout
            if self._wake is not None:
                self._wake.set()
        if self._task is not None:
            self._task.join(timeout + 5.0)
        report = self.stats()
        if report.pending_parts or report.pending_rows:
            log.warning("llmload: %s", report)
        else:
            log.info("%s", report)
        return report

    def stats(self) -> SinkReport:
        """A snapshot of the counters (safe to call any time)."""
        buffered = sum(self._buffered.values())
        pipeline = self._pipeline
        done = (
            pipeline.stats() if pipeline is not None else PipelineStats(dict.fromkeys(ENCODERS, 0))
        )
        memory = dict(done.memory_rows or {})
        for table, n in list(self._buffered.items()):
            memory[table] = memory.get(table, 0) + n
        return SinkReport(
            rows=done.rows,
            parts=done.parts,
            bytes=done.bytes,
            pending_parts=done.pending_parts,
            pending_rows=buffered + done.pending_rows,
            rejected_rows=done.rejected,
            dropped_rows=self._dropped,
            collisions=done.collisions,
            upload_failures=done.failures,
            index_written=done.index_written,
            spool_dir=self.config.spool_dir,
            errors=done.errors,
            events_uri=self.config.events_uri,
            spool_parts=dict(done.spool_parts or {}),
            spool_rows=dict(done.spool_rows or {}),
            memory_rows=memory,
            write_failures=done.write_failures,
            closed=self._closed,
        )

    # -- the pipeline's side (BatchSource) --------------------------------------------------

    @property
    def stopping(self) -> bool:
        """close() was called: the pipeline seals everything, uploads, then finishes."""
        return self._stopping

    @property
    def deadline(self) -> float:
        """Monotonic time by which close() wants the pipeline done (once stopping)."""
        return self._deadline

    def take(self) -> tuple[dict[str, list[Any]], list[Waiter], bool]:
        """The buffers (non-empty tables), the flush() waiters so far, and whether a part is
        due now: a flush() waits, close() was called, or a table holds `part_rows` rows.

        The pipeline takes the buffers every few hundred ms and encodes them at once; it
        seals a part when one is due or every `part_seconds`.
        """
        limit = self.config.part_rows
        with self._lock:
            waiters, self._waiters = self._waiters, []
            due = (
                self._stopping
                or bool(waiters)
                or any(rows >= limit for rows in self._buffered.values())
            )
            batches = {name: items for name, items in self._buffers.items() if items}
            if batches:
                self._buffers = {name: [] for name in self._buffers}
                self._buffered = dict.fromkeys(self._buffered, 0)
            self._wake_sent = False
        return batches, waiters, due

    def is_empty(self) -> bool:
        """No table holds a buffered item."""
        with self._lock:
            return not any(self._buffers.values())

    def reject_buffered(self) -> tuple[int, list[Waiter]]:
        """Close, drop the buffers; return their row count and the waiters to wake.

        For a pipeline that cannot run (its spool is unusable): nothing durable can be done.
        """
        with self._lock:
            rows = sum(self._buffered.values())
            self._buffers = {name: [] for name in self._buffers}
            self._buffered = dict.fromkeys(self._buffered, 0)
            self._closed = True
            waiters, self._waiters = self._waiters, []
        return rows, waiters
