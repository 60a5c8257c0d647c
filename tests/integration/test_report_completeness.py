"""Loading: completeness against the worker indexes, missing and corrupt parts, bad URIs."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import EventDataError, SchemaVersionError, UsageError, build_report, load_run
from analysis.kernel.schema import CHUNKS_SCHEMA, METADATA_KEY
from analysis.kernel.storage import open_store
from tests.support.runs import RunBuilder


def four_requests(run_id: str = "gaps") -> RunBuilder:
    """w1 writes r0..r3 round-robin into two parts: part 0 holds r0, r2; part 1 holds r1, r3."""
    b = RunBuilder(run_id, workers=("w1", "w2"))
    b.add_step(0, 2, started_s=0, spawned_s=0, ended_s=10)
    for i in range(4):
        b.add_request(
            sent_s=1.0 + i,
            worker="w1",
            chunks=[(0.1 * (i + 1), 1), (0.5, 2)],
            end_s=0.6,
            request_id=f"r{i}",
            concurrency=2,
        )
    return b


def test_complete_run(events_dir: Path) -> None:
    run = load_run(four_requests().write(events_dir, parts_per_worker=2), progress=False)
    c = run.completeness
    assert c.complete and run.warnings == []
    # w2 is in the manifest and wrote (empty) parts
    assert c.workers_found == c.workers_expected == ["w1", "w2"]
    assert (c.parts_expected, c.parts_found, c.parts_read) == (8, 8, 8)
    assert c.rows_read == c.rows_expected == {"requests": 4, "chunks": 8, "samples": 0, "stalls": 0}
    assert len(run.requests) == 4 and len(run.chunks) == 8


def test_missing_and_corrupt_parts_are_named_skipped_and_counted(
    events_dir: Path, tmp_path: Path
) -> None:
    uri = four_requests().write(events_dir, parts_per_worker=2)
    store = open_store(uri)
    store.delete("requests/worker=w1/part-000001.parquet")  # r1, r3: their chunks orphaned
    store.put("chunks/worker=w1/part-000000.parquet", b"PAR1 not parquet", overwrite=True)

    report = build_report(uri, tmp_path / "out", progress=False, html=False)
    c = report.completeness
    assert not c.complete
    assert c.missing_parts == ["requests/worker=w1/part-000001.parquet"]
    assert list(c.corrupt_parts) == ["chunks/worker=w1/part-000000.parquet"]
    assert (c.parts_expected, c.parts_found, c.parts_read) == (8, 7, 6)
    assert c.rows_read == {"requests": 2, "chunks": 4, "samples": 0, "stalls": 0}
    assert c.rows_expected == {"requests": 4, "chunks": 8, "samples": 0, "stalls": 0}
    text = "\n".join(report.warnings)
    assert "requests/worker=w1/part-000001.parquet" in text
    assert "chunks/worker=w1/part-000000.parquet" in text
    assert "4 chunk row(s) belong to no request row" in text

    step = report.table.rows[0]
    assert (step["requests"], step["ok"]) == (2, 2)  # r0, r2 survive
    assert step["ttft_p50_s"] == pytest.approx(0.1)  # from the request rows
    assert step["itl_p50_s"] is None or step["itl_p50_s"] != step["itl_p50_s"]  # no chunks
    md = report.files["report.md"].read_text()
    assert "complete: NO" in md and "1 missing, 1 unreadable" in md


def test_worker_without_final_index_is_reported(events_dir: Path) -> None:
    uri = four_requests().write(events_dir, index=False)
    run = load_run(uri, progress=False)
    assert run.completeness.workers_without_final_index == ["w1", "w2"]
    assert any("no final index" in w for w in run.warnings)


def test_manifest_worker_without_parts_is_missing(events_dir: Path) -> None:
    b = four_requests()
    b.manifest_extra["workers"] = [{"worker_id": w} for w in ("w1", "w2", "w3")]
    run = load_run(b.write(events_dir), progress=False)
    assert run.completeness.workers_missing == ["w3"]


def test_rows_a_workers_sink_rejected_make_the_report_incomplete(
    events_dir: Path, tmp_path: Path
) -> None:
    b = four_requests()
    reason = "request row 'r9' rejected: error_kind 'oops' is not one of the schema's kinds"
    b.manifest_extra["workers"] = [
        {"worker_id": "w1", "rows_rejected": 2, "rows_dropped": 0, "sink_errors": [reason]},
        {"worker_id": "w2", "rows_rejected": 0, "rows_dropped": 3, "sink_errors": []},
    ]
    report = build_report(b.write(events_dir), tmp_path / "out", progress=False, html=True)
    c = report.completeness
    assert not c.complete
    assert c.rows_rejected == {"w1": 2} and c.rows_dropped == {"w2": 3}
    assert f"worker w1's event sink rejected 2 row(s): {reason}" in report.warnings
    assert any("worker w2's event sink dropped 3 row(s)" in w for w in report.warnings)
    assert report.to_json()["completeness"]["rows_rejected"] == {"w1": 2}
    md = report.files["report.md"].read_text()
    completeness = md.split("## Completeness", 1)[1]
    assert "complete: NO" in completeness
    assert "rows rejected by worker w1's event sink: 2" in completeness and reason in completeness
    assert "rows dropped by worker w2's event sink (after close): 3" in completeness
    assert "rows rejected by worker w1" in report.files["report.html"].read_text()


def test_unknown_uri_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no llmload run at"):
        load_run(str(tmp_path / "nothing" / "here"))


def test_a_path_that_holds_no_run_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("{}")
    with pytest.raises(UsageError, match="no llmload run at .*a-file"):
        load_run(str(tmp_path / "a-file"), progress=False)
    with pytest.raises(UsageError, match="names no run id"):  # `/`: an unset $EVENTS/$RUN_ID
        load_run("/", progress=False)


def test_every_indexed_part_missing_is_refused_with_the_upload_command(events_dir: Path) -> None:
    builder = four_requests()
    uri = builder.write(events_dir)
    store = open_store(uri)
    for key in builder.keys:
        if key.endswith(".parquet"):
            store.delete(key)
    with pytest.raises(EventDataError, match="run gaps at .*missing.*llmload upload-spool"):
        load_run(uri, progress=False)


def test_unknown_major_schema_version_is_refused(events_dir: Path) -> None:
    uri = four_requests().write(events_dir)
    schema = CHUNKS_SCHEMA.with_metadata({METADATA_KEY: b"2.0"})
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    open_store(uri).put("chunks/worker=w1/part-000009.parquet", sink.getvalue().to_pybytes())
    with pytest.raises(SchemaVersionError, match="2.0 is not supported"):
        load_run(uri, progress=False)


def test_progress_line_only_on_a_terminal(events_dir: Path) -> None:
    uri = four_requests().write(events_dir)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    load_run(uri, progress_stream=tty)
    load_run(uri, progress_stream=pipe)
    assert "4/4 parts" in tty.getvalue() and pipe.getvalue() == ""
    last = tty.getvalue().rstrip().rsplit("\r", 1)[-1]  # the line as the terminal shows it last
    assert re.search(r": 4/4 parts, [\d,]+ rows/s, 0 s left", last), last
