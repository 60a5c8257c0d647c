"""What the report needs of the chunk table, from memory or out of core: one interface.

    facts = MemoryChunkFacts(metrics, requests, chunks)   # the chunks loaded (numpy)
    facts = EngineChunkFacts(engine, requests, by_folder(run.chunk_paths), run.chunk_filesystem)
    facts.per_request                   # itl_mean_s, icl_mean_s, chunk_count, chunk_tokens
    facts.groups([GroupSpec(latency, window, eligible), ...], sent)

The per-step statistics ask, per group (the cold group, each step): the ITL and ICL
distributions of its successful requests (DistributionSummary and the quantile curve) and
the output tokens of its eligible requests that arrived inside its window. Both paths define
them the same way (analysis/derive/metrics.py, analysis/derive/stats.py): per-token ITL samples weighted
by tokens, nearest-rank percentiles, a chunk's time = its request's aligned send + offset.

The engine path (analysis/read/engine.py) reads each chunk part where it lies, one worker's parts
at a time (a chunk joins only its own worker's requests; a worker with more rows than the
engine's memory holds is taken in slices of whole requests), in four scans: a hash
aggregation per request (counts, tokens, first and last offsets); a window over each
request's chunks in `seq` order that bins the ITL and ICL samples of each group in 5 µs bins
(weight, weighted sum, max), finds the requests that fail a timeline check and, from the
second batch on, keeps the values in the bins near each named percentile of the first batch's
histogram; the same window again, over the first batch (and over the others only for a bin
that holds a wanted rank and that they did not keep), for the values in the bins that hold a
wanted rank (each named percentile: exact nearest rank, only those bins' values sorted); and
the tokens inside each group's window. The curves of the report's CDF plots are read from
the histogram: each point the lower edge of the bin that holds its rank (within 5 µs). Nothing as long as the chunk table is ever held or written: memory is
bounded by DuckDB's limit plus the request rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis.derive.metrics import NS_PER_S, RequestMetrics, chunk_request_index
from analysis.derive.stats import DistributionSummary, SortedSamples
from analysis.derive.windows import Window
from analysis.kernel.errors import EventDataError, InvalidTimelineError
from analysis.kernel.layout import parse_part_key
from analysis.kernel.percentiles import PERCENTILES

CURVE_QUANTILES: Final = np.linspace(0.0, 1.0, 201)
"""Quantiles of each latency curve (report.html's CDFs)."""

CHUNK_COLUMNS: Final = ("itl_mean_s", "icl_mean_s", "chunk_count", "chunk_tokens",
                         "token_events", "multi_token_events", "max_event_tokens")  # fmt: skip
"""The per-request metrics that come from the chunks (analysis/derive/metrics.py)."""

_RANK_TOLERANCE: Final = 1e-9  # as analysis/derive/stats.py
_BIN_S: Final = 5e-6
"""The histogram bins that locate a percentile's rank (5 µs). Any width gives the same exact
figures (the second pass sorts a wanted bin's values); narrower bins make the first pass's
hash aggregation larger (1 µs: a million rows a worker at 10M requests, 6 s more a report),
wider ones the second pass's values (100 µs: 2x its time)."""
_BAND: Final = 0.001
_BAND_SIGMAS: Final = 6.0
"""The candidate bins (EngineChunkFacts._candidates) of a named percentile q: those whose share
of the first batch's weight n lies within max(_BAND, _BAND_SIGMAS * sqrt(q (1 - q) / n)) of q
(six standard errors of a quantile estimated from n samples; the batches are not a random
split of the run, so the band is wide)."""
_MOST_CANDIDATES: Final = 2_000_000
WINDOW_ROW_BYTES: Final = 128
"""Engine memory per chunk row one window over requests' chunks may take: a worker's parts
with more rows than the engine's memory over this are taken in slices."""
# the timeline checks of analysis/derive/metrics.py, in the order it makes them
_CHECKS: Final = (
    "a chunk offset_ns is negative",
    "a chunk has a negative token count",
    "two chunks share one seq number",
    "tokens out of order (chunk offsets decrease)",
    "a chunk arrives after the end of the response",
)


@dataclass(frozen=True)
class GroupSpec:
    """One summary row's question: `latency` (its successful requests: ITL/ICL), `window`
    and `eligible` (the requests whose tokens inside the window count)."""

    latency: np.ndarray
    window: Window | None
    eligible: np.ndarray


@dataclass(frozen=True)
class Latency:
    summary: DistributionSummary
    curve: np.ndarray  # at CURVE_QUANTILES


@dataclass(frozen=True)
class GroupChunks:
    itl: Latency
    icl: Latency
    tokens_in_window: float  # NaN without a window


class ChunkFacts(Protocol):
    @property
    def per_request(self) -> pd.DataFrame: ...  # CHUNK_COLUMNS, one row per request row

    @property
    def orphan_chunks(self) -> int: ...  # chunk rows whose request row is absent

    def groups(self, specs: list[GroupSpec], sent: np.ndarray) -> list[GroupChunks]: ...


def _latency(ordered: SortedSamples) -> Latency:
    return Latency(DistributionSummary.of_sorted(ordered), ordered.quantiles(CURVE_QUANTILES))


class MemoryChunkFacts:
    """The chunks in memory: analysis/derive/metrics.py's samples, numpy."""

    def __init__(
        self, metrics: RequestMetrics, requests: pd.DataFrame, chunks: pd.DataFrame
    ) -> None:
        if metrics.itl is None or metrics.icl is None:
            raise ValueError("MemoryChunkFacts needs the samples of compute_request_metrics")
        self.itl, self.icl = metrics.itl, metrics.icl
        self.per_request = metrics.per_request[list(CHUNK_COLUMNS)]
        self.orphan_chunks = metrics.orphan_chunks
        chunk_request = chunk_request_index(requests["request_id"], chunks["request_id"])
        known = chunk_request >= 0
        self.chunk_request = chunk_request[known]
        self.offsets = chunks["offset_ns"].to_numpy(np.int64)[known]
        self.tokens = chunks["tokens"].to_numpy(np.int64)[known]

    def groups(self, specs: list[GroupSpec], sent: np.ndarray) -> list[GroupChunks]:
        chunk_at = sent[self.chunk_request] + self.offsets
        out = []
        for spec in specs:
            itl = self.itl.select(spec.latency)
            icl = self.icl.select(spec.latency)
            tokens = float("nan")
            if spec.window is not None:
                inside = spec.window.contains(chunk_at) & spec.eligible[self.chunk_request]
                tokens = float(self.tokens[inside].sum())
            out.append(GroupChunks(_latency(SortedSamples.of(itl.value_s, itl.weight)),
                                   _latency(SortedSamples.of(icl.value_s, icl.weight)),
                                   tokens))  # fmt: skip
        return out


# -- out of core -----------------------------------------------------------------------------

_AGGREGATE_SQL: Final = """
SELECT request_id, count(*) AS n, sum(tokens) AS tokens,
       min(offset_ns) AS first_ns, max(offset_ns) AS last_ns,
       min(offset_ns) FILTER (WHERE tokens > 0) AS first_token_ns,
       max(offset_ns) FILTER (WHERE tokens > 0) AS last_token_ns,
       sum(tokens) FILTER (WHERE tokens > 0) AS token_chunk_tokens,
       count(*) FILTER (WHERE tokens > 0) AS token_events,
       count(*) FILTER (WHERE tokens > 1) AS multi_token_events,
       max(tokens) AS max_event_tokens
FROM llmload_chunks GROUP BY request_id
"""
"""Per request id: its chunks' count, tokens, first and last offsets (matched to the request
rows afterwards: an id with no row is orphan chunks)."""

_WINDOW_SQL: Final = """
    SELECT r.g, c.offset_ns, c.tokens,
           lag(c.offset_ns) OVER p AS prev_off,
           max(CASE WHEN c.tokens > 0 THEN c.offset_ns END)
               OVER (p ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_tok{more}
    FROM llmload_chunks c JOIN {requests} r ON c.request_id = r.rid
    WINDOW p AS (PARTITION BY r.r ORDER BY c.seq)
"""
_SAMPLES_SQL: Final = """
SELECT g, 0 AS k, (offset_ns / 1e9 - prev_off / 1e9)::DOUBLE AS v, 1::BIGINT AS w,
       offset_ns - prev_off AS ns
FROM w WHERE g >= 0 AND prev_off IS NOT NULL
UNION ALL
SELECT g, 1 AS k,
       (CASE WHEN prev_tok IS NULL THEN 0.0
             ELSE (offset_ns / 1e9 - prev_tok / 1e9) / tokens END)::DOUBLE AS v,
       (CASE WHEN prev_tok IS NULL THEN tokens - 1 ELSE tokens END)::BIGINT AS w,
       coalesce(offset_ns - prev_tok, 0) AS ns
FROM w WHERE g >= 0 AND tokens > 0 AND (prev_tok IS NOT NULL OR tokens > 1)
"""
_SAMPLES_CTE: Final = (
    "WITH w AS MATERIALIZED ("
    + _WINDOW_SQL.format(
        requests="llmload_req",
        more=""",
           r.r, r.e, r.sent + c.offset_ns AS at_ns,
           (c.offset_ns < 0)::INTEGER + 2 * (c.tokens < 0)::INTEGER
           + 4 * coalesce(c.seq = lag(c.seq) OVER p, false)::INTEGER
           + 8 * coalesce(c.offset_ns / 1e9 < lag(c.offset_ns) OVER p / 1e9, false)::INTEGER
           + 16 * coalesce(c.offset_ns / 1e9 > r.end_s, false)::INTEGER AS bad""",
    )
    + "), x AS ("
    + _SAMPLES_SQL
    + ")\n"
)
"""Every chunk's samples, from a window over its request's chunks in seq order: kinds 0 (ICL)
and 1 (ITL), the samples of each group's successful requests and their weights. The token
chunk before a chunk is the latest one before it (`max`: offsets never decrease within a
request, or the check of kind 5 refuses the run). `ns`: what a sample times its weight is, in
integer ns (a chunk's gap; 0 for a first chunk's extra tokens), so that a group's mean is an
exact sum whatever order the engine adds in. `bad` has a bit per check the chunk fails
(_CHECKS, in order): the window's rows are materialized with what their readers use and no
more, as their width is most of a pass's cost after the window's sort."""

_HIST_SQL: Final = (
    "INSERT INTO llmload_hist " + _SAMPLES_CTE
    + "SELECT x.g, x.k, floor(x.v / %(bin)s)::BIGINT AS b, sum(x.w), sum(x.ns), max(x.v), "
    "CASE WHEN n.b IS NOT NULL THEN x.v END FROM x LEFT JOIN llmload_cand n "
    "ON x.g = n.g AND x.k = n.k AND floor(x.v / %(bin)s)::BIGINT = n.b GROUP BY ALL "
    "UNION ALL "  # the tokens that arrived inside each window (kind 7, b: the window's index)
    "SELECT -1, 7, n.i, sum(w.tokens), 0, 0.0, NULL FROM w JOIN llmload_windows n "
    "ON w.e = n.code AND w.at_ns BETWEEN n.start_ns AND n.end_ns GROUP BY n.i "
    "UNION ALL "  # the rows of requests whose chunks fail a check (kinds 2..6, b: the row)
    "SELECT g, s.k, s.b, 1, 0, 0.0, NULL FROM (SELECT g, unnest(list_filter(["
    "{k: 2, b: r, f: bad & 1 > 0}, {k: 3, b: r, f: bad & 2 > 0}, {k: 4, b: r, f: bad & 4 > 0}, "
    "{k: 5, b: r, f: bad & 8 > 0}, {k: 6, b: r, f: bad & 16 > 0}], lambda x: x.f)) AS s "
    "FROM w WHERE bad <> 0)"
)  # fmt: skip
"""First pass, one batch, one scan: each group's samples (kinds 0, 1) by 5 µs bin: their
weight, weighted sum in integer ns and max; in the candidate bins (`llmload_cand`) by value
too (`val`); the tokens inside each window (kind 7, `llmload_windows`); and the requests that
fail a check (kinds 2..6). The candidate bins are none for the first batch, then those near
each named percentile of the first batch's histogram. The samples have one reader, the
histogram's aggregation (each group's totals are its bins' sums): with more, the engine keeps
them materialized, and spills. A bin may have a row per batch and per value: every reader
sums."""

_VALUES_SQL: Final = (
    "INSERT INTO llmload_values WITH w AS MATERIALIZED ("
    + _WINDOW_SQL.format(requests="(SELECT rid, r, g FROM llmload_req WHERE g >= 0)", more="")
    + "), x AS (" + _SAMPLES_SQL + ")\n"
    + "SELECT x.g, x.k, floor(x.v / %(bin)s)::BIGINT AS b, x.v, sum(x.w) FROM x "
    "SEMI JOIN %(bins)s n ON x.g = n.g AND x.k = n.k AND floor(x.v / %(bin)s)::BIGINT = n.b "
    "GROUP BY ALL"
)  # fmt: skip
"""Second pass, one batch: the values (and weights) in the bins of the table `bins` names (those
that hold a wanted rank: every one for the first batch, for the others those their first pass
did not keep); the window over the chunks of the groups' requests only, with the columns the
samples take."""


_CREATE_TABLES: Final = (
    "CREATE OR REPLACE TEMP TABLE llmload_hist "
    "(g INTEGER, k INTEGER, b BIGINT, w HUGEINT, vw HUGEINT, vmax DOUBLE, val DOUBLE)",
    "CREATE OR REPLACE TEMP TABLE llmload_values (g INTEGER, k INTEGER, b BIGINT, v DOUBLE, "
    "w HUGEINT)",
    "CREATE OR REPLACE TEMP TABLE llmload_cand (g INTEGER, k INTEGER, b BIGINT)",
)


def by_folder(paths: list[str]) -> list[list[str]]:
    """Part paths in batches, one per folder: a worker's parts of a table (`<table>/worker=<id>/`),
    whose chunks join only that worker's requests."""
    batches: dict[str, list[str]] = {}
    for path in paths:
        batches.setdefault(path.rsplit("/", 1)[0], []).append(path)
    return [sorted(batch) for _, batch in sorted(batches.items())]


class EngineChunkFacts:
    """The chunks left in their parts, read by the engine (analysis/read/engine.py), one batch of
    parts (a worker's) at a time: each scan holds one worker's chunks at most."""

    def __init__(
        self, engine: Any, requests: pd.DataFrame, batches: list[list[str]], filesystem: Any
    ) -> None:
        self.engine = engine
        self.requests = requests
        self.batches = batches
        self.filesystem = filesystem
        ids = requests["request_id"].astype(str).to_numpy()
        index = pd.Index(ids)
        if not index.is_unique:  # as analysis/derive/metrics.py
            dup = index[index.duplicated()].unique()
            raise EventDataError(
                f"request id {dup[0]} appears in more than one request row "
                f"({len(dup)} duplicated ids); each request must be recorded once"
            )
        self.ids = ids
        self.end_s = pd.to_numeric(requests["end_ns"], errors="coerce").to_numpy(np.float64)
        self.end_s = self.end_s / NS_PER_S
        self._per_request: pd.DataFrame | None = None
        self._orphans = 0

    @property
    def per_request(self) -> pd.DataFrame:
        if self._per_request is None:
            self._aggregate()
        assert self._per_request is not None
        return self._per_request

    @property
    def orphan_chunks(self) -> int:
        self.per_request  # noqa: B018 (counted by the aggregation)
        return self._orphans

    def _each_batch(self, sliced: bool = False) -> Any:
        """Yields once per batch, with the view `llmload_chunks` over that batch's parts.
        `sliced`: a batch of more rows than the engine's memory holds (WINDOW_ROW_BYTES a row)
        is taken in slices of whole requests
        (by a hash of the request id), each a scan of the batch's parts: a window over
        chunks holds one slice at a time."""
        for paths in self.batches or [[]]:
            self.engine.register_parts("chunks", [(paths, self.filesystem)] if paths else [],
                                       view="llmload_batch")  # fmt: skip
            self._on_batch(paths)
            rows = self.engine.sql("SELECT count(*) AS n FROM llmload_batch").to_pylist()[0]["n"]
            most = max(1_000, self.engine.memory_bytes // WINDOW_ROW_BYTES)
            slices = max(1, -(-int(rows) // most)) if sliced else 1
            by_parts = self._part_slices(paths, most) if slices > 1 else None
            for group in by_parts or []:  # each slice reads its own parts, none twice
                self.engine.register_parts("chunks", [(group, self.filesystem)],
                                           view="llmload_chunks")  # fmt: skip
                yield
            for i in range(slices if by_parts is None else 0):
                where = f" WHERE hash(request_id) % {slices} = {i}" if slices > 1 else ""
                self.engine.con.execute(
                    f"CREATE OR REPLACE VIEW llmload_chunks AS SELECT * FROM llmload_batch{where}"
                )
                yield

    def _on_batch(self, paths: list[str]) -> None:
        """Before each batch of parts is read (TableChunkFacts narrows its request rows)."""

    def _part_slices(self, paths: list[str], most: int) -> list[list[str]] | None:
        """A batch's parts in slices of at most `most` rows, where each request's chunks are
        known to lie in one part (TableChunkFacts); None: slices by a hash of the request id,
        each a scan of every part of the batch."""
        return None

    def _register(self, group: np.ndarray, sent: np.ndarray, elig: np.ndarray) -> None:
        table = pa.table({
            "rid": pa.array(self.ids, pa.string()),
            "r": pa.array(np.arange(len(self.ids), dtype=np.int64)),
            "g": pa.array(group.astype(np.int32)),
            "e": pa.array(elig.astype(np.int32)),
            "sent": pa.array(sent.astype(np.int64)),
            "end_s": pa.array(self.end_s, mask=np.isnan(self.end_s)),
        })  # fmt: skip
        self.engine.con.register("llmload_req", table)

    def _aggregate(self) -> None:
        n = len(self.ids)
        frames = [self.engine.sql(_AGGREGATE_SQL).to_pandas() for _ in self._each_batch()]
        frame = pd.concat(frames, ignore_index=True)
        if frame["request_id"].duplicated().any():  # one id in two batches: merge its rows
            frame = frame.groupby("request_id", as_index=False).agg(
                {"n": "sum", "tokens": "sum", "first_ns": "min", "last_ns": "max",
                 "first_token_ns": "min", "last_token_ns": "max", "token_chunk_tokens": "sum",
                 "token_events": "sum", "multi_token_events": "sum", "max_event_tokens": "max"}
            )  # fmt: skip
        rows = pd.Index(self.ids).get_indexer(frame["request_id"].astype(str))
        orphans = rows < 0
        self._orphans = int(frame.loc[orphans, "n"].sum())
        frame, rows = frame[~orphans], rows[~orphans]

        def column(name: str, fill: float) -> np.ndarray:
            out = np.full(n, fill, dtype=np.float64)
            out[rows] = pd.to_numeric(frame[name], errors="coerce").to_numpy(np.float64)
            return out

        count = column("n", 0)
        first, last = column("first_ns", np.nan) / NS_PER_S, column("last_ns", np.nan) / NS_PER_S
        tfirst = column("first_token_ns", np.nan) / NS_PER_S
        tlast = column("last_token_ns", np.nan) / NS_PER_S
        ttok = column("token_chunk_tokens", 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            itl = np.where(ttok > 1, (tlast - tfirst) / (ttok - 1), np.nan)
            icl = np.where(count > 1, (last - first) / (count - 1), np.nan)
        self._per_request = pd.DataFrame(
            {"itl_mean_s": itl, "icl_mean_s": icl, "chunk_count": count.astype(np.int64),
             "chunk_tokens": column("tokens", 0),
             "token_events": column("token_events", 0).astype(np.int64),
             "multi_token_events": column("multi_token_events", 0).astype(np.int64),
             "max_event_tokens": column("max_event_tokens", np.nan)},
            index=self.requests.index,
        )  # fmt: skip

    def groups(self, specs: list[GroupSpec], sent: np.ndarray) -> list[GroupChunks]:
        n = len(self.ids)
        group = np.full(n, -1, dtype=np.int64)
        for i, spec in enumerate(specs):
            if (group[spec.latency] >= 0).any():
                raise ValueError("a request in two summary groups")  # the steps never overlap
            group[spec.latency] = i
        masks: list[np.ndarray] = []  # distinct eligibility masks, coded by position
        elig = np.full(n, -1, dtype=np.int64)
        windows: list[tuple[int, Window]] = []
        window_of: list[int | None] = []
        for spec in specs:
            if spec.window is None:
                window_of.append(None)
                continue
            code = next((c for c, m in enumerate(masks) if np.array_equal(m, spec.eligible)),
                        None)  # fmt: skip
            if code is None:
                if (elig[spec.eligible] >= 0).any():
                    raise ValueError("overlapping eligibility masks")
                code = len(masks)
                masks.append(spec.eligible)
                elig[spec.eligible] = code
            window_of.append(len(windows))
            windows.append((code, spec.window))
        self._register(group, sent, elig)
        return self._group_facts(len(specs), windows, window_of)

    def _group_facts(
        self, groups: int, windows: list[tuple[int, Window]], window_of: list[int | None]
    ) -> list[GroupChunks]:
        """Each group's chunk facts, `llmload_req` registered (rid, r, g, e, sent, end_s):
        `windows` the distinct (eligibility code, window) pairs, `window_of` each group's."""
        for statement in _CREATE_TABLES:
            self.engine.con.execute(statement)
        self.engine.con.register("llmload_windows", pa.table({
            "i": pa.array(range(len(windows)), pa.int64()),
            "code": pa.array([code for code, _ in windows], pa.int32()),
            "start_ns": pa.array([w.start_ns for _, w in windows], pa.int64()),
            "end_ns": pa.array([w.end_ns for _, w in windows], pa.int64()),
        }))  # fmt: skip
        self._histogram_and_checks()
        summaries = self._summaries(groups)
        sums = np.zeros(len(windows))
        for row in self.engine.sql(
            "SELECT b, sum(w)::DOUBLE AS w FROM llmload_hist WHERE k = 7 GROUP BY b"
        ).to_pylist():
            sums[int(row["b"])] = float(row["w"] or 0)
        out = []
        for i, w in enumerate(window_of):
            tokens = float("nan") if w is None else float(sums[w])
            out.append(GroupChunks(summaries[(i, 1)], summaries[(i, 0)], tokens))
        for table in (
            "llmload_hist",
            "llmload_values",
            "llmload_cand",
            "llmload_bins",
            "llmload_bins_left",
        ):
            self.engine.con.execute(f"DROP TABLE IF EXISTS {table}")
        return out

    def _histogram_and_checks(self) -> None:
        for i, _ in enumerate(self._each_batch(sliced=True)):
            self.engine.con.execute(_HIST_SQL % {"bin": _BIN_S})
            if i == 0:
                self._candidates()
        bad = self.engine.sql(
            "SELECT k, list(DISTINCT b ORDER BY b) AS rows FROM llmload_hist "
            "WHERE k BETWEEN 2 AND 6 GROUP BY k"
        ).to_pylist()
        found = {int(b["k"]): b["rows"] for b in bad}
        for k, reason in enumerate(_CHECKS, start=2):
            if k in found:
                raise InvalidTimelineError(reason, self._ids_of(found[k]))

    def _candidates(self) -> None:
        """`llmload_cand`, from the first batch's histogram: each group's bins near a named
        percentile (_BAND_SIGMAS), and every bin between (to its largest, near the top). The
        later batches keep those bins' values in their first pass, so that a second pass reads
        only the first batch, and the others only for a wanted bin that none of them kept (their
        samples fell elsewhere). None past _MOST_CANDIDATES bins: the second pass reads all."""
        hist = self.engine.sql(
            "SELECT g, k, b, sum(w)::DOUBLE AS w "
            "FROM llmload_hist WHERE k < 2 GROUP BY ALL ORDER BY g, k, b"
        ).to_pandas()
        named = np.array(list(PERCENTILES.values()), dtype=np.float64)
        cand: dict[str, list[np.ndarray]] = {"g": [], "k": [], "b": []}
        size = 0
        for (g, k), h in hist.groupby(["g", "k"], sort=False):
            w = h["w"].to_numpy(np.float64)
            total = float(w.sum())
            if total <= 0:
                continue
            bins = h["b"].to_numpy(np.int64)
            above = np.cumsum(w) / total  # the share at or below each bin's top
            below = above - w / total
            spans = []
            for q in named:
                band = max(_BAND, _BAND_SIGMAS * float(np.sqrt(q * (1 - q) / total)))
                near = np.flatnonzero((above >= q - band) & (below <= q + band))
                spans.append(np.arange(bins[near[0]], bins[near[-1]] + 1, dtype=np.int64))
                size += len(spans[-1])
                if size > _MOST_CANDIDATES:
                    return
            kept = np.unique(np.concatenate(spans))
            cand["g"].append(np.full(len(kept), int(g), np.int32))
            cand["k"].append(np.full(len(kept), int(k), np.int32))
            cand["b"].append(kept)
        if cand["b"]:
            self.engine.con.register("llmload_cand_arrow", pa.table(
                {c: pa.array(np.concatenate(v)) for c, v in cand.items()}
            ))  # fmt: skip
            self.engine.con.execute("INSERT INTO llmload_cand SELECT * FROM llmload_cand_arrow")
            self.engine.con.unregister("llmload_cand_arrow")

    def _ids_of(self, rows: list[int]) -> list[str]:
        """The request ids of request rows `rows` (`llmload_req.r`)."""
        return [str(i) for i in self.ids[np.asarray(rows, dtype=np.int64)]]

    def _summaries(self, groups: int) -> dict[tuple[int, int], Latency]:
        """(group, kind) -> Latency; kind 0 ICL, 1 ITL: exact weighted nearest rank."""
        hist = self.engine.sql(
            "SELECT g, k, b, sum(w)::DOUBLE AS w "
            "FROM llmload_hist WHERE k < 2 GROUP BY ALL ORDER BY g, k, b"
        ).to_pandas()
        totals = self.engine.sql(
            "SELECT g, k, sum(w)::DOUBLE AS total, (sum(vw) / 1e9)::DOUBLE AS vw, "
            "max(vmax) AS vmax "
            "FROM llmload_hist WHERE k < 2 GROUP BY ALL ORDER BY g, k"
        ).to_pandas()
        qs = np.concatenate([list(PERCENTILES.values()), CURVE_QUANTILES])
        named = len(PERCENTILES)
        wanted: list[tuple[int, int, int, float, float, int]] = []  # g, k, bin, base, target, q
        stats: dict[tuple[int, int], tuple[float, float, float]] = {}
        picked: dict[tuple[int, int], np.ndarray] = {}
        for row in totals.itertuples(index=False):
            key = (int(row.g), int(row.k))
            total = float(row.total)
            stats[key] = (total, float(row.vw) / total, float(row.vmax))
            h = hist[(hist["g"] == key[0]) & (hist["k"] == key[1])]
            cum = np.cumsum(h["w"].to_numpy(np.float64))
            bins = h["b"].to_numpy(np.int64)
            targets = qs * total - _RANK_TOLERANCE * total
            at = np.clip(np.searchsorted(cum, targets, side="left"), 0, len(cum) - 1)
            # the curve (plots only): each rank's bin, at its lower edge
            picked[key] = bins[at].astype(np.float64) * _BIN_S
            for qi, (target, j) in enumerate(zip(targets[:named], at[:named], strict=True)):
                base = float(cum[j - 1]) if j > 0 else 0.0
                wanted.append((key[0], key[1], int(bins[j]), base, float(target), qi))
        values: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.second_pass_batches = 0  # how many batches the second pass read (the tests')
        if wanted:
            need = pa.table({"g": [w[0] for w in wanted], "k": [w[1] for w in wanted],
                             "b": [w[2] for w in wanted]})  # fmt: skip
            self.engine.con.register("llmload_bins_wanted", need)
            self.engine.con.execute("CREATE OR REPLACE TEMP TABLE llmload_bins AS "
                                    "SELECT DISTINCT g, k, b FROM llmload_bins_wanted")  # fmt: skip
            self.engine.con.execute("CREATE OR REPLACE TEMP TABLE llmload_bins_left AS "
                                    "SELECT * FROM llmload_bins "
                                    "EXCEPT SELECT * FROM llmload_cand")  # fmt: skip
            left = self.engine.sql("SELECT count(*) AS n FROM llmload_bins_left").to_pylist()
            # the second pass: the first batch's values in every wanted bin, the others' only
            # in the wanted bins their first pass did not keep
            for i, _ in enumerate(self._each_batch(sliced=True)):
                if i > 0 and not left[0]["n"]:
                    break
                table = "llmload_bins" if i == 0 else "llmload_bins_left"
                self.engine.con.execute(_VALUES_SQL % {"bin": _BIN_S, "bins": table})
                self.second_pass_batches = i + 1
            found = self.engine.sql(
                "SELECT g, k, b, v, sum(w)::DOUBLE AS w FROM ("
                "SELECT g, k, b, v, w FROM llmload_values UNION ALL "
                "SELECT h.g, h.k, h.b, h.val, h.w FROM llmload_hist h SEMI JOIN llmload_bins n "
                "ON h.g = n.g AND h.k = n.k AND h.b = n.b WHERE h.k < 2 AND h.val IS NOT NULL"
                ") GROUP BY ALL ORDER BY g, k, b, v"
            ).to_pandas()
            for key, part in found.groupby(["g", "k", "b"], sort=False):
                g, k, b = (int(x) for x in key)
                values[(g, k, b)] = (part["v"].to_numpy(np.float64),
                                     np.cumsum(part["w"].to_numpy(np.float64)))  # fmt: skip
        for g, k, b, base, target, qi in wanted:
            v, cum = values[(g, k, b)]
            j = min(int(np.searchsorted(base + cum, target, side="left")), len(v) - 1)
            picked[(g, k)][qi] = v[j]
        out: dict[tuple[int, int], Latency] = {}
        for g in range(groups):
            for k in (0, 1):
                if (g, k) not in stats:
                    out[(g, k)] = _latency(SortedSamples.of(np.array([])))
                    continue
                total, mean, vmax = stats[(g, k)]
                q = picked[(g, k)]
                p50, p90, p95, p99, p999 = (float(x) for x in q[:named])
                summary = DistributionSummary(count=int(round(total)), mean=mean, p50=p50,
                                              p90=p90, p95=p95, p99=p99, p999=p999, max=vmax)  # fmt: skip
                out[(g, k)] = Latency(summary, q[named:])
        return out


AGGREGATE_COLUMNS: Final = (
    "n", "tokens", "first_ns", "last_ns", "first_token_ns", "last_token_ns", "token_chunk_tokens",
    "token_events", "multi_token_events", "max_event_tokens",
)  # fmt: skip
"""What _AGGREGATE_SQL gives per request id (`llmload_chunkagg`, TableChunkFacts)."""


class TableChunkFacts(EngineChunkFacts):
    """The chunks out of core beside requests that are out of core too
    (analysis/steps/outofcore.py): the per-request aggregate is a table of the engine,
    `llmload_chunkagg` (request_id and AGGREGATE_COLUMNS), one worker's at a time, and each
    group's request rows come from a query over the engine's request table, never from arrays
    in memory. A chunk joins its own worker's requests (each worker writes both)."""

    def __init__(self, engine: Any, batches: list[list[str]], filesystem: Any) -> None:
        self.engine = engine
        self.batches = batches
        self.filesystem = filesystem
        self._orphans = 0
        # the batches whose requests lie in one part each: each part's chunk rows, by path
        self._whole: dict[tuple[str, ...], dict[str, int]] = {}

    def aggregate(self, paths: list[str]) -> None:
        """`llmload_chunkagg`: the per-request aggregate of one worker's chunk parts (a worker
        at a time: a hash aggregation of a worker's requests, not of every request at once).
        It notes whether each request's chunks lie in one part (the sink writes a request's
        chunks together): then a window over the worker's chunks may take them part by part."""
        self.engine.register_parts("chunks", [(paths, self.filesystem)] if paths else [],
                                   view="llmload_workerchunks", part_column=True)  # fmt: skip
        self.engine.con.execute(
            "CREATE OR REPLACE TEMP TABLE llmload_chunkagg AS "
            + _AGGREGATE_SQL.replace("llmload_chunks", "llmload_workerchunks").replace(
                "\nFROM ",
                ",\n       min(llmload_part) AS part_lo, max(llmload_part) AS part_hi\nFROM ",
            )
        )
        split = self.engine.sql(
            "SELECT count(*) FILTER (WHERE part_lo IS NULL OR part_lo <> part_hi) AS n "
            "FROM llmload_chunkagg"
        ).to_pylist()[0]["n"]
        if paths and not split:  # whole requests: a part's rows are its requests' chunks
            rows = self.engine.sql(
                "SELECT part_lo AS part, sum(n) AS n FROM llmload_chunkagg GROUP BY part_lo"
            ).to_pylist()
            self._whole[tuple(sorted(paths))] = {paths[r["part"]]: int(r["n"]) for r in rows}

    def _part_slices(self, paths: list[str], most: int) -> list[list[str]] | None:
        sizes = self._whole.get(tuple(sorted(paths)))
        if sizes is None:
            return None
        slices: list[list[str]] = []
        rows = most
        for path in sorted(paths):
            n = sizes.get(path, 0)
            if n > most:
                return None  # one part alone is more than a slice holds
            if rows + n > most:
                slices.append([])
                rows = 0
            slices[-1].append(path)
            rows += n
        return slices

    def count_orphans(self, requests_table: str) -> None:
        """Adds the chunk rows of `llmload_chunkagg` whose request id is not in
        `requests_table` (request_id): their worker recorded no such request."""
        row = self.engine.sql(
            f"SELECT coalesce(sum(n), 0) AS n FROM llmload_chunkagg c ANTI JOIN "
            f"{requests_table} r ON c.request_id = r.request_id"
        ).to_pylist()[0]
        self._orphans += int(row["n"])

    @property
    def per_request(self) -> pd.DataFrame:  # the aggregate stays in the engine
        raise NotImplementedError("TableChunkFacts keeps its per-request facts in the engine")

    @property
    def orphan_chunks(self) -> int:
        return self._orphans

    def table_groups(
        self, request_sql: str, groups: int, windows: list[tuple[int, Window]],
        window_of: list[int | None],
    ) -> list[GroupChunks]:  # fmt: skip
        """Each group's chunk facts; `request_sql` selects the request rows as `llmload_req`
        wants them (rid, r, g: the latency group or -1, e: the eligibility code or -1, sent,
        end_s)."""
        self.engine.con.execute(f"CREATE OR REPLACE VIEW llmload_req_all AS {request_sql}")
        self.engine.con.execute(
            "CREATE OR REPLACE VIEW llmload_req AS SELECT * FROM llmload_req_all"
        )
        try:
            return self._group_facts(groups, windows, window_of)
        finally:
            self.engine.con.execute("DROP TABLE IF EXISTS llmload_req_w")
            self.engine.con.execute("DROP VIEW IF EXISTS llmload_req_all")

    def _on_batch(self, paths: list[str]) -> None:
        """A batch is one worker's parts (by_folder): its chunks join its requests only, a
        table of them made for the batch (the request table holds a worker's rows together,
        so this reads only that worker's row groups)."""
        key = "/".join(paths[0].rsplit("/", 3)[-3:]) if paths else ""
        part = parse_part_key(key)
        if part is None:
            self.engine.con.execute(
                "CREATE OR REPLACE VIEW llmload_req AS SELECT * FROM llmload_req_all"
            )
            return
        worker = part.worker_id.replace(chr(39), chr(39) * 2)
        self.engine.con.execute(
            "CREATE OR REPLACE TEMP TABLE llmload_req_w AS "
            f"SELECT * FROM llmload_req_all WHERE worker_id = '{worker}'"
        )
        self.engine.con.execute("CREATE OR REPLACE VIEW llmload_req AS SELECT * FROM llmload_req_w")

    def _ids_of(self, rows: list[int]) -> list[str]:
        listed = ", ".join(str(int(r)) for r in rows)
        found = self.engine.sql(
            f"SELECT rid FROM llmload_req_all WHERE r IN ({listed}) ORDER BY r"
        ).to_pylist()
        return [str(row["rid"]) for row in found]
