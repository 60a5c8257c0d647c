"""The step table with the request rows left on disk too: the engine's path.

    table = engine_steps(run, engine, slo, by, saturation)   # run: load_run(..., requests=False)

`aggregate.aggregate_steps` holds every request row in memory (pandas, about 1.5 KB a request
once its per-request columns are computed beside it). This path holds none: the request parts
are read where they lie by the engine (analysis/read/engine.py, DuckDB under its memory
limit), which builds one table of the run's requests in a database file in its spill folder
(`llmload_rq`: the columns analysis reads, the send time on the master's clock, each
request's metrics joined from the chunks' per-request aggregate), and every figure of a
summary row is a query over it: counts, means and sums by group, exact nearest-rank
percentiles (each group's values sorted by the engine, only the wanted ranks handed back),
the throughput inside each window, the workers' stalls joined by time (ASOF). Python holds the
summary rows, each latency's quantile curve, a bounded sample of TTFT by send time and the
plot's timeline bins; `requests.parquet` is written by the engine (`write_requests`).

The figures are those of `aggregate_steps` by the same definitions (docs/metrics.md); what
can differ is the last bit or two of a mean of float values (the engine adds them up in
another order, on several threads). tests/integration/test_requests_out_of_core.py compares
the two paths column by column.

Every kind of run is covered (staircase, rate, sessions, trace replay, engine spans, several
models, shared prefixes) but one whose engine spans are more than SPANS_HELD: the spans are
read into memory whole (analysis/kernel/spans.py), so such a run is reported in memory
(`covers`). compare and repeats draw each step's bootstrap sample here too
(`bootstrap_steps`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis.derive.cachestate import PrefixPlan, cache_warnings, step_entry
from analysis.derive.chunkfacts import CURVE_QUANTILES, GroupChunks, TableChunkFacts, by_folder
from analysis.derive.metrics import OUTPUT_KIND_OFFSETS
from analysis.derive.openloop import open_loop_warnings
from analysis.derive.path import PARTS as PATH_PARTS
from analysis.derive.path import path_warnings
from analysis.derive.sessions import (
    STEP_SESSION_COLUMNS,
    cached_tokens_message,
    session_columns,
)
from analysis.derive.stats import DistributionSummary
from analysis.derive.windows import StepPlan, StepSeen, Window, plan_from
from analysis.derive.workers import WorkerHealth
from analysis.kernel.errors import EventDataError, InvalidTimelineError
from analysis.kernel.layout import parse_part_key
from analysis.kernel.percentiles import PERCENTILES
from analysis.kernel.schema import ERROR_KINDS
from analysis.kernel.slo import Slo
from analysis.read.clocks import worker_offsets_ns
from analysis.read.load import REQUEST_COLUMNS, RunData
from analysis.steps.aggregate import (
    BY_CHOICES,
    PER_REQUEST_COLUMNS,
    PROMPT_OFFSET_FROM,
    REPLAYED_PROMPTS,
    TIMELINE_BINS,
    StepTable,
    Timeline,
    _mixed_models_warning,
    _rate,
    _schedule_window,
    _step_warnings,
    event_token_columns,
    judge_slo,
    latency_columns,
    orphan_warnings,
    prompt_offset_warning,
    reasoning_means,
    row_name,
    validity_columns,
    weakest_source,
)

_RANK_TOLERANCE: Final = 1e-9  # as analysis/derive/stats.py
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
SPANS_HELD: Final = 2_000_000
"""A run with more engine spans than this is reported in memory: its spans are read into
memory whole (analysis/kernel/spans.py), the engine path would hold them beside its own."""
TTFT_SAMPLE: Final = 20_000
"""At most about this many requests' (send time, TTFT) for the server-metrics plot: those
whose id hashes into the sample, the same on every report of the run."""

_ORDERED_OFFSETS: Final = (
    "headers_ns",
    "first_event_ns",
    "first_token_ns",
    "last_token_ns",
    "end_ns",
)  # fmt: skip  (analysis/derive/metrics.py's order)


def covers(run: RunData) -> bool:
    """Whether this path computes every figure of the run: every run but one whose engine
    spans are too many to hold (they are read into memory: analysis/kernel/spans.py), which
    takes the in-memory path."""
    return run.spans is None or len(run.spans) <= SPANS_HELD


def _exists(engine: Any, table: str) -> bool:
    found = engine.sql(f"SELECT count(*) AS n FROM duckdb_tables() WHERE table_name = {_q(table)}")
    return bool(found.to_pylist()[0]["n"])


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# -- the request table ------------------------------------------------------------------------

_REQUEST_TABLE_SQL: Final = """
SELECT %(columns)s,
       q.sent_at_ns - coalesce(o.offset_ns, 0) AS sent,
       CASE WHEN q.end_ns IS NULL THEN -1
            ELSE q.sent_at_ns - coalesce(o.offset_ns, 0) + q.end_ns END AS done,
       CASE WHEN q.first_token_ns IS NULL THEN -1
            ELSE q.sent_at_ns - coalesce(o.offset_ns, 0) + q.first_token_ns END AS first_at,
       q.first_event_ns / 1e9 AS ttfe_s,
       q.first_token_ns / 1e9 AS ttft_s,
       q.first_answer_ns / 1e9 AS ttfo_s,
       q.first_reasoning_ns / 1e9 AS ttfr_s,
       CASE WHEN q.output_tokens >= 2
            THEN (q.last_token_ns / 1e9 - q.first_token_ns / 1e9) / (q.output_tokens - 1.0)
       END AS tpot_s,
       q.end_ns / 1e9 AS e2e_s,
       CASE WHEN c.token_chunk_tokens > 1
            THEN (c.last_token_ns / 1e9 - c.first_token_ns / 1e9) / (c.token_chunk_tokens - 1.0)
       END AS itl_mean_s,
       CASE WHEN c.n > 1 THEN (c.last_ns / 1e9 - c.first_ns / 1e9) / (c.n - 1.0) END
           AS icl_mean_s,
       CASE WHEN q.output_tokens >= 0 AND q.end_ns > 0
            THEN q.output_tokens / (q.end_ns / 1e9) END AS output_tokens_per_s,
       q.output_tokens::DOUBLE - q.reasoning_tokens::DOUBLE AS answer_tokens,
       coalesce(c.n, 0)::BIGINT AS chunk_count,
       coalesce(c.tokens, 0)::DOUBLE AS chunk_tokens,
       coalesce(c.token_events, 0)::BIGINT AS token_events,
       coalesce(c.multi_token_events, 0)::BIGINT AS multi_token_events,
       c.max_event_tokens::DOUBLE AS max_event_tokens,
       q.status = 'ok' AS is_ok,
       q.status = 'dropped' AS is_dropped,
       coalesce(q.turn, 0) = 0 AS arrival,
       coalesce(q.prompt_tokens::DOUBLE,
                q.prompt_tokens_requested + coalesce(q.history_tokens, 0)::DOUBLE)
           AS prompt_for_rate,
       CASE WHEN NOT coalesce(%(replayed)s, false) AND coalesce(q.turn, 0) = 0
                 AND coalesce(q.turn_kind, 'user') = 'user'
            THEN q.prompt_tokens::DOUBLE - q.prompt_tokens_requested END AS prompt_offset,
       CASE WHEN q.intended_ns IS NOT NULL AND q.queued_ns IS NOT NULL
                 AND q.status <> 'dropped'
            THEN (q.sent_at_ns - q.intended_ns - q.queued_ns) / 1000000 END AS slip_ms,
       CASE WHEN q.queued_ns IS NOT NULL AND q.status <> 'dropped'
            THEN q.queued_ns / 1000000 END AS queued_ms,
       q.client_delay_ns / 1e6 AS client_delay_ms,
       CASE WHEN coalesce(q.connect_new, false) THEN q.connect_ns / 1e6 END AS connect_ms
FROM llmload_rparts q
LEFT JOIN llmload_off o ON o.worker_id = q.worker_id
LEFT JOIN llmload_chunkagg c ON c.request_id = q.request_id
"""
"""One row per request: its columns, its send, end and first-token times on the master's
clock (-1: unknown), its metrics (analysis/derive/metrics.py, in the same floating-point
operations) and what the groups ask of it."""


def _worker_of(path: str) -> str:
    """The worker whose folder holds a part (`<table>/worker=<id>/part-N.parquet`)."""
    part = parse_part_key("/".join(path.rsplit("/", 3)[-3:]))
    return part.worker_id if part is not None else path.rsplit("/", 1)[0]


def _per_worker(run: RunData) -> list[tuple[list[str], list[str]]]:
    """Each worker's (request parts, chunk parts); one pair of empty lists for no parts."""
    workers: dict[str, tuple[list[str], list[str]]] = {}
    for index, paths in enumerate((run.request_paths or [], run.chunk_paths or [])):
        for path in paths:
            workers.setdefault(_worker_of(path), ([], []))[index].append(path)
    return [workers[w] for w in sorted(workers)] or [([], [])]


def _replayed_sql() -> str:
    return "(" + " OR ".join(f"starts_with(q.scenario, {_q(p)})" for p in REPLAYED_PROMPTS) + ")"


DISTINCT_PER_PASS: Final = 4_000_000
"""Request ids one pass of the duplicate check holds (a hash aggregation of its share): a
run of more requests is checked in passes, each a share of the ids by their hash."""


def _checks(engine: Any, rows: int) -> None:
    """What analysis/derive/metrics.py refuses of request rows, in its order: an id twice,
    negative or disordered offsets, a negative token count (EventDataError)."""
    passes = max(1, math.ceil(rows / DISTINCT_PER_PASS))
    dup: list[Any] = []
    for i in range(passes):
        share = f"WHERE hash(request_id) % {passes} = {i} " if passes > 1 else ""
        dup += engine.sql(
            f"SELECT request_id, min(r) AS first FROM llmload_rqr {share}"
            "GROUP BY request_id HAVING count(*) > 1"
        ).to_pylist()
    dup = [d["request_id"] for d in sorted(dup, key=lambda d: d["first"])]
    if dup:
        raise EventDataError(
            f"request id {dup[0]} appears in more than one request row "
            f"({len(dup)} duplicated ids); each request must be recorded once"
        )
    checks: list[tuple[str, str]] = []
    for column in (*_ORDERED_OFFSETS, *OUTPUT_KIND_OFFSETS):
        checks.append((f"{column} < 0", f"{column} is negative ({column} is an offset from send)"))
    for i, early in enumerate(_ORDERED_OFFSETS):
        for late in _ORDERED_OFFSETS[i + 1 :]:
            checks.append((f"{early} > {late}", f"{late} precedes {early}"))
    for column in OUTPUT_KIND_OFFSETS:
        checks.append((f"{column} < first_token_ns", f"{column} precedes first_token_ns"))
        checks.append((f"{column} > last_token_ns", f"{column} follows last_token_ns"))
    checks.append(("output_tokens < 0", "output_tokens is negative"))
    counts = ", ".join(f"count(*) FILTER (WHERE {cond}) AS c{i}" for i, (cond, _) in
                       enumerate(checks))  # fmt: skip
    found = engine.sql(f"SELECT {counts} FROM llmload_rq").to_pylist()[0]
    for i, (cond, reason) in enumerate(checks):
        if found[f"c{i}"]:
            ids = (
                engine.sql(f"SELECT request_id FROM llmload_rqr WHERE {cond} ORDER BY r")
                .column(0)
                .to_pylist()
            )
            raise InvalidTimelineError(reason, [str(x) for x in ids])


# -- the groups -------------------------------------------------------------------------------


@dataclass
class _Group:
    """One summary row's group: its kind, step, model and window, and its code `gid`."""

    gid: int
    group: str  # cold or step
    step: int | None
    concurrency: int
    window: Window | None
    model: str | None  # the model of a split row ("" without a split; None: not recorded)
    plan: StepPlan | None = None
    schedule: Window | None = None


def _seen(engine: Any) -> dict[int, StepSeen]:
    rows = engine.sql(
        "SELECT step, max(concurrency) AS c, min(sent) AS first, "
        "max(greatest(sent, CASE WHEN done >= 0 THEN done ELSE sent END)) AS last, "
        "max(rate) FILTER (WHERE NOT isnan(rate)) AS rate "
        "FROM llmload_rq WHERE NOT cold GROUP BY step ORDER BY step"
    ).to_pylist()
    return {
        int(r["step"]): StepSeen(
            int(r["c"]),
            (int(r["first"]), int(r["last"])),
            None if r["rate"] is None else float(r["rate"]),
        )
        for r in rows
    }


def _models(engine: Any, by: str | None) -> list[str | None]:
    """The split's models (as aggregate._model_masks): those the sent requests named, then
    None for those that named none (or when none named any); [""] without a split."""
    if by is None:
        return [""]
    rows = (
        engine.sql(
            "SELECT DISTINCT model FROM llmload_rq WHERE NOT is_dropped ORDER BY model NULLS LAST"
        )
        .column(0)
        .to_pylist()
    )
    named = [m for m in rows if m is not None]
    models: list[str | None] = [*named]
    if None in rows or not named:
        models.append(None)
    return models


def _model_sql(model: str | None, by: str | None) -> str:
    if by is None:
        return "true"
    return "model IS NULL" if model is None else f"model = {_q(model)}"


@dataclass
class _Plan:
    groups: list[_Group]
    models: list[str | None]
    warnings: list[str]


def _plan(run: RunData, engine: Any, by: str | None) -> _Plan:
    if by is not None and by not in BY_CHOICES:
        raise ValueError(f"by must be one of {BY_CHOICES} or None, not {by!r}")
    plans, warnings = plan_from(run.manifest, _seen(engine))
    cold = engine.sql(
        "SELECT count(*) AS n, max(concurrency) AS c, min(sent) AS first, "
        "max(greatest(sent, CASE WHEN done >= 0 THEN done ELSE sent END)) AS last "
        "FROM llmload_rq WHERE cold AND NOT is_dropped"
    ).to_pylist()[0]
    arrivals = {
        int(r["step"]): int(r["n"])
        for r in engine.sql(
            "SELECT step, count(*) AS n FROM llmload_rq WHERE NOT cold AND arrival GROUP BY step"
        ).to_pylist()
    }
    models = _models(engine, by)
    if by is None:
        named = (
            engine.sql(
                "SELECT DISTINCT model FROM llmload_rq WHERE NOT is_dropped AND model IS NOT NULL "
                "ORDER BY model"
            )
            .column(0)
            .to_pylist()
        )
        warnings.extend(_mixed_models_warning(dict.fromkeys(named, np.zeros(0, bool))))
    unsplit: list[tuple[str, int | None, int, Window | None, StepPlan | None]] = []
    if cold["n"]:
        concurrency = (run.manifest.get("cold_start") or {}).get("concurrency")
        if concurrency is None:
            concurrency = int(cold["c"])
        cold_window = Window(int(cold["first"]), int(cold["last"]), "cold")
        unsplit.append(("cold", None, int(concurrency), cold_window, None))
    for step_plan in plans:
        unsplit.append(("step", step_plan.step, step_plan.concurrency, step_plan.window, step_plan))
    groups: list[_Group] = []
    for kind, step, concurrency, window, plan in unsplit:
        schedule = (
            _schedule_window(plan, step_entry(run.manifest, plan.step), arrivals.get(plan.step, 0))
            if plan is not None
            else None
        )
        for model in models:
            groups.append(_Group(len(groups), kind, step, concurrency, window, model, plan,
                                 schedule))  # fmt: skip
    return _Plan(groups, models, warnings)


def _groups_table(engine: Any, plan: _Plan, by: str | None) -> None:
    """`llmload_groups` (gstep: the step, -1 the cold group; model; window; gid) and the
    view `llmload_rg`: each request with the gid of the group it is a member of (its step's
    window holds its send; every cold request is the cold group's) or NULL."""
    gs = plan.groups
    table = pa.table({
        "gid": pa.array([g.gid for g in gs], pa.int32()),
        "gstep": pa.array([-1 if g.group == "cold" else g.step for g in gs], pa.int64()),
        "gmodel": pa.array([g.model for g in gs], pa.string()),
        "ws": pa.array([_I64_MIN if g.group == "cold" else
                        (g.window.start_ns if g.window else _I64_MAX) for g in gs], pa.int64()),
        "we": pa.array([_I64_MAX if g.group == "cold" else
                        (g.window.end_ns if g.window else _I64_MIN) for g in gs], pa.int64()),
        "is_step": pa.array([g.group == "step" for g in gs], pa.bool_()),
    })  # fmt: skip
    engine.con.register("llmload_groups_arrow", table)
    engine.con.execute("CREATE OR REPLACE TEMP TABLE llmload_groups AS "
                       "SELECT * FROM llmload_groups_arrow")  # fmt: skip
    model_join = "AND g.gmodel IS NOT DISTINCT FROM q.model" if by is not None else ""
    engine.con.execute(f"""
        CREATE OR REPLACE VIEW llmload_rg AS
        SELECT q.*, g.gid, coalesce(g.is_step, false) AS steady
        FROM llmload_rqr q LEFT JOIN llmload_groups g
          ON g.gstep = CASE WHEN q.cold THEN -1 ELSE q.step END {model_join}
         AND q.sent BETWEEN g.ws AND g.we
    """)  # fmt: skip


# -- exact nearest ranks ----------------------------------------------------------------------


def _ranks(
    engine: Any, values_sql: str, quantiles: dict[int, np.ndarray]
) -> tuple[dict[tuple[int, int], np.ndarray], dict[tuple[int, int], tuple[int, float, float]]]:
    """Nearest-rank quantiles per (gid, kind) of the values `values_sql` selects (gid, k, v;
    NULL and NaN left out), `quantiles[k]` of kind k; and (count, mean, max) per (gid, k).
    The values are sorted by the engine; only the wanted ranks come back."""
    engine.con.execute(
        "CREATE OR REPLACE TEMP TABLE llmload_vals AS SELECT gid, k, v FROM (" + values_sql
        + ") WHERE gid IS NOT NULL AND v IS NOT NULL AND NOT isnan(v)"
    )  # fmt: skip
    stats = {
        (int(r["gid"]), int(r["k"])): (int(r["n"]), float(r["mean"]), float(r["vmax"]))
        for r in engine.sql(
            "SELECT gid, k, count(*) AS n, favg(v) AS mean, max(v) AS vmax FROM llmload_vals "
            "GROUP BY ALL"
        ).to_pylist()
    }
    wanted: dict[tuple[int, int, int], list[int]] = {}  # (gid, k, rank) -> quantile positions
    for (gid, k), (n, _, _) in stats.items():
        q = quantiles[k]
        idx = np.clip(np.ceil(q * n - _RANK_TOLERANCE * n).astype(np.int64) - 1, 0, n - 1)
        for position, rank in enumerate(idx.tolist()):
            wanted.setdefault((gid, k, rank), []).append(position)
    out = {key: np.full(len(quantiles[key[1]]), np.nan) for key in stats}
    if wanted:
        keys = list(wanted)
        engine.con.register("llmload_wanted_arrow", pa.table({
            "gid": pa.array([w[0] for w in keys], pa.int32()),
            "k": pa.array([w[1] for w in keys], pa.int32()),
            "rn": pa.array([w[2] for w in keys], pa.int64()),
        }))  # fmt: skip
        found = engine.sql(
            "SELECT s.gid, s.k, s.rn, s.v FROM (SELECT gid, k, v, row_number() OVER "
            "(PARTITION BY gid, k ORDER BY v) - 1 AS rn FROM llmload_vals) s "
            "SEMI JOIN llmload_wanted_arrow w ON s.gid = w.gid AND s.k = w.k AND s.rn = w.rn"
        ).to_pylist()
        for r in found:
            key = (int(r["gid"]), int(r["k"]))
            for position in wanted[(key[0], key[1], int(r["rn"]))]:
                out[key][position] = float(r["v"])
    engine.con.execute("DROP TABLE IF EXISTS llmload_vals")
    return out, stats


_NAMED: Final = np.array(list(PERCENTILES.values()))
_LATENCY_QS: Final = np.concatenate([_NAMED, CURVE_QUANTILES])
# the kinds of values _ranks sorts: per-request latencies over a group's successful requests,
# the open loop's slip and cap waits and the client's delays over its sent ones
_KINDS: Final = {
    "ttft": 0, "tpot": 1, "e2e": 2, "slip": 3, "queued": 4, "client_delay": 5, "connect": 6,
    "ttfo": 7, "ttfr": 8,
}  # fmt: skip
_KIND_QS: Final = {
    0: _LATENCY_QS, 1: _LATENCY_QS, 2: _LATENCY_QS, 3: np.array([0.5, 0.99]),
    4: np.array([0.99]), 5: np.array([0.5, 0.99]), 6: np.array([0.5, 0.99]),
    7: _LATENCY_QS, 8: _LATENCY_QS,
}  # fmt: skip


def _values_sql(rate_gids: list[int]) -> str:
    members = "gid IS NOT NULL AND NOT is_dropped"
    latency = f"{members} AND is_ok"
    rate = f"gid IN ({', '.join(map(str, rate_gids))})" if rate_gids else "false"
    parts = [f"SELECT gid, {_KINDS[m]} AS k, {m}_s AS v FROM llmload_rg WHERE {latency}"
             for m in ("ttft", "tpot", "e2e", "ttfo", "ttfr")]  # fmt: skip
    parts += [
        f"SELECT gid, 3 AS k, slip_ms AS v FROM llmload_rg WHERE {members} AND {rate}",
        f"SELECT gid, 4 AS k, queued_ms AS v FROM llmload_rg WHERE {members} AND {rate}",
        f"SELECT gid, 5 AS k, client_delay_ms AS v FROM llmload_rg WHERE {members}",
        f"SELECT gid, 6 AS k, connect_ms AS v FROM llmload_rg WHERE {members}",
    ]
    return " UNION ALL ".join(parts)


def _at(quantiles: np.ndarray | None, i: int) -> float:
    """The i-th of a group's quantiles from _ranks; NaN where the group has no values."""
    return float(quantiles[i]) if quantiles is not None else float("nan")


def _summary(key: tuple[int, int], ranks: dict[tuple[int, int], np.ndarray],
             stats: dict[tuple[int, int], tuple[int, float, float]]) -> tuple[DistributionSummary, np.ndarray]:  # fmt: skip
    """A latency's DistributionSummary and curve from _ranks (empty: no values)."""
    if key not in stats:
        return DistributionSummary.empty(), np.full(len(CURVE_QUANTILES), np.nan)
    n, mean, vmax = stats[key]
    q = ranks[key]
    p50, p90, p95, p99, p999 = (float(x) for x in q[: len(_NAMED)])
    return DistributionSummary(n, mean, p50, p90, p95, p99, p999, vmax), q[len(_NAMED) :]


# -- per-group sums ---------------------------------------------------------------------------

_GROUP_SQL: Final = """
SELECT gid,
       count(*) FILTER (WHERE NOT is_dropped) AS requests,
       count(*) FILTER (WHERE is_ok) AS ok,
       count(*) FILTER (WHERE status = 'error') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE status = 'aborted') AS aborted,
       count(*) FILTER (WHERE is_dropped) AS dropped_in,
       count(*) FILTER (WHERE NOT is_dropped AND arrival) AS arrivals,
       avg(prompt_tokens_requested) FILTER (WHERE is_ok) AS prompt_tokens_requested_mean,
       avg(prompt_tokens) FILTER (WHERE is_ok) AS prompt_tokens_mean,
       avg(abs(prompt_offset)) FILTER (WHERE is_ok AND NOT isnan(prompt_offset))
           AS prompt_tokens_offset_mean,
       avg(max_tokens) FILTER (WHERE is_ok) AS output_tokens_requested_mean,
       avg(output_tokens) FILTER (WHERE is_ok) AS output_tokens_mean,
       avg(reasoning_tokens) FILTER (WHERE is_ok) AS reasoning_tokens_mean,
       avg(answer_tokens) FILTER (WHERE is_ok) AS answer_tokens_mean,
       count(*) FILTER (WHERE is_ok AND first_reasoning_ns IS NOT NULL) AS requests_reasoning,
       sum(chunk_tokens) FILTER (WHERE is_ok) AS event_tokens,
       sum(token_events) FILTER (WHERE is_ok) AS token_events,
       sum(multi_token_events) FILTER (WHERE is_ok) AS multi_token_events,
       max(max_event_tokens) FILTER (WHERE is_ok) AS max_event_tokens,
       count(output_valid) FILTER (WHERE is_ok) AS requests_checked,
       count(*) FILTER (WHERE is_ok AND NOT output_valid) AS requests_invalid,
       list(DISTINCT output_tokens_source) FILTER (WHERE is_ok) AS sources,
       count(*) FILTER (WHERE is_ok AND output_tokens_source = 'events') AS per_event,
       list(DISTINCT coalesce(worker_id, '')) FILTER (WHERE NOT is_dropped) AS senders,
       count(*) FILTER (WHERE NOT is_dropped AND worker_stall_ns > 0) AS stalled,
       count(worker_stall_ns) FILTER (WHERE is_ok) AS stall_measured,
       count(*) FILTER (WHERE is_ok AND worker_stall_ns > 0) AS stall_hit,
       sum(coalesced_events) FILTER (WHERE is_ok AND coalesced_events IS NOT NULL
                                     AND events IS NOT NULL) AS coalesced,
       sum(events) FILTER (WHERE is_ok AND coalesced_events IS NOT NULL
                           AND events IS NOT NULL) AS events,
       count(*) FILTER (WHERE NOT is_dropped AND coalesce(connect_new, false)) AS connections_new,
       count(*) FILTER (WHERE NOT is_dropped AND queued_ms > 0) AS queued_n,
       sum(cached_tokens) FILTER (WHERE is_ok AND cached_tokens IS NOT NULL
                                  AND prompt_tokens IS NOT NULL) AS cached,
       sum(prompt_tokens) FILTER (WHERE is_ok AND cached_tokens IS NOT NULL
                                  AND prompt_tokens IS NOT NULL) AS cached_of,
       count(*) FILTER (WHERE is_ok AND prompt_tokens_requested >= %(offset_from)s
                        AND NOT isnan(prompt_offset)) AS offset_n,
       avg(abs(prompt_offset)) FILTER (WHERE is_ok AND prompt_tokens_requested >= %(offset_from)s
                                       AND NOT isnan(prompt_offset)) AS offset_abs,
       avg(prompt_offset) FILTER (WHERE is_ok AND prompt_tokens_requested >= %(offset_from)s
                                  AND NOT isnan(prompt_offset)) AS offset_mean,
       count(*) FILTER (WHERE is_ok AND cached_tokens IS NOT NULL AND prompt_tokens IS NOT NULL)
           AS both_n,
       sum(%(implied)s) FILTER (WHERE is_ok AND cached_tokens IS NOT NULL
                                AND prompt_tokens IS NOT NULL) AS implied_both,
       sum(prompt_tokens) FILTER (WHERE is_ok AND prompt_tokens IS NOT NULL) AS prompt_only,
       sum(%(implied)s) FILTER (WHERE is_ok AND prompt_tokens IS NOT NULL) AS implied_only
FROM llmload_rg WHERE gid IS NOT NULL GROUP BY gid
"""
"""Each group's counts, means and sums over its members (sent requests of its window; the
dropped ones only in `dropped_in`)."""

_ERROR_SQL: Final = """
SELECT gid, error_kind, count(*) AS n FROM llmload_rg
WHERE gid IS NOT NULL AND NOT is_dropped AND error_kind IS NOT NULL GROUP BY ALL
"""


def _window_sums(engine: Any, gs: list[_Group], by: str | None, good_sql: str | None) -> dict[int, dict[str, float]]:  # fmt: skip
    """Per group with a window: the requests (and good requests) eligible for its
    throughput that ended inside it, and the prompt tokens of those whose first token came
    inside it. Eligible: not cold for a step, cold for the cold group; of its model when split."""
    sums = []
    for g in gs:
        if g.window is None:
            continue
        elig = ("cold" if g.group == "cold" else "NOT cold") + " AND NOT is_dropped"
        elig += f" AND {_model_sql(g.model, by)}"
        inside = f"BETWEEN {g.window.start_ns} AND {g.window.end_ns}"
        sums.append(f"count(*) FILTER (WHERE {elig} AND is_ok AND done {inside}) AS done_{g.gid}")
        sums.append(f"coalesce(sum(prompt_for_rate) FILTER (WHERE {elig} AND first_at {inside} "
                    f"AND NOT isnan(prompt_for_rate)), 0) AS prompt_{g.gid}")  # fmt: skip
        if good_sql is not None:
            sums.append(f"count(*) FILTER (WHERE {elig} AND ({good_sql}) AND done {inside}) "
                        f"AS good_{g.gid}")  # fmt: skip
    if not sums:
        return {}
    row = engine.sql(f"SELECT {', '.join(sums)} FROM llmload_rq").to_pylist()[0]
    out: dict[int, dict[str, float]] = {}
    for g in gs:
        if g.window is not None:
            out[g.gid] = {
                "done": float(row[f"done_{g.gid}"]),
                "prompt": float(row[f"prompt_{g.gid}"]),
                "good": float(row[f"good_{g.gid}"]) if good_sql is not None else float("nan"),
            }
    return out


def good_sql(slo: Slo, checked: bool = False) -> str | None:
    """A request is good (Slo.good): ok, its answer not found invalid, and within every
    per-request threshold (a missing value does not disqualify); None without thresholds,
    unless the run's answers were `checked` (`_checked`)."""
    valid = " AND coalesce(output_valid, true)" if checked else ""
    if not slo.thresholds:
        return f"is_ok{valid}" if checked else None
    limits = " AND ".join(f"coalesce(NOT ({t.column} > {float(t.limit)!r}), true)"
                          for t in slo.thresholds)  # fmt: skip
    return f"is_ok{valid} AND {limits}"


def _checked(engine: Any) -> bool:
    """Whether any answer of the run was checked (analysis/kernel/slo.invalid_answers)."""
    found = engine.sql("SELECT count(output_valid) AS n FROM llmload_rq").to_pylist()[0]
    return bool(found["n"])


# -- the workers' stalls ----------------------------------------------------------------------


def _stall_effect(
    engine: Any, run: RunData, gids: list[int], seen: dict[int, dict[str, float]]
) -> dict[int, tuple[float, str | None]]:
    """analysis/derive/workers.stall_effect of the groups `gids` (those with a successful
    request that overlapped a stall): each request's stall seconds in its TTFT, decode and
    E2E from the stalls table (ASOF joins on the worker's stalls, the time before each),
    then the p50 and p99 of TTFT, TPOT and E2E with every request freed of them, against
    `seen` (the group's own, by figure name)."""
    from analysis.derive.workers import STALL_FIGURES

    stalls = run.stalls
    if stalls is not None and len(stalls):
        frame = stalls[["worker_id", "started_at_ns", "length_ns"]].copy()
        frame["worker_id"] = frame["worker_id"].astype(str)
        frame = frame.sort_values(["worker_id", "started_at_ns"], kind="stable")
        lengths = frame["length_ns"].to_numpy(np.float64)
        before = frame.groupby("worker_id")["length_ns"].cumsum().to_numpy(np.float64) - lengths
        table = pa.table({"worker_id": frame["worker_id"].to_numpy(object),
                          "start": frame["started_at_ns"].to_numpy(np.float64),
                          "length": lengths, "before": before})  # fmt: skip
    else:
        table = pa.table({"worker_id": pa.array([], pa.string()), "start": pa.array([], pa.float64()),
                          "length": pa.array([], pa.float64()), "before": pa.array([], pa.float64())})  # fmt: skip
    engine.con.register("llmload_stalls_arrow", table)
    engine.con.execute(
        "CREATE OR REPLACE TEMP TABLE llmload_st AS SELECT * FROM llmload_stalls_arrow"
    )
    listed = ", ".join(map(str, gids))
    # the hit requests: times as analysis/derive/workers.stall_phases computes them (float64)
    engine.con.execute(f"""
        CREATE OR REPLACE TEMP TABLE llmload_hit AS
        SELECT r, worker_id, worker_stall_ns / 1e9 AS whole,
               sent_at_ns::DOUBLE AS t0,
               sent_at_ns::DOUBLE + first_token_ns::DOUBLE AS t1,
               sent_at_ns::DOUBLE + last_token_ns::DOUBLE AS t2,
               sent_at_ns::DOUBLE + end_ns::DOUBLE AS t3
        FROM llmload_rg WHERE gid IN ({listed}) AND is_ok AND worker_stall_ns > 0
    """)  # fmt: skip
    by = "coalesce(worker_id, '')"
    engine.con.execute("CREATE OR REPLACE TEMP TABLE llmload_own AS "
                       "SELECT DISTINCT worker_id FROM llmload_st")  # fmt: skip
    stalled_by = []
    for i in range(4):
        stalled_by.append(f"""
            (SELECT h.r, CASE WHEN s.start IS NULL THEN 0.0
                         ELSE s.before + least(greatest(h.t{i} - s.start, 0.0), s.length) END AS b{i}
             FROM llmload_hit h ASOF LEFT JOIN llmload_st s
               ON {by.replace('worker_id', 'h.worker_id')} = s.worker_id AND h.t{i} >= s.start)
        """)  # fmt: skip
    engine.con.execute(f"""
        CREATE OR REPLACE TEMP TABLE llmload_phases AS
        SELECT h.r,
          CASE WHEN h.worker_id IN (SELECT worker_id FROM llmload_own) THEN
            CASE WHEN h.t1 IS NULL THEN h.whole ELSE greatest((p1.b1 - p0.b0) / 1e9, 0.0) END
          ELSE h.whole END AS ttft_stall,
          CASE WHEN h.worker_id IN (SELECT worker_id FROM llmload_own) THEN
            CASE WHEN h.t2 IS NULL THEN h.whole
                 WHEN h.t1 IS NULL THEN NULL
                 ELSE greatest((p2.b2 - p1.b1) / 1e9, 0.0) END
          ELSE h.whole END AS decode_stall,
          CASE WHEN h.worker_id IN (SELECT worker_id FROM llmload_own) THEN
            CASE WHEN h.t3 IS NULL THEN h.whole ELSE greatest((p3.b3 - p0.b0) / 1e9, 0.0) END
          ELSE h.whole END AS e2e_stall
        FROM llmload_hit h
        JOIN {stalled_by[0]} p0 USING (r) JOIN {stalled_by[1]} p1 USING (r)
        JOIN {stalled_by[2]} p2 USING (r) JOIN {stalled_by[3]} p3 USING (r)
    """)  # fmt: skip
    freed = {"ttft": 7, "tpot": 8, "e2e": 9}
    values = f"""
        SELECT q.gid, {{k}} AS k, {{expr}} AS v
        FROM llmload_rg q LEFT JOIN llmload_phases p ON p.r = q.r
        WHERE q.gid IN ({listed}) AND q.is_ok AND NOT q.is_dropped
    """
    exprs = {
        "ttft": "CASE WHEN q.ttft_s IS NULL THEN NULL "
                "ELSE greatest(q.ttft_s - coalesce(p.ttft_stall, 0.0), 0.0) END",
        "tpot": "CASE WHEN q.tpot_s IS NULL THEN NULL ELSE greatest(q.tpot_s - "
                "coalesce(p.decode_stall, 0.0) / greatest(coalesce(q.output_tokens::DOUBLE, 1.0) "
                "- 1.0, 1.0), 0.0) END",
        "e2e": "CASE WHEN q.e2e_s IS NULL THEN NULL "
               "ELSE greatest(q.e2e_s - coalesce(p.e2e_stall, 0.0), 0.0) END",
    }  # fmt: skip
    sql = " UNION ALL ".join(values.format(k=freed[m], expr=exprs[m]) for m in freed)
    ranks, _ = _ranks(engine, sql, {k: np.array([0.5, 0.99]) for k in freed.values()})
    positive = engine.sql(
        "SELECT q.gid, count(*) AS n FROM llmload_rg q JOIN llmload_phases p ON p.r = q.r "
        "WHERE p.e2e_stall > 0 GROUP BY q.gid"
    ).to_pylist()
    moved_any = {int(r["gid"]) for r in positive if r["n"]}
    out: dict[int, tuple[float, str | None]] = {}
    for gid in gids:
        if gid not in moved_any:
            out[gid] = (0.0, None)
            continue
        worst, figure = 0.0, None
        for name in STALL_FIGURES:
            metric, stat = name.split("_")
            before = seen[gid].get(name, float("nan"))
            after_q = ranks.get((gid, freed[metric]))
            after = _at(after_q, 0 if stat == "p50" else 1)
            if before > 0 and math.isfinite(before) and math.isfinite(after):
                moved = 100.0 * (before - after) / before
                if moved > worst:
                    worst, figure = moved, name
        out[gid] = (worst, figure)
    return out


# -- the rows ---------------------------------------------------------------------------------


def _div(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _f(value: Any) -> float:
    return float("nan") if value is None else float(value)


def engine_steps(
    run: RunData,
    engine: Any,
    slo: Slo,
    by: str | None,
    saturation: tuple[float, float],
) -> StepTable:
    """The step table of a run whose request parts are on disk (`load_run(..., chunks=False,
    requests=False)`) and the chunk rows of no request; see the module doc. `covers(run)`
    must have said yes."""
    for stale in ("llmload_path", "llmload_sess"):  # an earlier run's, in the same engine
        engine.con.execute(f"DROP TABLE IF EXISTS {stale}")
    offsets = worker_offsets_ns(run.manifest)
    engine.con.register("llmload_off", pa.table({
        "worker_id": pa.array(list(offsets), pa.string()),
        "offset_ns": pa.array(list(offsets.values()), pa.int64()),
    }))  # fmt: skip
    facts = TableChunkFacts(engine, by_folder(run.chunk_paths or []), run.chunk_filesystem)
    columns = ", ".join(f"q.{c}" for c in REQUEST_COLUMNS)  # what analysis reads of a request
    select = _REQUEST_TABLE_SQL % {"replayed": _replayed_sql(), "columns": columns}
    for i, (rparts, cparts) in enumerate(_per_worker(run)):  # one worker's parts at a time
        engine.register_parts("requests", [(rparts, run.chunk_filesystem)] if rparts else [],
                              view="llmload_rparts")  # fmt: skip
        facts.aggregate(cparts)
        facts.count_orphans("llmload_rparts")
        into = "CREATE OR REPLACE TABLE llmload_rq AS" if i == 0 else "INSERT INTO llmload_rq"
        engine.con.execute(f"{into} {select}")
    engine.con.execute("CREATE OR REPLACE VIEW llmload_rqr AS SELECT rowid AS r, * FROM llmload_rq")
    _checks(engine, run.request_rows)
    plan = _plan(run, engine, by)
    _groups_table(engine, plan, by)
    gs = plan.groups
    warnings = plan.warnings
    checked = _checked(engine)
    good = good_sql(slo, checked)

    # the chunks' facts: ITL and ICL of each group's successful requests, tokens in windows
    elig_codes: dict[tuple[bool, str | None], int] = {}
    windows: list[tuple[int, Window]] = []
    window_of: list[int | None] = []
    for g in gs:
        if g.window is None:
            window_of.append(None)
            continue
        code = elig_codes.setdefault((g.group == "cold", g.model), len(elig_codes))
        window_of.append(len(windows))
        windows.append((code, g.window))
    elig_case = " ".join(
        f"WHEN {'cold' if cold else 'NOT cold'} AND {_model_sql(model, by)} THEN {code}"
        for (cold, model), code in elig_codes.items()
    )
    elig_sql = f"CASE WHEN is_dropped THEN -1 {elig_case} ELSE -1 END" if elig_codes else "-1"
    chunks = facts.table_groups(
        f"SELECT request_id AS rid, r, CASE WHEN is_ok THEN coalesce(gid, -1) ELSE -1 END AS g, "
        f"{elig_sql} AS e, sent, end_ns / 1e9 AS end_s, worker_id FROM llmload_rg",
        len(gs), windows, window_of,
    )  # fmt: skip

    has_paths = _path(engine, run)
    paths = _path_columns(engine) if has_paths else None
    has_sessions = _sessions(engine)
    sessions = _session_columns(engine) if has_sessions else None
    rate_gids = [g.gid for g in gs if g.plan is not None and g.plan.mode == "rate"]
    ranks, stats = _ranks(engine, _values_sql(rate_gids), _KIND_QS)
    prefix = PrefixPlan.of(run.manifest)
    implied = "NULL::DOUBLE"
    if prefix is not None:  # cachestate.PrefixPlan.implied_tokens
        b = prefix.block_size
        implied = (f"{b} * greatest(least({prefix.tokens // b}, "
                   f"floor((prompt_tokens - 1) / {b})), 0)")  # fmt: skip
    sums = {
        int(r["gid"]): r
        for r in engine.sql(
            _GROUP_SQL % {"offset_from": PROMPT_OFFSET_FROM, "implied": implied}
        ).to_pylist()
    }
    errors: dict[int, dict[str, int]] = {}
    for r in engine.sql(_ERROR_SQL).to_pylist():
        errors.setdefault(int(r["gid"]), {})[str(r["error_kind"])] = int(r["n"])
    tagged = {
        (int(r["step"]), r["model"] if by is not None else ""): int(r["n"])
        for r in engine.sql(
            "SELECT step, " + ("model" if by is not None else "NULL AS model")
            + ", count(*) AS n FROM llmload_rq WHERE NOT cold AND NOT is_dropped GROUP BY ALL"
        ).to_pylist()
    }  # fmt: skip
    cold_total = {
        (r["model"] if by is not None else ""): int(r["n"])
        for r in engine.sql(
            "SELECT " + ("model" if by is not None else "NULL AS model")
            + ", count(*) AS n FROM llmload_rq WHERE cold AND NOT is_dropped GROUP BY ALL"
        ).to_pylist()
    }  # fmt: skip
    in_window = _window_sums(engine, gs, by, good)
    good_members = {}
    if good is not None:
        good_members = {int(r["gid"]): int(r["n"]) for r in engine.sql(
            f"SELECT gid, count(*) FILTER (WHERE NOT is_dropped AND {good}) AS n FROM llmload_rg "
            "WHERE gid IS NOT NULL GROUP BY gid").to_pylist()}  # fmt: skip
    measured = engine.sql("SELECT count(worker_stall_ns) > 0 AS m FROM llmload_rq").to_pylist()[0][
        "m"
    ]
    health = WorkerHealth.of(run.samples, run.stalls, offsets)

    rows: list[dict[str, Any]] = []
    curves: list[dict[str, np.ndarray]] = []
    for g, chunk in zip(gs, chunks, strict=True):
        s = sums.get(g.gid, {})
        row, curve = _row(g, s, chunk, ranks, stats, errors.get(g.gid, {}), in_window,
                          good_members, good is not None, tagged, cold_total, measured, health,
                          run, by, sessions, paths)  # fmt: skip
        rows.append(row)
        curves.append(curve)

    stall_gids = [g.gid for g in gs if sums.get(g.gid, {}).get("stall_hit")]
    if measured and stall_gids:
        seen = {gid: {f"{m}_{p}": rows[gid][f"{m}_{p}_s"] for m in ("ttft", "tpot", "e2e")
                      for p in ("p50", "p99")} for gid in stall_gids}  # fmt: skip
        for gid, (pct, figure) in _stall_effect(engine, run, stall_gids, seen).items():
            rows[gid]["stall_moved_pct"], rows[gid]["stall_moved_figure"] = pct, figure

    for g, row in zip(gs, rows, strict=True):
        s = sums.get(g.gid, {})
        name = row_name(row)
        warnings.extend(_step_warnings(row))
        if row["group"] == "step" and s.get("offset_n"):
            warnings.extend(prompt_offset_warning(name, float(s["offset_abs"]),
                                                  float(s["offset_mean"]), int(s["offset_n"])))  # fmt: skip
        senders = _senders(s)
        warnings.extend(health.warnings(name, g.window, *saturation, senders))
        warnings.extend(open_loop_warnings(row))
        if row["group"] == "step":
            warnings.extend(cache_warnings(name, row, step_entry(run.manifest, g.step)))
        warnings.extend(path_warnings(name, row))
        judge_slo(row, slo)
    warnings.extend(_cached_warning(engine))
    warnings.extend(orphan_warnings(facts.orphan_chunks))
    turns = _turn_rows(engine) if has_sessions else []
    table = StepTable(rows, None, None, curves, warnings, None, turns, None)
    table.sessions_on_disk = has_sessions
    table.timeline = _timeline(engine)
    table.ttft_sample = _ttft_sample(engine, run.request_rows)
    table.good_in_window = _good_counter(engine, checked)
    table.answers_checked = checked
    table.request_rows = run.request_rows
    return table


def _senders(s: Mapping[str, Any]) -> frozenset[str] | None:
    names = s.get("senders")
    if names is None:
        return frozenset()
    return frozenset(str(n) for n in names)


def _row(
    g: _Group, s: Mapping[str, Any], chunk: GroupChunks,
    ranks: dict[tuple[int, int], np.ndarray], stats: dict[tuple[int, int], tuple[int, float, float]],
    errors: dict[str, int], in_window: dict[int, dict[str, float]], good_members: dict[int, int],
    has_good: bool, tagged: dict[tuple[int, Any], int], cold_total: dict[Any, int], measured: bool,
    health: WorkerHealth, run: RunData, by: str | None,
    sessions: dict[int, dict[str, Any]] | None = None,
    paths: dict[int, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:  # fmt: skip
    """One summary row in aggregate._group_row's columns and order, and its curves."""
    mode = g.plan.mode if g.plan is not None else None
    rate = g.plan.rate if g.plan is not None else None
    requests, ok, failed = (
        int(s.get("requests") or 0),
        int(s.get("ok") or 0),
        int(s.get("failed") or 0),
    )
    row: dict[str, Any] = {"group": g.group}
    if by is not None:
        row[by] = g.model
    row.update({
        "step": g.step,
        "concurrency": g.concurrency,
        "mode": mode,
        "rate": rate,
        "rate_achieved": _rate(float(s.get("arrivals") or 0), g.schedule or g.window)
        if mode else float("nan"),
    })  # fmt: skip
    key = g.model if by is not None else ""
    total = cold_total.get(key, 0) if g.group == "cold" else tagged.get((int(g.step or 0), key), 0)
    row.update({
        "requests_total": total,
        "requests": requests,
        "ok": ok,
        "failed": failed,
        "cancelled": int(s.get("cancelled") or 0),
        "aborted": int(s.get("aborted") or 0),
        "requests_dropped": int(s.get("dropped_in") or 0) if mode == "rate" else None,
        "error_rate": failed / (ok + failed) if ok + failed else float("nan"),
    })  # fmt: skip
    curves: dict[str, np.ndarray] = {}
    row.update(latency_columns(chunk, curves,
                               lambda metric: _summary((g.gid, _KINDS[metric]), ranks, stats)))  # fmt: skip
    w = g.window
    sums = in_window.get(g.gid)
    if w is not None and sums is not None:
        completed, prompt, good = sums["done"], sums["prompt"], sums["good"]
        tokens = chunk.tokens_in_window
    else:
        tokens = completed = prompt = good = float("nan")
    row.update({
        "requests_per_s": _rate(completed, w),
        "output_tokens_per_s": _rate(tokens, w),
        "input_tokens_per_s": _rate(prompt, w),
        "goodput_requests_per_s": _rate(good, w),
        "good": good_members.get(g.gid, 0) if has_good else None,
        "window_start_ns": w.start_ns if w else None,
        "window_end_ns": w.end_ns if w else None,
        "window_s": w.length_s if w else float("nan"),
        "window_source": w.source if w else None,
    })  # fmt: skip
    row.update(
        {
            "prompt_tokens_requested_mean": _f(s.get("prompt_tokens_requested_mean")),
            "prompt_tokens_mean": _f(s.get("prompt_tokens_mean")),
            "prompt_tokens_offset_mean": _f(s.get("prompt_tokens_offset_mean")),
            "output_tokens_requested_mean": _f(s.get("output_tokens_requested_mean")),
            "output_tokens_mean": _f(s.get("output_tokens_mean")),
            **reasoning_means(
                _f(s.get("reasoning_tokens_mean")),
                _f(s.get("answer_tokens_mean")),
                int(s.get("requests_reasoning") or 0),
            ),  # fmt: skip
            **event_token_columns(
                float(s.get("event_tokens") or 0),
                float(s.get("token_events") or 0),
                float(s.get("multi_token_events") or 0),
                _f(s.get("max_event_tokens")),
            ),  # fmt: skip
            **validity_columns(
                int(s.get("requests_checked") or 0), int(s.get("requests_invalid") or 0)
            ),
        }
    )
    row.update({f"errors_{kind}": errors.get(kind, 0) for kind in ERROR_KINDS})
    row["errors_other"] = sum(n for kind, n in errors.items() if kind not in ERROR_KINDS)
    sources = np.array([v for v in (s.get("sources") or []) if v is not None], dtype=object)
    row["output_tokens_source"] = weakest_source(sources)
    row["requests_per_event_tokens"] = int(s.get("per_event") or 0)
    stalled = int(s.get("stalled") or 0) if measured else None
    row.update(health.columns(w, stalled, _senders(s)))
    if stalled is not None:
        if not s.get("stall_measured"):
            row["stall_moved_pct"], row["stall_moved_figure"] = float("nan"), None
        else:
            row["stall_moved_pct"], row["stall_moved_figure"] = 0.0, None  # _stall_effect
    events = _f(s.get("events"))
    row["coalesced_events_pct"] = (
        100.0 * _f(s.get("coalesced")) / events if events == events and events else float("nan")
    )
    # the sections' parts (aggregate.ROW_PARTS, in order): open loop, sessions, cache, path
    rate_step = mode == "rate"
    slip = ranks.get((g.gid, _KINDS["slip"])) if rate_step else None
    slip_stats = stats.get((g.gid, _KINDS["slip"])) if rate_step else None
    queued = ranks.get((g.gid, _KINDS["queued"])) if rate_step else None
    row.update({
        "slip_p50_ms": _at(slip, 0),
        "slip_p99_ms": _at(slip, 1),
        "slip_max_ms": slip_stats[2] if slip_stats is not None else float("nan"),
        "requests_queued": int(s.get("queued_n") or 0) if rate_step else None,
        "queued_p99_ms": _at(queued, 0),
    })  # fmt: skip
    row.update(session_columns(None, np.zeros(0, bool)))  # missing without sessions
    if sessions is not None:
        row.update({c: 0 if c in ("sessions", "sessions_complete", "sessions_error",
                                  "sessions_cut") else float("nan") for c in STEP_SESSION_COLUMNS})  # fmt: skip
        row.update(sessions.get(g.gid, {}))
    entry = step_entry(run.manifest, g.step)
    phase = (entry or {}).get("cache_phase") or {}
    cached_of = _f(s.get("cached_of"))
    row.update({
        "cached_tokens_pct": 100.0 * _f(s.get("cached")) / cached_of
        if cached_of == cached_of and cached_of > 0 else float("nan"),
        "cached_implied_pct": _implied_pct(s),
        "cache_phase": phase.get("phase"),
        "cache_flush": phase.get("flush"),
        "cache_primed": phase.get("primed") if "prime" in str(phase.get("phase")) else None,
    })  # fmt: skip
    delay = ranks.get((g.gid, _KINDS["client_delay"]))
    connect = ranks.get((g.gid, _KINDS["connect"]))
    row["client_delay_p50_ms"] = _at(delay, 0)
    row["client_delay_p99_ms"] = _at(delay, 1)
    row["connections_new"] = int(s.get("connections_new") or 0)
    row["connect_p50_ms"] = _at(connect, 0)
    row["connect_p99_ms"] = _at(connect, 1)
    row["span_share"] = float("nan")
    for part in PATH_PARTS:
        row[f"{part}_mean_s"] = row[f"{part}_p50_s"] = row[f"{part}_p99_s"] = float("nan")
    if paths is not None:  # the run has spans: a group without successful requests has NaN
        row.update(paths.get(g.gid, {}))
    return row, curves


def _implied_pct(s: Mapping[str, Any]) -> float:
    """cachestate.cache_columns' implied share: over the successful requests that report
    cached tokens where any does, else over those with a prompt count."""
    if s.get("implied_only") is None:
        return float("nan")  # no shared prefix, or no prompt count
    both = bool(s.get("both_n"))
    total = _f(s.get("cached_of") if both else s.get("prompt_only"))
    implied = _f(s.get("implied_both") if both else s.get("implied_only"))
    return 100.0 * implied / total if total == total and total > 0 else float("nan")


def _cached_warning(engine: Any) -> list[str]:
    """sessions.cached_tokens_warning over the request table."""
    row = engine.sql(
        "SELECT count(*) FILTER (WHERE is_ok AND prompt_tokens IS NOT NULL) AS total, "
        "count(*) FILTER (WHERE is_ok AND prompt_tokens IS NOT NULL AND cached_tokens IS NOT NULL) "
        "AS n FROM llmload_rq"
    ).to_pylist()[0]
    return cached_tokens_message(int(row["n"]), int(row["total"]))


# -- what the plots, the search and requests.parquet ask -------------------------------------


def _timeline(engine: Any) -> Timeline:
    span = engine.sql(
        "SELECT min(sent) AS t0, max(greatest(sent, done)) AS last, count(*) AS n "
        "FROM llmload_rq WHERE NOT is_dropped"
    ).to_pylist()[0]
    if not span["n"]:
        return Timeline.empty()
    t0, last = int(span["t0"]), int(span["last"])
    width = (max(last, t0 + 1) - t0) / TIMELINE_BINS
    sent_at = engine.sql(
        f"SELECT least(greatest(ceil((sent - {t0}) / {width!r}), 0), {TIMELINE_BINS})::BIGINT "
        "AS i, count(*) AS n FROM llmload_rq WHERE NOT is_dropped GROUP BY ALL"
    ).to_pylist()
    done_at = engine.sql(
        f"SELECT least(greatest(ceil((done - {t0}) / {width!r}), 0), {TIMELINE_BINS})::BIGINT "
        "AS i, count(*) AS n FROM llmload_rq WHERE NOT is_dropped AND done >= 0 GROUP BY ALL"
    ).to_pylist()
    failed = engine.sql(
        f"SELECT least(floor((done - {t0}) / {width!r}), {TIMELINE_BINS - 1})::BIGINT AS i, "
        f"count(*) AS n FROM llmload_rq WHERE NOT is_dropped AND status = 'error' "
        f"AND done >= {t0} AND done <= {max(last, t0 + 1)} GROUP BY ALL"
    ).to_pylist()

    def counts(found: list[dict[str, Any]], size: int) -> np.ndarray:
        out = np.zeros(size, dtype=np.int64)
        for r in found:
            out[int(r["i"])] += int(r["n"])
        return out

    sent_n, done_n = counts(sent_at, TIMELINE_BINS + 1), counts(done_at, TIMELINE_BINS + 1)
    return Timeline(t0, width, np.cumsum(sent_n) - np.cumsum(done_n),
                    counts(failed, TIMELINE_BINS), int(span["n"]))  # fmt: skip


def _ttft_sample(engine: Any, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(send time, TTFT s) of at most about TTFT_SAMPLE requests: those whose id hashes into
    the sample (all of them in a run of fewer)."""
    every = max(1, math.ceil(rows / TTFT_SAMPLE))
    where = f"hash(request_id) % {every} = 0 AND " if every > 1 else ""
    found = engine.sql(
        f"SELECT sent, ttft_s FROM llmload_rq WHERE {where}NOT is_dropped ORDER BY sent"
    )
    sent = found.column("sent").to_numpy().astype(np.int64)
    ttft = found.column("ttft_s").to_numpy(zero_copy_only=False).astype(np.float64)
    return sent, ttft


def _good_counter(engine: Any, checked: bool) -> Callable[[Slo, Window], int | None]:
    """judge.search.goodput_under's count (good, not cold, ended in the window) by `slo`."""

    def count(slo: Slo, window: Window) -> int | None:
        good = good_sql(slo, checked)
        if good is None:
            return None
        row = engine.sql(
            f"SELECT count(*) AS n FROM llmload_rq WHERE NOT cold AND NOT is_dropped AND "
            f"({good}) AND done BETWEEN {window.start_ns} AND {window.end_ns}"
        ).to_pylist()[0]
        return int(row["n"])

    return count


def write_requests(engine: Any, path: Path, slo: Slo, checked: bool) -> None:
    """requests.parquet by the engine (aggregate.PER_REQUEST_COLUMNS, streaming); `checked`:
    StepTable.answers_checked."""
    from analysis.derive.path import PER_REQUEST_COLUMNS as PATH_COLUMNS

    computed = {
        "steady": "q.steady",
        "good": "NULL::BOOLEAN",
        "span": "false",
        **{c: "NULL::DOUBLE" for c in PATH_COLUMNS if c != "span"},
    }
    good = good_sql(slo, checked)
    if good is not None:
        computed["good"] = f"({good})"
    source = "llmload_rg q"
    if _exists(engine, "llmload_path"):  # the run's spans: each request's path
        computed.update({c: f"p.{c}" for c in PATH_COLUMNS})
        source += " LEFT JOIN llmload_path p ON p.r = q.r"
    columns = ", ".join(f"{computed[c]} AS {c}" if c in computed else f"q.{c}"
                        for c in PER_REQUEST_COLUMNS)  # fmt: skip
    engine.con.execute(
        f"COPY (SELECT {columns} FROM {source}) TO {_q(str(path))} "
        "(FORMAT parquet, COMPRESSION zstd)"
    )


# -- sessions ---------------------------------------------------------------------------------

_SESSIONS_SQL: Final = """
CREATE OR REPLACE TABLE llmload_sess AS
WITH m AS (
    SELECT r, session_id, worker_id, step, turn, session_turns, status, tool_calls, e2e_s,
           sent_at_ns, end_ns, wait_ns, prompt_tokens, cached_tokens,
           coalesce(turn_kind, 'user') AS kind,
           {'a': turn IS NULL, 'b': coalesce(turn, 0), 'c': sent_at_ns, 'd': r} AS o
    FROM llmload_rqr WHERE session_id IS NOT NULL AND NOT is_dropped
), s AS (
    SELECT session_id,
           arg_min(r, o) AS first_r, arg_min(worker_id, o) AS worker_id,
           arg_min(step, o) AS step, count(*) AS turns, max(session_turns) AS planned,
           count(*) FILTER (WHERE status = 'ok') AS ok_turns,
           count(*) FILTER (WHERE kind = 'tool_result') AS tool_rounds,
           count(*) FILTER (WHERE kind = 'user') AS user_turns,
           count(*) FILTER (WHERE coalesce(tool_calls, 0) > 0) AS calls,
           bool_or(status = 'error') AS failed,
           bool_or(status IN ('aborted', 'cancelled')) AS broken,
           max(turn) AS last_turn,
           fsum(e2e_s) AS model_s, count(e2e_s) AS model_n,
           bool_or(wait_ns IS NOT NULL) AS wait_known,
           sum(CASE WHEN kind = 'tool_result' THEN coalesce(wait_ns, 0) ELSE 0 END) AS tool_wait,
           sum(CASE WHEN kind = 'user' THEN coalesce(wait_ns, 0) ELSE 0 END) AS think,
           min(sent_at_ns) AS started_at_ns,
           max(CASE WHEN end_ns IS NOT NULL THEN sent_at_ns + end_ns END) AS ended_at_ns,
           sum(prompt_tokens) AS prompt_tokens, sum(cached_tokens) AS cached_tokens
    FROM m GROUP BY session_id
)
SELECT first_r, session_id, worker_id, step::BIGINT AS step, turns::BIGINT AS turns,
       planned::BIGINT AS planned_turns, ok_turns::BIGINT AS ok_turns,
       tool_rounds::BIGINT AS tool_rounds,
       CASE WHEN failed THEN 'error'
            WHEN broken OR coalesce(user_turns < planned, false) OR tool_rounds < calls
                 OR coalesce(last_turn + 1 > turns, false) THEN 'cut'
            ELSE 'complete' END AS status,
       CASE WHEN model_n > 0 THEN model_s END AS model_s,
       CASE WHEN wait_known THEN tool_wait / 1e9 END AS tool_wait_s,
       CASE WHEN wait_known THEN think / 1e9 END AS think_s,
       (ended_at_ns - started_at_ns) / 1e9 AS session_e2e_s,
       started_at_ns, prompt_tokens::BIGINT AS prompt_tokens,
       cached_tokens::BIGINT AS cached_tokens
FROM s
"""
"""One row per session, as analysis/derive/sessions.SessionTable.of defines it (its first turn:
the lowest turn index, then the earliest send), with the row of its first turn (`first_r`)."""


def _sessions(engine: Any) -> bool:
    """Builds `llmload_sess` when the run has sessions; whether it has."""
    row = engine.sql(
        "SELECT count(*) AS n FROM llmload_rq WHERE session_id IS NOT NULL AND NOT is_dropped"
    ).to_pylist()[0]
    if not row["n"]:
        return False
    engine.con.execute(_SESSIONS_SQL)
    return True


def _session_columns(engine: Any) -> dict[int, dict[str, Any]]:
    """sessions.SessionTable.columns of every group: its sessions are those whose first turn
    is among its members; the distributions over the complete ones."""
    counts = {
        int(r["gid"]): r
        for r in engine.sql(
            "SELECT q.gid, count(*) AS n, count(*) FILTER (WHERE s.status = 'complete') AS c, "
            "count(*) FILTER (WHERE s.status = 'error') AS e, "
            "count(*) FILTER (WHERE s.status = 'cut') AS x, "
            "avg(s.turns) FILTER (WHERE s.status = 'complete') AS turns, "
            "favg(s.tool_wait_s) FILTER (WHERE s.status = 'complete') AS tool_wait, "
            "favg(s.think_s) FILTER (WHERE s.status = 'complete') AS think "
            "FROM llmload_sess s JOIN llmload_rg q ON q.r = s.first_r "
            "WHERE q.gid IS NOT NULL AND NOT q.is_dropped GROUP BY q.gid"
        ).to_pylist()
    }
    ranks, _ = _ranks(
        engine,
        "SELECT q.gid, 0 AS k, s.session_e2e_s AS v FROM llmload_sess s JOIN llmload_rg q "
        "ON q.r = s.first_r WHERE NOT q.is_dropped AND s.status = 'complete'",
        {0: np.array([0.5, 0.99])},
    )
    out = {}
    for gid, r in counts.items():
        e2e = ranks.get((gid, 0))
        out[gid] = {
            "sessions": int(r["n"]),
            "sessions_complete": int(r["c"]),
            "sessions_error": int(r["e"]),
            "sessions_cut": int(r["x"]),
            "session_turns_mean": _f(r["turns"]),
            "session_e2e_p50_s": _at(e2e, 0),
            "session_e2e_p99_s": _at(e2e, 1),
            "tool_wait_s_mean": _f(r["tool_wait"]),
            "think_s_mean": _f(r["think"]),
        }
    return out


def _turn_rows(engine: Any) -> list[dict[str, Any]]:
    """sessions.turn_rows over the steady requests of every step, by turn index."""
    counted = "steady AND turn IS NOT NULL AND NOT is_dropped"
    rows = engine.sql(
        f"SELECT turn::BIGINT AS turn, count(*) AS n, "
        f"avg(prompt_tokens) FILTER (WHERE is_ok) AS prompt, "
        f"avg(cached_tokens) FILTER (WHERE is_ok) AS cached, "
        f"sum(cached_tokens) FILTER (WHERE is_ok AND cached_tokens IS NOT NULL "
        f"AND prompt_tokens IS NOT NULL) AS hit, "
        f"sum(prompt_tokens) FILTER (WHERE is_ok AND cached_tokens IS NOT NULL "
        f"AND prompt_tokens IS NOT NULL) AS of "
        f"FROM llmload_rg WHERE {counted} GROUP BY ALL ORDER BY turn"
    ).to_pylist()
    ranks, _ = _ranks(
        engine,
        f"SELECT turn::INTEGER AS gid, 0 AS k, ttft_s AS v FROM llmload_rg "
        f"WHERE {counted} AND is_ok",
        {0: np.array([0.5, 0.99])},
    )
    out = []
    for r in rows:
        ttft = ranks.get((int(r["turn"]), 0))
        of = _f(r["of"])
        out.append({
            "turn": int(r["turn"]),
            "requests": int(r["n"]),
            "ttft_p50_s": _at(ttft, 0),
            "ttft_p99_s": _at(ttft, 1),
            "prompt_tokens_mean": _f(r["prompt"]),
            "cached_tokens_mean": _f(r["cached"]),
            "cache_hit_pct": 100.0 * _f(r["hit"]) / of if of == of and of > 0 else float("nan"),
        })  # fmt: skip
    return out


def write_sessions(engine: Any, path: Path) -> None:
    """sessions.parquet by the engine (sessions.SESSION_COLUMNS, in sessions.csv's order)."""
    from analysis.derive.sessions import SESSION_COLUMNS

    engine.con.execute(
        f"COPY (SELECT {', '.join(SESSION_COLUMNS)} FROM llmload_sess "
        f"ORDER BY started_at_ns, session_id) TO {_q(str(path))} (FORMAT parquet)"
    )


# -- the request path -------------------------------------------------------------------------

_PATH_SQL: Final = """
CREATE OR REPLACE TABLE llmload_path AS
WITH q AS (
    SELECT r, request_id, sent, ttft_s, e2e_s,
           CASE WHEN regexp_full_match(lower(request_id), '[0-9a-f]{32}')
                     AND lower(request_id) <> repeat('0', 32)
                THEN lower(request_id) ELSE substr(sha256(request_id), 1, 32) END AS tid
    FROM llmload_rqr
), t AS (
    SELECT trace_id, min(sr) AS sr FROM llmload_timed GROUP BY trace_id
), n AS (
    SELECT server_request_id AS sid, min(sr) AS sr FROM llmload_timed
    WHERE server_request_id IS NOT NULL GROUP BY ALL
), w AS (
    SELECT q.*, coalesce(t.sr, n1.sr, n2.sr) AS sr
    FROM q LEFT JOIN t ON t.trace_id = q.tid
    LEFT JOIN n n1 ON n1.sid = 'chatcmpl-' || q.request_id
    LEFT JOIN n n2 ON n2.sid = q.request_id
), p AS (
    SELECT w.r, w.ttft_s, w.e2e_s, s.sr IS NOT NULL AS span,
           (s.start_ns - w.sent) / 1e9 AS network_up_s,
           s.queue_s AS server_queue_s, s.prefill_s AS server_prefill_s, s.ttft_s AS st,
           coalesce(s.e2e_s - s.ttft_s, s.decode_s) AS server_decode_s
    FROM w LEFT JOIN llmload_timed s ON s.sr = w.sr
)
SELECT r, span, network_up_s,
       st - coalesce(server_queue_s, 0) - coalesce(server_prefill_s, 0) AS server_other_s,
       server_queue_s, server_prefill_s,
       ttft_s - network_up_s - st AS first_token_delivery_s,
       server_decode_s,
       e2e_s - network_up_s - st - server_decode_s AS tail_s
FROM p
"""
"""Each request's path (analysis/derive/path.request_path): its span by trace id, else by
`gen_ai.request.id` (chatcmpl-<id>, then the id), the earliest where several; its parts in
the same floating-point operations."""


def _path(engine: Any, run: RunData) -> bool:
    """Builds `llmload_path` when the run has spans that time requests; whether it has."""
    from analysis.derive.path import request_spans

    timed = request_spans(run.spans)
    if timed is None:
        return False
    frame = pa.table({
        "sr": pa.array(np.arange(len(timed), dtype=np.int64)),
        "trace_id": pa.array(timed["trace_id"].astype(str).to_numpy(object), pa.string()),
        "server_request_id": pa.array(
            [None if v is None or v != v else str(v) for v in timed["server_request_id"]],
            pa.string(),
        ),
        "start_ns": pa.array(timed["start_ns"].to_numpy(np.int64)),
        **{c: pa.array(pd.to_numeric(timed[c], errors="coerce").to_numpy(np.float64),
                       mask=pd.to_numeric(timed[c], errors="coerce").isna().to_numpy())
           for c in ("queue_s", "prefill_s", "ttft_s", "e2e_s", "decode_s")},
    })  # fmt: skip
    engine.con.register("llmload_timed_arrow", frame)
    engine.con.execute(
        "CREATE OR REPLACE TEMP TABLE llmload_timed AS SELECT * FROM llmload_timed_arrow"
    )
    engine.con.execute(_PATH_SQL)
    return True


def _path_columns(engine: Any) -> dict[int, dict[str, Any]]:
    """path.path_columns' span share and each part's mean, p50 and p99 of every group, over
    its successful requests with a span."""
    spanned = "q.gid IS NOT NULL AND NOT q.is_dropped AND q.is_ok AND p.span"
    values = " UNION ALL ".join(
        f"SELECT q.gid, {k} AS k, p.{part}_s AS v FROM llmload_rg q JOIN llmload_path p "
        f"ON p.r = q.r WHERE {spanned}"
        for k, part in enumerate(PATH_PARTS)
    )
    ranks, stats = _ranks(
        engine, values, {k: np.array([0.5, 0.99]) for k in range(len(PATH_PARTS))}
    )
    share = {
        int(r["gid"]): (int(r["spanned"]), int(r["n"]))
        for r in engine.sql(
            "SELECT q.gid, count(*) FILTER (WHERE p.span) AS spanned, count(*) AS n "
            "FROM llmload_rg q JOIN llmload_path p ON p.r = q.r "
            "WHERE q.gid IS NOT NULL AND NOT q.is_dropped AND q.is_ok GROUP BY q.gid"
        ).to_pylist()
    }
    out: dict[int, dict[str, Any]] = {}
    for gid in {*share, *(key[0] for key in stats)}:
        spanned_n, total = share.get(gid, (0, 0))
        row: dict[str, Any] = {"span_share": spanned_n / total if total else float("nan")}
        for k, part in enumerate(PATH_PARTS):
            q = ranks.get((gid, k))
            n_mean = stats.get((gid, k))
            row[f"{part}_mean_s"] = n_mean[1] if n_mean is not None else float("nan")
            row[f"{part}_p50_s"] = _at(q, 0)
            row[f"{part}_p99_s"] = _at(q, 1)
        out[gid] = row
    return out


# -- what the bootstrap draws (analysis/compare/bootstrap.py) ---------------------------------

BOOTSTRAP_SAMPLE: Final = 100_000
"""At most about this many successful requests of a step are drawn from by the bootstrap of
a run reported out of core (all of them in a smaller step): a seeded sample by a hash of
each request's id, the same for the same seed."""


@dataclass
class DiskStep:
    """One step of a run reported out of core, as the bootstrap resamples it: its successful
    requests in the window (a seeded sample of them when more than BOOTSTRAP_SAMPLE) with
    their per-request latencies, end times and per-token ITL samples, and what each slice of
    its window finished (exact: every request of the run)."""

    requests: int  # the step's successful requests in the window (all, not only the sample)
    values: dict[str, np.ndarray]  # ttft_s, tpot_s, e2e_s per sampled request
    done_ns: np.ndarray  # per sampled request
    itl: tuple[np.ndarray, np.ndarray, np.ndarray]  # (owner: sampled request, value, weight)
    totals: dict[str, np.ndarray]  # rate figure -> what each slice of the window finished


def _slice_expr(column: str, start: int, end: int, slices: int) -> str:
    """The slice of `column` (a time in ns) in the window, as compare.bootstrap._slice_totals
    places it: the edges are numpy's linspace, compared as float64."""
    edges = np.linspace(start, end, slices + 1)
    terms = " + ".join(f"({column}::DOUBLE >= '{float(e)!r}'::DOUBLE)::INTEGER"
                       for e in edges[1:-1])  # fmt: skip
    return terms or "0"


_ITL_OF_SAMPLE_SQL: Final = """
SELECT s.gid, s.o, (c.offset_ns / 1e9 - prev / 1e9) / c.tokens AS v, c.tokens AS w,
       prev IS NULL AS first
FROM (SELECT request_id, offset_ns, tokens,
             lag(offset_ns) OVER (PARTITION BY request_id ORDER BY seq) AS prev
      FROM llmload_chunks WHERE tokens > 0 AND request_id IN (SELECT request_id FROM llmload_bs)) c
JOIN llmload_bs s ON s.request_id = c.request_id
"""
"""The per-token ITL samples of the sampled requests (analysis/derive/metrics.py: a chunk of k
tokens Δ after the previous one, k samples of Δ/k; a first chunk's extra tokens, samples of
0), one worker's parts at a time."""


def bootstrap_steps(
    engine: Any, run: RunData, table: StepTable, slo: Slo, slices: int, seed: int,
    limit: int | None = None,
) -> dict[int, DiskStep]:  # fmt: skip
    """Each step row's DiskStep (by position in `table.rows`), drawn from the engine while it
    still holds the run (engine_steps)."""
    limit = BOOTSTRAP_SAMPLE if limit is None else limit
    steps = [p for p, row in enumerate(table.rows) if row["group"] == "step"]
    if not steps:
        return {}
    listed = ", ".join(map(str, steps))  # a row's gid is its position (engine_steps)
    counts = {int(r["gid"]): int(r["n"]) for r in engine.sql(
        f"SELECT gid, count(*) AS n FROM llmload_rg WHERE gid IN ({listed}) AND is_ok GROUP BY gid"
    ).to_pylist()}  # fmt: skip
    every = {gid: max(1, math.ceil(counts.get(gid, 0) / limit)) for gid in steps}
    share = " ".join(f"WHEN {gid} THEN {k}" for gid, k in every.items())
    pick = (f" AND hash(request_id, {int(seed)}) % (CASE gid {share} END) = 0"
            if any(k > 1 for k in every.values()) else "")  # fmt: skip
    # every step's sample at once; `o`: a request's place among its step's, by end time
    engine.con.execute(
        "CREATE OR REPLACE TEMP TABLE llmload_bs AS SELECT gid, request_id, ttft_s, tpot_s, "
        "e2e_s, done, (row_number() OVER (PARTITION BY gid ORDER BY done, r) - 1)::BIGINT AS o "
        f"FROM llmload_rg WHERE gid IN ({listed}) AND is_ok{pick}"
    )
    sample = engine.sql("SELECT gid, ttft_s, tpot_s, e2e_s, done FROM llmload_bs ORDER BY gid, o")
    parts = []
    for paths in by_folder(run.chunk_paths or []):  # the ITL samples: one pass, every step
        engine.register_parts("chunks", [(paths, run.chunk_filesystem)], view="llmload_chunks")
        parts.append(engine.sql(_ITL_OF_SAMPLE_SQL))
    engine.con.execute("DROP TABLE IF EXISTS llmload_bs")
    # in one order whatever order the engine's threads gave: the resampled means are float
    # sums, the same on every compare of the same runs
    order = [(c, "ascending") for c in ("gid", "o", "v", "w", "first")]
    itl = pa.concat_tables(parts).sort_by(order) if parts else None
    step_of = sample.column("gid").to_numpy().astype(np.int64)
    itl_gid = itl.column("gid").to_numpy().astype(np.int64) if itl is not None else None
    out: dict[int, DiskStep] = {}
    for gid in steps:
        mine = step_of == gid
        values = {
            c: sample.column(c).to_numpy(zero_copy_only=False).astype(np.float64)[mine]
            for c in ("ttft_s", "tpot_s", "e2e_s")
        }
        empty = np.zeros(0)
        itl_arrays = (empty.astype(np.int64), empty, empty)
        if itl is not None and itl_gid is not None and (itl_gid == gid).any():
            at = itl_gid == gid
            owner = itl.column("o").to_numpy().astype(np.int64)[at]
            first = itl.column("first").to_numpy(zero_copy_only=False).astype(bool)[at]
            raw = itl.column("v").to_numpy(zero_copy_only=False).astype(np.float64)[at]
            value = np.where(first, 0.0, raw)
            tokens = itl.column("w").to_numpy().astype(np.float64)[at]
            weight = np.where(first, tokens - 1.0, tokens)
            keep = weight > 0
            itl_arrays = (owner[keep], value[keep], weight[keep])
        done = sample.column("done").to_numpy().astype(np.int64)[mine]
        row = table.rows[gid]
        out[gid] = DiskStep(counts.get(gid, 0), values, done, itl_arrays,
                            _slice_totals(engine, row, slo, slices, table.answers_checked))  # fmt: skip
    return out


def _slice_totals(
    engine: Any, row: Mapping[str, Any], slo: Slo, slices: int, checked: bool
) -> dict[str, np.ndarray]:
    """compare.bootstrap's rate totals of a step: what the run's successful requests (cold
    left out) finished in each slice of the window; input tokens by first-token time."""
    start, end = row.get("window_start_ns"), row.get("window_end_ns")
    if start is None or end is None:
        return {}
    first = "(done - round_even(coalesce(e2e_s - ttft_s, 0.0) * 1e9, 0)::BIGINT)"
    prompt = "coalesce(prompt_tokens::DOUBLE, prompt_tokens_requested::DOUBLE, 0.0)"
    good = good_sql(slo, checked) or "false"
    found = engine.sql(
        f"SELECT 'done' AS t, {_slice_expr('done', start, end, slices)} AS j, "
        f"sum(coalesce(output_tokens, 0))::DOUBLE AS output, count(*)::DOUBLE AS requests, "
        f"count(*) FILTER (WHERE {good})::DOUBLE AS good, 0.0 AS input "
        f"FROM llmload_rq WHERE NOT cold AND is_ok AND done BETWEEN {start} AND {end} GROUP BY ALL "
        f"UNION ALL SELECT 'first', {_slice_expr(first, start, end, slices)}, 0.0, 0.0, 0.0, "
        f"sum({prompt}) FROM llmload_rq WHERE NOT cold AND is_ok "
        f"AND {first} BETWEEN {start} AND {end} GROUP BY ALL"
    ).to_pylist()
    totals = {n: np.zeros(slices) for n in ("output_tokens_per_s", "requests_per_s",
                                            "goodput_requests_per_s", "input_tokens_per_s")}  # fmt: skip
    for r in found:
        j = int(r["j"])
        totals["output_tokens_per_s"][j] += float(r["output"])
        totals["requests_per_s"][j] += float(r["requests"])
        totals["goodput_requests_per_s"][j] += float(r["good"])
        totals["input_tokens_per_s"][j] += float(r["input"])
    return totals
