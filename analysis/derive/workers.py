"""The workers' own health per step: CPU, event-loop lag, stalls, and the requests they touched.

Every worker samples itself (locustfiles/worker/monitor.py): once a second its process CPU% and the
lag of every loop probe in that second (`samples`), and every stall of its event loop of
5 ms or more (`stalls`); each request carries `worker_stall_ns`, the stall time that
overlapped it. Per step window (master clock: worker times corrected by the worker's clock
offset from the manifest) this module gives:

- `worker_cpu_max_pct`: the highest one-second CPU% of any worker in the window;
- `loop_lag_p99_ms`, `loop_lag_p90_ms`: the highest, over workers, of a worker's loop-lag
  p99 and p90 in the window (each worker's probes merged exactly, nearest rank);
- `worker_stalls`: stalls that started in the window, all workers;
- `requests_worker_stalled`: the step's requests that overlapped a stall of their worker.

A worker is saturated in a step when its CPU reached SATURATED_CPU_PERCENT or its loop-lag
p90 reached SATURATED_LAG_MS (its loop was late for a tenth of the step, not once: a single
hiccup, such as the event sink's periodic encoding holding the loop a few ms, shows in the
p99 but is judged by what it could move, analysis/judge/verdict.py): the report then warns,
naming the worker and the step (both limits are `--validity` options). Runs
written before schema 1.1 have no samples: the columns are missing, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pandas as pd

from analysis.derive.stats import weighted_quantiles
from analysis.derive.windows import Window
from analysis.kernel.schema import SATURATED_CPU_PERCENT, STALL_NS

SATURATED_LAG_MS: Final = STALL_NS / 1e6
"""A worker whose loop-lag p90 in a step is at or above this is saturated."""

HEALTH_COLUMNS: Final = (
    "worker_cpu_max_pct",
    "loop_lag_p99_ms",
    "loop_lag_p90_ms",
    "worker_stalls",
    "requests_worker_stalled",
    "stall_moved_pct",
    "stall_moved_figure",
)
"""Summary columns this module adds to every step row (docs/reports.md)."""


@dataclass
class WorkerHealth:
    """The workers' samples and stalls on the master's clock, ready to cut by window."""

    worker: np.ndarray  # per sample
    start_ns: np.ndarray  # per sample: start of its interval
    end_ns: np.ndarray  # per sample: end of its interval
    cpu: np.ndarray  # per sample
    lags: list[np.ndarray]  # per sample: its probes' lags, microseconds
    stall_worker: np.ndarray
    stall_at_ns: np.ndarray
    measured: bool  # any sample at all (a run written before schema 1.1 has none)
    _per_worker: dict[
        tuple[Window, frozenset[str] | None], dict[str, tuple[float, float, float]]
    ] = field(default_factory=dict, repr=False)  # per_worker's answers: each is asked twice

    @classmethod
    def of(
        cls,
        samples: pd.DataFrame | None,
        stalls: pd.DataFrame | None,
        offsets_ns: dict[str, int],
    ) -> WorkerHealth:
        samples = samples if samples is not None else pd.DataFrame()
        stalls = stalls if stalls is not None else pd.DataFrame()
        if len(samples):
            worker = samples["worker_id"].astype(str).to_numpy()
            shift = np.array([offsets_ns.get(w, 0) for w in worker], dtype=np.int64)
            end = samples["at_ns"].to_numpy(np.int64) - shift
            start = end - samples["interval_ns"].to_numpy(np.int64)
            cpu = samples["cpu_percent"].to_numpy(np.float64)
            lags = [np.asarray(v, dtype=np.int64) for v in samples["loop_lag_us"]]
        else:
            worker = np.array([], dtype=object)
            start = end = np.array([], dtype=np.int64)
            cpu = np.array([], dtype=np.float64)
            lags = []
        if len(stalls):
            stall_worker = stalls["worker_id"].astype(str).to_numpy()
            shift = np.array([offsets_ns.get(w, 0) for w in stall_worker], dtype=np.int64)
            stall_at = stalls["started_at_ns"].to_numpy(np.int64) - shift
        else:
            stall_worker = np.array([], dtype=object)
            stall_at = np.array([], dtype=np.int64)
        return cls(worker, start, end, cpu, lags, stall_worker, stall_at, bool(len(samples)))

    def per_worker(
        self, window: Window, senders: frozenset[str] | None = None
    ) -> dict[str, tuple[float, float, float]]:
        """worker -> (CPU% max, loop-lag p99 ms, loop-lag p90 ms) over the samples
        overlapping `window`; only the workers in `senders` (those whose requests the group
        holds: a worker that sent none of them cannot have disturbed their timings) where
        given."""
        key = (window, senders)
        if key in self._per_worker:
            return self._per_worker[key]
        inside = (self.end_ns >= window.start_ns) & (self.start_ns <= window.end_ns)
        out: dict[str, tuple[float, float, float]] = {}
        present = set(self.worker[inside].tolist())
        for worker in sorted(present if senders is None else present & senders):
            mine = np.flatnonzero(inside & (self.worker == worker))
            lags = np.concatenate([self.lags[i] for i in mine]) if len(mine) else np.array([])
            p99, p90 = weighted_quantiles(lags.astype(np.float64), None, [0.99, 0.90])
            out[worker] = (float(self.cpu[mine].max()), float(p99) / 1000.0, float(p90) / 1000.0)
        self._per_worker[key] = out
        return out

    def columns(
        self,
        window: Window | None,
        stalled_requests: int | None,
        senders: frozenset[str] | None = None,
    ) -> dict[str, Any]:
        """The HEALTH_COLUMNS of one group row (NaN where nothing was measured); CPU and
        loop lag of the `senders` only, where given (see per_worker)."""
        nan = float("nan")
        row: dict[str, Any] = dict.fromkeys(HEALTH_COLUMNS, nan)
        row["requests_worker_stalled"] = stalled_requests
        row["stall_moved_figure"] = None
        if window is None or not self.measured:
            return row
        workers = self.per_worker(window, senders)
        if workers:
            row["worker_cpu_max_pct"] = max(cpu for cpu, _, _ in workers.values())
            row["loop_lag_p99_ms"] = np.nanmax([lag for _, lag, _ in workers.values()])
            row["loop_lag_p90_ms"] = np.nanmax([lag for _, _, lag in workers.values()])
        row["worker_stalls"] = int(window.contains(self.stall_at_ns).sum())
        return row

    def warnings(
        self,
        name: str,
        window: Window | None,
        cpu_limit: float = SATURATED_CPU_PERCENT,
        lag_limit: float = SATURATED_LAG_MS,
        senders: frozenset[str] | None = None,
    ) -> list[str]:
        """One line per worker saturated in the window (the word "saturated" is the flag);
        of the `senders` only, where given (see per_worker)."""
        if window is None or not self.measured:
            return []
        out = []
        for worker, (cpu, p99, p90) in self.per_worker(window, senders).items():
            if cpu >= cpu_limit or p90 >= lag_limit:
                out.append(
                    f"{name}: worker {worker} was saturated (CPU max {cpu:.0f}%, loop-lag p90 "
                    f"{p90:.1f} ms, p99 {p99:.1f} ms): its timings include its own delay, not "
                    "only the server's; add worker processes or lower the load"
                )
        return out


STALL_FIGURES: Final = tuple(f"{m}_{s}" for m in ("ttft", "tpot", "e2e") for s in ("p50", "p99"))
"""The reported figures a stall's effect is bounded for (stall_moved_pct)."""


def stall_phases(requests: pd.DataFrame, stalls: pd.DataFrame | None) -> dict[str, np.ndarray]:
    """Per request: seconds of its own worker's loop stalls within each phase its figures
    measure: `ttft` (send → first token), `decode` (first → last token), `e2e` (send → end).

    From the `stalls` table (each stall's start and length, the worker's clock, like the
    request's send time). Where a request overlapped a stall (`worker_stall_ns > 0`) whose
    worker has no stall rows (a part lost), each phase gets the request's whole overlap (the
    safe side); NaN where stalls were not measured."""
    n = len(requests)
    whole = (
        pd.to_numeric(requests["worker_stall_ns"], errors="coerce").to_numpy(np.float64)
        if "worker_stall_ns" in requests
        else np.full(n, np.nan)
    )
    out = {phase: np.where(whole > 0, whole / 1e9, whole) for phase in ("ttft", "decode", "e2e")}
    hit = np.flatnonzero(whole > 0)
    if not len(hit) or stalls is None or not len(stalls):
        return out
    sent = requests["sent_at_ns"].to_numpy(np.int64)[hit].astype(np.float64)

    def at(column: str) -> np.ndarray:
        return sent + pd.to_numeric(requests[column], errors="coerce").to_numpy(np.float64)[hit]

    first, last, end = at("first_token_ns"), at("last_token_ns"), at("end_ns")
    workers = requests["worker_id"].astype(str).to_numpy()[hit]
    stall_worker = stalls["worker_id"].astype(str).to_numpy()
    for worker in np.unique(workers):
        own = stall_worker == worker
        if not own.any():
            continue
        starts = stalls["started_at_ns"].to_numpy(np.int64)[own].astype(np.float64)
        lengths = stalls["length_ns"].to_numpy(np.int64)[own].astype(np.float64)
        order = np.argsort(starts)
        starts, lengths = starts[order], lengths[order]
        before = np.concatenate([[0.0], np.cumsum(lengths)])  # stall time before stall i

        def stalled_by(t: np.ndarray, starts: np.ndarray = starts, lengths: np.ndarray = lengths,
                       before: np.ndarray = before) -> np.ndarray:  # fmt: skip
            """Stall time of this worker before each time `t` (stalls do not overlap)."""
            k = np.searchsorted(starts, t, side="right")  # stalls started by t
            last_one = np.clip(k - 1, 0, len(starts) - 1)
            partial = np.clip(t - starts[last_one], 0.0, lengths[last_one])
            return np.where(k > 0, before[np.maximum(k - 1, 0)] + partial, 0.0)

        mine = workers == worker
        idx = hit[mine]
        s0 = stalled_by(sent[mine])
        for phase, (a, b) in {"ttft": (s0, first[mine]), "decode": (None, last[mine]),
                              "e2e": (s0, end[mine])}.items():  # fmt: skip
            lo = stalled_by(first[mine]) if a is None else a
            span = (stalled_by(b) - lo) / 1e9
            out[phase][idx] = np.where(np.isnan(b), out[phase][idx], np.maximum(span, 0.0))
    return out


def stall_effect(
    ttft_s: np.ndarray, tpot_s: np.ndarray, e2e_s: np.ndarray, output_tokens: np.ndarray,
    stalled: dict[str, np.ndarray],
) -> tuple[float, str | None]:  # fmt: skip
    """How far the stalls of their own workers could have moved a step's percentiles, at most:
    (largest relative change in percent, the figure it is of, e.g. "ttft_p99").

    Arrays hold the step's successful requests; `stalled` their stall seconds per phase
    (stall_phases). Event times come from the kernel, but a stall can still delay a recorded
    time by its length (bytes read together after it take the time of the last), so a request
    could at most owe its TTFT the stall time inside its TTFT, its E2E the stall time inside
    it, and its TPOT the stall time between its first and last token over its tokens − 1.
    Each figure is recomputed with every stalled request freed of that much (the best case
    the stalls could have spoilt): the percentile moves no further than that, whatever the
    stalls did (percentiles only fall when values fall). 0.0 when no request overlapped a
    stall; NaN when stalls were not measured."""
    if np.isnan(stalled["e2e"]).all():
        return float("nan"), None
    if not (np.nan_to_num(stalled["e2e"]) > 0).any():
        return 0.0, None
    ttft_stall, decode_stall, e2e_stall = (
        np.nan_to_num(stalled[p], nan=0.0) for p in ("ttft", "decode", "e2e")
    )
    spread = decode_stall / np.maximum(np.nan_to_num(output_tokens, nan=1.0) - 1.0, 1.0)
    freed = {
        "ttft": (ttft_s, np.maximum(ttft_s - ttft_stall, 0.0)),
        "tpot": (tpot_s, np.maximum(tpot_s - spread, 0.0)),
        "e2e": (e2e_s, np.maximum(e2e_s - e2e_stall, 0.0)),
    }
    worst, figure = 0.0, None
    for name in STALL_FIGURES:
        metric, stat = name.split("_")
        seen, best = freed[metric]
        q = [0.5] if stat == "p50" else [0.99]
        before = float(weighted_quantiles(seen, None, q)[0])
        after = float(weighted_quantiles(best, None, q)[0])
        if before > 0 and np.isfinite(before) and np.isfinite(after):
            moved = 100.0 * (before - after) / before
            if moved > worst:
                worst, figure = moved, name
    return worst, figure
