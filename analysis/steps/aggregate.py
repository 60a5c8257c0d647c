"""Per-step statistics: one summary row per step, plus one for the cold-start group.

Which requests count (docs/metrics.md, "Per-step statistics"):

- A step's requests are the non-cold requests tagged with that step whose send time falls in
  the step's steady window; `requests_total` counts every request tagged with the step.
- Dropped arrivals (status `dropped`, rate steps over their cap with `--over-cap drop`) were
  never sent: they count in no request total, rate, latency or throughput, only in
  `requests_dropped` (those dropped inside the window).
- A rate (open-loop) step also reports its achieved send rate (arrivals: a session's later
  turns are not arrivals), how late the generator sent
  (slip = sent_at_ns − intended_ns − queued_ns) and how long arrivals waited for a cap slot.
- Latency distributions (TTFT, TPOT, ITL per token, ICL, E2E) use the successful ones.
- Throughput is time-based: output tokens of non-cold requests whose chunk arrived inside the
  window, successful requests (and good requests) that completed inside it, prompt tokens of
  requests whose first token arrived inside it — each over the window's length.
- The cold group holds the cold requests, over the span from their first send to their last
  response end.
- Sessions (schema 1.3, analysis/derive/sessions.py) count in the group of their first turn.
- Split by model (`by="model"`, `llmload report --by model`): every group above becomes one
  row per model the run asked for (its `model` column), each group's masks narrowed to that
  model's requests; without a split, a run of several models earns a warning.

Every distribution comes from the merged rows of all workers: nothing is averaged across
workers. No data gives NaN (None in JSON), never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from analysis.derive import cachestate, openloop, path, sessions
from analysis.derive.cachestate import step_entry
from analysis.derive.chunkfacts import CURVE_QUANTILES, ChunkFacts, GroupChunks, GroupSpec
from analysis.derive.metrics import RequestMetrics
from analysis.derive.parts import GroupView, Part, RunView
from analysis.derive.path import PER_REQUEST_COLUMNS as PATH_COLUMNS
from analysis.derive.sessions import (
    Sessions,
    SessionTable,
    first_turns,
    turn_rows,
    without_history,
)
from analysis.derive.stats import DistributionSummary, SortedSamples
from analysis.derive.windows import StepPlan, Window, plan_steps, request_span
from analysis.derive.workers import SATURATED_LAG_MS, WorkerHealth, stall_effect, stall_phases
from analysis.kernel.schema import (
    CLIENT_PHASE_COLUMNS_1_4,
    ERROR_KINDS,
    OPEN_LOOP_COLUMNS_1_2,
    SATURATED_CPU_PERCENT,
    SESSION_COLUMNS_1_3,
    WORKER_DELAY_COLUMNS_1_1,
)
from analysis.kernel.slo import Slo, invalid_answers
from analysis.read.clocks import aligned_sent_ns, worker_offsets_ns
from analysis.read.load import RunData

LATENCY_METRICS: Final = ("ttft", "ttfo", "ttfr", "tpot", "itl", "icl", "e2e")
"""Metrics summarised per step; each gets `<metric>_<stat>_s` columns (stats.STATS)."""

FEW_REQUESTS: Final = 30
"""Fewer successful requests than this in a step's window earns a warning."""

HIGH_ERROR_RATE: Final = 0.05
"""A step error rate above this earns a warning."""

PROMPT_OFFSET_FROM: Final = 32
"""Prompts asked for at least this many tokens should come out within PROMPT_OFFSET_MAX."""

PROMPT_OFFSET_MAX: Final = 1.0
"""A step whose prompts (of PROMPT_OFFSET_FROM tokens or more) came out further off the
requested length than this, on average over its successful requests, earns a warning.
Only prompts without history count (the first turn of a session, or a single request): a
later turn's server count includes the earlier turns it resends."""

REPLAYED_PROMPTS: Final = ("dataset:", "conversations:")
"""Scenarios whose prompt lengths llmload did not build (a file's texts, counted without
the chat template): left out of the prompt-length offset."""

ROW_PARTS: Final = (openloop.ROW_PART, sessions.ROW_PART, cachestate.ROW_PART, path.ROW_PART)
"""What the report's sections add to every summary row, in column order, after the columns
of this module (counts, latencies, throughput, tokens, errors, the workers' health): each
declared once in its derive module (analysis/derive/parts.py)."""

PER_REQUEST_COLUMNS: Final = (
    "request_id",
    "worker_id",
    "step",
    "concurrency",
    "scenario",
    "model",
    "status",
    "error_kind",
    "http_status",
    "cold",
    "steady",
    "good",
    "sent_at_ns",
    "ttfe_s",
    "ttft_s",
    "ttfo_s",
    "ttfr_s",
    "tpot_s",
    "e2e_s",
    "itl_mean_s",
    "icl_mean_s",
    "output_tokens_per_s",
    "output_tokens",
    "reasoning_tokens",
    "answer_tokens",
    "output_valid",
    "output_invalid_reason",
    "prompt_tokens",
    "prompt_tokens_requested",
    "max_tokens",
    "chunk_count",
    "chunk_tokens",
    "token_events",
    "multi_token_events",
    "max_event_tokens",
    "output_tokens_source",
    *WORKER_DELAY_COLUMNS_1_1,
    *OPEN_LOOP_COLUMNS_1_2,
    "slip_ms",
    *SESSION_COLUMNS_1_3,
    *CLIENT_PHASE_COLUMNS_1_4,
    *PATH_COLUMNS,
)
"""Columns of requests.parquet / requests.csv, in order: the requests columns analysis reads
and what it computes of each request."""


TIMELINE_BINS: Final = 400
"""Bins of the timeline plot (requests in flight and errors over the run)."""


@dataclass(frozen=True)
class Timeline:
    """Requests in flight at each of TIMELINE_BINS + 1 edges from the run's first send
    (`t0`, ns, `width` ns apart: a request is in flight from the edge its send rounds up to,
    to the edge its end rounds up to) and the failed requests that ended in each bin. The
    same definition in memory (`of`) and in the engine (analysis/steps/outofcore.py)."""

    t0: int
    width: float
    in_flight: np.ndarray
    errors: np.ndarray
    sent: int = 0  # the requests drawn (dropped arrivals were never sent, nor in flight)

    @classmethod
    def empty(cls) -> Timeline:
        return cls(0, 0.0, np.zeros(0, np.int64), np.zeros(0, np.int64))

    @classmethod
    def of(cls, sent: np.ndarray, done: np.ndarray, failed: np.ndarray) -> Timeline:
        """From the sent requests' send and end times (end -1: unknown) and failure flags."""
        if len(sent) == 0:
            return cls.empty()
        t0 = int(sent.min())
        last = max(int(sent.max()), int(done.max()), t0 + 1)
        width = (last - t0) / TIMELINE_BINS

        def edge(t: np.ndarray) -> np.ndarray:
            return np.clip(np.ceil((t - t0) / width), 0, TIMELINE_BINS).astype(np.int64)

        ended = done >= 0
        sent_n = np.bincount(edge(sent), minlength=TIMELINE_BINS + 1)
        done_n = np.bincount(edge(done[ended]), minlength=TIMELINE_BINS + 1)
        bad = failed & (done >= t0) & (done <= last)
        which = np.minimum(np.floor((done[bad] - t0) / width), TIMELINE_BINS - 1).astype(np.int64)
        return cls(t0, width, np.cumsum(sent_n) - np.cumsum(done_n),
                   np.bincount(which, minlength=TIMELINE_BINS), len(sent))  # fmt: skip

    @property
    def edges_s(self) -> np.ndarray:
        """The edges in seconds since `t0`."""
        return np.arange(len(self.in_flight)) * self.width / 1e9


@dataclass
class StepTable:
    """Summary rows (cold group first, then steps in order) and the per-request table."""

    rows: list[dict[str, Any]]
    _per_request: pd.DataFrame | None  # None: in `requests_file` (the engine's path)
    done_ns: np.ndarray | None  # per request: wall-clock end of the response, -1 when unknown
    curves: list[dict[str, np.ndarray]]  # per row: metric -> quantiles at CURVE_QUANTILES
    warnings: list[str] = field(default_factory=list)
    sessions: SessionTable | None = None  # one row per session; None: the run has none
    turns: list[dict[str, Any]] = field(default_factory=list)  # the by-turn table
    sent_ns: np.ndarray | None = None
    """Per request: its send time on the master's clock (`aligned_sent_ns`), computed once
    here for the windows, the steps and the plots; None on the engine's path."""
    timeline: Timeline | None = None  # the plot's bins (made from the arrays when None)
    ttft_sample: tuple[np.ndarray, np.ndarray] | None = None
    """(send time on the master's clock, TTFT s) of the requests the server-metrics plot
    draws: every sent request in memory, a bounded sample on the engine's path."""
    good_in_window: Callable[[Slo, Window], int | None] | None = None
    """The engine's count of good requests ended in a window (judge.search); None in memory."""
    request_rows: int = 0
    answers_checked: bool = False
    """The engine's path: whether any answer of the run was checked (output_valid set), read
    once (outofcore._checked) for every count of good requests."""
    requests_file: Path | None = None  # requests.parquet once written (the engine's path)
    sessions_on_disk: bool = False  # the engine's path: the run has sessions (sessions_file)
    sessions_file: Path | None = None  # sessions.parquet once written (the engine's path)

    @property
    def per_request(self) -> pd.DataFrame:
        """The per-request table; on the engine's path read back from requests.parquet (for
        a library caller: the report itself never holds it)."""
        if self._per_request is None:
            if self.requests_file is None:
                raise ValueError("the per-request table is not written yet (write_tables)")
            self._per_request = pq.read_table(self.requests_file).to_pandas()
        return self._per_request

    @property
    def in_memory(self) -> bool:
        return self.done_ns is not None

    def timeline_bins(self) -> Timeline:
        if self.timeline is None:
            assert self.done_ns is not None and self.sent_ns is not None
            per = self.per_request
            status = per["status"].to_numpy(str)
            sent_rows = status != "dropped"
            self.timeline = Timeline.of(self.sent_ns[sent_rows], self.done_ns[sent_rows],
                                        status[sent_rows] == "error")  # fmt: skip
        return self.timeline

    def ttft_by_send(self) -> tuple[np.ndarray, np.ndarray]:
        if self.ttft_sample is None:
            assert self.sent_ns is not None
            self.ttft_sample = (self.sent_ns, self.per_request["ttft_s"].to_numpy(float))
        return self.ttft_sample

    @property
    def has_sessions(self) -> bool:
        return self.sessions is not None or self.sessions_on_disk

    @property
    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame; integer columns that may be missing are nullable Int64."""
        frame = pd.DataFrame(self.rows)
        for column in (
            "step",
            "good",
            "window_start_ns",
            "window_end_ns",
            "requests_queued",
            "requests_dropped",
            "sessions",
            "sessions_complete",
            "sessions_error",
            "sessions_cut",
        ):
            if column in frame:
                frame[column] = frame[column].astype("Int64")
        if "slo_pass" in frame:
            frame["slo_pass"] = frame["slo_pass"].astype("boolean")
        if "accel_simulated" in frame:  # analysis/derive/energy.py (None: no telemetry)
            frame["accel_simulated"] = frame["accel_simulated"].astype("boolean")
        return frame


@dataclass
class _Arrays:
    """Per-request and per-chunk arrays computed once for every group."""

    sent: np.ndarray
    done: np.ndarray
    first_token_at: np.ndarray
    ok: np.ndarray
    status: np.ndarray
    error_kind: np.ndarray
    prompt_for_rate: np.ndarray
    prompt_requested: np.ndarray  # per request: prompt_tokens_requested, NaN when unknown
    prompt_offset: np.ndarray  # prompt_tokens - prompt_tokens_requested (prompts without
    # history that llmload built), NaN otherwise
    good: np.ndarray | None
    checked: np.ndarray  # the answer was checked (output_valid set)
    invalid: np.ndarray | None  # ...and found invalid; None: no answer of the run was checked
    tokens_source: np.ndarray  # per request: output_tokens_source (None when unknown)
    stall_ns: np.ndarray  # per request: worker_stall_ns, NaN when not measured
    stall_phases: dict[str, np.ndarray]  # per request: stall seconds in its TTFT, decode, E2E
    coalesced: np.ndarray  # per request: coalesced_events, NaN when not recorded
    events: np.ndarray  # per request: SSE events received
    dropped: np.ndarray  # per request: an open-loop arrival dropped at the cap (never sent)
    arrival: np.ndarray  # per request: it is an arrival (a single request or a session's
    # first turn), not a later turn of a session
    workers: tuple[np.ndarray, np.ndarray] | None  # per request: its worker's code; the names
    health: WorkerHealth
    parts: list[Part]  # the run's part of each section's columns (ROW_PARTS, in order)

    def session_table(self) -> SessionTable | None:
        """The run's sessions (schema 1.3), None without."""
        return next((p.table for p in self.parts if isinstance(p, Sessions)), None)


def _worker_codes(req: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """Each request's worker as a code into the workers' names, once for every group."""
    if "worker_id" not in req.columns:
        return None
    codes, names = pd.factorize(req["worker_id"].astype(str))
    return codes, np.asarray(names, dtype=object)


def _float(frame: pd.DataFrame, column: str) -> np.ndarray:
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(np.float64)


def _abs_ns(sent: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """sent + offset in int64 ns; -1 where the offset is missing."""
    have = ~np.isnan(offset)
    return np.where(have, sent + np.where(have, offset, 0).astype(np.int64), -1)


def _arrays(run: RunData, metrics: RequestMetrics, slo: Slo) -> _Arrays:
    req = run.requests
    sent = aligned_sent_ns(req, run.manifest)  # on the master's clock, like the windows
    status = req["status"].astype(str).to_numpy()
    dropped = status == "dropped"
    ok = status == "ok"
    ttft_s = metrics.per_request["ttft_s"].to_numpy(np.float64)
    e2e_s = metrics.per_request["e2e_s"].to_numpy(np.float64)
    view = RunView(run, sent, dropped, ok, ttft_s, e2e_s)
    reported, requested = _float(req, "prompt_tokens"), _float(req, "prompt_tokens_requested")
    history = _float(req, "history_tokens") if "history_tokens" in req else np.zeros(len(req))
    # without the server's count: the new tokens of the turn plus the history it resent
    prompt = np.where(np.isnan(reported), requested + np.nan_to_num(history), reported)
    built = ~req["scenario"].astype(str).str.startswith(REPLAYED_PROMPTS).to_numpy()
    return _Arrays(
        sent=sent,
        done=_abs_ns(sent, _float(req, "end_ns")),
        first_token_at=_abs_ns(sent, _float(req, "first_token_ns")),
        ok=ok,
        status=status,
        error_kind=req["error_kind"].to_numpy(object),
        prompt_for_rate=prompt,
        prompt_requested=requested,
        # prompts llmload built, without history: a file's lengths never counted the chat
        # template, and a later turn's server count includes the turns it resends
        prompt_offset=np.where(built & without_history(req), reported - requested, np.nan),
        good=slo.good(metrics.per_request, ok, invalid_answers(req)),
        checked=req["output_valid"].notna().to_numpy(bool)
        if "output_valid" in req
        else np.zeros(len(req), bool),
        invalid=invalid_answers(req),
        tokens_source=req["output_tokens_source"].to_numpy(object)
        if "output_tokens_source" in req
        else np.full(len(req), None, dtype=object),
        stall_ns=_float(req, "worker_stall_ns")
        if "worker_stall_ns" in req
        else np.full(len(req), np.nan),
        stall_phases=stall_phases(req, run.stalls),
        coalesced=_float(req, "coalesced_events")
        if "coalesced_events" in req
        else np.full(len(req), np.nan),
        events=_float(req, "events") if "events" in req else np.full(len(req), np.nan),
        dropped=dropped,
        arrival=first_turns(req),
        workers=_worker_codes(req),
        health=WorkerHealth.of(run.samples, run.stalls, worker_offsets_ns(run.manifest)),
        parts=[part.make(view) for part in ROW_PARTS],
    )


TOKEN_SOURCE_ORDER: Final = ("events", "tokenizer", "usage")
"""Weakest first: a group reports the weakest per-event token count any of its requests used."""


def weakest_source(sources: np.ndarray) -> str | None:
    """The weakest `output_tokens_source` among `sources` (None when none is known)."""
    present = {str(v) for v in sources if isinstance(v, str)}
    return next((s for s in TOKEN_SOURCE_ORDER if s in present), None)


def _mean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else float("nan")


def _rate(count: float, window: Window | None) -> float:
    if window is None or window.length_s <= 0:
        return float("nan")
    return float(count) / window.length_s


def _schedule_window(
    plan: StepPlan, entry: Mapping[str, Any] | None, arrivals: int
) -> Window | None:
    """A trace replay's step: the part of its window its arrivals were due in. The trace's
    schedule ends at its last row (`arrivals` rows at the step's `rate`, which is rows / the
    replayed span), while the step runs on for its last requests to finish; its achieved
    rate is over the schedule, not the tail. None for every other step (its arrivals are due
    all through the window)."""
    window = plan.window
    if window is None or not plan.rate or not entry or entry.get("arrival") != "trace":
        return None
    end = int(entry["started_at_ns"] + arrivals / plan.rate * 1e9)
    if end >= window.end_ns:
        return None
    return Window(window.start_ns, max(end, window.start_ns), window.source)


def _group_row(
    a: _Arrays,
    run: RunData,
    metrics: RequestMetrics,
    *,
    group: str,
    step: int | None,
    concurrency: int,
    window: Window | None,
    tagged: np.ndarray,
    members: np.ndarray,
    eligible: np.ndarray,
    curves: dict[str, np.ndarray],
    chunk: GroupChunks,
    view: GroupView,
    mode: str | None = None,
    rate: float | None = None,
    dropped_in: np.ndarray | None = None,
    schedule: Window | None = None,
) -> dict[str, Any]:
    """One summary row. `tagged`, `members`: the group's sent requests (dropped arrivals
    excluded), all and those of the window; `eligible`: sent requests whose output may count
    towards the group's throughput (non-cold for steps, cold for the cold group);
    `dropped_in`: a rate step's arrivals dropped inside its window; `schedule`: the part of
    the window its arrivals were due in, when shorter (a trace: _schedule_window). `mode` is
    None for the cold group. `view`: the group as ROW_PARTS see it. `chunk`: what the chunks say of the group (ITL, ICL, tokens in its window).
    Fills `curves` with each latency metric's quantiles at CURVE_QUANTILES."""
    req = run.requests
    latency = members & a.ok  # the successful requests of the window
    dropped = int(dropped_in.sum()) if mode == "rate" and dropped_in is not None else None
    row: dict[str, Any] = {
        "group": group,
        "step": step,
        "concurrency": concurrency,
        "mode": mode,
        "rate": rate,
        "rate_achieved": _rate(float((members & a.arrival).sum()), schedule or window)
        if mode
        else float("nan"),
    }
    row.update(_counts(a, tagged, members, dropped))
    row.update(_latencies(metrics, latency, curves, chunk))
    row.update(_throughput(a, window, members, eligible, chunk.tokens_in_window))
    row.update(_token_means(a, req, metrics.per_request, latency))
    per = metrics.per_request
    tokens, events, multi = (float(np.nansum(per[c].to_numpy(np.float64)[latency]))
                             for c in ("chunk_tokens", "token_events", "multi_token_events"))  # fmt: skip
    most = _max(per["max_event_tokens"].to_numpy(np.float64)[latency])
    row.update(event_token_columns(tokens, events, multi, most))
    row.update(validity_columns(int((latency & a.checked).sum()),
                                int((latency & a.invalid).sum()) if a.invalid is not None else 0))  # fmt: skip
    row.update(_error_kinds(a, members))
    row.update(_token_source(a, latency))
    row.update(_worker_health(a, metrics.per_request, req, window, members, latency))
    for part in a.parts:
        row.update(part.columns(view))
    return row


def _counts(
    a: _Arrays, tagged: np.ndarray, members: np.ndarray, dropped: int | None
) -> dict[str, Any]:
    """How many requests the group holds, by outcome; `dropped`: None but in rate steps."""
    ok = int((members & a.ok).sum())
    failed = int((members & (a.status == "error")).sum())
    return {
        "requests_total": int(tagged.sum()),
        "requests": int(members.sum()),
        "ok": ok,
        "failed": failed,
        "cancelled": int((members & (a.status == "cancelled")).sum()),
        "aborted": int((members & (a.status == "aborted")).sum()),
        "requests_dropped": dropped,
        "error_rate": failed / (ok + failed) if ok + failed else float("nan"),
    }


def _latencies(
    metrics: RequestMetrics,
    latency: np.ndarray,
    curves: dict[str, np.ndarray],
    chunk: GroupChunks,
) -> dict[str, Any]:
    """Each latency metric's summary over the successful requests; its quantiles into `curves`.
    ITL and ICL come from the chunks (`chunk`), the others from the per-request metrics."""
    per = metrics.per_request

    def of_requests(metric: str) -> tuple[DistributionSummary, np.ndarray]:
        ordered = SortedSamples.of(per[f"{metric}_s"].to_numpy(np.float64)[latency])
        return DistributionSummary.of_sorted(ordered), ordered.quantiles(CURVE_QUANTILES)

    return latency_columns(chunk, curves, of_requests)


def latency_columns(
    chunk: GroupChunks,
    curves: dict[str, np.ndarray],
    of_requests: Callable[[str], tuple[DistributionSummary, np.ndarray]],
) -> dict[str, Any]:
    """Each of LATENCY_METRICS' summary columns, its curve into `curves`: ITL and ICL from
    the chunks (`chunk`), the others' (summary, curve) from `of_requests(metric)` (numpy in
    memory, the engine out of core: analysis/steps/outofcore.py)."""
    out: dict[str, Any] = {}
    for metric in LATENCY_METRICS:
        if metric in ("itl", "icl"):
            latency_of = chunk.itl if metric == "itl" else chunk.icl
            summary, curve = latency_of.summary, latency_of.curve
        else:
            summary, curve = of_requests(metric)
        out.update(summary.columns(metric))
        curves[metric] = curve
    return out


def _throughput(
    a: _Arrays,
    window: Window | None,
    members: np.ndarray,
    eligible: np.ndarray,
    tokens_in_window: float,
) -> dict[str, Any]:
    """Rates over the window (time-based: what happened inside it), and the window itself.
    `tokens_in_window`: output tokens of eligible requests that arrived inside it."""
    if window is not None:
        done_in = eligible & window.contains(a.done)
        tokens = tokens_in_window
        completed = float((done_in & a.ok).sum())
        prefilled = eligible & window.contains(a.first_token_at)
        prompt = float(np.nansum(a.prompt_for_rate[prefilled]))
        good = float((done_in & a.good).sum()) if a.good is not None else float("nan")
    else:
        tokens = completed = prompt = good = float("nan")
    return {
        "requests_per_s": _rate(completed, window),
        "output_tokens_per_s": _rate(tokens, window),
        "input_tokens_per_s": _rate(prompt, window),
        "goodput_requests_per_s": _rate(good, window),
        "good": int(a.good[members].sum()) if a.good is not None else None,
        "window_start_ns": window.start_ns if window else None,
        "window_end_ns": window.end_ns if window else None,
        "window_s": window.length_s if window else float("nan"),
        "window_source": window.source if window else None,
    }


def _token_means(
    a: _Arrays, req: pd.DataFrame, per: pd.DataFrame, latency: np.ndarray
) -> dict[str, Any]:
    """Prompt and output lengths asked for and obtained, the output's reasoning and answer
    tokens, over the successful requests (`per`: the per-request metrics)."""
    return {
        "prompt_tokens_requested_mean": _mean(_float(req, "prompt_tokens_requested")[latency]),
        "prompt_tokens_mean": _mean(_float(req, "prompt_tokens")[latency]),
        "prompt_tokens_offset_mean": _mean(np.abs(a.prompt_offset[latency])),
        "output_tokens_requested_mean": _mean(_float(req, "max_tokens")[latency]),
        "output_tokens_mean": _mean(_float(req, "output_tokens")[latency]),
        **reasoning_means(
            _mean(_float(req, "reasoning_tokens")[latency])
            if "reasoning_tokens" in req
            else float("nan"),
            _mean(per["answer_tokens"].to_numpy(np.float64)[latency]),
            int((latency & ~np.isnan(_float(req, "first_reasoning_ns"))).sum())
            if "first_reasoning_ns" in req
            else 0,
        ),
    }


def _max(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.max()) if len(values) else float("nan")


def event_token_columns(tokens: float, events: float, multi: float, most: float) -> dict[str, Any]:
    """How many tokens each output event of a group's successful requests carried (several
    under speculative decoding, or when the server batches tokens into events): the mean,
    the share of events with more than one, and the most one event carried."""
    return {
        "tokens_per_event_mean": tokens / events if events else float("nan"),
        "multi_token_events_pct": 100.0 * multi / events if events else float("nan"),
        "max_event_tokens": most,
    }


def validity_columns(checked: int, invalid: int) -> dict[str, Any]:
    """A group's successful requests whose answers were checked, those found invalid, and
    the valid share (NaN when none was checked)."""
    return {"requests_checked": checked, "requests_invalid": invalid,
            "valid_share": (checked - invalid) / checked if checked else float("nan")}  # fmt: skip


def reasoning_means(reasoning: float, answer: float, reasoned: int) -> dict[str, Any]:
    """A group's reasoning and answer tokens (means over its successful requests) and how many
    of those reasoned (NaN, NaN, 0 for a run written before 1.5)."""
    return {"reasoning_tokens_mean": reasoning, "answer_tokens_mean": answer,
            "requests_reasoning": reasoned}  # fmt: skip


def _error_kinds(a: _Arrays, members: np.ndarray) -> dict[str, Any]:
    """`errors_<kind>` for every known kind, then `errors_other`."""
    kinds = a.error_kind[members]
    kinds = kinds[pd.notna(kinds)].astype(str)
    out: dict[str, Any] = {f"errors_{kind}": int((kinds == kind).sum()) for kind in ERROR_KINDS}
    out["errors_other"] = int((~np.isin(kinds, ERROR_KINDS)).sum())
    return out


def _token_source(a: _Arrays, latency: np.ndarray) -> dict[str, Any]:
    """The weakest per-event token count the successful requests used, and how many counted
    one token per event."""
    return {
        "output_tokens_source": weakest_source(a.tokens_source[latency]),
        "requests_per_event_tokens": int((latency & (a.tokens_source == "events")).sum()),
    }


def senders(
    workers: tuple[np.ndarray, np.ndarray] | None, rows: np.ndarray
) -> frozenset[str] | None:
    """The workers that sent the requests `rows` selects (`workers`: each request's worker as
    a code into the names, `_Arrays.workers`): a group's health (CPU, loop lag, saturation)
    is theirs alone; a worker that sent none of its requests (cut off, idle) cannot have
    disturbed their timings. None where the rows name no worker (every worker's, then)."""
    if workers is None:
        return None
    codes, names = workers
    used = np.bincount(codes[rows], minlength=len(names)) > 0
    return frozenset(names[used].tolist())


def _worker_health(
    a: _Arrays,
    per: pd.DataFrame,
    req: pd.DataFrame,
    window: Window | None,
    members: np.ndarray,
    latency: np.ndarray,
) -> dict[str, Any]:
    """How the workers themselves fared: their load and stalls, what the stalls could have
    moved (per: the per-request metrics), and events read together."""
    measured = ~np.isnan(a.stall_ns)
    stalled = int((members & measured & (a.stall_ns > 0)).sum()) if measured.any() else None
    out = a.health.columns(window, stalled, senders(a.workers, members))
    if stalled is not None:
        ttft, tpot, e2e = (
            per[f"{m}_s"].to_numpy(np.float64)[latency] for m in ("ttft", "tpot", "e2e")
        )
        phases = {phase: seconds[latency] for phase, seconds in a.stall_phases.items()}
        out["stall_moved_pct"], out["stall_moved_figure"] = stall_effect(
            ttft, tpot, e2e, _float(req, "output_tokens")[latency], phases
        )
    counted = latency & ~np.isnan(a.coalesced) & ~np.isnan(a.events)
    total_events = float(a.events[counted].sum())
    out["coalesced_events_pct"] = (
        100.0 * float(a.coalesced[counted].sum()) / total_events if total_events else float("nan")
    )
    return out


BY_CHOICES: Final = ("model",)
"""What the summary rows can be split by (`llmload report --by`)."""


def row_name(row: dict[str, Any]) -> str:
    """`step 2`, `cold-start group`, `step 2 (model a)`: how warnings name a summary row."""
    name = "cold-start group" if row["group"] == "cold" else f"step {row['step']}"
    return f"{name} (model {row['model']})" if "model" in row else name


def _model_masks(req: pd.DataFrame, sent: np.ndarray) -> dict[str | None, np.ndarray]:
    """Each model the sent requests asked for (None: not recorded) -> its requests."""
    if "model" not in req:
        return {None: np.ones(len(req), dtype=bool)}
    column = req["model"]
    missing = column.isna().to_numpy(bool)
    values = column.astype(object).where(~missing, "").astype(str).to_numpy()
    names = sorted(set(values[sent & ~missing]))
    masks: dict[str | None, np.ndarray] = {name: values == name for name in names}
    if (sent & missing).any() or not masks:
        masks[None] = missing
    return masks


def _split(
    groups: list[dict[str, Any]], masks: dict[str | None, np.ndarray]
) -> list[tuple[str | None, dict[str, Any]]]:
    """Each group once per model, its masks narrowed to the model's requests."""
    out = []
    for group in groups:
        for model, mask in masks.items():
            narrowed = {
                key: value & mask if key in _MASKS and value is not None else value
                for key, value in group.items()
            }
            out.append((model, narrowed))
    return out


_MASKS: Final = ("tagged", "members", "eligible", "dropped_in")


def _mixed_models_warning(masks: dict[str | None, np.ndarray]) -> list[str]:
    named = [m for m in masks if m is not None]
    if len(named) < 2:
        return []
    return [
        f"the run asked for {len(named)} models ({', '.join(named)}): every step mixes "
        "their requests; give --by model for one row per step and model"
    ]


def _step_warnings(row: dict[str, Any]) -> list[str]:
    name = row_name(row)
    out = []
    if row["requests"] and row["ok"] == 0:
        out.append(f"{name}: no successful request in the window; its latencies are missing")
    elif 0 < row["ok"] < FEW_REQUESTS and row["group"] != "cold":
        out.append(
            f"{name}: only {row['ok']} successful request(s) in the window; "
            "its high percentiles are weak"
        )
    elif row["requests"] == 0 and row["group"] != "cold":
        out.append(f"{name}: no request was sent in its steady window")
    rate = row["error_rate"]
    if rate == rate and rate > HIGH_ERROR_RATE:
        out.append(f"{name}: error rate {rate:.1%} (latencies describe the survivors only)")
    elif row.get("sessions_error"):
        out.append(
            f"{name}: {row['sessions_error']} of {row['sessions']} session(s) ended in error (a "
            "failed turn ends its session: its later turns were never sent; sessions.csv "
            "names them)"
        )
    if row.get("requests_invalid"):
        out.append(
            f"{name}: {row['requests_invalid']} of {row['requests_checked']} checked answer(s) "
            f"were invalid (valid share {row['valid_share']:.1%}): ok rows that goodput leaves "
            "out; requests.csv output_invalid_reason says why"
        )
    if row.get("output_tokens_source") == "events":
        out.append(
            f"{name}: output tokens of {row['requests_per_event_tokens']} successful request(s) "
            "were counted one per SSE event (output_tokens_source = events: no usage in each "
            "event, no --tokenizer), so ITL and TPOT there are per event (inter-chunk), not "
            "per token; enable continuous usage stats on the server or give --tokenizer"
        )
    return out  # stalls of the workers' loops: graded in analysis/judge/verdict.py


def _prompt_offset_warning(name: str, a: _Arrays, latency: np.ndarray) -> list[str]:
    """A warning when the step's prompts came out more than PROMPT_OFFSET_MAX tokens off the
    requested length on average (those asked for PROMPT_OFFSET_FROM tokens or more)."""
    asked = latency & (a.prompt_requested >= PROMPT_OFFSET_FROM) & ~np.isnan(a.prompt_offset)
    if not asked.any():
        return []
    offset = a.prompt_offset[asked]
    return prompt_offset_warning(name, float(np.abs(offset).mean()), float(offset.mean()),
                                 int(asked.sum()))  # fmt: skip


def prompt_offset_warning(name: str, off: float, mean: float, asked: int) -> list[str]:
    """The warning of a step whose `asked` prompts came out `off` tokens off on average
    (absolute; `mean` signed), when that is more than PROMPT_OFFSET_MAX."""
    if off <= PROMPT_OFFSET_MAX:
        return []
    return [
        f"{name}: prompts came out {off:.1f} tokens off the requested length on average "
        f"(mean {mean:+.1f}; {asked} successful requests of {PROMPT_OFFSET_FROM}+ tokens, "
        "server usage vs prompt_tokens_requested); give --tokenizer with the served model's "
        "tokenizer for exact prompt lengths"
    ]


def judge_slo(row: dict[str, Any], slo: Slo) -> None:
    """A step row's `slo_pass` and `slo_failures` (None and "" for the cold group or without
    objectives)."""
    if row["group"] == "step" and slo.objectives:
        failures = slo.failures(row)
        row["slo_pass"] = not failures
        row["slo_failures"] = "; ".join(failures)
    else:
        row["slo_pass"] = None
        row["slo_failures"] = ""


def orphan_warnings(orphans: int) -> list[str]:
    if not orphans:
        return []
    return [
        f"{orphans} chunk row(s) belong to no request row (a requests part is missing?); they "
        "are left out of every statistic"
    ]


def _new(curves: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    curves.append({})
    return curves[-1]


def aggregate_steps(
    run: RunData,
    metrics: RequestMetrics,
    slo: Slo,
    facts: ChunkFacts,
    by: str | None = None,
    saturation: tuple[float, float] = (SATURATED_CPU_PERCENT, SATURATED_LAG_MS),
) -> StepTable:
    """Summary rows for the cold group (when present) and every step, plus per-request flags.
    `facts`: what the chunks say of each group (in memory or out of core: chunkfacts.py);
    `by`: "model" splits every row by the model asked for (BY_CHOICES), None: no split;
    `saturation`: the CPU% and loop-lag p90 (ms) at which a worker is saturated."""
    req = run.requests
    a = _arrays(run, metrics, slo)
    plans, warnings = plan_steps(run.manifest, req, a.done, a.sent)
    sent_rows = ~a.dropped  # dropped arrivals were never sent: out of every count but one
    cold = req["cold"].to_numpy(bool) & sent_rows
    step_col = req["step"].to_numpy(np.int64)
    n = len(req)
    steady = np.zeros(n, dtype=bool)
    rows: list[dict[str, Any]] = []
    curves: list[dict[str, np.ndarray]] = []
    groups: list[dict[str, Any]] = []  # each row's _group_row arguments, chunks asked at once

    if cold.any():
        cold_start = run.manifest.get("cold_start") or {}
        concurrency = cold_start.get("concurrency")
        if concurrency is None:
            concurrency = int(req["concurrency"].to_numpy(np.int64)[cold].max())
        window = request_span(a.sent[cold], a.done[cold], "cold")
        groups.append({"group": "cold", "step": None, "concurrency": int(concurrency),
                       "window": window, "tagged": cold, "members": cold, "eligible": cold})  # fmt: skip
    not_cold = ~req["cold"].to_numpy(bool)
    for plan in plans:
        tagged = not_cold & sent_rows & (step_col == plan.step)
        in_window = plan.window.contains(a.sent) if plan.window else np.zeros(n, bool)
        members = tagged & in_window
        dropped_in = not_cold & a.dropped & (step_col == plan.step) & in_window
        steady |= members | dropped_in
        schedule = _schedule_window(plan, step_entry(run.manifest, plan.step),
                                    int((not_cold & a.arrival & (step_col == plan.step)).sum()))  # fmt: skip
        groups.append({"group": "step", "step": plan.step, "concurrency": plan.concurrency,
                       "window": plan.window, "tagged": tagged, "members": members,
                       "eligible": not_cold & sent_rows, "mode": plan.mode, "rate": plan.rate,
                       "dropped_in": dropped_in, "schedule": schedule})  # fmt: skip
    masks = _model_masks(req, sent_rows)
    if by is None:
        warnings.extend(_mixed_models_warning(masks))
        split: list[tuple[str | None, dict[str, Any]]] = [("", g) for g in groups]
    elif by == "model":
        split = _split(groups, masks)
    else:
        raise ValueError(f"by must be one of {BY_CHOICES} or None, not {by!r}")
    windows: list[Window | None] = [g["window"] for _, g in split]
    populations = [g["members"] for _, g in split]  # per row: its requests
    specs = [GroupSpec(g["members"] & a.ok, g["window"], g["eligible"]) for _, g in split]
    chunks = facts.groups(specs, a.sent)
    views = [
        GroupView(g["members"], a.ok, step_entry(run.manifest, g["step"]), g.get("mode") == "rate")
        for _, g in split
    ]
    for (model, group), chunk, view in zip(split, chunks, views, strict=True):
        row = _group_row(a, run, metrics, curves=_new(curves), chunk=chunk, view=view, **group)
        if by is not None:  # the split's key right after the group's kind
            row = {"group": row.pop("group"), by: model, **row}
        rows.append(row)

    for row, window, population, view in zip(rows, windows, populations, views, strict=True):
        warnings.extend(_step_warnings(row))
        name = row_name(row)
        if row["group"] == "step":
            warnings.extend(_prompt_offset_warning(name, a, population & a.ok))
        warnings.extend(
            a.health.warnings(name, window, *saturation, senders(a.workers, population))
        )
        for part in a.parts:
            warnings.extend(part.warnings(name, row, view))
        judge_slo(row, slo)
    for part in a.parts:
        warnings.extend(part.run_warnings())
    warnings.extend(orphan_warnings(facts.orphan_chunks))

    per = pd.concat(
        [req.reset_index(drop=True), metrics.per_request.reset_index(drop=True)], axis=1
    )
    per["steady"] = steady
    for part in a.parts:
        for column, values in part.per_request().items():
            per[column] = values
    per["good"] = pd.array(a.good, dtype="boolean") if a.good is not None else pd.NA
    per["good"] = per["good"].astype("boolean")
    per = per[list(PER_REQUEST_COLUMNS)]
    table = a.session_table()
    turns = turn_rows(per) if table is not None else []
    return StepTable(rows, per, a.done, curves, warnings, table, turns, a.sent)
