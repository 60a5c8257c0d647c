"""The local spool: Parquet parts wait here, on disk, until the store has them.

A worker's sink writes every part to the spool (fsync, then rename) before it uploads it,
and deletes it only after the store accepted it; a part is never lost to a store outage or a
worker crash. The spool mirrors the store's keys (docs/events.md), so one spool directory
can hold many runs and workers (keys: analysis/kernel/layout.py):

    <spool>/<run_id>/requests/worker=<worker_id>/part-000000.parquet   ready to upload
    <spool>/<run_id>/chunks/worker=<worker_id>/part-000000.parquet
    <spool>/<run_id>/index/worker=<worker_id>.json   every part the worker sealed + row counts
    <spool>/<run_id>/.owner/worker=<worker_id>.json  {host, pid} of the live sink (removed on close)
    .tmp-*                                           a write in progress; never uploaded

`upload_spool(root, store)` (the `llmload upload-spool` command) uploads what a dead worker
left behind and merges its index into the store's; it skips spools whose sink is still alive
on this host unless forced. Uploads never overwrite: a key that already holds the same bytes
counts as done (a crash after the upload, before the delete); a key that holds different
bytes is a collision, logged and kept in the spool.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.kernel.layout import (
    INDEX_FOLDER,
    TABLE_NAMES,
    WorkerIndex,
    index_key,
    parse_part_key,
    part_key,
    run_key,
    worker_folder,
    worker_name,
    worker_of,
)
from analysis.kernel.schema import SCHEMA_VERSION
from analysis.kernel.storage import ObjectExistsError, ObjectMissingError, ObjectStore, StorageError

log = logging.getLogger("llmload.spool")

PARQUET_COMPRESSION = "zstd"
UNIQUE_STRINGS = frozenset(
    {"prompt_sha256", "prompt_text", "error_detail", "server_request_id", "span_id", "attributes"}
)
"""String columns whose values rarely repeat within a part: written plain, not as a dictionary."""


def write_parquet(table: pa.Table, where: Any) -> None:
    """A part's Parquet bytes (zstd; dictionaries where values repeat) to a file or path."""
    pq.write_table(
        table, where, compression=PARQUET_COMPRESSION, use_dictionary=dictionary_columns(table)
    )


def dictionary_columns(table: pa.Table) -> list[str]:
    """The columns a part writes dictionary-encoded: its strings that repeat (run and worker
    ids, kinds, statuses, models; a chunk's request id once per event), not the ones unique to
    a row (a request's own id and the UNIQUE_STRINGS) nor numbers. Dictionaries on every column
    (pyarrow's default) cost twice the CPU of a part's write and made larger files: zstd packs
    plain numbers better than dictionary indices."""
    unique = UNIQUE_STRINGS | ({"request_id"} if "sent_at_ns" in table.schema.names else set())
    return [
        f.name
        for f in table.schema
        if (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)) and f.name not in unique
    ]


_TMP_PREFIX = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[Any], None]) -> int:
    """Write through `write(fh)` to a temp file, fsync, rename over `path`; return the size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
            size = fh.tell()
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return size
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


class Spool:
    """One worker's corner of a spool directory (`<root>/<run_id>/…worker=<worker_id>…`).

    Blocking file I/O with fsync: under gevent, call it from a threadpool.
    """

    def __init__(self, root: Path, run_id: str, worker_id: str) -> None:
        for name, value in (("run_id", run_id), ("worker_id", worker_id)):
            if not value or "/" in value or value in (".", "..") or value.startswith("."):
                raise ValueError(f"{name} {value!r} cannot name a directory")
        self.root = Path(root)
        self.run_id = run_id
        self.worker_id = worker_id
        self.run_dir = self.root / run_id

    def path(self, key: str) -> Path:
        """Spool file of a key relative to the run (`requests/worker=w/part-000000.parquet`)."""
        return self.run_dir / key

    def store_key(self, key: str) -> str:
        """The object key (relative to the events URI) of a run-relative key."""
        return run_key(self.run_id, key)

    # -- parts ---------------------------------------------------------------------------

    def write_part(self, table_name: str, seq: int, table: pa.Table) -> tuple[str, int]:
        """Write one Parquet part durably; return (key, size in bytes). Never replaces a part."""
        key = part_key(table_name, self.worker_id, seq)
        path = self.path(key)
        if path.exists():
            raise FileExistsError(f"spool part {path} already exists")
        size = write_atomic(path, lambda fh: write_parquet(table, fh))
        return key, size

    def pending(self) -> list[str]:
        """Keys of this worker's parts still waiting in the spool, in upload order."""
        keys = []
        for table in TABLE_NAMES:
            folder = worker_folder(table, self.worker_id)
            if (self.run_dir / folder).is_dir():
                found = (f"{folder}/{p.name}" for p in (self.run_dir / folder).iterdir())
                keys += [k for k in found if parse_part_key(k) is not None]
        return sorted(keys, key=lambda k: (k.rsplit("/", 1)[-1], k))

    def next_seq(self) -> dict[str, int]:
        """First unused sequence number per table (after parts in the spool or its index)."""
        index = self.load_index()
        seqs = dict.fromkeys(TABLE_NAMES, 0)
        for key in [*index.parts, *self.pending()]:
            part = parse_part_key(key)
            if part is not None:
                seqs[part.table] = max(seqs[part.table], part.seq + 1)
        return seqs

    def read(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def remove(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def part_rows(self, key: str) -> int:
        return int(pq.read_metadata(self.path(key)).num_rows)

    # -- index and owner ------------------------------------------------------------------

    @property
    def index_path(self) -> Path:
        return self.path(index_key(self.worker_id))

    def load_index(self) -> WorkerIndex:
        try:
            return WorkerIndex.from_json(self.index_path.read_bytes())
        except FileNotFoundError:
            return WorkerIndex(self.run_id, self.worker_id)

    def save_index(self, index: WorkerIndex) -> None:
        data = index.to_json(SCHEMA_VERSION)
        write_atomic(self.index_path, lambda fh: fh.write(data))

    @property
    def owner_path(self) -> Path:
        return self.run_dir / ".owner" / f"{worker_name(self.worker_id)}.json"

    def claim(self) -> None:
        """Mark this spool as owned by the live process (upload-spool leaves it alone)."""
        doc = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
        write_atomic(self.owner_path, lambda fh: fh.write(doc))

    def release(self) -> None:
        self.owner_path.unlink(missing_ok=True)

    def owner_alive(self) -> bool:
        """True when the sink that owns this spool still runs on this host."""
        try:
            doc = json.loads(self.owner_path.read_bytes())
        except (FileNotFoundError, ValueError):
            return False
        if doc.get("host") != socket.gethostname():
            return False  # cannot tell; the caller decides (upload-spool runs on the dead host)
        pid = int(doc.get("pid", -1))
        if pid <= 0 or pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)  # signal 0: existence check only
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def cleanup(self) -> None:
        """Remove this worker's index, owner file and empty folders once nothing waits."""
        if self.pending():
            return
        self.index_path.unlink(missing_ok=True)
        self.release()
        folders = [self.run_dir / worker_folder(t, self.worker_id) for t in TABLE_NAMES]
        for folder in folders:  # writes a killed process left half done
            for tmp in folder.glob(f"{_TMP_PREFIX}*") if folder.is_dir() else ():
                tmp.unlink(missing_ok=True)
        folders += [self.run_dir / t for t in TABLE_NAMES]
        folders += [self.run_dir / INDEX_FOLDER, self.owner_path.parent, self.run_dir]
        for folder in folders:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: other workers' files stay


# -- uploading ----------------------------------------------------------------------------


class PartCollisionError(StorageError):
    """The store already holds different bytes under a part's key; nothing was overwritten."""


def upload_part(store: ObjectStore, key: str, data: bytes) -> bool:
    """Put `data` under `key` without overwriting.

    Returns True when uploaded now, False when the store already held the same bytes (an
    earlier attempt got through). Raises PartCollisionError when it holds other bytes, and
    StorageError when the store fails.
    """
    try:
        store.put(key, data)
        return True
    except ObjectExistsError:
        try:
            existing = store.get(key)
        except ObjectMissingError:  # deleted between the put and the get: try once more
            store.put(key, data)
            return True
        if existing == data:
            return False
        raise PartCollisionError(
            f"{key} already exists in {store.uri} with different content "
            f"({len(existing)} bytes, ours {len(data)}); kept in the spool, not overwritten"
        ) from None


def put_index(store: ObjectStore, spool: Spool, index: WorkerIndex) -> None:
    """Write the worker's index to the store, merged with what the store already has."""
    key = spool.store_key(index_key(spool.worker_id))
    try:
        disagree = index.merge(WorkerIndex.from_json(store.get(key)))
    except ObjectMissingError:
        pass
    except ValueError as exc:
        log.warning("index %s in %s is not valid JSON (%s); replacing it", key, store.uri, exc)
    else:
        for part, (mine, theirs) in disagree.items():
            log.warning("index row counts disagree for %s: %d vs %d", part, mine, theirs)
    store.put(key, index.to_json(SCHEMA_VERSION), overwrite=True)


@dataclass
class RecoveryReport:
    """What `upload_spool` did."""

    workers: int = 0
    uploaded: int = 0  # parts uploaded now
    already_present: int = 0  # parts the store already held, byte for byte
    rows: int = 0  # rows in the parts uploaded or found present
    collisions: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # keys still in the spool after an error
    skipped_live: list[str] = field(default_factory=list)  # worker spools owned by a live sink

    @property
    def complete(self) -> bool:
        return not (self.collisions or self.failed or self.skipped_live)

    def __str__(self) -> str:
        text = (
            f"{self.workers} worker spool(s): {self.uploaded} part(s) uploaded, "
            f"{self.already_present} already in the store, {self.rows} rows"
        )
        if self.collisions:
            text += f"; {len(self.collisions)} collision(s) kept in the spool"
        if self.failed:
            text += f"; {len(self.failed)} part(s) failed and remain in the spool"
        if self.skipped_live:
            text += f"; skipped {len(self.skipped_live)} spool(s) of live worker(s)"
        return text


def find_spools(root: Path, run_id: str | None = None) -> Iterator[Spool]:
    """Every (run, worker) spool under a spool root that holds parts or an index."""
    root = Path(root)
    if not root.is_dir():
        return
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if run_dir.name.startswith(".") or (run_id and run_dir.name != run_id):
            continue
        workers: set[str] = set()
        for folder in [*(run_dir / t for t in TABLE_NAMES), run_dir / INDEX_FOLDER]:
            if folder.is_dir():
                for entry in folder.iterdir():
                    worker = worker_of(entry.name)
                    if worker is not None:
                        workers.add(worker)
        for worker_id in sorted(workers):
            yield Spool(root, run_dir.name, worker_id)


def upload_spool(
    root: Path, store: ObjectStore, *, run_id: str | None = None, force: bool = False
) -> RecoveryReport:
    """Upload every part left in a spool directory and merge each worker's index.

    Parts already in the store with the same bytes count as done; uploaded parts are
    deleted from the spool; collisions and failures stay there. Spools whose sink is still
    alive on this host are skipped unless `force`.
    """
    report = RecoveryReport()
    for spool in find_spools(root, run_id):
        label = run_key(spool.run_id, worker_name(spool.worker_id))
        if not force and spool.owner_alive():
            log.warning("%s: its sink is still running; skipped (use --force)", label)
            report.skipped_live.append(label)
            continue
        report.workers += 1
        index = spool.load_index()
        clean = True
        for key in spool.pending():
            try:
                rows = spool.part_rows(key)
                index.parts.setdefault(key, rows)
                if upload_part(store, spool.store_key(key), spool.read(key)):
                    report.uploaded += 1
                else:
                    report.already_present += 1
                report.rows += rows
                spool.remove(key)
            except PartCollisionError as exc:
                log.error("%s", exc)
                report.collisions.append(spool.store_key(key))
                clean = False
            except (StorageError, OSError, pa.ArrowException) as exc:
                log.error("%s: %s", spool.store_key(key), exc)
                report.failed.append(spool.store_key(key))
                clean = False
        try:
            put_index(store, spool, index)
        except StorageError as exc:
            log.error("%s: index not written: %s", label, exc)
            report.failed.append(spool.store_key(index_key(spool.worker_id)))
            clean = False
        if clean:
            spool.cleanup()
        else:
            spool.save_index(index)
    return report
