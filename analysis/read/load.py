"""Read a run: list and read every request and chunk part, check versions, report completeness.

    run = load_run("s3://bench/runs/r1")      # RUN_URI is <events-uri>/<run_id>
    run.requests, run.chunks, run.manifest, run.completeness.warnings()

Only the columns analysis needs are read; chunk `request_id` comes back as a pandas
categorical (dictionary-encoded in Parquet), which the metrics fast path uses. A part that is
missing or unreadable is named, skipped and counted, never silently dropped; when every
requests part is unreadable the load stops (EventDataError). A part written by an unknown
major schema version stops the load (SchemaVersionError).
"""

from __future__ import annotations

import io
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TextIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.kernel.errors import SchemaVersionError, UsageError
from analysis.kernel.layout import (
    ACCELERATOR_METRICS_FOLDER,
    INDEX_FOLDER,
    MANIFEST_NAME,
    SERVER_METRICS_FOLDER,
    SPANS_FOLDER,
    TABLE_NAMES,
    PartKey,
    WorkerIndex,
    parse_index_key,
    parse_part_key,
    table_of,
)
from analysis.kernel.schema import (
    CHUNKS_SCHEMA,
    OPEN_LOOP_COLUMNS_1_2,
    REQUESTS_SCHEMA,
    SAMPLES_SCHEMA,
    SESSION_COLUMNS_1_3,
    STALLS_SCHEMA,
    check_version,
    version_of,
)
from analysis.kernel.spans import read_spans
from analysis.kernel.storage import ObjectStore, open_store
from analysis.read.accelerator import AcceleratorMetrics, read_accelerator
from analysis.read.completeness import (
    Completeness,
    note_unconfirmed,
    refuse_all_missing,
    refuse_unreadable_requests,
)
from analysis.read.partfs import footer_rows, locate
from analysis.read.server_metrics import ServerMetrics, read_server_metrics


def _read_but(schema: pa.Schema, *left_on_disk: str) -> tuple[str, ...]:
    """The columns of `schema` that analysis reads: all but those it leaves on disk."""
    return tuple(c for c in schema.names if c not in left_on_disk)


REQUEST_COLUMNS: Final = _read_but(
    REQUESTS_SCHEMA,
    "run_id",
    "endpoint",
    "stream",
    "prompt_sha256",
    "prompt_text",
    "error_detail",
    "completion_tokens",
    "server_request_id",
)
"""Columns of `requests` parts that analysis reads, in schema order. Columns a part's schema
version lacks (those 1.1, 1.2 and 1.3 added: analysis.kernel.schema's WORKER_DELAY_COLUMNS_1_1,
OPEN_LOOP_COLUMNS_1_2, SESSION_COLUMNS_1_3) read as null: missing, never 0."""

EXACT_INT_COLUMNS: Final = tuple(
    c
    for c in (*OPEN_LOOP_COLUMNS_1_2, *SESSION_COLUMNS_1_3)
    if pa.types.is_integer(REQUESTS_SCHEMA.field(c).type)
)
"""The integer request columns of open-loop steps and sessions, kept exact as pandas nullable
integers (Int64, Int32 for int32 columns) rather than float64 (as the older integer columns
read, NaN when missing): an `intended_ns` wall-clock time (~1.7e18) would lose ~100 ns in a
float, which slip would show; a turn index or token count stays an integer in requests.csv
and requests.parquet."""

CHUNK_COLUMNS: Final = _read_but(CHUNKS_SCHEMA, "run_id", "worker_id", "chars", "kind")
"""Columns of `chunks` parts that analysis reads (`request_id` first)."""

SAMPLE_COLUMNS: Final = _read_but(SAMPLES_SCHEMA, "run_id")
STALL_COLUMNS: Final = _read_but(STALLS_SCHEMA, "run_id")
"""Columns of the workers' own measurements (`samples`, `stalls`; schema 1.1)."""

_READ_THREADS = 8


@dataclass
class RunData:
    """A run's merged events (all workers) plus its manifest and completeness report."""

    uri: str
    run_id: str
    manifest: dict[str, Any]
    requests: pd.DataFrame
    chunks: pd.DataFrame | None  # None: left in their parts (`chunk_paths`), for the engine
    completeness: Completeness
    warnings: list[str]
    server_metrics: ServerMetrics | None = None  # the target's /metrics, when it had one
    samples: pd.DataFrame | None = None  # workers' CPU% and loop lag (schema 1.1)
    stalls: pd.DataFrame | None = None  # workers' event-loop stalls (schema 1.1)
    chunk_paths: list[str] | None = None  # the readable chunk parts, when left on disk
    chunk_filesystem: Any = None  # pyarrow filesystem of `chunk_paths`
    spans: pd.DataFrame | None = (
        None  # the engine's spans (analysis/kernel/spans.py), when it traced
    )
    request_paths: list[str] | None = None
    """The readable requests parts, when left on disk (`load_run(..., requests=False)`):
    `requests` is then an empty frame of its columns and `request_rows` counts them."""
    request_rows: int = 0
    accelerator: AcceleratorMetrics | None = None  # the accelerators' telemetry, when read

    @property
    def requests_on_disk(self) -> bool:
        return self.request_paths is not None


class Progress:
    """A one-line progress counter on stderr (parts read, rows/s, time left), shown only when
    stderr is a terminal: none in pipelines and logs."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = total > 0 and self.stream.isatty()
        self.total, self.label, self.done, self.rows = total, label, 0, 0
        self.started = time.monotonic()

    def step(self, n: int = 1, rows: int = 0) -> None:
        self.done += n
        self.rows += rows
        if self.enabled:
            elapsed = max(time.monotonic() - self.started, 1e-9)
            left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            self.stream.write(f"\r{self.label}: {self.done}/{self.total} parts, "
                              f"{self.rows / elapsed:,.0f} rows/s, {left:.0f} s left  ")  # fmt: skip
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def read_manifest(store: ObjectStore) -> dict[str, Any] | None:
    if not store.exists(MANIFEST_NAME):
        return None
    try:
        manifest = json.loads(store.get(MANIFEST_NAME))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{store.uri}/{MANIFEST_NAME} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise UsageError(f"{store.uri}/{MANIFEST_NAME} is not a JSON object")
    check_version(manifest.get("schema_version"), where=MANIFEST_NAME)
    return manifest


def _read_indexes(store: ObjectStore, keys: list[str]) -> dict[str, WorkerIndex]:
    """The workers' indexes, by the worker their key names."""
    out = {}
    for key in keys:
        worker = parse_index_key(key)
        if worker is None:
            continue
        try:
            out[worker] = WorkerIndex.from_json(store.get(key))
        except ValueError:
            continue  # an unreadable index is reported as "no final index"
    return out


def _empty_frame(schema: pa.Schema, columns: tuple[str, ...]) -> pa.Table:
    return pa.schema([schema.field(c) for c in columns]).empty_table()


def _read_part(data: bytes, key: str, schema: pa.Schema, columns: tuple[str, ...]) -> pa.Table:
    """Decode one part: needed columns only, version checked, absent (newer) columns null."""
    dictionary = ["request_id"] if schema is CHUNKS_SCHEMA else []
    file = pq.ParquetFile(io.BytesIO(data), read_dictionary=dictionary or None)
    check_version(version_of(file.schema_arrow), where=key)
    present = [c for c in columns if c in file.schema_arrow.names]
    table = file.read(columns=present)
    for name in columns:
        if name not in present:
            table = table.append_column(name, pa.nulls(len(table), schema.field(name).type))
    table = table.select(list(columns))
    target = [schema.field(c) for c in columns]
    if dictionary:
        target[0] = pa.field("request_id", pa.dictionary(pa.int32(), pa.string()))
    return table.cast(pa.schema(target).remove_metadata(), safe=True)


def _exact_ints(column: pa.ChunkedArray) -> pd.arrays.IntegerArray:
    """A nullable integer Arrow column as pandas Int64 (Int32 for int32), every value exact
    (no float detour)."""
    dtype = np.int32 if column.type == pa.int32() else np.int64
    values = pc.fill_null(column, 0).to_numpy().astype(dtype, copy=False)
    mask = column.is_null().to_numpy(zero_copy_only=False).astype(bool, copy=False)
    return pd.arrays.IntegerArray(values, mask)


def _to_pandas(tables: list[pa.Table], schema: pa.Schema, columns: tuple[str, ...]) -> pd.DataFrame:
    table = pa.concat_tables(tables) if tables else _empty_frame(schema, columns)
    exact = {c: _exact_ints(table[c]) for c in EXACT_INT_COLUMNS if c in columns}
    if exact:
        table = table.drop_columns(list(exact))
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    for name in (c for c in columns if c in exact):  # back in place, in column order
        frame.insert(columns.index(name), name, exact[name])
    return frame


def run_keys(store: ObjectStore) -> list[str]:
    """The keys under a run's own folders (parts, indexes, server and accelerator metrics):
    never a walk of everything below the URI, which for `/` (an unset `$EVENTS/$RUN_ID`) is
    the whole disk."""
    folders = (*TABLE_NAMES, INDEX_FOLDER, SERVER_METRICS_FOLDER, ACCELERATOR_METRICS_FOLDER,
               SPANS_FOLDER)  # fmt: skip
    return [o.key for folder in folders for o in store.list(f"{folder}/")]


def not_a_run(run_uri: str) -> str:
    """The one line for a URI that holds no run, with a hint when it names no run id."""
    path = run_uri.split("?", 1)[0].split("://", 1)[-1]
    unset = "" if path.strip("/") else " (it names no run id: is a variable in it unset?)"
    return (
        f"no llmload run at {run_uri}{unset}: found no {MANIFEST_NAME} and no event parts; "
        "RUN_URI is <events-uri>/<run_id>"
    )


@dataclass(frozen=True)
class _Footer:
    """A chunks part left on disk: its footer was read (version, rows), not its rows."""

    path: str
    rows: int


def open_run(
    run_uri: str,
) -> tuple[ObjectStore, dict[str, Any] | None, list[str], dict[str, PartKey]]:
    """A run's store, manifest (None: absent), keys and parsed part keys; UsageError when the
    URI cannot be read or holds no run."""
    store = open_store(run_uri)
    try:
        manifest = read_manifest(store)
        keys = run_keys(store)
    except OSError as exc:  # a local path that cannot be read (permissions, not a folder)
        raise UsageError(
            f"cannot read the run at {run_uri}: {exc.strerror or exc}; "
            "RUN_URI is <events-uri>/<run_id>"
        ) from exc
    parsed = {k: p for k in keys if (p := parse_part_key(k)) is not None}
    if manifest is None and not parsed:
        raise UsageError(not_a_run(run_uri))
    return store, manifest, keys, parsed


def run_id_of(manifest: dict[str, Any], run_uri: str) -> str:
    """The run's id: its manifest's, else the URI's last segment."""
    return str(manifest.get("run_id") or run_uri.rstrip("/").rsplit("/", 1)[-1])


def load_run(
    run_uri: str,
    *,
    progress: bool = True,
    progress_stream: TextIO | None = None,
    chunks: bool = True,
    requests: bool = True,
) -> RunData:
    """Read every part of the run at `run_uri` (`<events-uri>/<run_id>`), all workers merged.

    `chunks=False`: the chunk parts are not loaded, only their footers read (schema version,
    row count, a part that is not Parquet is named as unreadable); `chunk_paths` lists the
    readable ones for the out-of-core engine (analysis/derive/chunkfacts.py).
    `requests=False` (with `chunks=False`): the request parts are left on disk too
    (`request_paths`; analysis/steps/outofcore.py), `requests` an empty frame.

    Raises UsageError when nothing at the URI looks like a run, SchemaVersionError for parts
    or a manifest of an unknown major version. Missing and unreadable parts are skipped and
    reported in `completeness` and `warnings`.
    """
    store, manifest, keys, parsed = open_run(run_uri)
    parts = list(parsed)
    warnings: list[str] = []
    if manifest is None:
        warnings.append(f"{MANIFEST_NAME} is missing: no run metadata and no step timeline")
        manifest = {}
    elif manifest.get("status") == "running":
        warnings.append(
            "the run has no recorded end (manifest status running): it is still going, or its "
            "master was lost before writing it; what the master writes at the end (the last "
            "step's end, the workers' confirmation of their events) is missing"
        )
    run_id = run_id_of(manifest, run_uri)
    indexes = _read_indexes(store, keys)

    comp = Completeness()
    manifest_workers = [str(w.get("worker_id")) for w in manifest.get("workers") or []]
    comp.workers_expected = sorted(set(manifest_workers) | set(indexes))
    comp.note_sinks(manifest.get("workers") or [])
    comp.workers_found = sorted({p.worker_id for p in parsed.values()})
    expected_rows: dict[str, int] = {}
    for worker in sorted(set(comp.workers_expected) | set(comp.workers_found)):
        index = indexes.get(worker)
        if index is None or not index.final:
            comp.workers_without_final_index.append(worker)
        if index is not None:
            expected_rows.update(index.parts)
    note_unconfirmed(comp, manifest, indexes)
    found = set(parts)
    comp.parts_expected = len(expected_rows)
    comp.parts_found = len(parts)
    comp.missing_parts = sorted(set(expected_rows) - found)
    comp.unindexed_parts = sorted(
        k for k in found - set(expected_rows) if parsed[k].worker_id in indexes
    )
    schemas = {
        "requests": (REQUESTS_SCHEMA, REQUEST_COLUMNS),
        "chunks": (CHUNKS_SCHEMA, CHUNK_COLUMNS),
        "samples": (SAMPLES_SCHEMA, SAMPLE_COLUMNS),
        "stalls": (STALLS_SCHEMA, STALL_COLUMNS),
    }
    comp.rows_expected = {
        t: sum(r for k, r in expected_rows.items() if table_of(k) == t) for t in schemas
    }

    chunk_fs, chunk_path = None, {}
    left = ({"chunks"} if not chunks else set()) | ({"requests"} if not requests else set())
    if left:
        chunk_keys = [k for k, p in parsed.items() if p.table in left]
        chunk_fs, located = locate(store, chunk_keys)
        chunk_path = dict(zip(chunk_keys, located, strict=True))

    def read(key: str) -> tuple[str, pa.Table | _Footer | SchemaVersionError | None, str]:
        schema, columns = schemas[parsed[key].table]
        try:
            if key in chunk_path:
                assert chunk_fs is not None
                return (
                    key,
                    _Footer(chunk_path[key], footer_rows(chunk_fs, chunk_path[key], key)),
                    "",
                )
            return key, _read_part(store.get(key), key, schema, columns), ""
        except SchemaVersionError as exc:
            return key, exc, ""  # raised once every read has ended (see below)
        except (pa.ArrowException, OSError, ValueError) as exc:
            reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            return key, None, reason

    bar = Progress(len(parts), f"reading {run_id}", progress_stream) if progress else None
    tables: dict[str, list[pa.Table]] = {t: [] for t in schemas}
    footers: dict[str, list[_Footer]] = {"chunks": [], "requests": []}
    newer: SchemaVersionError | None = None
    # Raised only once every read has ended: raising out of pool.map while other parts were
    # still being decoded made the process abort now and then at exit (SIGABRT, "terminate
    # called without an active exception"; measured 9 in 100 runs, 0 in 300 after).
    with ThreadPoolExecutor(max_workers=_READ_THREADS) as pool:
        for key, table, reason in pool.map(read, parts):
            rows = table.rows if isinstance(table, _Footer) else None
            if isinstance(table, pa.Table):
                rows = len(table)
            if bar:
                bar.step(rows=rows or 0)
            if isinstance(table, SchemaVersionError):
                newer = newer or table
                continue
            if table is None or rows is None:
                comp.corrupt_parts[key] = reason
                continue
            comp.parts_read += 1
            name = parsed[key].table
            if isinstance(table, _Footer):
                footers[name].append(table)
            else:
                tables[name].append(table)
            comp.rows_read[name] += rows
            if key in expected_rows and expected_rows[key] != rows:
                comp.row_mismatches[key] = (expected_rows[key], rows)
    if bar:
        bar.close()
    if newer is not None:
        raise newer
    requests_parts = [k for k, p in parsed.items() if p.table == "requests"]
    refuse_unreadable_requests(run_uri, requests_parts, comp)
    refuse_all_missing(run_id, run_uri, comp)

    request_frame = _to_pandas(tables.pop("requests"), REQUESTS_SCHEMA, REQUEST_COLUMNS)
    chunk_frame = None
    if chunks:
        chunk_frame = _to_pandas(tables.pop("chunks"), CHUNKS_SCHEMA, CHUNK_COLUMNS)
        if not isinstance(chunk_frame["request_id"].dtype, pd.CategoricalDtype):
            chunk_frame["request_id"] = chunk_frame["request_id"].astype("category")
    samples = _to_pandas(tables.pop("samples"), SAMPLES_SCHEMA, SAMPLE_COLUMNS)
    stalls = _to_pandas(tables.pop("stalls"), STALLS_SCHEMA, STALL_COLUMNS)
    # the decoded parts are freed, but Arrow's allocator keeps their pages until asked:
    # about 0.3 GB per million request rows that the out-of-core report would carry along
    pa.default_memory_pool().release_unused()
    warnings.extend(comp.warnings())
    server_metrics = read_server_metrics(store, keys)
    if server_metrics is not None:
        warnings.extend(server_metrics.warnings)
    spans = read_spans(store, keys, warnings)
    accelerator = read_accelerator(store, keys)
    if accelerator is not None:
        warnings.extend(accelerator.warnings)
    return RunData(
        run_uri, run_id, manifest, request_frame, chunk_frame, comp, warnings, server_metrics,
        samples, stalls, None if chunks else sorted(f.path for f in footers["chunks"]),
        chunk_fs, spans, None if requests else sorted(f.path for f in footers["requests"]),
        comp.rows_read["requests"] if not requests else len(request_frame),
        accelerator=accelerator,
    )  # fmt: skip


def read_requests(run: RunData) -> None:
    """Read into memory the request parts a run left on disk (`load_run(..., requests=False)`):
    a run the out-of-core steps do not cover yet takes the in-memory path."""
    if run.request_paths is None:
        return
    filesystem = run.chunk_filesystem

    def read(path: str) -> pa.Table:
        with filesystem.open_input_file(path) as file:
            return _read_part(file.read(), path, REQUESTS_SCHEMA, REQUEST_COLUMNS)

    with ThreadPoolExecutor(max_workers=_READ_THREADS) as pool:
        tables = list(pool.map(read, run.request_paths))
    run.requests = _to_pandas(tables, REQUESTS_SCHEMA, REQUEST_COLUMNS)
    run.request_rows = len(run.requests)
    run.request_paths = None
    pa.default_memory_pool().release_unused()
