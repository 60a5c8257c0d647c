"""Where a run's objects live in the store: the one module that builds and parses their keys.

Writers (the workers' sinks and spools, the master) and the reader (analysis.read.load) both use
it; docs/events.md ("Object layout") describes the same keys:

    <prefix>/<run_id>/manifest.json                                 MANIFEST_NAME
    <prefix>/<run_id>/<table>/worker=<worker_id>/part-<seq>.parquet part_key(table, worker, seq)
    <prefix>/<run_id>/index/worker=<worker_id>.json                 index_key(worker)
    <prefix>/<run_id>/server_metrics/part-<seq>.jsonl               server_metrics_key(seq)
    <prefix>/<run_id>/accelerator_metrics/part-<seq>.jsonl          accelerator_metrics_key(seq)
    <prefix>/<run_id>/spans/part-<source>-<seq>.parquet             spans_key(source, seq)

Keys here are relative to the run (`<prefix>/<run_id>/`); `run_key` puts one under a run for
writers whose store is the events URI itself. Also here: the worker index's format
(`WorkerIndex`), written by the sink and read by analysis.

Standard library only: analysis.kernel.schema builds on it (its tables are named here).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Final

TABLE_NAMES: Final = ("requests", "chunks", "samples", "stalls")
"""The event tables, each a folder of Parquet parts per worker (schemas: analysis.kernel.schema)."""

MANIFEST_NAME: Final = "manifest.json"
INDEX_FOLDER: Final = "index"
SERVER_METRICS_FOLDER: Final = "server_metrics"
ACCELERATOR_METRICS_FOLDER: Final = "accelerator_metrics"
SPANS_FOLDER: Final = "spans"

_WORKER = "worker="
_PART_RE = re.compile(rf"^([^/]+)/{_WORKER}([^/]+)/part-(\d+)\.parquet$")
_SERVER_METRICS_RE = re.compile(rf"^{SERVER_METRICS_FOLDER}/part-\d+\.jsonl$")
_ACCELERATOR_METRICS_RE = re.compile(rf"^{ACCELERATOR_METRICS_FOLDER}/part-\d+\.jsonl$")
_SPANS_RE = re.compile(rf"^{SPANS_FOLDER}/part-([a-z]+)-(\d+)\.parquet$")


def run_key(run_id: str, key: str) -> str:
    """The key (relative to the events URI) of a run-relative key."""
    return f"{run_id}/{key}"


def worker_name(worker_id: str) -> str:
    """`worker=<id>`: how a worker's folders and files are named."""
    return f"{_WORKER}{worker_id}"


def worker_of(name: str) -> str | None:
    """The worker a folder (`worker=<id>`) or index file (`worker=<id>.json`) is named for."""
    name = name.removesuffix(".json")
    return name.removeprefix(_WORKER) if name.startswith(_WORKER) else None


def worker_folder(table: str, worker_id: str) -> str:
    """The folder of one worker's parts of one table (`requests/worker=<id>`)."""
    if table not in TABLE_NAMES:
        raise ValueError(f"unknown table {table!r}; expected one of {sorted(TABLE_NAMES)}")
    return f"{table}/{worker_name(worker_id)}"


def part_key(table: str, worker_id: str, seq: int) -> str:
    """Key of one Parquet part, relative to `<prefix>/<run_id>/`."""
    return f"{worker_folder(table, worker_id)}/part-{seq:06d}.parquet"


@dataclass(frozen=True)
class PartKey:
    """A parsed part key: its table, worker and sequence number."""

    table: str
    worker_id: str
    seq: int


def parse_part_key(key: str) -> PartKey | None:
    """The table, worker and sequence of a part key; None for any other key."""
    match = _PART_RE.match(key)
    if match is None or match.group(1) not in TABLE_NAMES:
        return None
    return PartKey(match.group(1), match.group(2), int(match.group(3)))


def table_of(key: str) -> str:
    """The table a part key belongs to (its first folder)."""
    return key.split("/", 1)[0]


def index_key(worker_id: str) -> str:
    """Key of a worker's index, relative to `<prefix>/<run_id>/`."""
    return f"{INDEX_FOLDER}/{worker_name(worker_id)}.json"


def parse_index_key(key: str) -> str | None:
    """The worker whose index `key` is; None for any other key."""
    folder, _, name = key.partition("/")
    if folder != INDEX_FOLDER or not name.endswith(".json") or "/" in name:
        return None
    return worker_of(name) or None


def server_metrics_key(seq: int) -> str:
    """Key of one part of the target's scraped metrics (JSON lines), relative to the run."""
    return f"{SERVER_METRICS_FOLDER}/part-{seq:06d}.jsonl"


def is_server_metrics_key(key: str) -> bool:
    return _SERVER_METRICS_RE.match(key) is not None


def accelerator_metrics_key(seq: int) -> str:
    """Key of one part of the accelerators' scraped telemetry (JSON lines), relative to the run."""
    return f"{ACCELERATOR_METRICS_FOLDER}/part-{seq:06d}.jsonl"


def is_accelerator_metrics_key(key: str) -> bool:
    return _ACCELERATOR_METRICS_RE.match(key) is not None


def spans_key(source: str, seq: int) -> str:
    """Key of one part of the engine's spans (Parquet, analysis.kernel.schema.SPANS_SCHEMA),
    relative to the run; `source`: "otlp" (the master's receiver) or "import"."""
    if not re.fullmatch(r"[a-z]+", source):
        raise ValueError(f"a spans source is lowercase letters, not {source!r}")
    return f"{SPANS_FOLDER}/part-{source}-{seq:06d}.parquet"


def parse_spans_key(key: str) -> tuple[str, int] | None:
    """The source and sequence of a spans part key (relative to the run); None otherwise."""
    match = _SPANS_RE.match(key)
    return (match.group(1), int(match.group(2))) if match else None


def is_spans_key(key: str) -> bool:
    return parse_spans_key(key) is not None


@dataclass
class WorkerIndex:
    """`index/worker=<id>.json`: the parts a worker sealed and their row counts.

    `final` once the worker's sink has sealed its last part: then every part it wrote is
    named here, and analysis can tell a missing part from one never written.
    """

    run_id: str
    worker_id: str
    parts: dict[str, int] = field(default_factory=dict)  # key relative to the run → rows
    final: bool = False

    def rows(self) -> dict[str, int]:
        totals = dict.fromkeys(TABLE_NAMES, 0)
        for key, rows in self.parts.items():
            table = table_of(key)
            if table in totals:
                totals[table] += rows
        return totals

    def to_json(self, schema_version: str) -> bytes:
        """The index document, stamped with the writer's event schema version."""
        doc = {
            "schema_version": schema_version,
            "run_id": self.run_id,
            "worker_id": self.worker_id,
            "final": self.final,
            "parts": dict(sorted(self.parts.items())),
            "rows": self.rows(),
        }
        return json.dumps(doc, indent=1).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> WorkerIndex:
        """Parse an index document; ValueError when `data` is not one."""
        doc = json.loads(data)  # a ValueError (UnicodeDecodeError included) when not JSON
        if not isinstance(doc, dict):
            raise ValueError(f"a worker index is a JSON object, not {type(doc).__name__}")
        try:
            return cls(
                run_id=str(doc["run_id"]),
                worker_id=str(doc["worker_id"]),
                parts={str(k): int(v) for k, v in (doc.get("parts") or {}).items()},
                final=bool(doc.get("final", False)),
            )
        except (KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"not a worker index: {type(exc).__name__}: {exc}") from exc

    def merge(self, other: WorkerIndex) -> dict[str, tuple[int, int]]:
        """Add the parts `other` names; on a row-count disagreement this index's count wins.

        Returns the disagreements: key → (this index's rows, the other's).
        """
        disagree = {}
        for key, rows in other.parts.items():
            mine = self.parts.setdefault(key, rows)
            if mine != rows:
                disagree[key] = (mine, rows)
        self.final = self.final or other.final
        return disagree
