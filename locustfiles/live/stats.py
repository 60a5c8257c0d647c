"""Live statistics: per-step sketches on workers, merged exactly on the master.

Workers (and the local runner) observe every finished request into a `Recorder`: per step
(and the cold group) DDSketches (locustfiles/live/sketch.py, 1% relative accuracy) of TTFT, TPOT,
per-token ITL, ICL and E2E over ok requests, counts by status and error kind, output and
input tokens. With every Locust stats report (`report_to_master`, every ~3 s and at stop) a
worker sends what it gathered since the previous report, as sparse bins under the key
`llmload_live`, and starts afresh: a report is bounded by groups × metrics × BIN_LIMIT
bins, whatever the request rate. The master (`worker_report`) merges the bins into its
`LiveStats`, exactly as if one sketch had seen every request. The local runner observes
straight into the master's `LiveStats` (no messages).

`environment.llmload_live.snapshot()` is what the web UI tab, the Prometheus endpoint
(locustfiles/live/metrics.py) and the console read. Live figures are for watching a run:
the report (analysis/) stays the exact source of truth; docs/live.md says how they differ.
A new run (a new coordinator run id) starts fresh statistics.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Protocol

import gevent

from locustfiles.live.sketch import RELATIVE_ACCURACY, Sketch
from locustfiles.request.record import RequestRecord

log = logging.getLogger("llmload.live")

REPORT_KEY = "llmload_live"  # key of a worker's delta in Locust's stats report
MSG_LIVE = "llmload_live"  # worker -> master at test_stop: the last delta (Locust's "stop"
# sends no final stats report; this one arrives before the worker's llmload_finished)
METRICS = ("ttft", "tpot", "itl", "icl", "e2e")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
SERIES_INTERVAL_S = 2.0  # one point of the time series this often
SERIES_WINDOW_S = 6.0  # each point covers the reports of the last 6 s (two worker reports)
SERIES_POINTS = 3600  # two hours at 2 s; older points are dropped
NS = 1e9

GroupKey = tuple[str, int | None]  # ("cold", None) or ("step", index)


class Observer(Protocol):
    """Where a worker puts each finished request: a Recorder, or the local LiveStats."""

    def observe(self, record: RequestRecord) -> None: ...


def group_of(record: RequestRecord) -> GroupKey:
    return ("cold", None) if record.cold else ("step", int(record.step))


class GroupStats:
    """One step's (or the cold group's) sketches and counters; mergeable."""

    __slots__ = ("busy_s", "concurrency", "input_tokens", "key", "outcomes", "output_tokens",
                 "requests", "sketches")  # fmt: skip

    def __init__(self, concurrency: int = 0) -> None:
        self.concurrency = concurrency
        self.sketches: dict[str, Sketch] = {m: Sketch() for m in METRICS}
        self.key = self.sketches["itl"].key_function()
        self.requests = 0
        self.outcomes: dict[str, int] = {}  # "status<TAB>error kind" ("ok<TAB>") -> requests
        self.output_tokens = 0
        self.input_tokens = 0
        self.busy_s = 0.0  # summed request time: / elapsed = mean requests in flight

    # -- worker side ------------------------------------------------------------------
    def observe(self, r: RequestRecord) -> None:
        self.concurrency = int(r.concurrency)
        self.requests += 1
        kind = "" if r.status == "ok" else (r.error_kind or "unknown")
        outcome = f"{r.status}\t{kind}"
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.output_tokens += int(r.output_tokens or 0)
        prompt = r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_requested
        self.input_tokens += int(prompt or 0)
        if r.end_ns is not None:
            self.busy_s += r.end_ns / NS
        if r.status != "ok":
            return  # latency metrics describe ok requests only, as in the report
        s = self.sketches
        if r.first_token_ns is not None:
            s["ttft"].add(r.first_token_ns / NS)
        if r.end_ns is not None:
            s["e2e"].add(r.end_ns / NS)
        out = r.output_tokens
        if out is not None and out >= 2 and r.first_token_ns is not None and r.last_token_ns:
            s["tpot"].add((r.last_token_ns - r.first_token_ns) / NS / (out - 1))
        if len(r.chunk_offsets) > 0:
            self._intervals(r.chunk_offsets, r.chunk_tokens)

    def _intervals(self, offsets: list[int], tokens: list[int]) -> None:
        """ICL: every interval between output events. Per-token ITL (docs/metrics.md): a
        chunk of k tokens Δ after the previous token chunk gives k samples of Δ/k; the first
        token chunk's extra k-1 tokens give samples of 0. Binned per request (fast path)."""
        itl, icl = self.sketches["itl"], self.sketches["icl"]
        key = self.key  # the same mapping for every sketch
        ib: dict[int | None, float] = {}
        cb: dict[int | None, float] = {}
        i_n = i_sum = c_n = c_sum = 0.0
        i_lo = c_lo = float("inf")
        i_hi = c_hi = 0.0
        prev_event = prev_token = -1
        for offset, k in zip(offsets, tokens, strict=False):
            d_key: int | None = None
            if prev_event >= 0:
                d = (offset - prev_event) / NS
                d_key = key(d)
                cb[d_key] = cb.get(d_key, 0.0) + 1
                c_n += 1
                c_sum += d
                if d < c_lo:
                    c_lo = d
                if d > c_hi:
                    c_hi = d
            if k <= 0:
                prev_event = offset
                continue
            if prev_token < 0:
                v, w, v_key = 0.0, k - 1, None
            elif k == 1 and prev_token == prev_event:  # one token per event: v is d
                v, w, v_key = d, 1, d_key
            else:
                v = (offset - prev_token) / NS / k
                w, v_key = k, key(v)
            prev_event = prev_token = offset
            if w <= 0:
                continue
            ib[v_key] = ib.get(v_key, 0.0) + w
            i_n += w
            i_sum += v * w
            if v < i_lo:
                i_lo = v
            if v > i_hi:
                i_hi = v
        icl.add_keyed(cb, c_n, c_sum, c_lo, c_hi)
        itl.add_keyed(ib, i_n, i_sum, i_lo, i_hi)

    @property
    def empty(self) -> bool:
        return self.requests == 0

    def to_wire(self, key: GroupKey) -> dict[str, Any]:
        return {
            "group": key[0],
            "step": key[1],
            "concurrency": self.concurrency,
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "output_tokens": self.output_tokens,
            "input_tokens": self.input_tokens,
            "busy_s": self.busy_s,
            "sketches": {m: s.to_wire() for m, s in self.sketches.items() if s.count > 0},
        }

    # -- master side ------------------------------------------------------------------
    def merge_wire(self, wire: dict[str, Any]) -> dict[str, Sketch]:
        """Add a worker's delta; returns its sketches (for the time series)."""
        delta = {m: Sketch.from_wire(w) for m, w in (wire.get("sketches") or {}).items()}
        for metric, sketch in delta.items():
            if metric in self.sketches:
                self.sketches[metric].merge(sketch)
        self.concurrency = int(wire.get("concurrency") or self.concurrency)
        self.requests += int(wire.get("requests") or 0)
        for outcome, n in (wire.get("outcomes") or {}).items():
            self.outcomes[str(outcome)] = self.outcomes.get(str(outcome), 0) + int(n)
        self.output_tokens += int(wire.get("output_tokens") or 0)
        self.input_tokens += int(wire.get("input_tokens") or 0)
        self.busy_s += float(wire.get("busy_s") or 0.0)
        return delta

    def by_outcome(self) -> list[tuple[str, str, int]]:
        """(status, error kind, requests), sorted; the kind is "" for ok requests."""
        out = []
        for outcome, n in sorted(self.outcomes.items()):
            status, _, kind = outcome.partition("\t")
            out.append((status, kind, n))
        return out

    def count(self, status: str) -> int:
        return sum(n for s, _, n in self.by_outcome() if s == status)

    def errors(self) -> dict[str, int]:
        """Requests that were not ok, by error kind."""
        out: dict[str, int] = {}
        for status, kind, n in self.by_outcome():
            if status != "ok":
                out[kind] = out.get(kind, 0) + n
        return out

    def quantiles(self, metric: str) -> dict[str, float | None]:
        sketch = self.sketches[metric]
        return {name: sketch.quantile(q) for name, q in QUANTILES.items()}


class Recorder:
    """A worker's observations since its last report (what `report_to_master` sends)."""

    def __init__(self) -> None:
        self.groups: dict[GroupKey, GroupStats] = {}

    def observe(self, record: RequestRecord) -> None:
        key = group_of(record)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = GroupStats(int(record.concurrency))
        group.observe(record)

    def take(self, run_id: str | None) -> dict[str, Any] | None:
        """The delta since the last take (None when nothing happened), and start afresh."""
        groups, self.groups = self.groups, {}
        wire = [g.to_wire(k) for k, g in groups.items() if not g.empty]
        return {"run": run_id, "groups": wire} if wire else None


class LiveStats:
    """The master's merged live statistics (environment.llmload_live)."""

    def __init__(self, environment: Any) -> None:
        self.environment = environment
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
        return getattr(getattr(self.environment, "llmload_coordinator", None), "run_id", None)

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
            runner = self.environment.runner
            if self.window or getattr(runner, "state", None) in ("spawning", "running"):
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
        coordinator = getattr(self.environment, "llmload_coordinator", None)
        staircase = getattr(coordinator, "staircase", None)
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
        coordinator = getattr(self.environment, "llmload_coordinator", None)
        staircase = getattr(coordinator, "staircase", None)
        current = getattr(coordinator, "current", None)
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
        clients = getattr(self.environment.runner, "clients", None)
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


# -- wiring into Locust -------------------------------------------------------------------
def setup(environment: Any) -> None:
    """Register the live statistics on an Environment (from chat.setup, at init).

    Master and local runner: `environment.llmload_live` (LiveStats), merged from worker
    reports, and `GET /llmload/metrics` on the web UI. Worker and local runner:
    `environment.llmload_recorder`, what WorkerContext observes each request into.
    """
    from locust.runners import LocalRunner, MasterRunner, WorkerRunner

    runner = environment.runner
    environment.llmload_live = None
    environment.llmload_recorder = None
    if isinstance(runner, MasterRunner | LocalRunner):
        live = LiveStats(environment)
        environment.llmload_live = live
        environment.events.test_start.add_listener(lambda **_: live.start_sampler())
        environment.events.quitting.add_listener(lambda **_: live.stop_sampler())
        if isinstance(runner, LocalRunner):
            environment.llmload_recorder = live
        else:
            environment.events.worker_report.add_listener(
                lambda client_id, data, **_: _on_worker_report(live, client_id, data)
            )
            runner.register_message(
                MSG_LIVE, lambda environment, msg, **_: live.merge(msg.data, msg.node_id)
            )
        if getattr(environment, "web_ui", None) is not None:
            from locustfiles.live.metrics import register_endpoint

            register_endpoint(environment.web_ui, live)
    if isinstance(runner, WorkerRunner):
        recorder = Recorder()
        environment.llmload_recorder = recorder
        environment.events.test_start.add_listener(lambda **_: recorder.take(None))
        environment.events.report_to_master.add_listener(
            lambda client_id, data, **_: _on_report_to_master(environment, recorder, data)
        )
        environment.events.test_stop.add_listener(lambda **_: _send_last(environment, recorder))


def _on_report_to_master(environment: Any, recorder: Recorder, data: dict[str, Any]) -> None:
    parsed = getattr(environment, "parsed_options", None)
    delta = recorder.take(getattr(parsed, "run_id", None))
    if delta is not None:
        data[REPORT_KEY] = delta


def _on_worker_report(live: LiveStats, client_id: str, data: dict[str, Any]) -> None:
    delta = data.get(REPORT_KEY) if isinstance(data, dict) else None
    if delta is not None:
        live.merge(delta, source=client_id)


def _send_last(environment: Any, recorder: Recorder) -> None:
    """Worker, at test_stop (its users stopped, in-flight ones recorded): the last delta."""
    from locust.exception import RPCError

    parsed = getattr(environment, "parsed_options", None)
    delta = recorder.take(getattr(parsed, "run_id", None))
    if delta is None:
        return
    try:
        environment.runner.send_message(MSG_LIVE, delta)
    except RPCError:
        log.warning("llmload: could not send the last live statistics to the master")
