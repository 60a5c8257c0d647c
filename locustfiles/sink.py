"""EventSink: a worker's request and chunk rows → Parquet parts in object storage, nothing lost.

The request path only appends references to in-memory buffers (no I/O, no conversion, no
exception); one background task (a greenlet under gevent, a thread otherwise) seals the
buffers into Parquet parts when a table reaches `part_rows` rows or every `part_seconds`,
writes each part to a local spool with fsync, uploads it without overwriting, deletes it
from the spool only once the store has it, and keeps `index/worker=<id>.json` up to date.
A store outage only makes parts wait in the spool (uploads retry with capped exponential
backoff and jitter, forever while running); a crashed worker's spool is uploaded later by
`llmload upload-spool`. See docs/reliability.md.

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

Rows may leave out `run_id` and `worker_id` (the sink fills them in). Hand the sink lists
you will not modify afterwards: it keeps references until the part is sealed. Bad rows are
rejected when the part is built, counted in the report and logged; append never raises.
`prompt_text` is dropped unless `store_prompts=True`; values of secret-named environment
variables are redacted from `error_detail`.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.storage import FileStore, ObjectStore, S3Store, StorageError, open_store
from locustfiles.encode import EncodeContext, encode_chunks, encode_requests
from locustfiles.runtime import Runtime, Task, Waitable, pick_runtime
from locustfiles.secrets import redact, secret_values
from locustfiles.spool import PartCollisionError, Spool, WorkerIndex, put_index, upload_part

log = logging.getLogger("llmload.sink")

DEFAULT_PART_ROWS = 100_000
"""Rows per part and table: ~1,000 requests of 100 chunk rows, ~1-2 MB of Parquet."""
DEFAULT_PART_SECONDS = 10.0
"""Longest a row waits in memory: bounds what a SIGKILL can lose and how stale the store is."""
DEFAULT_CLOSE_TIMEOUT = 60.0


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

    def __str__(self) -> str:
        rows = ", ".join(f"{n} {t} rows" for t, n in self.rows.items())
        text = f"event sink wrote {self.parts} parts ({rows}, {self.bytes} bytes)"
        if self.pending_parts or self.pending_rows:
            text += (
                f"; NOT UPLOADED: {self.pending_rows} rows in {self.pending_parts} parts kept "
                f"in {self.spool_dir} (run `llmload upload-spool {self.spool_dir} "
                "--events-uri URI`)"
            )
        if self.rejected_rows:
            text += f"; {self.rejected_rows} bad rows rejected"
        if self.dropped_rows:
            text += f"; {self.dropped_rows} rows appended after close dropped"
        if self.collisions:
            text += f"; {self.collisions} key collisions (parts kept in the spool)"
        return text


class Backoff:
    """Capped exponential backoff with full jitter: 0.5 s, 1 s, 2 s … ≤ max."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self.attempt = 0

    def next(self) -> float:
        ceiling = min(self.maximum, self.initial * 2**self.attempt)
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class EventSink:
    """Buffers a worker's rows and writes them as Parquet parts (see the module docstring)."""

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
        self._requests: list[Mapping[str, Any]] = []
        self._chunks: list[tuple[Any, ...]] = []
        self._chunk_rows = 0
        self._wake: Waitable | None = None
        self._wake_sent = False
        self._waiters: list[tuple[Waitable, bool]] = []  # (event, wants upload)
        self._sealed_waiters: list[tuple[Waitable, bool]] = []  # their rows are sealed
        self._task: Task | None = None
        self._stopping = False
        self._deadline = 0.0
        self._closed = False
        self._ctx = EncodeContext(config.run_id, config.worker_id, config.store_prompts)
        # state owned by the background task
        self._seq: dict[str, int] = {}
        self._index = WorkerIndex(config.run_id, config.worker_id)
        self._index_dirty = False
        self._index_merged = False
        self._unspooled: list[tuple[str, Any]] = []  # (table name, pa.Table) not yet spooled
        self._pending: list[str] = []  # run-relative keys in the spool, not yet uploaded
        self._collided: set[str] = set()
        self._failing_since: float | None = None
        # counters
        self._rows = {"requests": 0, "chunks": 0}
        self._parts = 0
        self._bytes = 0
        self._rejected = 0
        self._dropped = 0
        self._failures = 0
        self._errors: list[str] = []

    # -- the request path: appends only ------------------------------------------------------

    def append_request(self, row: Mapping[str, Any]) -> None:
        """Buffer one request row (REQUESTS_SCHEMA column names). Never raises, never blocks."""
        with self._lock:
            if self._closed:
                self._drop(1)
                return
            self._requests.append(row)
            if len(self._requests) >= self.config.part_rows:
                self._kick()

    def append_chunks(
        self,
        request_id: str,
        offset_ns: Sequence[int],
        tokens: Sequence[int],
        chars: Sequence[int],
        kind: str | Sequence[str] = "content",
    ) -> None:
        """Buffer one request's chunk rows column-wise (`seq` is the position). Never raises."""
        try:
            n = len(offset_ns)
        except TypeError:
            n = 0
        with self._lock:
            if self._closed:
                self._drop(n)
                return
            self._chunks.append((request_id, offset_ns, tokens, chars, kind))
            self._chunk_rows += n
            if self._chunk_rows >= self.config.part_rows:
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
        """Start the background task (after any fork: it makes the store's client)."""
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
            secret_values(os.environ),
        )
        self._wake = self._rt.event()
        self._task = self._rt.spawn(self._run, f"llmload-sink-{self.config.worker_id}")
        return self

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
            log.warning("%s", report)
        else:
            log.info("%s", report)
        return report

    def stats(self) -> SinkReport:
        """A snapshot of the counters (safe to call any time)."""
        buffered = len(self._requests) + self._chunk_rows
        unspooled = sum(t.num_rows for _, t in self._unspooled)
        waiting = sum(self._index.parts.get(k, 0) for k in self._pending)
        return SinkReport(
            rows=dict(self._rows),
            parts=self._parts,
            bytes=self._bytes,
            pending_parts=len(self._pending),
            pending_rows=buffered + unspooled + waiting,
            rejected_rows=self._rejected,
            dropped_rows=self._dropped,
            collisions=len(self._collided),
            upload_failures=self._failures,
            index_written=not self._index_dirty and bool(self._index_merged),
            spool_dir=self.config.spool_dir,
            errors=tuple(self._errors),
        )

    # -- the background task ----------------------------------------------------------------

    def _run(self) -> None:
        rt = self._rt
        assert rt is not None and self._wake is not None
        try:
            self._prepare()
        except Exception as exc:  # the spool is unusable: nothing durable can be done
            log.exception("event sink cannot use its spool %s", self.config.spool_dir)
            self._error(f"spool unusable: {exc}")
            self._reject_everything()
            return
        backoff = Backoff(self.config.backoff_initial_s, self.config.backoff_max_s)
        period = self.config.part_seconds
        last_seal = time.monotonic()
        next_try = 0.0
        while True:
            now = time.monotonic()
            if not self._stopping:
                timeout = last_seal + period - now
                if self._has_work():
                    timeout = min(timeout, next_try - now)
                if timeout > 0:
                    self._wake.wait(timeout)
                self._wake.clear()  # before looking at the buffers: a later kick is kept
                now = time.monotonic()
            time_due = now - last_seal >= period
            if time_due:
                last_seal = now
            requests, chunks = self._take(time_due)
            if requests or chunks:
                self._encode(requests, chunks)
            if self._stopping and not self._index.final and self._drained():
                self._index.final = True  # every row is sealed: this index is the last
                self._save_index()
            # spool at once (durability); retries of a failed spool write wait for backoff
            fresh = bool(requests or chunks)
            spooled = True
            if self._unspooled and (fresh or time.monotonic() >= next_try):
                spooled = self._spool_unspooled()
            if not spooled:
                next_try = time.monotonic() + backoff.next()
            elif self._has_work() and time.monotonic() >= next_try:
                if self._upload_pass():
                    backoff.reset()
                else:
                    next_try = time.monotonic() + backoff.next()
            self._settle_waiters()
            if self._stopping:
                if self._index.final and self._drained() and not self._has_work():
                    return
                left = self._deadline - time.monotonic()
                if left <= 0:
                    return
                rt.sleep(min(left, max(0.0, next_try - time.monotonic())))

    def _drained(self) -> bool:
        with self._lock:
            return not self._requests and not self._chunks and not self._unspooled

    def _settle_waiters(self) -> None:
        """Wake flush() callers whose rows are spooled (or uploaded, if they asked)."""
        if not self._sealed_waiters:
            return
        spooled = not self._unspooled
        uploaded = spooled and not self._has_work()
        keep = []
        for event, wants_upload in self._sealed_waiters:
            if uploaded or (spooled and not wants_upload):
                event.set()
            else:
                keep.append((event, wants_upload))
        self._sealed_waiters = keep

    def _prepare(self) -> None:
        rt = self._rt
        assert rt is not None
        rt.run_blocking(self._spool.run_dir.mkdir, 0o755, True, True)
        rt.run_blocking(self._spool.claim)
        self._seq = rt.run_blocking(self._spool.next_seq)
        self._index = rt.run_blocking(self._spool.load_index)
        self._index.final = False
        self._pending = rt.run_blocking(self._spool.pending)
        for key in self._pending:  # left by an earlier sink with this worker id
            if key not in self._index.parts:
                self._index.parts[key] = rt.run_blocking(self._spool.part_rows, key)
        self._index_dirty = True
        store = self._store
        if isinstance(store, S3Store):  # make the boto3 client (~0.3 s of CPU) off the loop
            try:
                rt.run_blocking(lambda: store.client)
            except Exception as exc:
                self._note_failure(exc)

    def _reject_everything(self) -> None:
        with self._lock:
            self._rejected += len(self._requests) + self._chunk_rows
            self._requests, self._chunks, self._chunk_rows = [], [], 0
            self._closed = True
            waiters, self._waiters = self._waiters, []
        for event, _ in [*waiters, *self._sealed_waiters]:
            event.set()

    def _has_work(self) -> bool:
        return bool(
            self._unspooled
            or self._index_dirty
            or any(k not in self._collided for k in self._pending)
        )

    def _take(self, time_due: bool) -> tuple[list[Any], list[Any]]:
        """Swap out the buffers when a part is due (flush waiters move along with them)."""
        limit = self.config.part_rows
        with self._lock:
            waiters, self._waiters = self._waiters, []
            self._sealed_waiters += waiters
            due = (
                self._stopping
                or bool(waiters)
                or time_due
                or len(self._requests) >= limit
                or self._chunk_rows >= limit
            )
            if not due:
                return [], []
            requests, chunks = self._requests, self._chunks
            self._requests, self._chunks, self._chunk_rows = [], [], 0
            self._wake_sent = False
        return requests, chunks

    def _encode(self, requests: list[Any], chunks: list[Any]) -> None:
        rt = self._rt
        assert rt is not None
        for name, rows, encode in (
            ("requests", requests, encode_requests),
            ("chunks", chunks, encode_chunks),
        ):
            if not rows:
                continue
            try:
                result = encode(rows, self._ctx, rt.pause)
            except Exception as exc:  # a bug in encoding: count the rows, keep the task alive
                log.exception("event sink could not encode %d %s rows", len(rows), name)
                self._rejected += len(rows)
                self._error(f"{name}: encoding failed: {exc}")
                continue
            if result.rejected:
                self._rejected += result.rejected
            for message in result.errors:
                message = redact(message, self._ctx.secrets)  # rows may quote secrets
                self._error(message)
                log.error("event sink: %s", message)
            table, limit = result.table, self.config.part_rows
            for offset in range(0, table.num_rows, limit):  # parts hold at most part_rows
                self._unspooled.append((name, table.slice(offset, limit)))

    def _spool_unspooled(self) -> bool:
        """Write sealed tables to the spool (fsync); False when the disk refused."""
        rt = self._rt
        assert rt is not None
        wrote = False
        ok = True
        while self._unspooled and ok:
            name, table = self._unspooled[0]
            try:
                key, _ = rt.run_blocking(self._spool.write_part, name, self._seq[name], table)
            except FileExistsError:  # a part of an earlier sink with this id: skip the number
                self._seq[name] += 1
                continue
            except OSError as exc:
                log.error("event sink cannot write to its spool %s: %s", self.config.spool_dir, exc)
                self._error(f"spool write failed: {exc}")
                self._failures += 1
                ok = False
                continue
            self._seq[name] += 1
            self._unspooled.pop(0)
            self._index.parts[key] = table.num_rows
            self._pending.append(key)
            wrote = True
        if wrote:
            self._save_index()
        return ok

    def _save_index(self) -> None:
        assert self._rt is not None
        try:
            self._rt.run_blocking(self._spool.save_index, self._index)
        except OSError as exc:
            log.error("event sink cannot write its spool index: %s", exc)
            self._error(f"spool index write failed: {exc}")
        self._index_dirty = True

    def _store_io(self, fn: Any, *args: Any) -> Any:
        """Store calls: inline when sockets cooperate (gevent-patched), else off the loop."""
        rt = self._rt
        assert rt is not None
        if isinstance(self._store, FileStore) or rt.blocks_on_sockets():
            return rt.run_blocking(fn, *args)
        return fn(*args)

    def _upload_pass(self) -> bool:
        """Upload every pending part, then the index. False when the store failed."""
        rt = self._rt
        store = self._store
        assert rt is not None and store is not None
        for key in list(self._pending):
            if key in self._collided:
                continue
            try:
                data = rt.run_blocking(self._spool.read, key)
                self._store_io(upload_part, store, self._spool.store_key(key), data)
            except PartCollisionError as exc:
                log.error("event sink: %s", exc)
                self._error(str(exc))
                self._collided.add(key)
                continue
            except (StorageError, OSError) as exc:
                self._note_failure(exc)
                return False
            except Exception as exc:  # an unexpected client error: logged in full, retried
                log.exception("event sink: unexpected error uploading %s", key)
                self._note_failure(exc)
                return False
            try:
                rt.run_blocking(self._spool.remove, key)
            except OSError as exc:  # harmless: a later upload finds identical bytes
                log.warning("event sink: uploaded %s but could not delete it: %s", key, exc)
            self._pending.remove(key)
            self._parts += 1
            self._bytes += len(data)
            table = key.split("/", 1)[0]
            self._rows[table] = self._rows.get(table, 0) + self._index.parts.get(key, 0)
        if self._index_dirty:
            try:
                self._put_index()
            except Exception as exc:
                self._note_failure(exc)
                return False
        if self._failing_since is not None:
            log.info(
                "event store %s is back after %.1f s; spool drained",
                store.uri,
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None
        return True

    def _put_index(self) -> None:
        store = self._store
        assert store is not None
        snapshot = WorkerIndex(
            self._index.run_id, self._index.worker_id, dict(self._index.parts), self._index.final
        )
        if not self._index_merged:  # pick up an earlier sink's index for this worker id once
            self._store_io(put_index, store, self._spool, snapshot)
            self._index.merge(snapshot)
            self._index_merged = True
        else:
            key = self._spool.store_key(f"index/worker={self._index.worker_id}.json")
            self._store_io(lambda: store.put(key, snapshot.to_json(), overwrite=True))
        self._index_dirty = False
        if self._index.final and not self._pending and not self._unspooled:
            assert self._rt is not None
            self._rt.run_blocking(self._spool.cleanup)

    def _note_failure(self, exc: Exception) -> None:
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            store = self._store.uri if self._store is not None else self.config.events_uri
            log.warning(
                "event store %s failed (%s); %d part(s) wait in the spool %s, retrying",
                store,
                exc,
                len(self._pending),
                self.config.spool_dir,
            )
        else:
            log.debug("event store still failing: %s", exc)

    def _error(self, message: str) -> None:
        if len(self._errors) < 20:
            self._errors.append(message)
