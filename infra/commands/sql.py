"""`llmload sql RUN_URI [RUN_URI...] QUERY`: SQL over runs' events, where they lie."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

VIEWS = "requests, chunks, samples, stalls, request_metrics, itl_samples"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "sql",
        help="query runs' events with SQL (DuckDB, out of core)",
        description=(
            "Open the events of one or more runs (s3://bucket/prefix/<run_id>, a path...) as "
            f"the views {VIEWS} (docs/reports.md, 'Query the events') and run one query "
            "with DuckDB, under --memory-limit (spilling to disk beyond it). Prints the "
            "result as a table, or writes all of it with --out FILE.csv or FILE.parquet."
        ),
    )
    parser.add_argument("args", nargs="+", metavar="RUN_URI... QUERY",
                        help="one or more <events-uri>/<run_id>, then the query")  # fmt: skip
    parser.add_argument("--out", metavar="FILE", default=None,
                        help="write the whole result to FILE.csv or FILE.parquet")  # fmt: skip
    parser.add_argument("--limit", type=int, default=50, metavar="N",
                        help="rows to print (default 50; --out writes them all)")  # fmt: skip
    parser.add_argument("--memory-limit", default=None, metavar="SIZE",
                        help="DuckDB's memory limit, e.g. 2GB (the default); beyond it, spill")  # fmt: skip
    parser.add_argument("--spill-dir", default=None, metavar="DIR",
                        help="where DuckDB spills (default: a temporary folder, removed after)")  # fmt: skip
    parser.set_defaults(handler=run)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def print_table(names: list[str], rows: list[tuple[Any, ...]]) -> None:
    """A plain fixed-width table (numbers to 6 significant digits)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(n), *(len(r[i]) for r in cells)]) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _writer(out: Path, schema: Any) -> Any:
    if out.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetWriter(out, schema)
    import pyarrow.csv as pacsv

    return pacsv.CSVWriter(out, schema)


def _write_all(out: Path, reader: Any, given: str) -> int:
    """Every batch of `reader` into `out`; rows written. A file that cannot be written (a
    folder such as /proc, a full disk) is UsageError, and nothing half-written stays."""
    from analysis.kernel.errors import UsageError

    existed = out.exists()
    rows = 0
    try:
        with _writer(out, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    except OSError as exc:
        if not existed:
            out.unlink(missing_ok=True)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(
            f"--out {given}: cannot write it ({reason}); give a writable file"
        ) from None
    return rows


def run(args: argparse.Namespace) -> int:
    import duckdb

    from analysis.kernel.errors import UsageError
    from analysis.kernel.storage import expand_home
    from analysis.read.engine import DEFAULT_MEMORY_LIMIT, Engine, parse_memory_limit

    if len(args.args) < 2:
        raise UsageError("give one or more RUN_URIs and then a query, e.g. llmload sql runs/r1 "
                         "'SELECT step, count(*) FROM requests GROUP BY step'")  # fmt: skip
    *uris, query = args.args
    memory = parse_memory_limit(args.memory_limit or DEFAULT_MEMORY_LIMIT)
    out = Path(expand_home(args.out, "--out")) if args.out else None
    if out is not None:
        if out.suffix not in (".csv", ".parquet"):
            raise UsageError(f"--out {args.out}: give a file ending in .csv or .parquet")
        if not out.absolute().parent.is_dir():
            raise UsageError(f"--out {args.out}: folder {out.absolute().parent} does not "
                             "exist; give a file in an existing folder")  # fmt: skip
    if args.limit < 0:
        raise UsageError(f"--limit must be >= 0, not {args.limit}")
    with Engine(memory, args.spill_dir) as engine:
        engine.attach(uris)
        try:
            reader = engine.stream(query)
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"the query failed: {first}; the views are {VIEWS} "
                             "(docs/reports.md, 'Query the events')") from None  # fmt: skip
        if out is not None:
            rows = _write_all(out, reader, args.out)
            print(f"{rows} row(s) written to {out}", file=sys.stderr)
            return 0
        shown: list[tuple[Any, ...]] = []
        total = 0
        for batch in reader:
            total += batch.num_rows
            if len(shown) < args.limit:
                columns = [c.to_pylist() for c in batch.columns]
                shown.extend(list(zip(*columns, strict=True))[: args.limit - len(shown)])
        print_table(list(reader.schema.names), shown)
        if total > len(shown):
            print(f"... {total - len(shown)} more row(s): raise --limit, or write them all "
                  "with --out FILE.csv", file=sys.stderr)  # fmt: skip
    return 0
