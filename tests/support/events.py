"""Rows like a worker's: one request row plus its chunk columns (for sink tests and the bench)."""

from __future__ import annotations

from typing import Any

RUN_ID = "run-sink"


def request_id(i: int) -> str:
    return f"req-{i:08d}"


def request_row(i: int, **extra: Any) -> dict[str, Any]:
    """A finished request row (run_id/worker_id left for the sink to fill in)."""
    row: dict[str, Any] = {
        "request_id": request_id(i),
        "step": i % 3,
        "concurrency": 8,
        "scenario": "D(128,64)",
        "endpoint": "chat",
        "model": "tiny-llama",
        "stream": True,
        "prompt_tokens_requested": 128,
        "max_tokens": 64,
        "prompt_sha256": "ab" * 32,
        "sent_at_ns": 1_700_000_000_000_000_000 + i * 1_000_000,
        "headers_ns": 1_000_000,
        "first_event_ns": 2_000_000,
        "first_token_ns": 2_000_000,
        "first_content_ns": 2_000_000,
        "last_token_ns": 50_000_000,
        "end_ns": 51_000_000,
        "http_status": 200,
        "status": "ok",
        "prompt_tokens": 128,
        "completion_tokens": 64,
        "output_tokens": 64,
        "output_tokens_source": "usage",
        "events": 66,
        "cold": False,
    }
    row.update(extra)
    return row


def chunk_columns(n: int, base_ns: int = 2_000_000) -> tuple[list[int], list[int], list[int]]:
    """(offset_ns, tokens, chars) of `n` events, 1 ms apart."""
    return (
        [base_ns + k * 1_000_000 for k in range(n)],
        [1] * n,
        [4] * n,
    )
