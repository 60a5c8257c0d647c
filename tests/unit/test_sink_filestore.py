"""EventSink against a directory store: parts, index, spool, retries, collisions, recovery."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from analysis.kernel.storage import FileStore, ObjectInfo, StorageError
from locustfiles.sink.eventsink import Backoff, EventSink, SinkConfig
from locustfiles.sink.pipeline import ENCODE_EVERY_S
from locustfiles.sink.runtime import GeventRuntime, ThreadRuntime
from locustfiles.sink.spool import Spool, upload_spool
from tests.support.events import RUN_ID, chunk_columns, request_id, request_row

WORKER = "host-1-abc"


class FlakyStore:
    """A FileStore that fails every call while `down` is set."""

    def __init__(self, root: Path) -> None:
        self.inner = FileStore(root)
        self.uri = self.inner.uri
        self.down = False
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise StorageError("S3 put failed: EndpointConnectionError")

    def put(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        self._check()
        self.inner.put(key, data, overwrite=overwrite)

    def get(self, key: str) -> bytes:
        self._check()
        return self.inner.get(key)

    def exists(self, key: str) -> bool:
        self._check()
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def config(tmp_path: Path, **kw: Any) -> SinkConfig:
    defaults: dict[str, Any] = {
        "events_uri": str(tmp_path / "store"),
        "run_id": RUN_ID,
        "worker_id": WORKER,
        "spool_dir": tmp_path / "spool",
        "part_rows": 1000,
        "part_seconds": 30.0,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "runtime": "threads",
    }
    defaults.update(kw)
    return SinkConfig(**defaults)


def feed(sink: EventSink, start: int, count: int, events: int = 10) -> None:
    for i in range(start, start + count):
        sink.append_request(request_row(i))
        sink.append_chunks(request_id(i), *chunk_columns(events))


def read_rows(root: Path, table: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted((root / RUN_ID / table).rglob("*.parquet")):
        # partitioning=None: no `worker` column made from the path (older pyarrow adds one)
        rows += pq.read_table(path, partitioning=None).to_pylist()
    return rows


def spool_parts(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "spool").rglob("*.parquet"))


def test_parts_keys_index_and_report(tmp_path: Path) -> None:
    sink = EventSink(config(tmp_path, part_rows=500)).start()
    feed(sink, 0, 120)  # 120 request rows, 1,200 chunk rows: chunk parts of >= 500 rows
    assert sink.flush(10)
    report = sink.close(10)
    assert report.complete, report
    assert report.rows == {"requests": 120, "chunks": 1200, "samples": 0, "stalls": 0}
    root = tmp_path / "store"
    keys = sorted(p.relative_to(root / RUN_ID).as_posix() for p in root.rglob("*.parquet"))
    assert keys[0] == f"chunks/worker={WORKER}/part-000000.parquet"
    assert f"requests/worker={WORKER}/part-000000.parquet" in keys
    assert report.parts == len(keys) >= 3
    index = json.loads((root / RUN_ID / "index" / f"worker={WORKER}.json").read_text())
    assert index["final"] is True and index["run_id"] == RUN_ID
    assert index["rows"] == {"requests": 120, "chunks": 1200, "samples": 0, "stalls": 0}
    assert set(index["parts"]) == set(keys)
    requests = read_rows(root, "requests")
    assert [r["request_id"] for r in requests] == [request_id(i) for i in range(120)]
    expected = {**request_row(7), "run_id": RUN_ID, "worker_id": WORKER}
    assert {k: v for k, v in requests[7].items() if v is not None} == expected
    chunks = read_rows(root, "chunks")
    assert (
        len(chunks) == 1200 and chunks[10]["seq"] == 0 and chunks[10]["request_id"] == request_id(1)
    )
    assert not spool_parts(tmp_path)
    assert not (tmp_path / "spool" / RUN_ID).exists()  # spool cleaned up after a clean close


def test_time_seals_parts(tmp_path: Path) -> None:
    sink = EventSink(config(tmp_path, part_seconds=0.1)).start()
    feed(sink, 0, 3)
    deadline = time.monotonic() + 5
    while sink.stats().parts < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sink.stats().rows == {"requests": 3, "chunks": 30, "samples": 0, "stalls": 0}
    sink.close(5)


def test_rows_are_encoded_as_they_come_and_sealed_into_one_part(tmp_path: Path) -> None:
    # Encoding runs every ENCODE_EVERY_S, long before the part is due (part_seconds 30):
    # a bad row is rejected within a moment, the good ones wait encoded (pending, not in
    # any part), and the seal then writes every batch into one part per table.
    sink = EventSink(config(tmp_path, part_rows=10_000)).start()
    feed(sink, 0, 3)
    sink.append_request({"request_id": "broken"})
    deadline = time.monotonic() + 10
    while sink.stats().rejected_rows < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    for batch in range(1, 4):  # three more batches, each encoded on its own
        time.sleep(3 * ENCODE_EVERY_S)
        feed(sink, batch * 3, 3)
    during = sink.stats()
    assert during.rejected_rows == 1 and during.parts == 0 and not spool_parts(tmp_path)
    assert during.pending_rows == 12 + 120  # encoded or buffered: counted as not stored
    report = sink.close(10)
    assert report.complete is False and report.rejected_rows == 1  # the broken row
    assert report.rows == {"requests": 12, "chunks": 120, "samples": 0, "stalls": 0}
    assert report.parts == 2 and report.pending_rows == 0
    requests = read_rows(tmp_path / "store", "requests")
    assert [r["request_id"] for r in requests] == [request_id(i) for i in range(12)]


def test_outage_loses_nothing_and_retries(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "store")
    sink = EventSink(config(tmp_path), store=store).start()
    store.down = True
    feed(sink, 0, 50)
    assert sink.flush(5, upload=False)  # sealed and in the spool, not uploaded
    assert not sink.flush(0.2)
    assert spool_parts(tmp_path)
    feed(sink, 50, 50)
    time.sleep(0.2)
    stats = sink.stats()
    assert stats.upload_failures >= 2 and stats.parts == 0
    store.down = False
    report = sink.close(10)
    assert report.complete, report
    assert len(read_rows(tmp_path / "store", "requests")) == 100
    assert len(read_rows(tmp_path / "store", "chunks")) == 1000


def test_close_with_store_down_keeps_the_spool_then_upload_spool_recovers(
    tmp_path: Path,
) -> None:
    store = FlakyStore(tmp_path / "store")
    store.down = True
    sink = EventSink(config(tmp_path), store=store).start()
    feed(sink, 0, 40)
    report = sink.close(0.3)
    assert not report.complete
    assert report.pending_parts == 2 and report.pending_rows == 440
    assert "upload-spool" in str(report)
    assert len(spool_parts(tmp_path)) == 2
    recovery = upload_spool(tmp_path / "spool", FileStore(tmp_path / "store"))
    assert recovery.complete and recovery.uploaded == 2 and recovery.rows == 440
    assert len(read_rows(tmp_path / "store", "chunks")) == 400
    index = json.loads(
        (tmp_path / "store" / RUN_ID / "index" / f"worker={WORKER}.json").read_text()
    )
    assert index["rows"] == {"requests": 40, "chunks": 400, "samples": 0, "stalls": 0}
    assert not spool_parts(tmp_path)


def test_identical_part_already_uploaded_counts_as_done(tmp_path: Path) -> None:
    """A crash after an upload but before the spool delete: the retry finds the same bytes."""
    store = FlakyStore(tmp_path / "store")
    store.down = True
    sink = EventSink(config(tmp_path), store=store).start()
    feed(sink, 0, 5)
    sink.close(0.2)
    for path in spool_parts(tmp_path):
        key = path.relative_to(tmp_path / "spool").as_posix()
        store.inner.put(key, path.read_bytes())
    recovery = upload_spool(tmp_path / "spool", store.inner)
    assert recovery.complete and recovery.already_present == 2 and recovery.uploaded == 0


def test_collision_is_never_overwritten(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FileStore(tmp_path / "store")
    taken = f"{RUN_ID}/requests/worker={WORKER}/part-000000.parquet"
    store.put(taken, b"someone else's bytes")
    sink = EventSink(config(tmp_path), store=store).start()
    feed(sink, 0, 5)
    report = sink.close(2)
    assert report.collisions == 1 and not report.complete
    assert store.get(taken) == b"someone else's bytes"
    assert [p.name for p in spool_parts(tmp_path)] == ["part-000000.parquet"]
    assert "different content" in caplog.text
    recovery = upload_spool(tmp_path / "spool", store)
    assert recovery.collisions == [taken] and not recovery.complete
    assert spool_parts(tmp_path)  # still kept


def test_restart_with_same_worker_id_continues_sequence(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "store")
    store.down = True
    first = EventSink(config(tmp_path), store=store).start()
    feed(first, 0, 5)
    first.close(0.1)
    store.down = False
    second = EventSink(config(tmp_path), store=store).start()
    feed(second, 5, 5)
    report = second.close(5)
    assert report.complete, report
    names = sorted(p.name for p in (tmp_path / "store").rglob("requests/*/*.parquet"))
    assert names == ["part-000000.parquet", "part-000001.parquet"]
    assert len(read_rows(tmp_path / "store", "requests")) == 10


def test_appends_after_close_are_counted_not_raised(tmp_path: Path) -> None:
    sink = EventSink(config(tmp_path)).start()
    feed(sink, 0, 1)
    sink.close(5)
    feed(sink, 1, 2)
    stats = sink.stats()
    assert stats.dropped_rows == 22 and stats.rows == {
        "requests": 1,
        "chunks": 10,
        "samples": 0,
        "stalls": 0,
    }


def test_bad_rows_are_counted_and_good_rows_written(tmp_path: Path) -> None:
    sink = EventSink(config(tmp_path)).start()
    feed(sink, 0, 3)
    sink.append_request({"request_id": "broken"})
    sink.append_chunks("x", [1, 2], [1], [1, 1])
    report = sink.close(5)
    assert report.rejected_rows == 3 and report.rows == {
        "requests": 3,
        "chunks": 30,
        "samples": 0,
        "stalls": 0,
    }
    assert any("required" in e for e in report.errors)


def test_spool_refuses_path_like_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="worker_id"):
        Spool(tmp_path, RUN_ID, "../escape")


def test_upload_spool_skips_a_live_sink(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "store")
    store.down = True
    sink = EventSink(config(tmp_path), store=store).start()
    feed(sink, 0, 2)
    assert sink.flush(5, upload=False)
    owner = Spool(tmp_path / "spool", RUN_ID, WORKER).owner_path
    owner.write_text(json.dumps({"host": __import__("socket").gethostname(), "pid": 1}))
    recovery = upload_spool(tmp_path / "spool", store.inner)
    assert recovery.skipped_live and recovery.uploaded == 0
    sink.close(0.1)


def test_backoff_is_capped_with_jitter() -> None:
    backoff = Backoff(0.5, 30.0)
    delays = [backoff.next() for _ in range(12)]
    assert 0.25 <= delays[0] <= 0.5
    assert all(d <= 30.0 for d in delays) and delays[-1] >= 15.0
    backoff.reset()
    assert backoff.next() <= 0.5


def test_gevent_runtime_without_blocking_the_loop(tmp_path: Path) -> None:
    import gevent

    runtime = GeventRuntime()
    sink = EventSink(config(tmp_path, part_rows=2000, part_seconds=0.05), runtime=runtime)
    sink.start()

    def worker(offset: int) -> None:
        for n in range(10):
            feed(sink, offset + n * 20, 20)
            gevent.sleep(0.001)

    done = gevent.joinall([gevent.spawn(worker, k * 1000) for k in range(4)], timeout=60)
    assert len(done) == 4  # (a loaded machine makes the first seals slow: a generous bound)
    report = sink.close(10)
    assert report.complete, report
    assert report.rows == {"requests": 800, "chunks": 8000, "samples": 0, "stalls": 0}


def test_thread_runtime_is_the_default_without_gevent_patching(tmp_path: Path) -> None:
    from locustfiles.sink.runtime import pick_runtime

    assert isinstance(pick_runtime("auto"), ThreadRuntime)
    with pytest.raises(ValueError):
        pick_runtime("asyncio")
