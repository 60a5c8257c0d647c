"""What a worker records of one request: the `requests` row plus its chunk columns.

The row's columns are the schema's (analysis.kernel.schema.REQUEST_ROW_COLUMNS): `row()` is built
from them once, at import, as the dict display one would write out by hand (it runs once per
request, on the request path: no loop over the schema per call). A record has a field per
column; tests/unit/test_record_schema.py checks both against the schema and the encoder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.kernel.schema import REQUEST_ROW_COLUMNS

_ID_BATCH = 256
_ids: list[str] = []


def new_request_id() -> str:
    """A request id: what `uuid.uuid4().hex` gives (16 random bytes, the version-4 and variant
    bits set), drawn from the OS 256 at a time (one getrandom and no UUID object per request).
    A forked child starts with none of its parent's (os.register_at_fork)."""
    if not _ids:
        raw = np.frombuffer(os.urandom(16 * _ID_BATCH), dtype=np.uint8).reshape(_ID_BATCH, 16)
        raw = raw.copy()
        raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
        raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
        text = raw.tobytes().hex()
        _ids.extend(text[i : i + 32] for i in range(0, len(text), 32))
    return _ids.pop()


os.register_at_fork(after_in_child=_ids.clear)

# Strength of a per-event token count source; a request reports its weakest.
_SOURCE_RANK = {"usage": 2, "tokenizer": 1, "events": 0}


def _row_method(columns: Sequence[str]) -> Callable[[Any], dict[str, Any]]:
    """`def row(self): return {"<column>": self.<column>, ...}` for these columns."""
    if not all(c.isidentifier() for c in columns):
        raise ValueError(f"columns must be identifiers: {list(columns)}")
    items = ", ".join(f"{c!r}: self.{c}" for c in columns)
    namespace: dict[str, Any] = {}
    exec(f"def row(self):\n    return {{{items}}}\n", namespace)  # identifiers only (above)
    row: Callable[[Any], dict[str, Any]] = namespace["row"]
    row.__doc__ = "The schema v1 `requests` row (run_id and worker_id: the sink fills them in)."
    return row


@dataclass(slots=True)
class RequestRecord:
    """Mutable while the request runs; `row()` gives the schema v1 `requests` row."""

    row = _row_method(REQUEST_ROW_COLUMNS)  # not a field: no annotation

    request_id: str
    step: int
    concurrency: int
    cold: bool
    scenario: str
    endpoint: str
    model: str | None
    stream: bool
    prompt_tokens_requested: int | None
    max_tokens: int | None
    prompt_sha256: str
    prompt_text: str | None = None
    sent_at_ns: int = 0
    headers_ns: int | None = None
    first_event_ns: int | None = None
    first_token_ns: int | None = None
    first_content_ns: int | None = None
    last_token_ns: int | None = None
    end_ns: int | None = None
    http_status: int | None = None
    status: str = "ok"
    error_kind: str | None = None
    error_detail: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    events: int = 0
    server_request_id: str | None = None
    coalesced_events: int = 0  # events that arrived in the same read as the one before
    worker_stall_ns: int | None = None  # the worker's own stalls during the request
    # open loop (rate steps): the step's global rate, this arrival's index in the step's
    # schedule, its intended send time (wall ns) and the time it waited for a cap slot
    rate: float | None = None
    arrival_index: int | None = None
    intended_ns: int | None = None
    queued_ns: int | None = None
    # sessions (multi-turn, agents): see docs/events.md
    session_id: str | None = None
    turn: int | None = None
    session_turns: int | None = None
    turn_kind: str | None = None
    wait_ns: int | None = None
    tool_calls: int | None = None
    cached_tokens: int | None = None
    history_tokens: int | None = None
    # the client's phases before the write (1.4): a new connection or a reused one, how long
    # opening it took, and the time from deciding to send to handing the bytes to the kernel
    connect_new: bool | None = None
    connect_ns: int | None = None
    client_delay_ns: int | None = None
    # reasoning and answer apart (1.5): when each began, and the output tokens of reasoning
    first_reasoning_ns: int | None = None
    first_answer_ns: int | None = None
    reasoning_tokens: int | None = None
    output_valid: bool | None = None  # locustfiles/request/validity.py
    output_invalid_reason: str | None = None
    # not a column: the server's count of the reasoning tokens (its usage's details), which
    # `finish` prefers to the reasoning events' own
    usage_reasoning_tokens: int | None = None
    # sessions only (not columns): the reply's text and tool calls, for the next turn's history
    reply_parts: list[str] | None = None  # collected when not None
    tool_call_parts: dict[int, dict[str, str]] | None = None  # index -> id, name, arguments
    # chunk columns (one entry per output event)
    chunk_offsets: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    chunk_chars: list[int] = field(default_factory=list)
    chunk_kinds: list[str] = field(default_factory=list)

    def note_source(self, source: str) -> None:
        current = self.output_tokens_source
        if current is None or _SOURCE_RANK[source] < _SOURCE_RANK[current]:
            self.output_tokens_source = source

    def fail(self, kind: str, detail: str, status: str = "error") -> None:
        """Record the first failure only: later ones are consequences of it."""
        if self.error_kind is None:
            self.status = status
            self.error_kind = kind
            self.error_detail = detail[:200]

    def finish(self) -> None:
        """Settle totals once the request is over."""
        if self.completion_tokens is not None:
            self.output_tokens = self.completion_tokens
            if self.output_tokens_source is None:  # no event carried text: usage is the count
                self.output_tokens_source = "usage"
        elif self.chunk_tokens:
            self.output_tokens = sum(self.chunk_tokens)
        elif self.status == "ok" and self.output_tokens_source is None and self.stream:
            self.output_tokens = 0
        if self.usage_reasoning_tokens is not None:
            self.reasoning_tokens = self.usage_reasoning_tokens
        elif self.reasoning_tokens is None and self.output_tokens is not None:
            # an answer without reasoning has none; a whole body's reasoning nobody counted
            # (no usage details, no tokenizer) is unknown
            self.reasoning_tokens = 0 if self.first_reasoning_ns is None else None
        if (self.reasoning_tokens or 0) > (self.output_tokens or 0) and self.status == "ok":
            self.fail("invalid_usage", f"{self.reasoning_tokens} reasoning tokens of "
                      f"{self.output_tokens} output tokens")  # fmt: skip
