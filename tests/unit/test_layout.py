"""The store layout (analysis/kernel/layout.py): keys built and parsed in one place, as documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis.kernel.layout import (
    MANIFEST_NAME,
    TABLE_NAMES,
    PartKey,
    WorkerIndex,
    accelerator_metrics_key,
    index_key,
    is_accelerator_metrics_key,
    is_server_metrics_key,
    parse_index_key,
    parse_part_key,
    part_key,
    run_key,
    server_metrics_key,
    worker_of,
)
from analysis.kernel.schema import TABLES

DOC = Path(__file__).parents[2] / "docs" / "events.md"


def test_every_table_has_a_schema_and_a_folder() -> None:
    assert tuple(TABLES) == TABLE_NAMES


@pytest.mark.parametrize("table", TABLE_NAMES)
def test_part_keys_parse_back(table: str) -> None:
    key = part_key(table, "host-1-ab", 12)
    assert key == f"{table}/worker=host-1-ab/part-000012.parquet"
    assert parse_part_key(key) == PartKey(table, "host-1-ab", 12)


@pytest.mark.parametrize(
    "key",
    [
        "tokens/worker=w1/part-000000.parquet",  # not a table
        "requests/worker=w1/part-x.parquet",
        "requests/worker=w1/.tmp-abc",
        "requests/w1/part-000000.parquet",
        "requests/worker=w1/part-000000.parquet/more",
        "index/worker=w1.json",
        MANIFEST_NAME,
    ],
)
def test_other_keys_are_not_parts(key: str) -> None:
    assert parse_part_key(key) is None


def test_index_keys_parse_back() -> None:
    assert index_key("w-1") == "index/worker=w-1.json"
    assert parse_index_key(index_key("w-1")) == "w-1"
    for other in ("index/w1.json", "index/worker=w1.txt", "requests/worker=w1.json", "index/a/b"):
        assert parse_index_key(other) is None
    assert worker_of("worker=w2") == worker_of("worker=w2.json") == "w2"
    assert worker_of(".tmp-123") is None


def test_server_metrics_and_run_keys() -> None:
    assert server_metrics_key(3) == "server_metrics/part-000003.jsonl"
    assert is_server_metrics_key(server_metrics_key(3))
    assert not is_server_metrics_key("server_metrics/part-000003.json")
    assert accelerator_metrics_key(3) == "accelerator_metrics/part-000003.jsonl"
    assert is_accelerator_metrics_key(accelerator_metrics_key(3))
    assert not is_accelerator_metrics_key(server_metrics_key(3))
    assert run_key("r1", MANIFEST_NAME) == "r1/manifest.json"


def test_docs_show_the_keys_the_code_builds() -> None:
    text = DOC.read_text()
    documented = set(re.findall(r"^<prefix>/<run_id>/(\S+)$", text, flags=re.MULTILINE))
    built = {
        MANIFEST_NAME,
        index_key("<worker_id>"),
        server_metrics_key(0).replace("000000", "<seq>"),
        accelerator_metrics_key(0).replace("000000", "<seq>"),
        *(part_key(t, "<worker_id>", 0).replace("000000", "<seq>") for t in TABLE_NAMES),
    }
    assert documented == built


def test_worker_index_round_trip() -> None:
    index = WorkerIndex("r1", "w1", {part_key("chunks", "w1", 1): 20}, final=True)
    index.parts[part_key("requests", "w1", 0)] = 5
    data = index.to_json("1.3")
    assert WorkerIndex.from_json(data) == index
    doc = data.decode()
    assert '"schema_version": "1.3"' in doc
    assert list(WorkerIndex.from_json(data).parts) == sorted(index.parts)  # written sorted
    assert index.rows() == {"requests": 5, "chunks": 20, "samples": 0, "stalls": 0}


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"\xff\xfe\x00",
        b"[]",
        b'{"worker_id": "w1"}',  # no run_id
        b'{"run_id": "r", "worker_id": "w", "parts": {"k": "many"}}',
        b'{"run_id": "r", "worker_id": "w", "parts": ["k"]}',
    ],
)
def test_a_broken_index_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        WorkerIndex.from_json(data)


def test_an_index_without_parts_is_empty() -> None:
    index = WorkerIndex.from_json(b'{"run_id": "r", "worker_id": "w", "parts": null}')
    assert index.parts == {} and not index.final


def test_merge_keeps_its_own_counts_and_reports_disagreements() -> None:
    mine = WorkerIndex("r", "w", {"a": 1, "b": 2})
    theirs = WorkerIndex("r", "w", {"b": 3, "c": 4}, final=True)
    assert mine.merge(theirs) == {"b": (2, 3)}
    assert mine.parts == {"a": 1, "b": 2, "c": 4} and mine.final
