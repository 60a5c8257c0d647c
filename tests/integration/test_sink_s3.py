"""The sink against a real S3 server (SeaweedFS): keys, round trip, races, secrets."""

from __future__ import annotations

import io
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from analysis.kernel.storage import ObjectExistsError, ObjectStore, open_store
from locustfiles.run.manifest import RunManifest, write_manifest
from locustfiles.sink.eventsink import EventSink, SinkConfig
from tests.support.events import RUN_ID, chunk_columns, request_id, request_row
from tests.support.store import S3Target

WORKER = "host-7-w1"


def make_sink(uri: str, tmp_path: Path, **kw: Any) -> EventSink:
    options: dict[str, Any] = {
        "part_rows": 2000,
        "part_seconds": 30.0,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.5,
        "runtime": "threads",
    }
    options.update(kw)
    config = SinkConfig(uri, RUN_ID, WORKER, spool_dir=tmp_path / "spool", **options)
    return EventSink(config).start()


def parquet_rows(objects: dict[str, bytes], table: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for key in sorted(k for k in objects if f"/{RUN_ID}/{table}/" in f"/{k}"):
        rows += pq.read_table(io.BytesIO(objects[key])).to_pylist()
    return rows


def test_parts_land_under_the_documented_keys_and_read_back_identical(
    s3_target: S3Target, tmp_path: Path
) -> None:
    sink = make_sink(s3_target.uri, tmp_path)
    for i in range(300):
        sink.append_request(request_row(i))
        sink.append_chunks(request_id(i), *chunk_columns(20), ["content"] * 20)
    report = sink.close(30)
    assert report.complete, report
    objects = s3_target.objects()
    prefix = f"events/{RUN_ID}/"
    assert set(objects) == {
        *(f"{prefix}chunks/worker={WORKER}/part-{n:06d}.parquet" for n in range(3)),
        f"{prefix}requests/worker={WORKER}/part-000000.parquet",
        f"{prefix}index/worker={WORKER}.json",
    }
    requests = parquet_rows(objects, "requests")
    expected = [{**request_row(i), "run_id": RUN_ID, "worker_id": WORKER} for i in range(300)]
    assert [{k: v for k, v in r.items() if v is not None} for r in requests] == expected
    chunks = parquet_rows(objects, "chunks")
    assert len(chunks) == 6000
    offsets, tokens, chars = chunk_columns(20)
    assert [c["offset_ns"] for c in chunks[20:40]] == offsets
    assert {(c["request_id"], c["seq"]) for c in chunks} == {
        (request_id(i), s) for i in range(300) for s in range(20)
    }
    index = json.loads(objects[f"{prefix}index/worker={WORKER}.json"])
    assert index["final"] and index["rows"] == {
        "requests": 300,
        "chunks": 6000,
        "samples": 0,
        "stalls": 0,
    }
    for key, rows in index["parts"].items():
        assert pq.read_metadata(io.BytesIO(objects[prefix + key])).num_rows == rows
    assert report.bytes == sum(len(v) for k, v in objects.items() if k.endswith(".parquet"))


def race(stores: list[ObjectStore], key: str) -> tuple[list[int], list[int]]:
    """One thread per store puts different bytes under one key at once: winners, losers."""
    barrier = threading.Barrier(len(stores))
    winners: list[int] = []
    losers: list[int] = []

    def write(n: int) -> None:
        barrier.wait(5)
        try:
            stores[n].put(key, f"writer {n}".encode())
            winners.append(n)
        except ObjectExistsError:
            losers.append(n)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return winners, losers


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_two_writers_racing_for_a_key_never_overwrite(
    kind: str, s3_target: S3Target, tmp_path: Path
) -> None:
    uri = s3_target.uri if kind == "s3" else str(tmp_path / "store")
    stores = [open_store(uri) for _ in range(5)]  # one client each, like separate workers
    for attempt in range(3):
        key = f"{RUN_ID}/requests/worker=w/part-{attempt:06d}.parquet"
        winners, losers = race(stores, key)
        assert len(winners) == 1 and len(losers) == 4
        assert stores[0].get(key) == f"writer {winners[0]}".encode()


def test_secrets_are_absent_from_everything_written(
    s3_target: S3Target,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api_key = "sk-test-ABCDEF0123456789abcdef"
    aws_secret = s3_target.env["AWS_SECRET_ACCESS_KEY"]
    monkeypatch.setenv("OPENAI_API_KEY", api_key)
    caplog.set_level(logging.DEBUG)
    sink = make_sink(s3_target.uri, tmp_path)
    for i in range(20):
        sink.append_request(
            request_row(
                i,
                prompt_text=f"my key is {api_key}",
                status="error",
                error_kind="http_4xx_other",
                error_detail=f"401: invalid key {api_key} (aws {aws_secret})",
            )
        )
        sink.append_chunks(request_id(i), *chunk_columns(5))
    sink.append_request({**request_row(99), "request_id": api_key, "step": "x"})  # rejected
    assert sink.close(30).parts == 2
    manifest = RunManifest(
        RUN_ID,
        config={
            "api_key": api_key,
            "api_key_env": "OPENAI_API_KEY",
            "headers": [f"Authorization: Bearer {api_key}"],
            "events_uri": s3_target.uri,
        },
        target={"url": f"https://user:{api_key}@api.example.com/v1", "model": "m"},
    )
    manifest.finish()
    write_manifest(open_store(s3_target.uri), manifest)

    objects = s3_target.objects()
    assert {k.rsplit("/", 1)[-1] for k in objects} >= {"manifest.json", f"worker={WORKER}.json"}
    texts = [data for data in objects.values()]
    for key, data in objects.items():
        if key.endswith(".parquet"):  # compressed: check the decoded values too
            texts.append(json.dumps(pq.read_table(io.BytesIO(data)).to_pylist()).encode())
    texts.append(caplog.text.encode())
    texts += [p.read_bytes() for p in (tmp_path / "spool").rglob("*") if p.is_file()]
    for secret in (api_key, aws_secret):
        for text in texts:
            assert secret.encode() not in text
    assert "OPENAI_API_KEY" in objects[f"events/{RUN_ID}/manifest.json"].decode()
    assert "rejected" in caplog.text  # the bad row was logged, its secret redacted
    requests = parquet_rows(objects, "requests")
    assert requests[0]["error_detail"] == "401: invalid key <redacted> (aws <redacted>)"
    assert {r["prompt_text"] for r in requests} == {None}
