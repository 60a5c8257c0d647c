"""A worker's RequestRecord against the schema: its row and chunk columns are the schema's.

`RequestRecord.row()` is built from analysis.kernel.schema (REQUEST_ROW_COLUMNS); these tests tie
the record's fields to the schema's columns and run real records through the sink's encoder.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from analysis.kernel.schema import CHUNKS_SCHEMA, REQUEST_ROW_COLUMNS, REQUESTS_SCHEMA, SINK_COLUMNS
from locustfiles.request.record import RequestRecord
from locustfiles.request.stream import StreamState
from locustfiles.sink.encode import EncodeContext, encode_chunks, encode_requests

CTX = EncodeContext("run-1", "w1", store_prompts=True)

NOT_COLUMNS = {"reply_parts", "tool_call_parts", "usage_reasoning_tokens"}
"""Record fields that are no column: the reply kept for a session's next turn, the server's
count of reasoning tokens (`reasoning_tokens` settles on it)."""

CHUNK_LISTS = {
    "offset_ns": "chunk_offsets",
    "tokens": "chunk_tokens",
    "chars": "chunk_chars",
    "kind": "chunk_kinds",
}
"""The record's chunk lists, by the `chunks` column each becomes (`seq`: the position)."""


def _event(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def _delta(t: int, **delta: Any) -> dict[str, Any]:
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": t,
        "prompt_tokens_details": {"cached_tokens": 16},
    }
    return {"id": "srv-9", "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            "usage": usage}  # fmt: skip


def streamed_record() -> RequestRecord:
    """A session turn as a worker records it: streamed events, then what the worker adds."""
    rec = RequestRecord("req-1", 2, 8, False, "D(40,3)", "chat", "tiny", True, 40, 3, "ab" * 32)
    rec.prompt_text = "hello"
    rec.sent_at_ns = 1_700_000_000_000_000_000
    rec.headers_ns, rec.http_status = 900, 200
    state = StreamState(rec, chat=True, counter=None)
    state.on_event(
        _event({"id": "srv-9", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}), 1_000
    )
    state.on_event(_event(_delta(1, reasoning_content="hm")), 2_000)
    state.on_event(_event(_delta(2, content="Hi")), 3_000)
    state.on_event(
        _event(_delta(3, tool_calls=[{"index": 0, "function": {"arguments": "{}"}}])), 4_000
    )
    state.on_event(b"[DONE]", 5_000)
    state.on_end()
    rec.end_ns = 5_100
    rec.finish()
    rec.coalesced_events, rec.worker_stall_ns = 1, 0
    rec.rate, rec.arrival_index, rec.intended_ns, rec.queued_ns = 2.5, 7, rec.sent_at_ns - 10, 5
    rec.session_id, rec.turn, rec.session_turns, rec.turn_kind = "s-1", 1, 3, "tool_result"
    rec.wait_ns, rec.tool_calls, rec.history_tokens = 1_000_000, 1, 24
    rec.connect_new, rec.connect_ns, rec.client_delay_ns = True, 150_000, 210_000
    return rec  # fmt: skip


def failed_record() -> RequestRecord:
    rec = RequestRecord("req-2", 0, 1, True, "D(8,8)", "completions", None, False, 8, 8, "cd" * 32)
    rec.sent_at_ns = 1_700_000_000_000_000_000
    rec.fail("http_5xx", "HTTP 500: boom")
    rec.http_status, rec.end_ns = 500, 1_000
    rec.finish()
    return rec


def test_the_row_columns_are_the_schema_columns_the_sink_does_not_fill() -> None:
    unfilled = tuple(n for n in REQUESTS_SCHEMA.names if n not in SINK_COLUMNS)
    assert unfilled == REQUEST_ROW_COLUMNS
    assert set(SINK_COLUMNS) < set(REQUESTS_SCHEMA.names)
    assert set(SINK_COLUMNS) < set(CHUNKS_SCHEMA.names)
    assert list(streamed_record().row()) == list(REQUEST_ROW_COLUMNS)


def test_every_record_field_is_a_column_or_a_chunk_list_or_named_here() -> None:
    fields = [f.name for f in dataclasses.fields(RequestRecord)]
    columns = [f for f in fields if f not in NOT_COLUMNS and f not in CHUNK_LISTS.values()]
    assert sorted(columns) == sorted(REQUEST_ROW_COLUMNS)
    chunk_columns = [
        n for n in CHUNKS_SCHEMA.names if n not in {*SINK_COLUMNS, "request_id", "seq"}
    ]
    assert chunk_columns == list(CHUNK_LISTS)
    assert set(CHUNK_LISTS.values()) <= set(fields)


def test_a_streamed_record_with_every_column_set_encodes_whole() -> None:
    rec = streamed_record()
    row = rec.row()
    unset = ["error_kind", "error_detail", "output_valid", "output_invalid_reason"]
    assert [c for c, v in row.items() if v is None] == unset  # a valid answer, unchecked
    result = encode_requests([row], CTX)
    assert (result.rejected, result.errors) == (0, [])
    assert result.table.schema == REQUESTS_SCHEMA
    assert result.table.to_pylist() == [{"run_id": "run-1", "worker_id": "w1", **row}]


def test_a_failed_record_encodes_whole() -> None:
    row = failed_record().row()
    result = encode_requests([row], CTX)
    assert (result.rejected, result.errors) == (0, [])
    assert result.table.to_pylist() == [{"run_id": "run-1", "worker_id": "w1", **row}]


@pytest.mark.parametrize("make", [streamed_record, failed_record])
def test_the_record_chunk_lists_encode_as_chunk_rows(make: Any) -> None:
    rec = make()
    lists = [getattr(rec, CHUNK_LISTS[c]) for c in CHUNK_LISTS]
    result = encode_chunks([(rec.request_id, *lists)], CTX)
    assert (result.rejected, result.errors) == (0, [])
    rows = result.table.to_pylist()
    assert len(rows) == len(rec.chunk_offsets)
    for seq, row in enumerate(rows):
        expected = {c: getattr(rec, name)[seq] for c, name in CHUNK_LISTS.items()}
        assert row == {"run_id": "run-1", "worker_id": "w1", "request_id": rec.request_id,
                       "seq": seq, **expected}  # fmt: skip
    if rec.stream:
        assert set(rec.chunk_kinds) == {"reasoning", "content", "tool_call"}
