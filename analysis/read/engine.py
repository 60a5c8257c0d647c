"""Runs' event parts as tables of an embedded DuckDB, read where they lie, out of core.

    with Engine(memory_limit="2GB") as engine:
        engine.attach(["runs/r1", "s3://bucket/runs/r2"])   # views over every part
        table = engine.sql("SELECT step, count(*) FROM request_metrics GROUP BY step")

Views (one row per row of every part of every attached run; `run_id` tells the runs apart):
`requests`, `chunks`, `samples`, `stalls`, `spans` (the tables of docs/events.md, every column
of the newest schema: columns an older part lacks read as null; `spans` is empty for a run
whose engine sent none), and `request_metrics`, one row per
request with its columns and the per-request metrics of analysis/derive/metrics.py: `ttfe_s`,
`ttft_s`, `tpot_s`, `e2e_s`, `itl_mean_s`, `icl_mean_s`, `output_tokens_per_s`,
`chunk_count`, `chunk_tokens`; `request_path`, the same with the request's engine span
joined and its path's parts (analysis/derive/path.py: `span`, `network_up_s` … `tail_s`); `itl_samples`, the per-token ITL samples (value and weight)
of every chunk; the macro `nearest_rank(list(x), q)` is llmload's percentile.

The per-request means come from aggregates, not from a window over the chunks: a request's
per-token ITL samples sum to (last token chunk − first token chunk) over (its tokens − 1)
samples, and its ICL samples to (last chunk − first chunk) over (chunks − 1). So the view is
a hash aggregation that DuckDB spills to disk under its memory limit, whatever the run's
size (tests/integration/test_engine.py checks it against analysis/derive/metrics.py on a run of
more than a million chunk rows).

The parts are read through pyarrow datasets: only the columns a query needs, the local
files or S3 objects read in ranges (pyarrow's S3 filesystem, with the credentials and
endpoint boto3 resolves, as everywhere in llmload): nothing is downloaded whole, and no
DuckDB extension is installed or fetched. A part of an unknown major schema version stops
the attach (SchemaVersionError), as it stops `llmload report`.
"""

from __future__ import annotations

import math
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from analysis.kernel.errors import UsageError
from analysis.kernel.layout import TABLE_NAMES, is_spans_key
from analysis.kernel.schema import (
    CHUNKS_SCHEMA,
    REQUESTS_SCHEMA,
    SAMPLES_SCHEMA,
    SPANS_SCHEMA,
    STALLS_SCHEMA,
)
from analysis.read.clocks import worker_offsets_ns
from analysis.read.load import open_run, run_id_of
from analysis.read.partfs import footer_rows, locate

SCHEMAS: Final = {
    "requests": REQUESTS_SCHEMA,
    "chunks": CHUNKS_SCHEMA,
    "samples": SAMPLES_SCHEMA,
    "stalls": STALLS_SCHEMA,
    "spans": SPANS_SCHEMA,  # the engine's own spans (analysis/kernel/spans.py): not a worker's table
}

DEFAULT_MEMORY_LIMIT: Final = "2GB"
"""DuckDB's memory limit unless --memory-limit says otherwise: beyond it, it spills."""

REQUEST_METRICS_SQL: Final = """
CREATE OR REPLACE VIEW request_metrics AS
WITH per_request AS (
    SELECT run_id, request_id,
           count(*) AS chunk_count,
           sum(tokens) AS chunk_tokens,
           min(offset_ns) AS first_chunk_ns,
           max(offset_ns) AS last_chunk_ns,
           min(offset_ns) FILTER (WHERE tokens > 0) AS first_token_chunk_ns,
           max(offset_ns) FILTER (WHERE tokens > 0) AS last_token_chunk_ns,
           sum(tokens) FILTER (WHERE tokens > 0) AS token_chunk_tokens
    FROM chunks
    GROUP BY run_id, request_id
)
SELECT r.*,
       r.first_event_ns / 1e9 AS ttfe_s,
       r.first_token_ns / 1e9 AS ttft_s,
       r.first_answer_ns / 1e9 AS ttfo_s,
       r.first_reasoning_ns / 1e9 AS ttfr_s,
       CASE WHEN r.output_tokens >= 2
            THEN (r.last_token_ns - r.first_token_ns) / 1e9 / (r.output_tokens - 1) END
           AS tpot_s,
       r.end_ns / 1e9 AS e2e_s,
       CASE WHEN c.token_chunk_tokens > 1
            THEN (c.last_token_chunk_ns - c.first_token_chunk_ns) / 1e9
                 / (c.token_chunk_tokens - 1) END AS itl_mean_s,
       CASE WHEN c.chunk_count > 1
            THEN (c.last_chunk_ns - c.first_chunk_ns) / 1e9 / (c.chunk_count - 1) END
           AS icl_mean_s,
       CASE WHEN r.output_tokens >= 0 AND r.end_ns > 0
            THEN r.output_tokens / (r.end_ns / 1e9) END AS output_tokens_per_s,
       coalesce(c.chunk_count, 0) AS chunk_count,
       coalesce(c.chunk_tokens, 0) AS chunk_tokens
FROM requests r
LEFT JOIN per_request c ON c.run_id = r.run_id AND c.request_id = r.request_id
"""

REQUEST_PATH_SQL: Final = """
CREATE OR REPLACE VIEW request_path AS
WITH timed AS (  -- the spans that time one request, the earliest of each trace
    SELECT * FROM (
        SELECT *, row_number() OVER (PARTITION BY run_id, trace_id ORDER BY start_ns) AS nth
        FROM spans WHERE name = 'llm_request' OR ttft_s IS NOT NULL)
    WHERE nth = 1
), joined AS (
    SELECT m.*,
           m.sent_at_ns - coalesce(o.offset_ns, 0) AS sent_master_ns,
           s.start_ns AS span_start_ns, s.queue_s AS span_queue_s, s.prefill_s AS span_prefill_s,
           s.ttft_s AS span_ttft_s,
           coalesce(s.e2e_s - s.ttft_s, s.decode_s) AS span_decode_s,
           s.trace_id IS NOT NULL AS span
    FROM request_metrics m
    LEFT JOIN llmload_clock_offsets o ON o.run_id = m.run_id AND o.worker_id = m.worker_id
    LEFT JOIN timed s ON s.run_id = m.run_id AND s.trace_id = CASE
        WHEN regexp_full_match(lower(m.request_id), '[0-9a-f]{32}')
             AND lower(m.request_id) <> repeat('0', 32)
        THEN lower(m.request_id) ELSE substr(sha256(m.request_id), 1, 32) END
)
SELECT * EXCLUDE (sent_master_ns, span_start_ns, span_queue_s, span_prefill_s, span_ttft_s,
                  span_decode_s),
       (span_start_ns - sent_master_ns) / 1e9 AS network_up_s,
       span_ttft_s - coalesce(span_queue_s, 0) - coalesce(span_prefill_s, 0) AS server_other_s,
       span_queue_s AS server_queue_s,
       span_prefill_s AS server_prefill_s,
       ttft_s - (span_start_ns - sent_master_ns) / 1e9 - span_ttft_s AS first_token_delivery_s,
       span_decode_s AS server_decode_s,
       e2e_s - (span_start_ns - sent_master_ns) / 1e9 - span_ttft_s - span_decode_s AS tail_s
FROM joined
"""
"""One row per request: request_metrics and its request path (analysis/derive/path.py), joined with
its engine span by trace id (the fallback by `gen_ai.request.id` is the report's only).
The write is moved onto the master's clock with the worker's measured offset, as the report
does; the span's times are the server's clock."""

ITL_SAMPLES_SQL: Final = """
CREATE OR REPLACE VIEW itl_samples AS
SELECT run_id, request_id, seq,
       CASE WHEN prev IS NULL THEN 0.0 ELSE (offset_ns - prev) / 1e9 / tokens END AS value_s,
       CASE WHEN prev IS NULL THEN tokens - 1 ELSE tokens END AS weight
FROM (SELECT run_id, request_id, seq, offset_ns, tokens,
             lag(offset_ns) OVER (PARTITION BY run_id, request_id ORDER BY seq) AS prev
      FROM chunks WHERE tokens > 0)
WHERE (CASE WHEN prev IS NULL THEN tokens - 1 ELSE tokens END) > 0
"""
"""Per-token ITL samples (analysis/derive/metrics.py): a chunk of k tokens Δ after the previous one
stands for k samples of Δ/k, a first chunk's extra tokens for samples of 0."""

MACROS_SQL: Final = (
    "CREATE OR REPLACE MACRO llmload_rank(s, q) AS "
    "s[greatest(1, ceil(q * len(s) - 1e-9 * len(s))::BIGINT)]",
    "CREATE OR REPLACE MACRO nearest_rank(l, q) AS "
    "llmload_rank(list_sort(list_filter(l, lambda v: v IS NOT NULL)), q)",
)
"""`nearest_rank(list(x), 0.99)`: llmload's percentile (the smallest value with at least q
of the samples at or below it: docs/metrics.md), which DuckDB's quantile_disc is not."""

_FOOTER_THREADS = 8


@dataclass
class AttachedRun:
    """One run the engine reads: where it is, its manifest, its parts by table."""

    uri: str
    run_id: str
    manifest: dict[str, Any]
    parts: dict[str, list[str]] = field(default_factory=dict)  # table -> paths in `filesystem`
    filesystem: pafs.FileSystem | None = None


_UNITS: Final = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
                 "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def limit_bytes(limit: str) -> int:
    """A parsed memory limit (parse_memory_limit) in bytes."""
    unit = next(u for u in sorted(_UNITS, key=len, reverse=True) if limit.endswith(u))
    return int(float(limit[: -len(unit)]) * _UNITS[unit])


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


ENGINE_FLOOR: Final = 128 * 2**20
"""The least DuckDB is given, whatever the limit: below it even a small run's window fails."""


def engine_share(limit: str) -> str:
    """What DuckDB may hold of a whole-process `limit`: half of what the process does not
    already hold (the request rows), at least a quarter of the limit and ENGINE_FLOOR."""
    total = limit_bytes(limit)
    # half of what is left: DuckDB's limit covers its buffers, not every allocation it makes
    # (nor the Arrow results handed back), measured to take about as much again at the peak
    share = max(total // 4, (total - resident_bytes()) // 2, ENGINE_FLOOR)
    return f"{share // 2**20}MiB"


REQUEST_ROWS_PEAK: Final = 6
"""The report's peak RSS over the loaded request frame's own size, measured at a million
requests of 10 chunks (0.28 GB of request rows, 1.72 GB peak: docs/benchmarks.md)."""


def over_limit_warning(limit: str, requests: pd.DataFrame) -> str | None:
    """A warning when the loaded request rows are too many for `limit`: they stay in memory
    (the chunks do not), and the report peaks near REQUEST_ROWS_PEAK times their size; None
    when they fit."""
    size = int(requests.memory_usage(deep=True).sum())
    if size * REQUEST_ROWS_PEAK <= limit_bytes(limit):
        return None
    wanted = math.ceil(size * REQUEST_ROWS_PEAK * 1.2 / 2**30)
    return (
        f"the {len(requests):,} request rows take {size / 2**30:.2f} GiB in memory (they stay "
        f"there, the chunks do not): the report will likely pass --memory-limit {limit}; give "
        f"--memory-limit {wanted}GiB or more"
    )


def parse_memory_limit(text: str) -> str:
    """A DuckDB memory limit such as 2GB, 512MB or 1.5GiB; UsageError otherwise."""
    value = text.strip().upper().replace(" ", "")
    units = ("KIB", "MIB", "GIB", "TIB", "KB", "MB", "GB", "TB")
    unit = next((u for u in units if value.endswith(u)), None)
    number = value[: -len(unit)] if unit else ""
    try:
        ok = unit is not None and float(number) > 0
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(
            f"--memory-limit {text!r} is not a size; give a number and a unit, e.g. "
            "--memory-limit 2GB (or 512MB, 8GiB)"
        )
    return value


def find_run(uri: str) -> AttachedRun:
    """A run's manifest and its parts' paths; UsageError when the URI holds no run."""
    store, found, keys, parsed = open_run(uri)
    manifest = found or {}
    run_id = run_id_of(manifest, uri)
    spans = [k for k in keys if is_spans_key(k)]
    filesystem, paths = locate(store, [*parsed, *spans])
    by_key = dict(zip([*parsed, *spans], paths, strict=True))
    parts = {t: sorted(by_key[k] for k, p in parsed.items() if p.table == t) for t in TABLE_NAMES}
    parts["spans"] = sorted(by_key[k] for k in spans)
    return AttachedRun(uri, run_id, manifest, parts, filesystem)


def _check_versions(filesystem: pafs.FileSystem | None, paths: list[str]) -> None:
    """Every part's schema version is one this llmload reads (its footer, read in ranges)."""

    def check(path: str) -> None:
        footer_rows(filesystem or pafs.LocalFileSystem(), path, path)

    with ThreadPoolExecutor(max_workers=_FOOTER_THREADS) as pool:
        list(pool.map(check, paths))


_DUCK_TYPES: Final = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.float32(): "FLOAT",
    pa.bool_(): "BOOLEAN",
}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class Engine:
    """An embedded DuckDB with a memory limit and a spill folder (see the module doc)."""

    def __init__(
        self,
        memory_limit: str = DEFAULT_MEMORY_LIMIT,
        spill_dir: str | None = None,
        threads: int | None = None,
        on_disk: bool = False,
    ) -> None:
        import duckdb

        self._spill = None if spill_dir else tempfile.TemporaryDirectory(prefix="llmload-spill-")
        spill = spill_dir or (self._spill.name if self._spill else "")
        self.spill_root = spill_dir  # the folder given (None: the system's temporary one)
        # on_disk: tables the engine makes (a run's request table) live in a database file in
        # the spill folder, paged in under the memory limit, not in memory
        self._database = (
            Path(spill) / f"llmload-{os.getpid()}-{id(self)}.duckdb" if on_disk else None
        )
        self.con = duckdb.connect(str(self._database) if self._database else ":memory:",
                                  config={"autoinstall_known_extensions": False,
                                          "autoload_known_extensions": False})  # fmt: skip
        limit = parse_memory_limit(memory_limit)
        self.memory_bytes = limit_bytes(limit)
        self.con.execute(f"SET memory_limit = '{limit}'")
        self.con.execute("SET temp_directory = ?", [spill])
        self.con.execute("SET preserve_insertion_order = false")  # lets big scans stream
        self.con.execute(f"SET threads = {int(threads or os.cpu_count() or 1)}")
        self.runs: list[AttachedRun] = []
        self._datasets: dict[str, ds.Dataset] = {}

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()
        if self._database is not None:
            for leftover in (self._database, self._database.with_suffix(".duckdb.wal")):
                leftover.unlink(missing_ok=True)
        if self._spill is not None:
            self._spill.cleanup()
            self._spill = None

    def attach(self, uris: list[str]) -> list[AttachedRun]:
        """Views `requests`, `chunks`, `samples`, `stalls`, `spans` and `request_metrics` over the runs
        at `uris` (each `<events-uri>/<run_id>`)."""
        self.runs = [find_run(uri) for uri in uris]
        ids = [run.run_id for run in self.runs]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise UsageError(f"run {dup} is given twice; give each run once")
        for table in SCHEMAS:
            sources = []
            for run in self.runs:
                paths = run.parts.get(table) or []
                if paths:
                    _check_versions(run.filesystem, paths)
                    sources.append((paths, run.filesystem))
            self.register_parts(table, sources)
        offsets = [
            (run.run_id, worker, offset)
            for run in self.runs
            for worker, offset in worker_offsets_ns(run.manifest).items()
        ]
        self.con.register(
            "llmload_clock_offsets",
            pa.table(
                {
                    "run_id": pa.array([o[0] for o in offsets], pa.string()),
                    "worker_id": pa.array([o[1] for o in offsets], pa.string()),
                    "offset_ns": pa.array([o[2] for o in offsets], pa.int64()),
                }
            ),
        )
        for statement in (REQUEST_METRICS_SQL, REQUEST_PATH_SQL, ITL_SAMPLES_SQL, *MACROS_SQL):
            self.con.execute(statement)
        return self.runs

    def register_parts(
        self,
        table: str,
        sources: list[tuple[list[str], pafs.FileSystem | None]],
        view: str | None = None,
        part_column: bool = False,
    ) -> None:
        """A view `table` over Parquet parts whose versions are checked: `sources` are lists
        of paths, each in its filesystem. Every column of the newest schema, in its order;
        a column older parts lack reads as null. Local files are read by DuckDB itself
        (within its memory limit), others through a pyarrow dataset. `view`: the view's name
        (default: the table's). `part_column`: a last column `llmload_part`, the row's part
        (its file's place among its source's paths; null where the source is not local)."""
        schema = SCHEMAS[table].remove_metadata()
        selects = []
        for i, (paths, filesystem) in enumerate(sources):
            if isinstance(filesystem, pafs.LocalFileSystem):
                files = "[" + ", ".join(_quote(p) for p in paths) + "]"
                source = f"read_parquet({files}, union_by_name = true)"
                present = {
                    row[0] for row in self.con.sql(f"DESCRIBE SELECT * FROM {source}").fetchall()
                }
            else:
                source = f"llmload_{view or table}_{i}"
                dataset = ds.dataset(paths, schema=schema, format="parquet", filesystem=filesystem)
                self._datasets[source] = dataset
                self.con.register(source, dataset)
                present = set(schema.names)
            columns = ", ".join(
                f.name
                if f.name in present
                else f"CAST(NULL AS {_DUCK_TYPES.get(f.type, 'VARCHAR')}) AS {f.name}"
                for f in schema
            )
            if part_column:
                local = isinstance(filesystem, pafs.LocalFileSystem)
                columns += ", " + ("file_index" if local else "NULL::UBIGINT") + " AS llmload_part"
            selects.append(f"SELECT {columns} FROM {source}")
        if not selects:
            empty = f"llmload_{view or table}_empty"
            self.con.register(empty, schema.empty_table())
            part = ", NULL::UBIGINT AS llmload_part" if part_column else ""
            selects.append(f"SELECT *{part} FROM {empty}")
        name = view or table
        self.con.execute(f"CREATE OR REPLACE VIEW {name} AS " + " UNION ALL ".join(selects))

    def sql(self, query: str) -> pa.Table:
        """The result of one query as an Arrow table."""
        return self.con.sql(query).to_arrow_table()

    def stream(self, query: str, batch_rows: int = 100_000) -> pa.RecordBatchReader:
        """The result of one query, batch by batch (for results too large to hold).
        UsageError for a query that returns no result (empty, or a statement such as SET)."""
        relation = self.con.sql(query)
        if relation is None:
            raise UsageError(
                f"the query {query.strip()[:60]!r} returns no result; give one query that "
                "returns rows, e.g. 'SELECT step, count(*) FROM requests GROUP BY step'"
            )
        return relation.to_arrow_reader(batch_rows)
