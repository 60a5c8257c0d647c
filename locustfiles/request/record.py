"""What a worker records of one request: the `requests` row plus its chunk columns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Strength of a per-event token count source; a request reports its weakest.
_SOURCE_RANK = {"usage": 2, "tokenizer": 1, "events": 0}


@dataclass(slots=True)
class RequestRecord:
    """Mutable while the request runs; `row()` gives the schema v1 `requests` row."""

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

    def row(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "step": self.step,
            "concurrency": self.concurrency,
            "scenario": self.scenario,
            "endpoint": self.endpoint,
            "model": self.model,
            "stream": self.stream,
            "prompt_tokens_requested": self.prompt_tokens_requested,
            "max_tokens": self.max_tokens,
            "prompt_sha256": self.prompt_sha256,
            "prompt_text": self.prompt_text,
            "sent_at_ns": self.sent_at_ns,
            "headers_ns": self.headers_ns,
            "first_event_ns": self.first_event_ns,
            "first_token_ns": self.first_token_ns,
            "first_content_ns": self.first_content_ns,
            "last_token_ns": self.last_token_ns,
            "end_ns": self.end_ns,
            "http_status": self.http_status,
            "status": self.status,
            "error_kind": self.error_kind,
            "error_detail": self.error_detail,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "output_tokens": self.output_tokens,
            "output_tokens_source": self.output_tokens_source,
            "events": self.events,
            "cold": self.cold,
            "server_request_id": self.server_request_id,
            "coalesced_events": self.coalesced_events,
            "worker_stall_ns": self.worker_stall_ns,
            "rate": self.rate,
            "arrival_index": self.arrival_index,
            "intended_ns": self.intended_ns,
            "queued_ns": self.queued_ns,
            "session_id": self.session_id,
            "turn": self.turn,
            "session_turns": self.session_turns,
            "turn_kind": self.turn_kind,
            "wait_ns": self.wait_ns,
            "tool_calls": self.tool_calls,
            "cached_tokens": self.cached_tokens,
            "history_tokens": self.history_tokens,
        }
