"""The engine's own spans: W3C trace context for requests, OTLP in, span rows out.

Every request llmload sends carries `traceparent: 00-<trace id>-<span id>-01` where the trace
id is the request id itself (a uuid4's 32 hex digits) or, for any other id, the first 32 hex
digits of its SHA-256: `trace_id_of`. An engine that traces (vLLM's
`--otlp-traces-endpoint`, `llmload sim --otlp-traces-endpoint`) puts its span for the
request in that trace, so a span joins its request row by trace id without a table; a span
without a usable trace id may still join by `gen_ai.request.id` (`chatcmpl-<X-Request-Id>`
in vLLM; the request row's `server_request_id`).

OTLP arrives as an ExportTraceServiceRequest, protobuf or JSON (the OTLP/HTTP encodings and
an OpenTelemetry Collector's file exporter, one JSON request per line), decoded with the
official messages of `opentelemetry-proto`: `decode_export`, `span_rows`. Rows follow
analysis.kernel.schema.SPANS_SCHEMA: the latency attributes vLLM sets become columns, and every
attribute is kept as JSON, nothing dropped.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from analysis.kernel.errors import SchemaVersionError
from analysis.kernel.layout import is_spans_key
from analysis.kernel.schema import SPANS_SCHEMA, check_version, version_of
from analysis.kernel.storage import ObjectStore, StorageError

if TYPE_CHECKING:
    import pandas as pd

_HEX32 = re.compile(r"[0-9a-f]{32}")

REQUEST_SPAN: Final = "llm_request"
"""The name of vLLM's (and the simulator's) span of one request."""

START_UP_SPANS: Final = ("Overall Loading", "Load model", "Warmup (CPU)", "Allocate KV cache")
"""Spans an engine emits while it starts, before any request: its cold start (recorded in the
manifest's `cold_start.engine`); any span named here counts, with or without a trace."""

LATENCY_ATTRIBUTES: Final = {
    "queue_s": "gen_ai.latency.time_in_queue",
    "ttft_s": "gen_ai.latency.time_to_first_token",
    "prefill_s": "gen_ai.latency.time_in_model_prefill",
    "decode_s": "gen_ai.latency.time_in_model_decode",
    "inference_s": "gen_ai.latency.time_in_model_inference",
    "e2e_s": "gen_ai.latency.e2e",
}
"""Span columns (seconds) and the attribute each is read from (vLLM's names)."""

TOKEN_ATTRIBUTES: Final = {
    "prompt_tokens": "gen_ai.usage.prompt_tokens",
    "completion_tokens": "gen_ai.usage.completion_tokens",
}
REQUEST_ID_ATTRIBUTE: Final = "gen_ai.request.id"

CONTENT_TYPES: Final = {"application/x-protobuf": "protobuf", "application/json": "json"}
"""OTLP/HTTP request bodies this reads, by Content-Type."""


class SpansFormatError(ValueError):
    """A body or file line that is not an OTLP trace export."""


def trace_id_of(request_id: str) -> str:
    """The W3C trace id (32 lowercase hex digits) of a request: its id when that is one (a
    uuid4's hex, as llmload's request ids are), else the start of the id's SHA-256."""
    rid = request_id.lower()
    if _HEX32.fullmatch(rid) and rid != "0" * 32:
        return rid
    return hashlib.sha256(request_id.encode()).hexdigest()[:32]


def traceparent(request_id: str) -> str:
    """The `traceparent` header of a request: version 00, its trace id, a parent span id
    derived from the request id (never all zeros), sampled."""
    span = hashlib.sha256(b"span:" + request_id.encode()).hexdigest()[:16]
    if span == "0" * 16:  # pragma: no cover - a 1 in 2**64 chance, but the spec forbids it
        span = "0" * 15 + "1"
    return f"00-{trace_id_of(request_id)}-{span}-01"


def _hex_ids_to_base64(node: Any) -> Any:
    """OTLP JSON spells trace and span ids in hex; protobuf's JSON mapping wants base64."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                try:
                    value = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise SpansFormatError(f"{key} {value[:40]!r} is not hex") from None
            else:
                value = _hex_ids_to_base64(value)
            out[key] = value
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


def decode_export(body: bytes, encoding: str) -> ExportTraceServiceRequest:
    """An OTLP trace export from its protobuf or JSON (`encoding`) body; SpansFormatError."""
    message = ExportTraceServiceRequest()
    try:
        if encoding == "protobuf":
            message.ParseFromString(body)
        elif encoding == "json":
            doc = json.loads(body)
            if not isinstance(doc, dict):
                raise SpansFormatError("an OTLP JSON export is an object with resourceSpans")
            json_format.ParseDict(_hex_ids_to_base64(doc), message, ignore_unknown_fields=True)
        else:
            raise ValueError(f"unknown OTLP encoding {encoding!r}")
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpansFormatError(f"not an OTLP trace export ({encoding}): {exc}") from None
    except RecursionError:  # JSON nested deeper than any export: was a 500 and a traceback
        raise SpansFormatError(
            f"not an OTLP trace export ({encoding}): nested too deeply to be one"
        ) from None
    return message


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def _attributes(pairs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _float(attrs: dict[str, Any], name: str) -> float | None:
    value = attrs.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(attrs: dict[str, Any], name: str) -> int | None:
    value = attrs.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def span_rows(
    export: ExportTraceServiceRequest, run_id: str, source: str
) -> Iterator[dict[str, Any]]:
    """One SPANS_SCHEMA row per span of `export`, every attribute kept (JSON)."""
    for resource_spans in export.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        resource_json = json.dumps(resource, sort_keys=True, default=str)
        service = resource.get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attrs = _attributes(span.attributes)
                row: dict[str, Any] = {
                    "run_id": run_id,
                    "source": source,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex() or None,
                    "name": span.name,
                    "service_name": str(service) if service is not None else None,
                    "start_ns": int(span.start_time_unix_nano),
                    "end_ns": int(span.end_time_unix_nano),
                    "server_request_id": (
                        str(attrs[REQUEST_ID_ATTRIBUTE]) if REQUEST_ID_ATTRIBUTE in attrs else None
                    ),
                }
                for column, name in LATENCY_ATTRIBUTES.items():
                    row[column] = _float(attrs, name)
                for column, name in TOKEN_ATTRIBUTES.items():
                    row[column] = _int(attrs, name)
                row["attributes"] = json.dumps(attrs, sort_keys=True, default=str)
                row["resource"] = resource_json
                yield row


def rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Span rows as an Arrow table of SPANS_SCHEMA (its version in the metadata)."""
    return pa.Table.from_pylist(rows, schema=SPANS_SCHEMA)


def start_up_record(rows: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The engine's cold start from its start-up spans: each one's start, end and seconds
    (the latest of a name wins); None when there is none."""
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["name"] in START_UP_SPANS:
            mine = found.get(row["name"])
            if mine is None or row["start_ns"] > mine["start_ns"]:
                found[row["name"]] = {
                    "start_ns": row["start_ns"],
                    "end_ns": row["end_ns"],
                    "seconds": (row["end_ns"] - row["start_ns"]) / 1e9,
                    "service_name": row.get("service_name"),
                }
    if not found:
        return None
    return {"spans": dict(sorted(found.items()))}


def _conformed(table: pa.Table) -> pa.Table:
    """`table` with SPANS_SCHEMA's columns in order (a column it lacks: nulls)."""
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in SPANS_SCHEMA
    ]
    return pa.Table.from_arrays(columns, schema=SPANS_SCHEMA)


def read_spans(
    store: ObjectStore, keys: list[str], warnings: list[str] | None = None
) -> pd.DataFrame | None:
    """Every spans part among a run's `keys` (`spans/part-<source>-<seq>.parquet`) as one frame
    of SPANS_SCHEMA's columns; None when there is none. A part that cannot be read is skipped
    with a line appended to `warnings`; one of an unknown major version raises
    SchemaVersionError, as the other tables' do."""
    parts = sorted(k for k in keys if is_spans_key(k))
    if not parts:
        return None
    tables = []
    for key in parts:
        try:
            table = pq.read_table(io.BytesIO(store.get(key)))
            check_version(version_of(table.schema), where=key)
            tables.append(_conformed(table))
        except SchemaVersionError:
            raise
        except (StorageError, OSError, pa.ArrowException) as exc:
            if warnings is not None:
                warnings.append(f"spans part {key} could not be read (skipped): {exc}")
    table = pa.concat_tables(tables) if tables else SPANS_SCHEMA.empty_table()
    frame: pd.DataFrame = table.to_pandas()
    return frame.sort_values("start_ns", ignore_index=True, kind="stable")
