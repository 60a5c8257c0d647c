"""Trace replay: a recorded trace's arrivals and lengths, sent as recorded.

    replay = load_trace(Path("t.jsonl"), TraceSettings(speedup=10.0))
    for index, offset_s in replay.share(position=0, count=2):   # this worker's arrivals
        row = replay.rows[index]   # its input_length, output_length and hash_ids

Formats (`--trace-format`, detected from the file when not given):
- `mooncake`: JSON lines with `timestamp` (ms), `input_length`, `output_length` and
  `hash_ids` (the ids of the prompt's blocks of `--trace-block-tokens` tokens, in order);
- `azure`: the Azure LLM inference trace CSV, `TIMESTAMP` (a date-time, or seconds),
  `ContextTokens`, `GeneratedTokens`;
- `burstgpt`: BurstGPT's CSV, `Timestamp` (s), `Model`, `Request tokens`, `Response tokens`,
  `Total tokens`, `Log Type`; rows with 0 response tokens (failed requests) are skipped.

The arrival schedule is the trace's own: arrival i (the i-th row by time inside the window
`--trace-start`/`--trace-duration`, seconds from the trace's first request) is due
`(t_i - window start) / --trace-speedup` seconds after the step's start. Every worker reads
the same file, so every worker has the same schedule and sends the arrivals i with
`i % count == position` (as arrivals.Schedule shares a rate step's).
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from analysis.kernel.errors import UsageError
from analysis.kernel.schema import REQUESTS_SCHEMA, int_max
from analysis.kernel.storage import expand_home

log = logging.getLogger("llmload.trace")

FORMATS = ("mooncake", "azure", "burstgpt")
BLOCK_TOKENS = 512  # Mooncake's block size


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: when (seconds from the trace's first request) and its lengths."""

    at_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class TraceSettings:
    """The options that cut and pace a trace (`--trace-*`); format "" means detect it."""

    format: str = ""
    speedup: float = 1.0
    start_s: float = 0.0
    duration_s: float = 0.0  # 0: to the end
    block_tokens: int = BLOCK_TOKENS


@dataclass(frozen=True)
class TraceReplay:
    """The window of a trace to send: its rows, each arrival's offset from the step's start."""

    name: str
    format: str
    rows: tuple[TraceRow, ...]
    offsets_s: tuple[float, ...]
    block_tokens: int
    span_s: float  # the window's length after the speedup

    @property
    def rate(self) -> float:
        """The window's mean arrival rate after the speedup (requests/s), for the record."""
        return len(self.rows) / self.span_s if self.span_s > 0 else float(len(self.rows))

    def arrivals(self) -> Iterator[tuple[int, float]]:
        """Every arrival, in order: (index, seconds after the step's start)."""
        yield from enumerate(self.offsets_s)

    def share(self, position: int, count: int) -> Iterator[tuple[int, float]]:
        """The arrivals of the worker at share `position` of `count`: i % count == position."""
        if not 0 <= position < count:
            raise ValueError(f"share position {position} is not in 0..{count - 1}")
        for index in range(position, len(self.offsets_s), count):
            yield index, self.offsets_s[index]


def detect_format(path: Path) -> str:
    """The format of a trace file from its first line, or UsageError asking for it."""
    first = ""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                first = line.strip()
                break
    header = {c.strip().lower() for c in first.split(",")}
    if first.startswith("{"):
        return "mooncake"
    if {"contexttokens", "generatedtokens"} <= header:
        return "azure"
    if {"request tokens", "response tokens"} <= header:
        return "burstgpt"
    raise UsageError(
        f"trace {path}: the format is not recognised from its first line; give "
        "--trace-format mooncake|azure|burstgpt"
    )


# the request column each trace length lands in: a value above what it holds is refused here,
# as a dataset's is, not dropped with the row (and the server's 400 for it) by the sink
_COLUMN = {"input_length": "prompt_tokens_requested", "output_length": "max_tokens"}

SPAN_MAX_S: Final = 7 * 24 * 3600.0
"""The longest window a replay runs after --trace-speedup: a week. A gap of 1e15 ms made one
step of 30 million years at 2e-12 requests/s, stopped only by a kill."""


def _int(path: Path, lineno: int, key: str, value: Any, minimum: int) -> int:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value.strip()) if value.strip() else None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(
            f"{path}:{lineno}: {key} must be an integer >= {minimum}, not {value!r}; "
            "fix or remove the line"
        )
    column = _COLUMN.get(key)
    if column is not None and value > (most := int_max(REQUESTS_SCHEMA, column)):
        raise UsageError(
            f"{path}:{lineno}: {key} {value} is above {most}, the most a request row records "
            f"({column}); fix or remove the line"
        )
    return value


def _mooncake(path: Path, lineno: int, line: str) -> TraceRow:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path}:{lineno}: not valid JSON ({exc.msg}); give one JSON object per line"
        ) from None
    if not isinstance(row, dict):
        raise UsageError(f"{path}:{lineno}: each line must be a JSON object")
    for key in ("timestamp", "input_length", "output_length"):
        if key not in row:
            raise UsageError(
                f'{path}:{lineno}: no "{key}"; a Mooncake line needs "timestamp" (ms), '
                '"input_length", "output_length" and optionally "hash_ids"'
            )
    ts = row["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise UsageError(f"{path}:{lineno}: timestamp must be a number (ms), not {ts!r}")
    ids = row.get("hash_ids") or []
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise UsageError(f"{path}:{lineno}: hash_ids must be a list of integers, not {ids!r}")
    return TraceRow(
        ts / 1000.0,
        _int(path, lineno, "input_length", row["input_length"], 1),
        _int(path, lineno, "output_length", row["output_length"], 1),
        tuple(ids),
    )


def _timestamp(path: Path, lineno: int, text: str) -> float:
    """Seconds: a number, or an ISO-like date-time (the Azure trace's 7-digit fractions)."""
    text = (text or "").strip()
    try:
        return float(text)
    except ValueError:
        pass
    main, _, frac = text.partition(".")
    try:
        when = datetime.fromisoformat(main).replace(tzinfo=UTC)
        return when.timestamp() + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise UsageError(
            f"{path}:{lineno}: timestamp {text!r} is neither seconds nor a date-time like "
            "2023-11-16 18:15:46.68; fix or remove the line"
        ) from None


_CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}


def _csv_rows(path: Path, fmt: str) -> Iterator[TraceRow]:
    when, given, generated = _CSV_COLUMNS[fmt]
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in (when, given, generated) if c not in (reader.fieldnames or [])]
        if missing:
            raise UsageError(
                f"trace {path}: no column {missing[0]!r}; a trace in the {fmt} format needs the columns "
                f"{', '.join(_CSV_COLUMNS[fmt])} (or give the right --trace-format)"
            )
        skipped = 0
        for row in reader:
            lineno = reader.line_num
            out = _int(path, lineno, generated, row[generated], 0)
            if out == 0 and fmt == "burstgpt":
                skipped += 1  # a failed request in BurstGPT's log: nothing was generated
                continue
            yield TraceRow(
                _timestamp(path, lineno, row[when]),
                _int(path, lineno, given, row[given], 1),
                _int(path, lineno, generated, out, 1),
            )
        if skipped:
            log.info("llmload: trace %s: %d rows with 0 response tokens skipped", path, skipped)


def read_trace(path: Path, fmt: str) -> list[TraceRow]:
    """Every row of a trace, by time, with times from its first request; UsageError on a
    bad line (naming the file and line)."""
    try:
        if fmt == "mooncake":
            with path.open(encoding="utf-8") as fh:
                rows = [_mooncake(path, n, ln) for n, ln in enumerate(fh, 1) if ln.strip()]
        else:
            rows = list(_csv_rows(path, fmt))
    except UnicodeDecodeError:
        raise UsageError(f"trace {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"cannot read trace {path}: {exc.strerror}") from None
    if not rows:
        raise UsageError(f"trace {path} has no requests; give a {fmt} trace with rows")
    rows.sort(key=lambda r: r.at_s)
    first = rows[0].at_s
    return [TraceRow(r.at_s - first, r.input_length, r.output_length, r.hash_ids) for r in rows]


def trace_path(spec: str) -> Path:
    """The file of a `trace:PATH` workload, checked to be a file."""
    text = spec.split(":", 1)[1].strip()
    if not text:
        raise UsageError("workload trace: no path given; use trace:PATH")
    path = Path(expand_home(text, "workload trace"))
    if not path.is_file():
        raise UsageError(f"workload trace {path} is not a file; give trace:PATH")
    return path


def load_trace(path: Path, settings: TraceSettings) -> TraceReplay:
    """The window of the trace at `path` that the run replays; UsageError if it is empty."""
    fmt = settings.format or detect_format(path)
    rows = read_trace(path, fmt)
    start = settings.start_s
    end = start + settings.duration_s if settings.duration_s > 0 else math.inf
    window = [r for r in rows if start <= r.at_s < end]
    if not window:
        raise UsageError(
            f"trace {path}: no request in the window from {start:g} s "
            f"({'to the end' if end == math.inf else f'for {settings.duration_s:g} s'}); "
            f"the trace spans 0 to {rows[-1].at_s:g} s: give a --trace-start inside it"
        )
    speedup = settings.speedup
    offsets = tuple((r.at_s - start) / speedup for r in window)
    span = (settings.duration_s if end != math.inf else window[-1].at_s - start) / speedup
    if span > SPAN_MAX_S:
        raise UsageError(
            f"trace {path}: the window replays over {span:.3g} s after --trace-speedup "
            f"{speedup:g}, more than a week ({SPAN_MAX_S:,.0f} s); give --trace-duration "
            "(seconds of the trace), or a larger --trace-speedup"
        )
    return TraceReplay(f"trace:{path.name}", fmt, tuple(window), offsets,
                       settings.block_tokens, span)  # fmt: skip
