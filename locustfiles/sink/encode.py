"""Turn buffered rows into Arrow tables of schema v1, rejecting bad rows one by one.

The request path only appends references (a dict per request, a few lists per request's
chunks); this module does the conversion later, in slices, calling `pause()` between
slices so that, under gevent, request greenlets run while a large part is being built.

What it enforces: column types (Arrow conversion), non-null columns, the enumerated values
of `status`, `error_kind`, `output_tokens_source` and `kind`, and `run_id`/`worker_id`
equal to the sink's (filled in when a row leaves them out). It drops `prompt_text` unless
prompts are stored, and redacts known secret values from `error_detail`. A rejected row is
counted and described in `EncodeResult.errors`, never raised.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.kernel.schema import (
    CHUNK_KINDS,
    CHUNKS_SCHEMA,
    ERROR_KINDS,
    REQUESTS_SCHEMA,
    SINK_COLUMNS,
    STATUSES,
    TABLES,
    TOKEN_SOURCES,
)

REQUEST_SLICE = 100  # request rows converted per slice
CHECK_ROWS = 5_000  # converted request rows checked at once (at most; fewer at the end)
CHUNK_SLICE = 20  # requests' chunk lists converted per slice, as Python lists (~2,000 rows)
CHUNK_SLICE_ROWS = 20_000  # chunk rows per slice in the sink's compact form (~1 ms here),
CHUNK_SLICE_BATCHES = 400  # and at most this many requests' (short ones: ~1 ms per 400)
MAX_ERRORS = 20  # error messages kept per encode (all rejections are counted)
REDACTED = "<redacted>"

_ENUMS: dict[str, Mapping[str, tuple[str, ...]]] = {
    "requests": {
        "status": STATUSES,
        "error_kind": ERROR_KINDS,
        "output_tokens_source": TOKEN_SOURCES,
    },
    "chunks": {"kind": CHUNK_KINDS},
}
_REQUEST_NAMES = frozenset(REQUESTS_SCHEMA.names)
_CHUNK_FIELDS = [f for f in CHUNKS_SCHEMA if f.name not in SINK_COLUMNS]
"""The chunk columns after the sink's keys: request_id, seq, offset_ns, tokens, chars, kind."""

ChunkBatch = tuple[str, Sequence[int], Sequence[int], Sequence[int], "str | Sequence[str]"]


class CompactChunks(NamedTuple):
    """One request's chunk columns as the sink keeps them until they are encoded."""

    request_id: str
    offset_ns: bytes  # int64 values, native order
    tokens: bytes
    chars: bytes
    kind: str | tuple[str, ...]  # one kind for every row, or one per row
    rows: int


def compact_chunks(
    request_id: str,
    offset_ns: Sequence[int],
    tokens: Sequence[int],
    chars: Sequence[int],
    kind: str | Sequence[str],
) -> ChunkBatch | CompactChunks:
    """One request's chunk columns in the sink's compact form: int64 bytes (8 bytes a value,
    no Python object each, nothing for the garbage collector to walk: lists of ints held by
    the thousand made every full collection slow) and the kind once when every row has the
    same. Columns that do not convert (None, floats, text, too large, lengths that differ)
    stay as given, for the encoder to judge and reject as before. Never raises."""
    try:
        n = len(offset_ns)
        offsets, toks, chs = array("q", offset_ns), array("q", tokens), array("q", chars)
        if not isinstance(kind, str):
            kind = tuple(kind)
            if len(kind) != n or not all(isinstance(k, str) for k in kind):
                raise ValueError("kinds")
            if kind and kind.count(kind[0]) == n:
                kind = kind[0]
        if len(toks) != n or len(chs) != n or not isinstance(request_id, str):
            raise ValueError("columns")
    except Exception:  # the request path's append never raises
        return request_id, offset_ns, tokens, chars, kind
    return CompactChunks(request_id, offsets.tobytes(), toks.tobytes(), chs.tobytes(), kind, n)


"""One request's chunk rows, column-wise: (request_id, offset_ns, tokens, chars, kind)."""


@dataclass(frozen=True)
class EncodeContext:
    run_id: str
    worker_id: str
    store_prompts: bool = False
    secrets: tuple[str, ...] = ()  # values redacted from error_detail


@dataclass
class EncodeResult:
    table: pa.Table
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    def reject(self, count: int, message: str) -> None:
        self.rejected += count
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)


def _noop() -> None:
    pass


def encode_requests(
    rows: Sequence[Mapping[str, Any]],
    ctx: EncodeContext,
    pause: Callable[[], None] = _noop,
) -> EncodeResult:
    """Request rows (dicts keyed by column name) → a REQUESTS_SCHEMA table.

    The conversion runs on one slice at a time, with `pause()` after each slice; the checks
    (whole-column Arrow calls, ~0.5 ms whatever the rows) then run once on every CHECK_ROWS
    rows converted, not once per slice.
    """
    result = EncodeResult(REQUESTS_SCHEMA.empty_table())
    tables: list[pa.Table] = []
    converted: list[pa.Table] = []  # not yet checked
    unchecked = 0  # their rows
    unknown_reported: set[frozenset[str]] = set()
    for start in range(0, len(rows), REQUEST_SLICE):
        part = []
        for row in rows[start : start + REQUEST_SLICE]:
            if type(row) is not dict and not isinstance(row, Mapping):
                result.reject(1, f"request row is a {type(row).__name__}, not a dict")
                continue
            part.append(row)
            if not row.keys() <= _REQUEST_NAMES:  # no set built for a good row
                extra = row.keys() - _REQUEST_NAMES
                if frozenset(extra) not in unknown_reported:
                    unknown_reported.add(frozenset(extra))
                    result.errors.append(
                        f"request rows carry unknown columns {sorted(extra)}; ignored"
                    )
        try:
            slice_tables = [pa.Table.from_pylist(part, schema=REQUESTS_SCHEMA)]
        except (pa.ArrowException, TypeError, ValueError, AttributeError):
            slice_tables = _one_by_one(
                part, result, REQUESTS_SCHEMA, lambda r: f"request row {r.get('request_id')!r}"
            )
        converted += slice_tables
        unchecked += sum(len(t) for t in slice_tables)
        if unchecked >= CHECK_ROWS or start + REQUEST_SLICE >= len(rows):
            if converted:
                tables.append(_checked_requests(pa.concat_tables(converted), ctx, result))
            converted, unchecked = [], 0
        pause()
    if tables:
        result.table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return result


def _checked_requests(table: pa.Table, ctx: EncodeContext, result: EncodeResult) -> pa.Table:
    """Converted request rows with their keys filled, prompts dropped unless stored, secrets
    redacted and bad rows rejected."""
    table = _fill_keys(table, ctx, result, "requests")
    if not ctx.store_prompts:
        idx = table.schema.get_field_index("prompt_text")
        table = table.set_column(idx, REQUESTS_SCHEMA.field(idx), pa.nulls(len(table), pa.string()))
    table = _redact(table, "error_detail", ctx.secrets)
    return _check(table, result, "requests")


def _one_by_one(
    part: Sequence[Mapping[str, Any]],
    result: EncodeResult,
    schema: pa.Schema,
    what: Callable[[Mapping[str, Any]], str],
) -> list[pa.Table]:
    """Convert rows one at a time (a slice failed): keep the good, reject and describe the bad."""
    good = []
    for row in part:
        try:
            good.append(pa.Table.from_pylist([dict(row)], schema=schema))
        except (pa.ArrowException, TypeError, ValueError, AttributeError) as exc:
            result.reject(1, f"{what(row)} rejected: {exc}")
    return good


def encode_chunks(
    batches: Sequence[ChunkBatch | CompactChunks],
    ctx: EncodeContext,
    pause: Callable[[], None] = _noop,
) -> EncodeResult:
    """Per-request chunk columns → a CHUNKS_SCHEMA table (`seq` is the position in each list).

    Every step runs on one slice at a time, with `pause()` after each slice.
    """
    result = EncodeResult(CHUNKS_SCHEMA.empty_table())
    tables = []
    for part in _chunk_slices(batches):
        try:
            tables.append(_check(_chunk_table(part, ctx), result, "chunks"))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            for batch in part:
                try:
                    tables.append(_check(_chunk_table([batch], ctx), result, "chunks"))
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    message = f"chunks of request {batch[0]!r} rejected: {exc}"
                    result.reject(_batch_len(batch), message)
        pause()
    if tables:
        result.table = pa.concat_tables(tables)
    return result


def encode_rows(
    name: str,
    rows: Sequence[Mapping[str, Any]],
    ctx: EncodeContext,
    pause: Callable[[], None] = _noop,
) -> EncodeResult:
    """Rows of a small table (`samples`, `stalls`: dicts keyed by column) → its schema.

    Rows leave out `run_id` and `worker_id` (filled in); a row that does not convert is
    rejected alone, counted and described.
    """
    schema = TABLES[name]
    result = EncodeResult(schema.empty_table())
    tables = []
    for start in range(0, len(rows), REQUEST_SLICE):
        part = [r for r in rows[start : start + REQUEST_SLICE] if isinstance(r, Mapping)]
        if len(part) < len(rows[start : start + REQUEST_SLICE]):
            result.reject(
                len(rows[start : start + REQUEST_SLICE]) - len(part), f"{name} row is not a dict"
            )
        try:
            converted = [pa.Table.from_pylist(part, schema=schema)]
        except (pa.ArrowException, TypeError, ValueError, AttributeError):
            converted = _one_by_one(part, result, schema, lambda _: f"{name} row")
        for table in converted:
            tables.append(_check(_fill_keys(table, ctx, result, name), result, name))
        pause()
    if tables:
        result.table = pa.concat_tables(tables)
    return result


def _constant(value: str, n: int) -> pa.Array:
    """A string column holding one value n times (~10x faster than pa.repeat)."""
    indices = pa.array(np.zeros(n, dtype=np.int32))
    return pa.DictionaryArray.from_arrays(indices, pa.array([value])).cast(pa.string())


def _batch_len(batch: Any) -> int:
    if _compact(batch):
        return int(batch.rows)
    try:
        return len(batch[1])
    except TypeError:
        return 0


def _compact(batch: Any) -> bool:
    return type(batch) is CompactChunks


def _chunk_slices(batches: Sequence[Any]) -> Iterator[Sequence[Any]]:
    """Slices of about CHUNK_SLICE_ROWS rows (at most CHUNK_SLICE_BATCHES requests) of compact
    batches (numpy joins them), or of CHUNK_SLICE batches of lists (converted value by value)."""
    start = 0
    while start < len(batches):
        end, rows = start, 0
        while (
            end < len(batches)
            and _compact(batches[end])
            and rows < CHUNK_SLICE_ROWS
            and end - start < CHUNK_SLICE_BATCHES
        ):
            rows += batches[end].rows
            end += 1
        if end == start:
            end = start + 1
            while end < len(batches) and end - start < CHUNK_SLICE and not _compact(batches[end]):
                end += 1
        yield batches[start:end]
        start = end


def _chunk_table(part: Sequence[ChunkBatch], ctx: EncodeContext) -> pa.Table:
    if all(_compact(batch) for batch in part):
        return _compact_table(part, ctx)  # type: ignore[arg-type]
    request_ids: list[str] = []
    seqs: list[int] = []
    offsets: list[int] = []
    tokens: list[int] = []
    chars: list[int] = []
    kinds: list[str] = []
    for request_id, offset_ns, tok, ch, kind in part:
        n = len(offset_ns)
        if len(tok) != n or len(ch) != n or (not isinstance(kind, str) and len(kind) != n):
            raise ValueError(
                f"column lengths differ (offset_ns {n}, tokens {len(tok)}, chars {len(ch)}, "
                f"kind {1 if isinstance(kind, str) else len(kind)})"
            )
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, not {type(request_id).__name__}")
        request_ids += [request_id] * n
        seqs += range(n)
        offsets += offset_ns
        tokens += tok
        chars += ch
        kinds += [kind] * n if isinstance(kind, str) else kind
    n_rows = len(offsets)
    keys = [_constant(ctx.run_id, n_rows), _constant(ctx.worker_id, n_rows)]
    values = (request_ids, seqs, offsets, tokens, chars, kinds)  # _CHUNK_FIELDS' order
    arrays = [pa.array(v, f.type) for v, f in zip(values, _CHUNK_FIELDS, strict=True)]
    return pa.Table.from_arrays([*keys, *arrays], schema=CHUNKS_SCHEMA)


def _compact_table(part: Sequence[CompactChunks], ctx: EncodeContext) -> pa.Table:
    """`_chunk_table` for batches in the compact form (checked when they were made): whole
    columns joined and converted by numpy and Arrow, request ids and kinds as dictionaries."""
    counts = [batch.rows for batch in part]
    n_rows = sum(counts)
    per_row = np.repeat(np.arange(len(part), dtype=np.int32), counts)
    starts = np.cumsum(counts, dtype=np.int64) - counts
    seqs = np.arange(n_rows, dtype=np.int64) - np.repeat(starts, counts)

    def joined(columns: list[bytes]) -> np.ndarray:
        return np.frombuffer(b"".join(columns), dtype=np.int64)

    uniform = [batch.kind for batch in part if isinstance(batch.kind, str)]
    if len(uniform) == len(part):
        names = sorted(set(uniform))
        index = np.array([names.index(k) for k in uniform], dtype=np.int32)
        kind_column = _dictionary(index[per_row], names)
    else:
        flat: list[str] = []
        for batch in part:
            flat += [batch.kind] * batch.rows if isinstance(batch.kind, str) else batch.kind
        kind_column = pa.array(flat, pa.string())
    values = (
        _dictionary(per_row, [batch.request_id for batch in part]),
        seqs,
        joined([batch.offset_ns for batch in part]),
        joined([batch.tokens for batch in part]),
        joined([batch.chars for batch in part]),
        kind_column,
    )  # _CHUNK_FIELDS' order
    arrays = [
        v if isinstance(v, pa.Array) else pa.array(v, f.type)
        for v, f in zip(values, _CHUNK_FIELDS, strict=True)
    ]
    keys = [_constant(ctx.run_id, n_rows), _constant(ctx.worker_id, n_rows)]
    return pa.Table.from_arrays([*keys, *arrays], schema=CHUNKS_SCHEMA)


def _dictionary(indices: np.ndarray, values: Sequence[str]) -> pa.Array:
    """A string column of `values[i]` for each index (built as a dictionary, then decoded)."""
    return pa.DictionaryArray.from_arrays(pa.array(indices), pa.array(values, pa.string())).cast(
        pa.string()
    )


def _fill_keys(table: pa.Table, ctx: EncodeContext, result: EncodeResult, name: str) -> pa.Table:
    """Fill run_id/worker_id where rows left them out; reject rows that name others."""
    for column, value in (("run_id", ctx.run_id), ("worker_id", ctx.worker_id)):
        col = table.column(column)
        if col.null_count < len(col):
            wrong = pc.fill_null(pc.not_equal(col, value), False)
            bad = pc.sum(wrong).as_py() or 0
            if bad:
                result.reject(bad, f"{bad} {name} row(s) with a {column} other than {value!r}")
                table = table.filter(pc.invert(wrong))
        idx = table.schema.get_field_index(column)
        table = table.set_column(idx, table.schema.field(idx), _constant(value, len(table)))
    return table


def _redact(table: pa.Table, column: str, secrets: Sequence[str]) -> pa.Table:
    col = table.column(column)
    if not secrets or col.null_count == len(col):
        return table
    for secret in secrets:
        col = pc.replace_substring(col, pattern=secret, replacement=REDACTED)
    idx = table.schema.get_field_index(column)
    return table.set_column(idx, table.schema.field(idx), col)


def _check(table: pa.Table, result: EncodeResult, name: str) -> pa.Table:
    """Drop rows with nulls in non-null columns or values outside an enumeration."""
    bad = pa.array(np.zeros(len(table), dtype=bool))
    for fld in table.schema:
        col = table.column(fld.name)
        if not fld.nullable and col.null_count:
            nulls = pc.and_(col.is_null(), pc.invert(bad))  # count each row once
            count = pc.sum(nulls).as_py() or 0
            if count:
                result.reject(count, f"{count} {name} row(s) without the required {fld.name}")
                bad = pc.or_(bad, nulls)
        allowed = _ENUMS.get(name, {}).get(fld.name)
        if allowed is not None:
            known = pc.or_(col.is_null(), pc.is_in(col, value_set=pa.array(allowed)))
            outside = pc.invert(known)  # nulls pass here; required columns are checked above
            outside = pc.and_(outside, pc.invert(bad))  # count each row once
            count = pc.sum(outside).as_py() or 0
            if count:
                values = pc.unique(col.filter(outside)).to_pylist()[:5]
                message = f"{count} {name} row(s) with {fld.name} not in {allowed}: {values}"
                result.reject(count, message)
                bad = pc.or_(bad, outside)
    if pc.any(bad).as_py():
        table = table.filter(pc.invert(bad))
    return table
