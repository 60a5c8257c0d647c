"""A store stopped mid-run and restarted (same dir, same ports): no row is lost."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pyarrow.parquet as pq

from locustfiles.sink.eventsink import EventSink, SinkConfig
from tests.support.events import RUN_ID, chunk_columns, request_id, request_row
from tests.support.store import S3Target


def feed(sink: EventSink, start: int, count: int) -> None:
    for i in range(start, start + count):
        sink.append_request(request_row(i))
        sink.append_chunks(request_id(i), *chunk_columns(10))


def test_store_outage_loses_no_row(own_seaweed: S3Target, tmp_path: Path) -> None:
    config = SinkConfig(
        own_seaweed.uri,
        RUN_ID,
        "w-outage",
        spool_dir=tmp_path / "spool",
        part_rows=500,
        part_seconds=0.1,
        backoff_initial_s=0.05,
        backoff_max_s=0.3,
        runtime="threads",
    )
    sink = EventSink(config).start()
    feed(sink, 0, 100)
    assert sink.flush(20)
    uploaded = sink.stats().parts

    own_seaweed.local.stop()
    for n in range(10):  # rows keep coming while the store is down
        feed(sink, 100 + n * 20, 20)
        time.sleep(0.05)
    assert sink.flush(10, upload=False)
    time.sleep(0.5)
    during = sink.stats()
    assert during.parts == uploaded and during.upload_failures >= 1
    assert during.pending_parts >= 3 and during.pending_rows == 200 * 11
    assert len(list((tmp_path / "spool").rglob("*.parquet"))) == during.pending_parts

    own_seaweed.local.start()  # same directory, same ports
    feed(sink, 300, 50)
    report = sink.close(30)
    assert report.complete, report
    assert report.rows == {"requests": 350, "chunks": 3500, "samples": 0, "stalls": 0}

    objects = own_seaweed.objects()
    ids = []
    chunks = 0
    for key, data in objects.items():
        if key.endswith(".parquet"):
            table = pq.read_table(io.BytesIO(data))
            if "/requests/" in key:
                ids += table.column("request_id").to_pylist()
            else:
                chunks += table.num_rows
    assert sorted(ids) == [request_id(i) for i in range(350)]
    assert chunks == 3500
