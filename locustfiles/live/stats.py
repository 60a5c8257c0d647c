"""The master's live statistics: every worker's deltas merged exactly, per step.

Workers gather per-step sketches (locustfiles/live/groups.py) and send deltas with Locust's
reports (locustfiles/live/wiring.py); `LiveStats.merge` adds each to the master's groups,
exactly as if one sketch had seen every request. The local runner observes straight into
the master's LiveStats (no messages).

`snapshot()` is what the web UI tab, the Prometheus endpoint (locustfiles/live/metrics.py)
and the console read; the steps' timeline comes from the run pinned on the Board
(locustfiles/live/board.py, read through `run`). Live figures are for watching a run: the report (analysis/)
stays the exact source of truth; docs/live.md says how they differ. A new run (a new run id
on the board) starts fresh statistics.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import gevent

from locustfiles.live.groups import METRICS, NS, GroupKey, GroupStats, Recorder
from locustfiles.live.sketch import RELATIVE_ACCURACY, Sketch
from locustfiles.request.record import RequestRecord

log = logging.getLogger("llmload.live")

SERIES_INTERVAL_S = 2.0  # one point of the time series this often
SERIES_WINDOW_S = 6.0  # each point covers the reports of the last 6 s (two worker reports)
SERIES_POINTS = 3600  # two hours at 2 s; older points are dropped


class RunView(Protocol):
    """What the live views read of the master's current run (a RunCoordinator)."""

    run_id: str
    options: Any  # ChatOptions
    manifest: Any  # RunManifest: its target says whether the server is simulated
    current: dict[str, Any] | None  # the step being run, as announced to the workers
    finished_at: int | None

    @property
    def staircase(self) -> Any: ...  # Staircase: the timeline, the cold phase, the step left


class LiveStats:
    """The master's merged live statistics (Board.stats).

    `runner`: Locust's runner (its state and its workers); `run`: the run now going (the
    one the master pinned on the Board: its id and staircase), or None."""

    def __init__(self, runner: Any, run: Callable[[], RunView | None]) -> None:
        self.runner = runner
        self.run = run
        self.local = Recorder()  # the local runner's own observations
        self.series: deque[dict[str, Any]] = deque(maxlen=SERIES_POINTS)
        self._sampler: gevent.Greenlet | None = None
        self.reset(None)

    def reset(self, run_id: str | None) -> None:
        self.run_id = run_id
        self.groups: dict[GroupKey, GroupStats] = {}
        self.first_seen: dict[GroupKey, float] = {}
        self.window: deque[tuple[float, Sketch, Sketch, int]] = deque()
        self.series.clear()
        self.started = time.monotonic()
        self.local.take(None)

    # -- input ------------------------------------------------------------------------
    def observe(self, record: RequestRecord) -> None:
        """Local runner: a finished request (merged at the next read)."""
        run_id = self._run_now()
        if run_id is not None and run_id != self.run_id:
            self.reset(run_id)  # what the local recorder held was of the previous run
        self.local.observe(record)

    def _run_now(self) -> str | None:
        run = self.run()
        return run.run_id if run is not None else None

    def merge(self, delta: Any, source: str = "local") -> bool:
        """A worker's delta (`Recorder.take`). False when it is of another run or malformed."""
        self._sync()
        if not isinstance(delta, dict):
            return False
        if self.run_id is not None and delta.get("run") not in (None, self.run_id):
            return False  # a late report of an earlier run
        ttft, tpot, tokens = Sketch(), Sketch(), 0
        try:
            for wire in delta.get("groups") or []:
                kind = "cold" if wire.get("group") == "cold" else "step"
                key: GroupKey = (kind, None if kind == "cold" else int(wire["step"]))
                group = self.groups.get(key)
                if group is None:
                    group = self.groups[key] = GroupStats()
                    self.first_seen[key] = time.time()
                sketches = group.merge_wire(wire)
                tokens += int(wire.get("output_tokens") or 0)
                for metric, into in (("ttft", ttft), ("tpot", tpot)):
                    if metric in sketches:
                        into.merge(sketches[metric])
        except (KeyError, TypeError, ValueError, AttributeError):
            log.warning("llmload: ignored a malformed live report from %s", source)
            return False
        self.window.append((time.monotonic(), ttft, tpot, tokens))
        return True

    def _sync(self) -> None:
        """Fresh statistics for a new run; the local runner's observations merged."""
        run_id = self._run_now()
        if run_id is not None and run_id != self.run_id:
            self.reset(run_id)
        delta = self.local.take(self.run_id)
        if delta is not None:
            self.merge(delta)

    # -- series -----------------------------------------------------------------------
    def sample(self) -> dict[str, Any] | None:
        """One point of the time series over the last SERIES_WINDOW_S (appended)."""
        self._sync()
        now = time.monotonic()
        while self.window and self.window[0][0] < now - SERIES_WINDOW_S:
            self.window.popleft()
        ttft, tpot, tokens = Sketch(), Sketch(), 0
        for _, t1, t2, n in self.window:
            ttft.merge(t1)
            tpot.merge(t2)
            tokens += n
        span = min(SERIES_WINDOW_S, max(now - self.started, SERIES_INTERVAL_S))
        point = {
            "t": round(time.time(), 3),
            "ttft_p50": ttft.quantile(0.5),
            "ttft_p99": ttft.quantile(0.99),
            "tpot_p50": tpot.quantile(0.5),
            "tpot_p99": tpot.quantile(0.99),
            "output_tokens_per_s": tokens / span if self.window else None,  # no report yet
        }
        self.series.append(point)
        return point

    def _sample_forever(self) -> None:
        while True:
            gevent.sleep(SERIES_INTERVAL_S)
            if self.window or getattr(self.runner, "state", None) in ("spawning", "running"):
                self.sample()

    def start_sampler(self) -> None:
        if self._sampler is None or self._sampler.dead:
            self._sampler = gevent.spawn(self._sample_forever)

    def stop_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.kill(block=False)
            self._sampler = None

    # -- output -----------------------------------------------------------------------
    def _timeline(self) -> dict[GroupKey, dict[str, Any]]:
        """(group) -> {concurrency, started_at_ns, ended_at_ns} from the master's staircase."""
        staircase = getattr(self.run(), "staircase", None)
        out: dict[GroupKey, dict[str, Any]] = {}
        if staircase is None:
            return out
        cold = staircase.cold or {}
        if cold.get("started_at_ns"):
            out[("cold", None)] = {"concurrency": 1, **cold}
        for entry in staircase.timeline:
            out[("step", int(entry["step"]))] = entry
        return out

    def _row(self, key: GroupKey, timeline: dict[str, Any] | None, now_ns: int) -> dict[str, Any]:
        group = self.groups.get(key) or GroupStats()
        if timeline and timeline.get("started_at_ns"):
            end = timeline.get("ended_at_ns") or now_ns
            elapsed = max(0.0, (end - timeline["started_at_ns"]) / NS)
            concurrency = int(timeline.get("concurrency") or group.concurrency)
        else:
            elapsed = max(0.0, now_ns / NS - self.first_seen.get(key, now_ns / NS))
            concurrency = group.concurrency
        rate = (lambda n: n / elapsed) if elapsed > 0 else (lambda n: None)
        row: dict[str, Any] = {
            "group": key[0],
            "step": key[1],
            "concurrency": concurrency,
            "rate": (timeline or {}).get("rate"),  # open loop: the intended requests/s
            "actual_concurrency": rate(group.busy_s),
            "requests": group.requests,
            "ok": group.count("ok"),
            "failed": group.count("error"),
            "errors": group.errors(),
            "valid_share": group.valid_share,
        }
        for metric in METRICS:
            row[metric] = group.quantiles(metric)
        row.update(
            {
                "output_tokens": group.output_tokens,
                "input_tokens": group.input_tokens,
                "output_tokens_per_s": rate(group.output_tokens),
                "requests_per_s": rate(group.requests),
                "elapsed_s": round(elapsed, 3),
            }
        )
        return row

    def _keys(self, timeline: dict[GroupKey, dict[str, Any]]) -> list[GroupKey]:
        keys = set(self.groups) | set(timeline)
        return sorted(keys, key=lambda k: (k[0] != "cold", k[1] if k[1] is not None else -1))

    def current(self) -> dict[str, Any]:
        run = self.run()
        staircase = getattr(run, "staircase", None)
        current = getattr(run, "current", None)
        if staircase is None or current is None or staircase.done:
            return {"step": None, "cold": False, "concurrency": 0, "rate": None,
                    "time_left_s": None}  # fmt: skip
        cold = bool(current.get("cold"))
        left: float | None = None
        if not cold and staircase.spawned_at_ns is not None:
            spent = time.time_ns() - staircase.spawned_at_ns
            left = round(max(0.0, (staircase.duration_ns - spent) / NS), 3)
        return {
            "step": None if cold else int(current["step"]),
            "cold": cold,
            "concurrency": int(current.get("concurrency") or 0),
            "rate": current.get("rate"),
            "time_left_s": left,
        }

    def workers(self) -> int:
        clients = getattr(self.runner, "clients", None)
        if clients is None:  # the local runner is its own worker
            return 1
        return sum(1 for c in clients.all if c.state != "missing")

    def snapshot(self) -> dict[str, Any]:
        """Everything live, JSON-able; None where there is no data (never 0)."""
        self._sync()
        timeline = self._timeline()
        now_ns = time.time_ns()
        return {
            "relative_accuracy": RELATIVE_ACCURACY,
            "current": self.current(),
            "workers": self.workers(),
            "steps": [self._row(k, timeline.get(k), now_ns) for k in self._keys(timeline)],
            "series": list(self.series),
        }

    def step_summary(self, step: int) -> dict[str, Any] | None:
        """One step's row as merged so far (None for a step not seen). Workers report every
        ~3 s: a step's row is complete about one report interval after the step ends."""
        self._sync()
        key: GroupKey = ("step", int(step))
        timeline = self._timeline()
        if key not in self.groups and key not in timeline:
            return None
        return self._row(key, timeline.get(key), time.time_ns())

    def export(self) -> list[tuple[GroupKey, GroupStats]]:
        """Every group's merged statistics, cold first (for the Prometheus collector)."""
        self._sync()
        return [(k, self.groups[k]) for k in self._keys({}) if k in self.groups]
