"""Row conversion: schema v1 types, keys filled in, bad rows rejected one by one."""

from __future__ import annotations

import gc
import random
from typing import Any

import pyarrow as pa
import pytest

from analysis.kernel.schema import CHUNKS_SCHEMA, REQUESTS_SCHEMA
from locustfiles.sink.encode import (
    CHUNK_SLICE_ROWS,
    REDACTED,
    CompactChunks,
    EncodeContext,
    compact_chunks,
    encode_chunks,
    encode_requests,
)
from tests.support.events import chunk_columns, request_row

CTX = EncodeContext("run-1", "w1", store_prompts=False, secrets=("sk-supersecret",))


def test_requests_fill_keys_drop_prompt_text_and_redact() -> None:
    rows = [
        request_row(0, prompt_text="hello"),
        request_row(1, status="error", error_kind="http_5xx", error_detail="key sk-supersecret x"),
    ]
    result = encode_requests(rows, CTX)
    table = result.table
    assert result.rejected == 0 and result.errors == []
    assert table.schema.equals(REQUESTS_SCHEMA, check_metadata=True)
    assert table.column("run_id").to_pylist() == ["run-1", "run-1"]
    assert table.column("worker_id").to_pylist() == ["w1", "w1"]
    assert table.column("prompt_text").to_pylist() == [None, None]
    assert table.column("error_detail").to_pylist() == [None, f"key {REDACTED} x"]


def test_prompt_text_kept_when_asked() -> None:
    ctx = EncodeContext("run-1", "w1", store_prompts=True)
    table = encode_requests([request_row(0, prompt_text="hello")], ctx).table
    assert table.column("prompt_text").to_pylist() == ["hello"]


def test_bad_request_rows_are_rejected_alone() -> None:
    rows = [
        request_row(0),
        request_row(1, step="not a number"),  # wrong type
        request_row(2, status="maybe"),  # outside the enumeration
        {"request_id": "x"},  # required columns missing
        request_row(3, worker_id="someone-else"),  # another worker's row
        "not a dict",
        request_row(4, ttft=1.0),  # unknown column: kept, reported
    ]
    result = encode_requests(rows, CTX)  # type: ignore[arg-type]
    assert result.table.column("request_id").to_pylist() == ["req-00000000", "req-00000004"]
    assert result.rejected == 5
    text = "\n".join(result.errors)
    for needle in ("req-00000001", "status", "required", "worker_id", "not a dict", "ttft"):
        assert needle in text


def test_chunks_columns_become_rows_with_seq() -> None:
    off, tok, ch = chunk_columns(3)
    batches = [
        ("a", off, tok, ch, "content"),
        ("b", off[:2], tok[:2], ch[:2], ["reasoning", "content"]),
    ]
    result = encode_chunks(batches, CTX)
    table = result.table
    assert result.rejected == 0
    assert table.schema.equals(CHUNKS_SCHEMA, check_metadata=True)
    assert table.column("request_id").to_pylist() == ["a", "a", "a", "b", "b"]
    assert table.column("seq").to_pylist() == [0, 1, 2, 0, 1]
    assert table.column("kind").to_pylist()[-2:] == ["reasoning", "content"]
    assert table.column("offset_ns").type == pa.int64()


def test_bad_chunk_batches_are_rejected_alone() -> None:
    off, tok, ch = chunk_columns(4)
    batches = [
        ("good", off, tok, ch, "content"),
        ("short", off, tok[:2], ch, "content"),  # lengths differ
        ("text", off, ["x"] * 4, ch, "content"),  # wrong type
        ("kind", off, tok, ch, "thinking"),  # outside the enumeration
    ]
    result = encode_chunks(batches, CTX)
    assert set(result.table.column("request_id").to_pylist()) == {"good"}
    assert result.rejected == 12
    assert len(result.errors) == 3


def test_pause_is_called_between_slices() -> None:
    calls: list[int] = []
    off, tok, ch = chunk_columns(2)
    encode_chunks([("r", off, tok, ch, "content")] * 60, CTX, lambda: calls.append(1))
    assert len(calls) >= 3
    calls.clear()  # the compact form: slices of about CHUNK_SLICE_ROWS rows
    big = compact_chunks("r", *chunk_columns(1000), "content")
    result = encode_chunks([big] * (3 * CHUNK_SLICE_ROWS // 1000), CTX, lambda: calls.append(1))
    assert len(calls) >= 3 and result.table.num_rows == 3 * CHUNK_SLICE_ROWS


def random_batches(seed: int, n: int) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    kinds = ["content", "reasoning", "tool_call"]
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        m = rng.choice([0, 1, 2, 7, 100, 1000])
        offsets = sorted(rng.randrange(0, 10**12) for _ in range(m))
        tokens = [rng.choice([0, 1, 1, 3]) for _ in range(m)]
        chars = [rng.randrange(0, 50) for _ in range(m)]
        style = rng.random()
        kind: Any = (
            rng.choice(kinds) if style < 0.4
            else [kinds[0]] * m if style < 0.7
            else [rng.choice(kinds) for _ in range(m)]
        )  # fmt: skip
        out.append((f"req-{seed}-{i}", offsets, tokens, chars, kind))
    return out


def test_the_compact_form_encodes_as_the_lists_do() -> None:
    batches = random_batches(3, 400)
    compact = [compact_chunks(*b) for b in batches]
    assert sum(isinstance(b[4], str) for b in compact) > sum(isinstance(b[4], str) for b in batches)
    as_lists, as_arrays = encode_chunks(batches, CTX), encode_chunks(compact, CTX)
    assert as_arrays.rejected == as_lists.rejected == 0
    assert as_arrays.table.schema.equals(CHUNKS_SCHEMA, check_metadata=True)
    assert as_arrays.table.equals(as_lists.table)
    # lists and compact batches mixed in one buffer (a caller's odd columns stay lists)
    mixed = [c if i % 3 else b for i, (b, c) in enumerate(zip(batches, compact, strict=True))]
    assert encode_chunks(mixed, CTX).table.equals(as_lists.table)


def test_the_compact_form_holds_nothing_the_garbage_collector_walks() -> None:
    batch = compact_chunks("r", *chunk_columns(100), ["content"] * 100)
    assert batch[4] == "content" and not any(gc.is_tracked(c) for c in batch[1:])


@pytest.mark.parametrize(
    ("columns", "why"),
    [
        (([1, None], [1, 1], [1, 1], "content"), "without the required offset_ns"),
        (([1, 2], ["x", 1], [1, 1], "content"), "chunks of request"),
        (([1, 2], [1.5, 1], [1, 1], "content"), ""),  # Arrow truncates floats: kept
        (([1, 2], [1, 1], [1, 2**70], "content"), "too large"),
        (([1, 2], [1, 1], [1, 1], ["content"] * 3), "column lengths differ"),
        (([1, 2], [1, 1], [1, 1], ["content", "thinking"]), "kind not in"),
        (([1, 2], [1, 1], [1, 1], None), "chunks of request"),
        (([1, 2], [1], [1, 1], "content"), "column lengths differ"),
    ],
)
def test_odd_columns_are_kept_as_given_and_rejected_as_before(columns: Any, why: str) -> None:
    batch = compact_chunks("odd", *columns)
    good = compact_chunks("good", *chunk_columns(3), "content")
    assert isinstance(batch, CompactChunks) == (why == "kind not in")  # else left as given
    result = encode_chunks([good, batch], CTX)
    assert result.table.column("request_id").to_pylist()[:3] == ["good"] * 3
    assert (result.rejected > 0) == bool(why) and why in "\n".join(result.errors), result.errors
    listed = encode_chunks([("good", *chunk_columns(3), "content"), ("odd", *columns)], CTX)
    assert listed.rejected == result.rejected and listed.table.equals(result.table)


def test_small_tables_keep_good_rows_and_reject_bad_ones_alone() -> None:
    from locustfiles.sink.encode import encode_rows

    good = {"at_ns": 1, "interval_ns": 10, "cpu_percent": 12.5, "loop_lag_us": [3, 4]}
    bad = {**good, "cpu_percent": "lots"}
    result = encode_rows("samples", [good, bad, good], CTX)
    assert result.table.num_rows == 2 and result.rejected == 1
    assert result.errors[0].startswith("samples row rejected: ")
    assert set(result.table.column("worker_id").to_pylist()) == {"w1"}
    stalls = encode_rows("stalls", [{"started_at_ns": 5, "length_ns": None}], CTX)
    assert stalls.table.num_rows == 0 and stalls.rejected == 1  # length is required
