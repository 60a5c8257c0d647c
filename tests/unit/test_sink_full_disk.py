"""A full disk under the event sink (issue 20 item 7): one line per table, rows kept in memory
(a full spool) or in the spool (a full store) and retried until space comes back, and a
final report that names what was kept and what was lost."""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from analysis.kernel.storage import FileStore
from locustfiles.sink.eventsink import EventSink, SinkConfig
from locustfiles.sink.runtime import GeventRuntime
from locustfiles.sink.spool import Spool
from tests.support.events import RUN_ID, chunk_columns, request_id, request_row

WORKER = "host-1-full"
TABLES = ("requests", "chunks", "samples", "stalls")


def full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullSpool(Spool):
    """A spool whose part writes fail with ENOSPC while `full` is set."""

    full = False

    def write_part(self, table_name: str, seq: int, table: Any) -> tuple[str, int]:
        if FullSpool.full:
            raise full()
        return super().write_part(table_name, seq, table)


class FullStore(FileStore):
    """A directory store whose puts fail with ENOSPC while `full` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.full = False

    def put(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        if self.full:
            raise full()
        super().put(key, data, overwrite=overwrite)


@pytest.fixture
def full_spool(monkeypatch: pytest.MonkeyPatch) -> type[FullSpool]:
    monkeypatch.setattr("locustfiles.sink.eventsink.Spool", FullSpool)
    monkeypatch.setattr(FullSpool, "full", False)
    return FullSpool


def make_sink(tmp_path: Path, store: FileStore | None = None, **kw: Any) -> EventSink:
    config = SinkConfig(events_uri=str(tmp_path / "store"), run_id=RUN_ID, worker_id=WORKER,
                        spool_dir=tmp_path / "spool", part_rows=1000, part_seconds=30.0,
                        backoff_initial_s=0.01, backoff_max_s=0.05, runtime="threads", **kw)  # fmt: skip
    return EventSink(config, store=store or FileStore(tmp_path / "store")).start()


def feed(sink: EventSink, start: int, count: int) -> None:
    """`count` requests of 10 chunks, and one samples and one stalls row per request."""
    for i in range(start, start + count):
        sink.append_request(request_row(i))
        sink.append_chunks(request_id(i), *chunk_columns(10))
        at = 1_700_000_000_000_000_000 + i * 1_000_000_000
        sink.append_row("samples", {"at_ns": at, "interval_ns": 10**9, "cpu_percent": 12.5,
                                    "loop_lag_us": [100, 200]})  # fmt: skip
        sink.append_row("stalls", {"started_at_ns": at, "length_ns": 6_000_000})


def stored(tmp_path: Path, table: str, root: str = "store") -> int:
    files = (tmp_path / root / RUN_ID / table).rglob("*.parquet")
    return sum(pq.read_metadata(f).num_rows for f in files)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_full_spool_keeps_every_table_in_memory_until_space_comes_back(
    tmp_path: Path, full_spool: type[FullSpool], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llmload.sink")
    sink = make_sink(tmp_path)
    full_spool.full = True
    for batch in range(4):  # four parts per table refused, retried many times
        feed(sink, batch * 10, 10)
        assert not sink.flush(0.3, upload=False)
    during = sink.stats()
    assert during.memory_rows == {"requests": 40, "chunks": 400, "samples": 40, "stalls": 40}
    assert during.parts == 0 and during.upload_failures >= 8 and not during.lost_rows
    refused = lines(caplog, "cannot write the")
    for table in TABLES:  # one line per table, however many parts and retries
        (line,) = [m for m in refused if f"the {table} table" in m]
        assert f"to the spool {tmp_path / 'spool'}: no space left on device" in line
        assert "kept in memory and retried" in line
    assert len(refused) == 4

    full_spool.full = False  # space is back: everything reaches the spool, then the store
    assert sink.flush(10)
    report = sink.close(10)
    assert report.complete, report
    assert report.rows == {"requests": 40, "chunks": 400, "samples": 40, "stalls": 40}
    assert len(lines(caplog, "table is written to the spool again")) == 4
    assert len(lines(caplog, "cannot write the")) == 4
    assert "write failures: the spool" in str(report) and "no space left on device" in str(report)


def test_rows_a_full_spool_still_refuses_at_close_are_reported_lost(
    tmp_path: Path, full_spool: type[FullSpool]
) -> None:
    sink = make_sink(tmp_path)
    full_spool.full = True
    feed(sink, 0, 25)
    report = sink.close(0.5)
    assert not report.complete and report.closed
    assert report.lost_rows == {"requests": 25, "chunks": 250, "samples": 25, "stalls": 25}
    assert report.pending_parts == 0
    text = str(report)
    assert "LOST at exit: 25 requests rows, 250 chunks rows, 25 samples rows, 25 stalls rows" in (
        text
    )
    assert f"write failures: the spool {tmp_path / 'spool'}: no space left on device (" in text


def test_a_full_store_keeps_every_table_in_the_spool_and_names_the_command(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llmload.sink")
    store = FullStore(tmp_path / "store")
    sink = make_sink(tmp_path, store)
    assert sink.flush(5)  # the index is in the store: the store works
    store.full = True
    feed(sink, 0, 30)
    assert sink.flush(5, upload=False)  # in the spool
    time.sleep(0.3)  # uploads retried several times
    refused = lines(caplog, "cannot write the")
    assert len(refused) == 4, refused
    for table in TABLES:
        (line,) = [m for m in refused if f"the {table} table" in m]
        assert f"to the events store {store.uri}: no space left on device" in line
        assert f"its parts are kept in the spool {tmp_path / 'spool'} and retried" in line
    report = sink.close(0.3)
    assert not report.complete and not report.lost_rows
    assert report.spool_parts == {"requests": 1, "chunks": 1, "samples": 1, "stalls": 1}
    assert report.spool_rows == {"requests": 30, "chunks": 300, "samples": 30, "stalls": 30}
    text = str(report)
    assert "NOT UPLOADED: 390 rows in 4 parts kept in the spool" in text
    assert "requests: 1 part, 30 rows; chunks: 1 part, 300 rows" in text
    spool = tmp_path / "spool"
    assert f"`llmload upload-spool {spool} --events-uri {tmp_path / 'store'}`" in text
    assert sum(stored(tmp_path, t, "spool") for t in TABLES) == 390  # the spool holds them
    assert not any(stored(tmp_path, t) for t in TABLES)


def test_space_back_in_the_store_uploads_what_waited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llmload.sink")
    store = FullStore(tmp_path / "store")
    sink = make_sink(tmp_path, store)
    store.full = True
    feed(sink, 0, 20)
    assert sink.flush(5, upload=False)
    time.sleep(0.2)
    store.full = False
    report = sink.close(10)
    assert report.complete, report
    assert {t: stored(tmp_path, t) for t in TABLES} == {
        "requests": 20, "chunks": 200, "samples": 20, "stalls": 20
    }  # fmt: skip
    assert len(lines(caplog, "cannot write the")) == 4
    assert len(lines(caplog, "table is written to the events store again")) == 4


def test_gevent_runtime_raises_a_blocking_calls_error_without_printing_it(
    capfd: pytest.CaptureFixture[str],
) -> None:
    runtime = GeventRuntime()

    def refuse() -> None:
        raise full()

    with pytest.raises(OSError) as raised:
        runtime.run_blocking(refuse)
    assert raised.value.errno == errno.ENOSPC
    assert runtime.run_blocking(sum, [1, 2]) == 3
    assert "Traceback" not in capfd.readouterr().err
