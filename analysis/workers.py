"""The workers' own health per step: CPU, event-loop lag, stalls, and the requests they touched.

Every worker samples itself (locustfiles/worker/monitor.py): once a second its process CPU% and the
lag of every loop probe in that second (`samples`), and every stall of its event loop of
5 ms or more (`stalls`); each request carries `worker_stall_ns`, the stall time that
overlapped it. Per step window (master clock: worker times corrected by the worker's clock
offset from the manifest) this module gives:

- `worker_cpu_max_pct`: the highest one-second CPU% of any worker in the window;
- `loop_lag_p99_ms`: the highest, over workers, of a worker's loop-lag p99 in the window
  (each worker's probes merged exactly, nearest rank);
- `worker_stalls`: stalls that started in the window, all workers;
- `requests_worker_stalled`: the step's requests that overlapped a stall of their worker.

A worker is saturated in a step when its CPU reached SATURATED_CPU_PERCENT or its loop-lag
p99 reached SATURATED_LAG_MS: the report then warns, naming the worker and the step. Runs
written before schema 1.1 have no samples: the columns are missing, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pandas as pd

from analysis.schema import SATURATED_CPU_PERCENT, STALL_NS
from analysis.stats import weighted_quantiles
from analysis.windows import Window

SATURATED_LAG_MS: Final = STALL_NS / 1e6
"""A worker whose loop-lag p99 in a step is at or above this is saturated."""

HEALTH_COLUMNS: Final = (
    "worker_cpu_max_pct",
    "loop_lag_p99_ms",
    "worker_stalls",
    "requests_worker_stalled",
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
    _per_worker: dict[Window, dict[str, tuple[float, float]]] = field(
        default_factory=dict, repr=False
    )  # per_worker's answers: each window is asked twice (columns, warnings)

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

    def per_worker(self, window: Window) -> dict[str, tuple[float, float]]:
        """worker -> (CPU% max, loop-lag p99 ms) over the samples overlapping `window`."""
        if window in self._per_worker:
            return self._per_worker[window]
        inside = (self.end_ns >= window.start_ns) & (self.start_ns <= window.end_ns)
        out: dict[str, tuple[float, float]] = {}
        for worker in sorted(set(self.worker[inside].tolist())):
            mine = np.flatnonzero(inside & (self.worker == worker))
            lags = np.concatenate([self.lags[i] for i in mine]) if len(mine) else np.array([])
            p99 = float(weighted_quantiles(lags.astype(np.float64), None, [0.99])[0])
            out[worker] = (float(self.cpu[mine].max()), p99 / 1000.0)
        self._per_worker[window] = out
        return out

    def columns(self, window: Window | None, stalled_requests: int | None) -> dict[str, Any]:
        """The HEALTH_COLUMNS of one group row (NaN where nothing was measured)."""
        nan = float("nan")
        row: dict[str, Any] = dict.fromkeys(HEALTH_COLUMNS, nan)
        row["requests_worker_stalled"] = stalled_requests
        if window is None or not self.measured:
            return row
        workers = self.per_worker(window)
        if workers:
            row["worker_cpu_max_pct"] = max(cpu for cpu, _ in workers.values())
            row["loop_lag_p99_ms"] = np.nanmax([lag for _, lag in workers.values()])
        row["worker_stalls"] = int(window.contains(self.stall_at_ns).sum())
        return row

    def warnings(self, name: str, window: Window | None) -> list[str]:
        """One line per worker saturated in the window (the word "saturated" is the flag)."""
        if window is None or not self.measured:
            return []
        out = []
        for worker, (cpu, lag) in self.per_worker(window).items():
            if cpu >= SATURATED_CPU_PERCENT or lag >= SATURATED_LAG_MS:
                out.append(
                    f"{name}: worker {worker} was saturated (CPU max {cpu:.0f}%, loop-lag p99 "
                    f"{lag:.1f} ms): its timings include its own delay, not only the server's; "
                    "add worker processes or lower the load"
                )
        return out
