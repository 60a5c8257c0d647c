"""Event schema v1: the one definition shared by the writer (workers) and the reader (analysis).

Documented column by column in docs/events.md; a test keeps the two in step.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from analysis.kernel.errors import SchemaVersionError
from analysis.kernel.layout import TABLE_NAMES

SCHEMA_VERSION: Final = "1.5"
"""major.minor: readers accept any minor of a major they know and refuse other majors."""

SUPPORTED_MAJORS: Final = frozenset({1})

METADATA_KEY: Final = b"llmload.schema_version"
"""Parquet/Arrow schema metadata key that carries SCHEMA_VERSION in every part."""

STATUSES: Final = ("ok", "error", "cancelled", "aborted", "dropped")
"""`dropped` (1.2): an open-loop arrival not sent because `--max-concurrency` requests were in
flight and `--over-cap drop` was chosen, or due before the run stopped and not yet sent by its
worker (behind its schedule); it has no response times."""
TOKEN_SOURCES: Final = ("usage", "tokenizer", "events")
TURN_KINDS: Final = ("user", "tool_result")
"""1.3: a session's turn is a new user message, or the result of the previous turn's tool call."""
CHUNK_KINDS: Final = ("content", "reasoning", "tool_call")
"""`tool_call` (1.3): a streamed tool-call delta (its function arguments): output like content."""

# Error kinds a request row may carry (error_kind column). Documented in docs/events.md.
ERROR_KINDS: Final = (
    "connect",  # could not connect / connection reset before a response
    "http_4xx_input",  # 400/413/422: input rejected (e.g. over the context limit)
    "http_4xx_other",  # any other 4xx (401, 404...)
    "queue_rejected",  # 429/503: queue full or rate limited
    "http_5xx",  # other 5xx
    "ttft_timeout",  # no first token within --ttft-timeout
    "stall_timeout",  # no byte for --stall-timeout after the first token
    "total_timeout",  # the whole request exceeded --request-timeout
    "stream_error",  # the server sent an error event inside the stream
    "malformed_event",  # an event that is not valid JSON / not the expected shape
    "stream_truncated",  # the stream ended before a finish reason / [DONE]
    "cancelled",  # the client cancelled on purpose (--cancel-rate)
    "aborted",  # in flight when the run stopped
    "http_3xx",  # a redirect (llmload does not follow redirects)
    "http_unexpected_status",  # any other status that is not 200 (201, 204, 1xx...)
    "client_error",  # a bug in llmload while handling the request: recorded, never raised
    "invalid_usage",  # usage that is no token count: negative, > 2**31 - 1, or going down
)

# Named subsets of ERROR_KINDS: each is written here once and imported where it is used.
TIMEOUT_KINDS: Final = ("ttft_timeout", "total_timeout", "stall_timeout")
"""The client's own deadlines ran out (--ttft-timeout, --request-timeout, --stall-timeout)."""

OVERLOAD_KINDS: Final = ("queue_rejected", *TIMEOUT_KINDS)
"""Error kinds that say the server turned a request away or let it time out."""

SHAPE_KINDS: Final = ("stream_truncated", "malformed_event")
"""An answer that is no completion stream (with no output: a page, an empty body)."""

_SINK_KEYS = [  # every table's first columns: the sink fills them in
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("worker_id", pa.string(), nullable=False),
]
_KEYS = [*_SINK_KEYS, pa.field("request_id", pa.string(), nullable=False)]

# The request columns each minor version added; null for requests that have none of it.
_WORKER_DELAY_1_1 = [  # how far the worker's own delays may have touched this request
    pa.field("coalesced_events", pa.int32()),
    pa.field("worker_stall_ns", pa.int64()),
]
_OPEN_LOOP_1_2 = [  # open-loop (rate) steps; null in concurrency steps
    pa.field("rate", pa.float64()),
    pa.field("arrival_index", pa.int64()),
    pa.field("intended_ns", pa.int64()),
    pa.field("queued_ns", pa.int64()),
]
_SESSIONS_1_3 = [  # multi-turn sessions and agent tool rounds; null for single requests
    pa.field("session_id", pa.string()),
    pa.field("turn", pa.int32()),
    pa.field("session_turns", pa.int32()),
    pa.field("turn_kind", pa.string()),
    pa.field("wait_ns", pa.int64()),
    pa.field("tool_calls", pa.int32()),
    pa.field("cached_tokens", pa.int32()),
    pa.field("history_tokens", pa.int32()),
]

_CLIENT_PHASES_1_4 = [  # the client's side of the request path, before the request's bytes
    pa.field("connect_new", pa.bool_()),  # it opened a new connection (false: a reused one)
    pa.field("connect_ns", pa.int64()),  # how long opening it took (null when reused)
    pa.field("client_delay_ns", pa.int64()),  # decided to send -> bytes handed to the kernel
]

_OUTPUT_KINDS_1_5 = [  # what the answer was: reasoning, then the answer; and whether valid
    pa.field("first_reasoning_ns", pa.int64()),  # the first event carrying reasoning
    pa.field("first_answer_ns", pa.int64()),  # the first carrying answer: content or a tool call
    pa.field("reasoning_tokens", pa.int32()),  # of output_tokens, those that were reasoning
    pa.field("output_valid", pa.bool_()),  # the answer is what was asked for (null: unchecked)
    pa.field("output_invalid_reason", pa.string()),  # why not (null: valid or unchecked)
]


def _with_version(fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={METADATA_KEY: SCHEMA_VERSION.encode()})


def _names(fields: list[pa.Field]) -> tuple[str, ...]:
    return tuple(f.name for f in fields)


SINK_COLUMNS: Final = _names(_SINK_KEYS)
"""Key columns the event sink fills in (one value for all of a worker's rows): a recorded row
leaves them out."""
WORKER_DELAY_COLUMNS_1_1: Final = _names(_WORKER_DELAY_1_1)
"""1.1: the request columns that measure the worker's own delays."""
OPEN_LOOP_COLUMNS_1_2: Final = _names(_OPEN_LOOP_1_2)
"""1.2: the request columns of open-loop (rate) steps."""
SESSION_COLUMNS_1_3: Final = _names(_SESSIONS_1_3)
"""1.3: the request columns of multi-turn sessions and agent tool rounds."""
CLIENT_PHASE_COLUMNS_1_4: Final = _names(_CLIENT_PHASES_1_4)
"""1.4: the request columns of the client's phases before the write (its connection, its
own delay); `sent_at_ns` is the write itself from 1.4 on (the decision to send before)."""
OUTPUT_KIND_COLUMNS_1_5: Final = _names(_OUTPUT_KINDS_1_5)
"""1.5: the request columns that tell reasoning from answer (when each began: TTFR, TTFO; how
many of the output tokens were reasoning) and whether the answer was valid."""

REQUESTS_SCHEMA: Final = _with_version(
    [
        *_KEYS,
        pa.field("step", pa.int32(), nullable=False),
        pa.field("concurrency", pa.int32(), nullable=False),
        pa.field("scenario", pa.string()),
        pa.field("endpoint", pa.string()),
        pa.field("model", pa.string()),
        pa.field("stream", pa.bool_(), nullable=False),
        pa.field("prompt_tokens_requested", pa.int32()),
        pa.field("max_tokens", pa.int32()),
        pa.field("prompt_sha256", pa.string()),
        pa.field("prompt_text", pa.string()),
        pa.field("sent_at_ns", pa.int64(), nullable=False),
        pa.field("headers_ns", pa.int64()),
        pa.field("first_event_ns", pa.int64()),
        pa.field("first_token_ns", pa.int64()),
        pa.field("first_content_ns", pa.int64()),
        pa.field("last_token_ns", pa.int64()),
        pa.field("end_ns", pa.int64()),
        pa.field("http_status", pa.int32()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error_kind", pa.string()),
        pa.field("error_detail", pa.string()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("output_tokens", pa.int32()),
        pa.field("output_tokens_source", pa.string()),
        pa.field("events", pa.int32(), nullable=False),
        pa.field("cold", pa.bool_(), nullable=False),
        pa.field("server_request_id", pa.string()),
        *_WORKER_DELAY_1_1,
        *_OPEN_LOOP_1_2,
        *_SESSIONS_1_3,
        *_CLIENT_PHASES_1_4,
        *_OUTPUT_KINDS_1_5,
    ]
)

REQUEST_ROW_COLUMNS: Final = tuple(n for n in REQUESTS_SCHEMA.names if n not in SINK_COLUMNS)
"""The keys of a request row as a worker records it (`RequestRecord.row()`), in order."""

CHUNKS_SCHEMA: Final = _with_version(
    [
        *_KEYS,
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("offset_ns", pa.int64(), nullable=False),
        pa.field("tokens", pa.int32(), nullable=False),
        pa.field("chars", pa.int32(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
    ]
)

SAMPLES_SCHEMA: Final = _with_version(
    [
        *_SINK_KEYS,
        pa.field("at_ns", pa.int64(), nullable=False),
        pa.field("interval_ns", pa.int64(), nullable=False),
        pa.field("cpu_percent", pa.float64(), nullable=False),
        pa.field("loop_lag_us", pa.list_(pa.int32()), nullable=False),
    ]
)
"""1.1: one row per worker and second: the worker's CPU% and every loop-lag probe."""

STALLS_SCHEMA: Final = _with_version(
    [
        *_SINK_KEYS,
        pa.field("started_at_ns", pa.int64(), nullable=False),
        pa.field("length_ns", pa.int64(), nullable=False),
    ]
)
"""1.1: one row per stall of a worker's event loop (a lag of STALL_NS or more)."""

SPANS_SCHEMA: Final = _with_version(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # "otlp" (the master) or "import"
        pa.field("trace_id", pa.string(), nullable=False),  # 32 hex digits
        pa.field("span_id", pa.string(), nullable=False),  # 16 hex digits
        pa.field("parent_span_id", pa.string()),
        pa.field("name", pa.string(), nullable=False),
        pa.field("service_name", pa.string()),
        pa.field("start_ns", pa.int64(), nullable=False),  # unix ns, the server's clock
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("server_request_id", pa.string()),  # gen_ai.request.id
        pa.field("queue_s", pa.float64()),  # gen_ai.latency.time_in_queue
        pa.field("ttft_s", pa.float64()),  # gen_ai.latency.time_to_first_token
        pa.field("prefill_s", pa.float64()),  # gen_ai.latency.time_in_model_prefill
        pa.field("decode_s", pa.float64()),  # gen_ai.latency.time_in_model_decode
        pa.field("inference_s", pa.float64()),  # gen_ai.latency.time_in_model_inference
        pa.field("e2e_s", pa.float64()),  # gen_ai.latency.e2e
        pa.field("prompt_tokens", pa.int64()),  # gen_ai.usage.prompt_tokens
        pa.field("completion_tokens", pa.int64()),  # gen_ai.usage.completion_tokens
        pa.field("attributes", pa.string(), nullable=False),  # every attribute, JSON
        pa.field("resource", pa.string(), nullable=False),  # the resource's attributes, JSON
    ]
)
"""1.4: the engine's own spans (OTLP), one row per span, as received or imported: a
request's `llm_request` span joins its request row by trace id (analysis/kernel/spans.py)."""

STALL_NS: Final = 5_000_000
"""A worker's event loop late by this much or more has stalled (a `stalls` row); a worker
whose loop-lag p99 reaches it is saturated, as is one at SATURATED_CPU_PERCENT."""
SATURATED_CPU_PERCENT: Final = 80.0
"""A worker at or above this CPU% is saturated: its timings include its own delay."""

TABLES: Final = dict(
    zip(TABLE_NAMES, (REQUESTS_SCHEMA, CHUNKS_SCHEMA, SAMPLES_SCHEMA, STALLS_SCHEMA), strict=True)
)
"""Each table's schema, by the name of its folder in the store (analysis/kernel/layout.py)."""


def check_version(version: str | bytes | None, where: str = "events") -> str:
    """Return the version string if this reader understands it, else raise SchemaVersionError."""
    if isinstance(version, bytes):
        version = version.decode(errors="replace")
    if not version:
        raise SchemaVersionError(
            f"{where}: no llmload schema version found; was it written by llmload?"
        )
    major_text = version.split(".", 1)[0]
    if not major_text.isdigit() or int(major_text) not in SUPPORTED_MAJORS:
        raise SchemaVersionError(
            f"{where}: schema version {version} is not supported by this llmload "
            f"(reads {', '.join(f'{m}.x' for m in sorted(SUPPORTED_MAJORS))}); "
            "upgrade llmload to read it"
        )
    return version


def version_of(schema: pa.Schema) -> str | None:
    """The schema version stored in an Arrow/Parquet schema's metadata, if any."""
    meta = schema.metadata or {}
    raw = meta.get(METADATA_KEY)
    return raw.decode(errors="replace") if raw is not None else None


def int_max(schema: pa.Schema, column: str) -> int:
    """The largest value the integer `column` of `schema` holds (2**31 - 1 for an int32), so
    that inputs are checked where they are read, not refused row by row by the sink."""
    kind = schema.field(column).type
    if not pa.types.is_integer(kind):
        raise ValueError(f"column {column!r} is {kind}, not an integer")
    bits = kind.bit_width
    return 2**bits - 1 if pa.types.is_unsigned_integer(kind) else 2 ** (bits - 1) - 1
