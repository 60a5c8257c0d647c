"""The event sink's background pipeline: sealed buffers → Parquet parts → spool → store.

`EventSink` (locustfiles/sink/eventsink.py) owns what the request path touches: the buffers, their
lock, the flush() waiters and the dropped-row count. `SinkPipeline` is its one background
task (a greenlet under gevent, a thread otherwise). It takes the buffers from the front
(`EventSink.take`) every ENCODE_EVERY_S and encodes them with each table's encoder (in
slices, yielding to the loop), so that encoding is a steady trickle of small slices whose
code stays warm; seals the encoded rows into a part when a table reaches `part_rows` rows,
every `part_seconds`, or on flush()/close(); writes each part to a local spool with fsync;
uploads it without overwriting; deletes it from the spool only once the store has it; and
keeps `index/worker=<id>.json` up to date. A store outage only makes parts wait in the
spool (uploads retry with capped exponential backoff and jitter, forever while running); a
crashed worker's spool is uploaded later by `llmload upload-spool`. A disk that refuses a
table's part (a full spool, a full directory store) is logged once per table, not per part:
the part waits in memory (spool) or in the spool (store), is retried with the same backoff,
and is written once space is back. See docs/reliability.md.

The pipeline knows tables only by name: whatever `encoders` maps a name to turns that
table's buffered items into an Arrow table, and row counts are kept per table name.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from analysis.kernel.layout import WorkerIndex, index_key, table_of
from analysis.kernel.schema import SCHEMA_VERSION
from analysis.kernel.storage import FileStore, ObjectStore, StorageError
from locustfiles.run.secrets import redact
from locustfiles.sink.encode import EncodeContext, EncodeResult
from locustfiles.sink.runtime import Runtime, Waitable
from locustfiles.sink.spool import PartCollisionError, Spool, put_index, upload_part

log = logging.getLogger("llmload.sink")

MAX_ERRORS = 20
"""Error messages a sink keeps for its report (every rejected row is counted)."""

INDEX = "index"
"""The worker's index, where write failures are noted by table name."""

ENCODE_EVERY_S = 0.25
"""The pipeline encodes buffered rows this often, part due or not.

Encoding a whole part at the seal meant running Arrow's conversion code once every
`part_seconds`: cold in the CPU's caches by then, its first slice held the loop 20-70 ms on
the benchmark machine (bench/bench_stalls.py), where the same slice takes ~1-3 ms when it ran
a quarter of a second before. Encoding small batches often keeps every slice short and
frees the buffered Python objects early (shorter garbage collections)."""

Encoder = Callable[[Sequence[Any], EncodeContext, Callable[[], None]], EncodeResult]
"""Turns a table's buffered items into rows of its schema: `encode(items, context, pause)`."""

Waiter = tuple[Waitable, bool]
"""A flush() caller: its event, and whether it waits for the upload (else for the spool)."""

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""A full disk (or quota): the write may succeed later, once space is freed."""


def why(exc: BaseException) -> str:
    """A write failure in a few words: "no space left on device", or the exception."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return "no space left on device"
    return f"{type(exc).__name__}: {exc}"


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


class BatchSource(Protocol):
    """The sink's front as the pipeline sees it (`EventSink`)."""

    @property
    def stopping(self) -> bool:
        """close() was called: seal everything, upload until the deadline, then finish."""
        ...

    @property
    def deadline(self) -> float:
        """Monotonic time by which close() wants the pipeline done (once stopping)."""
        ...

    def take(self) -> tuple[dict[str, list[Any]], list[Waiter], bool]:
        """The buffers (non-empty tables), the flush() waiters so far, and whether a part is
        due now (waiters, close(), or a table of `part_rows` rows)."""
        ...

    def is_empty(self) -> bool:
        """No table holds a buffered item."""
        ...

    def reject_buffered(self) -> tuple[int, list[Waiter]]:
        """Close, drop the buffers; return their row count and the waiters to wake."""
        ...


@dataclass(frozen=True)
class PipelineStats:
    """The pipeline's side of a `SinkReport`: what it uploaded, still holds, and refused."""

    rows: dict[str, int]  # rows uploaded, per table
    parts: int = 0  # parts uploaded
    bytes: int = 0  # bytes uploaded (parts only)
    pending_parts: int = 0  # parts in the spool, not yet uploaded
    pending_rows: int = 0  # rows taken but not in the store: encoded, unspooled or spooled
    rejected: int = 0  # bad rows dropped at encode time
    failures: int = 0  # failed spool writes and upload attempts (each retried)
    collisions: int = 0  # parts whose key held other bytes (kept in the spool)
    index_written: bool = False  # the store's index is up to date
    errors: tuple[str, ...] = ()
    spool_parts: dict[str, int] | None = None  # per table: parts in the spool, not uploaded
    spool_rows: dict[str, int] | None = None  # per table: rows in those parts
    memory_rows: dict[str, int] | None = None  # per table: taken, not yet in the spool
    write_failures: tuple[str, ...] = ()  # "<where>: <why> (N failed writes)", each kind once


class SinkPipeline:
    """Seals, encodes, spools and uploads a sink's rows; `run` is the background task.

    All its state is owned by that task; `stats()` may be read from any thread.
    """

    def __init__(
        self,
        source: BatchSource,
        encoders: Mapping[str, Encoder],
        *,
        spool: Spool,
        store: ObjectStore,
        runtime: Runtime,
        wake: Waitable,
        context: EncodeContext,
        part_rows: int,
        part_seconds: float,
        backoff: Backoff,
    ) -> None:
        self._source = source
        self._encoders = dict(encoders)  # table name → encoder, in sealing order
        self._spool = spool
        self._store = store
        self._rt = runtime
        self._wake = wake  # set by the front: a table is full, or flush()/close()
        self._ctx = context
        self._part_rows = part_rows
        self._part_seconds = part_seconds
        self._backoff = backoff
        self._sealed_waiters: list[Waiter] = []  # flush() callers whose rows are sealed
        self._seq: dict[str, int] = {}
        self._index = WorkerIndex(spool.run_id, spool.worker_id)
        self._index_dirty = False
        self._index_merged = False
        self._encoded: dict[str, list[Any]] = {name: [] for name in self._encoders}  # tables
        self._encoded_rows = dict.fromkeys(self._encoders, 0)  # rows encoded, not yet sealed
        self._unspooled: list[tuple[str, Any]] = []  # (table name, pa.Table) not yet spooled
        self._pending: list[str] = []  # run-relative keys in the spool, not yet uploaded
        self._collided: set[str] = set()
        self._failing_since: float | None = None
        # (table, "spool" | "store") → why its writes fail now: logged once, when it starts
        self._troubles: dict[tuple[str, str], str] = {}
        self._failed_writes: dict[str, int] = {}  # "<where>: <why>" → failed writes, all run
        # counters
        self._rows = dict.fromkeys(self._encoders, 0)
        self._parts = 0
        self._bytes = 0
        self._rejected = 0
        self._failures = 0
        self._errors: list[str] = []

    def stats(self) -> PipelineStats:
        """A snapshot of the counters (safe to call any time)."""
        memory = dict(self._encoded_rows)
        for name, table in list(self._unspooled):
            memory[name] = memory.get(name, 0) + table.num_rows
        pending = list(self._pending)
        spool_parts = dict.fromkeys(self._encoders, 0)
        spool_rows = dict.fromkeys(self._encoders, 0)
        for key in pending:
            table = table_of(key)
            spool_parts[table] = spool_parts.get(table, 0) + 1
            spool_rows[table] = spool_rows.get(table, 0) + self._index.parts.get(key, 0)
        return PipelineStats(
            rows=dict(self._rows),
            parts=self._parts,
            bytes=self._bytes,
            pending_parts=len(pending),
            pending_rows=sum(memory.values()) + sum(spool_rows.values()),
            rejected=self._rejected,
            failures=self._failures,
            collisions=len(self._collided),
            index_written=not self._index_dirty and bool(self._index_merged),
            errors=tuple(self._errors),
            spool_parts=spool_parts,
            spool_rows=spool_rows,
            memory_rows=memory,
            write_failures=tuple(
                f"{where} ({n} failed write{'s' if n > 1 else ''})"
                for where, n in list(self._failed_writes.items())
            ),
        )

    # -- the background task ----------------------------------------------------------------

    def run(self) -> None:
        """Seal, spool and upload until close() and everything is done (or its deadline)."""
        rt, source = self._rt, self._source
        try:
            self._prepare()
        except Exception as exc:  # the spool is unusable: nothing durable can be done
            log.exception("event sink cannot use its spool %s", self._spool.root)
            self._error(f"spool unusable: {exc}")
            self._reject_everything()
            return
        backoff = self._backoff
        period = self._part_seconds
        last_seal = next_encode = time.monotonic()
        next_try = 0.0
        while True:
            now = time.monotonic()
            if not source.stopping:
                timeout = min(last_seal + period, next_encode) - now
                if self._has_work():
                    timeout = min(timeout, next_try - now)
                if timeout > 0:
                    self._wake.wait(timeout)
                self._wake.clear()  # before looking at the buffers: a later kick is kept
                now = time.monotonic()
            time_due = now - last_seal >= period
            if time_due:
                last_seal = now
            due = self._take()
            next_encode = time.monotonic() + ENCODE_EVERY_S
            sealed = False
            if due or time_due or self._part_full():
                sealed = self._seal()
            if source.stopping and not self._index.final and self._drained():
                self._index.final = True  # every row is sealed: this index is the last
                self._save_index()
            # spool at once (durability); retries of a failed spool write wait for backoff
            spooled = True
            if self._unspooled and (sealed or time.monotonic() >= next_try):
                spooled = self._spool_unspooled()
            if not spooled:
                next_try = time.monotonic() + backoff.next()
            elif self._has_work() and time.monotonic() >= next_try:
                if self._upload_pass():
                    backoff.reset()
                else:
                    next_try = time.monotonic() + backoff.next()
            self._settle_waiters()
            if source.stopping:
                if self._index.final and self._drained() and not self._has_work():
                    return
                left = source.deadline - time.monotonic()
                if left <= 0:
                    return
                rt.sleep(min(left, max(0.0, next_try - time.monotonic())))

    def _drained(self) -> bool:
        return (
            self._source.is_empty() and not any(self._encoded_rows.values()) and not self._unspooled
        )

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

    def _reject_everything(self) -> None:
        rejected, waiters = self._source.reject_buffered()
        self._rejected += rejected
        for event, _ in [*waiters, *self._sealed_waiters]:
            event.set()

    def _has_work(self) -> bool:
        return bool(
            self._unspooled
            or self._index_dirty
            or any(k not in self._collided for k in self._pending)
        )

    def _take(self) -> bool:
        """Take and encode the front's buffers (flush waiters move along with their rows).

        True when the front says a part is due (flush(), close(), a full table).
        """
        batches, waiters, due = self._source.take()
        self._sealed_waiters += waiters
        if batches:
            self._encode(batches)
        return due

    def _part_full(self) -> bool:
        return any(rows >= self._part_rows for rows in self._encoded_rows.values())

    def _seal(self) -> bool:
        """Encoded rows → parts of at most `part_rows` rows, waiting to be spooled."""
        sealed = False
        for name, tables in self._encoded.items():
            if not self._encoded_rows[name]:
                tables.clear()
                continue
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            self._encoded[name] = []
            self._encoded_rows[name] = 0
            limit = self._part_rows
            for offset in range(0, table.num_rows, limit):  # parts hold at most part_rows
                self._unspooled.append((name, table.slice(offset, limit)))
            sealed = True
        return sealed

    def _encode(self, batches: Mapping[str, list[Any]]) -> None:
        for name, encode in self._encoders.items():
            rows = batches.get(name)
            if not rows:
                continue
            try:
                result = encode(rows, self._ctx, self._rt.pause)
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
            if result.table.num_rows:
                self._encoded[name].append(result.table)
                self._encoded_rows[name] += result.table.num_rows

    def _spool_unspooled(self) -> bool:
        """Write sealed tables to the spool (fsync); False when the disk refused one.

        A table whose part the disk refused keeps that part and its later ones in memory, in
        order, for the next try; the other tables' parts are still tried (smaller ones may fit).
        """
        wrote = False
        refused: set[str] = set()
        left: list[tuple[str, Any]] = []  # refused, or behind a refused part of their table
        parts = self._unspooled
        for i, (name, table) in enumerate(parts):
            if name in refused:
                left.append((name, table))
                continue
            while True:
                try:
                    key, _ = self._io(self._spool.write_part, name, self._seq[name], table)
                except FileExistsError:  # a part of an earlier sink with this id: skip the number
                    self._seq[name] += 1
                    continue
                except OSError as exc:
                    self._write_failed(name, "spool", exc)
                    refused.add(name)
                    left.append((name, table))
                    break
                self._seq[name] += 1
                self._unspooled = [*left, *parts[i + 1 :]]  # (stats() never counts it twice)
                self._index.parts[key] = table.num_rows
                self._pending.append(key)
                self._write_done(name, "spool")
                wrote = True
                break
        self._unspooled = left
        if wrote:
            self._save_index()
        return not refused

    def _write_failed(self, table: str, place: str, exc: Exception) -> None:
        """A part of `table` could not be written to the spool or the store: one line per
        table and place when it starts (not one per part or retry), counted after."""
        self._failures += 1
        cause = why(exc)
        where = (
            f"the spool {self._spool.root}"
            if place == "spool"
            else f"the events store {self._store.uri}"
        )
        kind = f"{where}: {cause}"
        self._failed_writes[kind] = self._failed_writes.get(kind, 0) + 1
        if self._troubles.get((table, place)) == cause:
            log.debug("event sink: %s: %s still refuses %s parts", where, cause, table)
            return
        self._troubles[(table, place)] = cause
        self._error(f"{table}: {place} write failed: {exc}")
        if place == "spool":
            log.warning(
                "llmload: cannot write the %s table to the spool %s: %s; its rows are kept in "
                "memory and retried with backoff; free space there, or the rows still in "
                "memory when this worker exits are lost",
                table,
                self._spool.root,
                cause,
            )
        else:
            log.warning(
                "llmload: cannot write the %s table to the events store %s: %s; its parts "
                "are kept in the spool %s and retried with backoff",
                table,
                self._store.uri,
                cause,
                self._spool.root,
            )

    def _write_done(self, table: str, place: str) -> None:
        """A part of `table` was written: if its writes there had failed, say they work again."""
        if self._troubles and self._troubles.pop((table, place), None) is not None:
            where = "the spool" if place == "spool" else "the events store"
            log.info("llmload: the %s table is written to %s again", table, where)

    def _save_index(self) -> None:
        try:
            self._io(self._spool.save_index, self._index)
        except OSError as exc:  # upload-spool reads the row counts from the parts instead
            if (INDEX, "spool") not in self._troubles:
                self._troubles[(INDEX, "spool")] = why(exc)
                self._error(f"spool index write failed: {exc}")
                log.warning("llmload: cannot write the spool index %s: %s (written again "
                            "with the next part)", self._spool.index_path, why(exc))  # fmt: skip
        else:
            self._troubles.pop((INDEX, "spool"), None)
        self._index_dirty = True

    def _io(self, fn: Any, *args: Any) -> Any:
        """A part's blocking work (write, read back, upload to a file store, remove, index):
        while requests run, in the runtime's background thread (below the loop's priority:
        runtime.BACKGROUND_NICE); once the sink is closing, where nothing waits behind it."""
        if self._source.stopping:
            return self._rt.run_blocking(fn, *args)
        return self._rt.run_background(fn, *args)

    def _store_io(self, fn: Any, *args: Any) -> Any:
        """Store calls: inline when sockets cooperate (gevent-patched), else off the loop."""
        rt = self._rt
        if isinstance(self._store, FileStore) or rt.blocks_on_sockets():
            return self._io(fn, *args)
        return fn(*args)

    def _upload_pass(self) -> bool:
        """Upload every pending part, then the index. False when the store failed.

        A store out of space refuses a table's part: that table's later parts wait for the
        next pass, the other tables' parts are still tried (smaller ones may fit).
        """
        store = self._store
        full: set[str] = set()
        for key in list(self._pending):
            table = table_of(key)
            if key in self._collided or table in full:
                continue
            try:
                data = self._io(self._spool.read, key)
                self._store_io(upload_part, store, self._spool.store_key(key), data)
            except PartCollisionError as exc:
                log.error("event sink: %s", exc)
                self._error(str(exc))
                self._collided.add(key)
                continue
            except OSError as exc:
                if exc.errno not in NO_SPACE:
                    self._note_failure(exc)
                    return False
                self._write_failed(table, "store", exc)
                full.add(table)
                continue
            except StorageError as exc:
                self._note_failure(exc)
                return False
            except Exception as exc:  # an unexpected client error: logged in full, retried
                log.exception("event sink: unexpected error uploading %s", key)
                self._note_failure(exc)
                return False
            try:
                self._io(self._spool.remove, key)
            except OSError as exc:  # harmless: a later upload finds identical bytes
                log.warning("event sink: uploaded %s but could not delete it: %s", key, exc)
            self._pending.remove(key)
            self._parts += 1
            self._bytes += len(data)
            self._rows[table] = self._rows.get(table, 0) + self._index.parts.get(key, 0)
            self._write_done(table, "store")
        if full:
            return False
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
        snapshot = WorkerIndex(
            self._index.run_id, self._index.worker_id, dict(self._index.parts), self._index.final
        )
        if not self._index_merged:  # pick up an earlier sink's index for this worker id once
            self._store_io(put_index, store, self._spool, snapshot)
            self._index.merge(snapshot)
            self._index_merged = True
        else:
            key = self._spool.store_key(index_key(self._index.worker_id))
            self._store_io(lambda: store.put(key, snapshot.to_json(SCHEMA_VERSION), overwrite=True))
        self._index_dirty = False
        if self._index.final and not self._pending and not self._unspooled:
            self._rt.run_blocking(self._spool.cleanup)

    def _note_failure(self, exc: Exception) -> None:
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.warning(
                "event store %s failed (%s); %d part(s) wait in the spool %s, retrying",
                self._store.uri,
                exc,
                len(self._pending),
                self._spool.root,
            )
        else:
            log.debug("event store still failing: %s", exc)

    def _error(self, message: str) -> None:
        if len(self._errors) < MAX_ERRORS:
            self._errors.append(message)
