"""`llmload spans import RUN_URI FILE`: add an engine's spans, collected apart, to a run.

FILE is what an OpenTelemetry Collector's file exporter writes (one OTLP JSON
ExportTraceServiceRequest per line), one JSON document, or a `.pb` file holding one
protobuf ExportTraceServiceRequest. Its spans become one part
`<run>/spans/part-import-<seq>.parquet` (the next free seq: nothing is overwritten) and the
engine's start-up spans, if any, the manifest's `cold_start.engine`. Every line is decoded
before anything is written: a bad one is named (its line number) and nothing is written.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from analysis.kernel.errors import UsageError
from analysis.kernel.layout import MANIFEST_NAME, SPANS_FOLDER, parse_spans_key, spans_key
from analysis.kernel.storage import ObjectExistsError, ObjectStore

SOURCE = "import"
SEQ_TRIES = 100  # parts written meanwhile by another import: the next free seq


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "spans",
        help="the engine's spans of a run (OTLP traces)",
        description="The engine's own spans of a run: docs/events.md, 'spans'.",
    )
    commands = parser.add_subparsers(dest="spans_command", metavar="COMMAND")
    importer = commands.add_parser(
        "import",
        help="import an OpenTelemetry Collector file-exporter file into a run",
        description=(
            "Read FILE (OTLP JSON lines as a Collector's file exporter writes them, one JSON "
            "document, or a .pb protobuf export) and store its spans as a part of the run at "
            "RUN_URI (<events-uri>/<run_id>); the engine's start-up spans go to the "
            "manifest's cold_start.engine. A bad line is named and nothing is written."
        ),
    )
    importer.add_argument("run_uri", metavar="RUN_URI", help="the run: <events-uri>/<run_id>")
    importer.add_argument("file", type=Path, metavar="FILE", help="the spans file")
    importer.set_defaults(handler=run_import)
    parser.set_defaults(handler=lambda _args: _help(parser))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 0


def read_exports(path: Path) -> list[Any]:
    """The OTLP exports in a file; UsageError naming the file (and line) when it is not one."""
    from analysis.kernel.spans import SpansFormatError, decode_export

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}; give a spans file") from None
    if path.suffix == ".pb":
        try:
            return [decode_export(data, "protobuf")]
        except SpansFormatError as exc:
            raise UsageError(f"{path} is not a protobuf OTLP trace export: {exc}") from None
    try:
        whole = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        whole = None  # JSON lines (or not JSON: each line says)
    if isinstance(whole, dict):
        try:
            return [decode_export(data, "json")]
        except SpansFormatError as exc:
            raise UsageError(f"{path} is not an OTLP trace export: {exc}") from None
    exports = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            exports.append(decode_export(line, "json"))
        except SpansFormatError as exc:
            raise UsageError(
                f"{path} line {number} is not an OTLP trace export ({exc}); give an "
                "OpenTelemetry Collector file-exporter file (one JSON export per line)"
            ) from None
    if not exports:
        raise UsageError(f"{path} holds no OTLP trace export; give a file-exporter file")
    return exports


def _next_seq(store: ObjectStore) -> int:
    parsed = (parse_spans_key(o.key) for o in store.list(f"{SPANS_FOLDER}/"))
    return max((p[1] for p in parsed if p is not None and p[0] == SOURCE), default=-1) + 1


def _put_part(store: ObjectStore, data: bytes) -> str:
    """Put the part under the next free key; the key."""
    seq = _next_seq(store)
    for _ in range(SEQ_TRIES):
        key = spans_key(SOURCE, seq)
        try:
            store.put(key, data)
            return key
        except ObjectExistsError:
            seq += 1
    raise UsageError(f"no free spans part key under {store.uri}/{SPANS_FOLDER}; try again")


def _request_traces(store: ObjectStore, keys: list[str]) -> set[str]:
    """The trace ids of the run's requests (their ids through trace_id_of)."""
    from analysis.kernel.layout import parse_part_key
    from analysis.kernel.spans import trace_id_of

    traces: set[str] = set()
    for key in keys:
        part = parse_part_key(key)
        if part is None or part.table != "requests":
            continue
        try:
            ids = pq.read_table(io.BytesIO(store.get(key)), columns=["request_id"])
        except Exception:  # a part the report names as unreadable: not joined here
            continue
        traces.update(trace_id_of(str(i)) for i in ids.column(0).to_pylist() if i)
    return traces


def run_import(args: argparse.Namespace) -> int:
    from analysis.kernel.spans import rows_table, span_rows, start_up_record
    from analysis.read.load import open_run, run_id_of

    store, manifest, keys, _ = open_run(args.run_uri)
    run_id = run_id_of(manifest or {}, args.run_uri)
    exports = read_exports(args.file)
    rows = [row for export in exports for row in span_rows(export, run_id, SOURCE)]
    if not rows:
        print(f"spans: {args.file} holds no span; nothing imported into run {run_id}")
        return 0
    try:
        table = rows_table(rows)
    except (ValueError, OverflowError) as exc:  # e.g. a time past int64
        raise UsageError(f"{args.file} holds a span llmload cannot store: {exc}") from None
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    key = _put_part(store, sink.getvalue())
    engine = start_up_record(rows)
    cold = ""
    if engine is not None and manifest is not None:
        manifest.setdefault("cold_start", {})["engine"] = engine
        store.put(MANIFEST_NAME, json.dumps(manifest, indent=1).encode() + b"\n", overwrite=True)
        cold = f"; engine start-up ({', '.join(engine['spans'])}) in the manifest's cold_start"
    traces = _request_traces(store, keys)
    joined = sum(1 for row in rows if row["trace_id"] in traces)
    print(f"spans: {len(rows)} span(s) imported into run {run_id} ({key}), {joined} join a "
          f"request by trace id{cold}")  # fmt: skip
    return 0
