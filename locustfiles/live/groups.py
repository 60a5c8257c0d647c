"""A worker's live statistics: per-step sketches and counters of every finished request.

Workers (and the local runner) observe every finished request into a `Recorder`: per step
(and the cold group) DDSketches (locustfiles/live/sketch.py, 1% relative accuracy) of TTFT,
TTFO (first answer token), TTFR (first reasoning token), TPOT, per-token ITL, ICL and E2E
over ok requests, counts by status and error kind, the answers checked and found invalid
(locustfiles/request/validity.py), output and input tokens. `Recorder.take` hands over what it gathered since the last take as sparse
bins (bounded by groups × metrics × BIN_LIMIT, whatever the request rate) and starts afresh;
`GroupStats.merge_wire` merges them exactly, as if one sketch had seen every request
(the master's side: locustfiles/live/stats.py).
"""

from __future__ import annotations

from array import array
from typing import Any, Protocol

import numpy as np

from locustfiles.live.sketch import Sketch
from locustfiles.request.record import RequestRecord

METRICS = ("ttft", "ttfo", "ttfr", "tpot", "itl", "icl", "e2e")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
NS = 1e9

GroupKey = tuple[str, int | None]  # ("cold", None) or ("step", index)
SCALARS = ("ttft", "ttfo", "ttfr", "e2e", "tpot")  # one value per request
PENDING_EVENTS = 50_000
"""Output events a GroupStats buffers before binning them (~1 ms of numpy, 0.8 MB held)."""


class Observer(Protocol):
    """Where a worker puts each finished request: a Recorder, or the local LiveStats."""

    def observe(self, record: RequestRecord) -> None: ...


def group_of(record: RequestRecord) -> GroupKey:
    return ("cold", None) if record.cold else ("step", int(record.step))


class GroupStats:
    """One step's (or the cold group's) sketches and counters; mergeable.

    A worker's observations are binned in bulk: `observe` appends a request's values to
    columnar buffers (array('d'), array('q'): no Python object per value, nothing for the
    garbage collector), and they go into the sketches by numpy (`Sketch.bin_array`, the same
    bins as one `add` per value) when the sketches are read (`sketches`, `to_wire`,
    `quantiles`) or when PENDING_EVENTS events wait. Per request that is two array
    extensions instead of a DDSketch call per value and a Python loop per event."""

    __slots__ = ("_at", "_counts", "_k", "_scalars", "_sketches", "busy_s", "concurrency",
                 "input_tokens", "invalid", "outcomes", "output_tokens", "requests",
                 "validated")  # fmt: skip

    def __init__(self, concurrency: int = 0) -> None:
        self.concurrency = concurrency
        self._sketches: dict[str, Sketch] = {m: Sketch() for m in METRICS}
        self.requests = 0
        self.outcomes: dict[str, int] = {}  # "status<TAB>error kind" ("ok<TAB>") -> requests
        self.output_tokens = 0
        self.input_tokens = 0
        self.busy_s = 0.0  # summed request time: / elapsed = mean requests in flight
        self.validated = 0  # ok answers checked (output_valid set)
        self.invalid = 0  # ... and found invalid
        # waiting to be binned: TTFT, E2E, TPOT values; every request's output events
        self._scalars: dict[str, array[float]] = {m: array("d") for m in SCALARS}
        self._at: array[int] = array("q")  # event offsets (ns), request after request
        self._k: array[int] = array("q")  # their tokens
        self._counts: array[int] = array("q")  # events per request

    @property
    def sketches(self) -> dict[str, Sketch]:
        """The sketches, every observation binned."""
        self._flush()
        return self._sketches

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
        s = self._scalars
        if r.first_token_ns is not None:
            s["ttft"].append(r.first_token_ns / NS)
        if r.first_answer_ns is not None:
            s["ttfo"].append(r.first_answer_ns / NS)
        if r.first_reasoning_ns is not None:
            s["ttfr"].append(r.first_reasoning_ns / NS)
        if r.output_valid is not None:
            self.validated += 1
            if not r.output_valid:
                self.invalid += 1
        if r.end_ns is not None:
            s["e2e"].append(r.end_ns / NS)
        out = r.output_tokens
        if out is not None and out >= 2 and r.first_token_ns is not None and r.last_token_ns:
            s["tpot"].append((r.last_token_ns - r.first_token_ns) / NS / (out - 1))
        n = len(r.chunk_offsets)
        if n > 0 and len(r.chunk_tokens) == n:
            self._at.extend(r.chunk_offsets)
            self._k.extend(r.chunk_tokens)
            self._counts.append(n)
            if len(self._at) >= PENDING_EVENTS:
                self._flush()

    def _flush(self) -> None:
        """Bin what waits: each scalar metric at once; ICL: every interval between a request's
        output events; per-token ITL (docs/metrics.md): a chunk of k tokens Δ after the
        request's previous token chunk gives k samples of Δ/k, its first token chunk's extra
        k-1 tokens samples of 0."""
        sk = self._sketches
        for metric, values in self._scalars.items():
            if values:
                held = np.maximum(np.frombuffer(values, dtype=np.float64), 0.0)
                sk[metric].add_keyed(*sk[metric].bin_array(held))
                del values[:]
        if not self._counts:
            return
        at = np.frombuffer(self._at, dtype=np.int64)
        k = np.frombuffer(self._k, dtype=np.int64)
        counts = np.frombuffer(self._counts, dtype=np.int64)
        request = np.repeat(np.arange(len(counts)), counts)
        same = request[1:] == request[:-1]  # consecutive events of one request
        gaps = np.diff(at)[same] / NS
        if len(gaps):
            sk["icl"].add_keyed(*sk["icl"].bin_array(gaps))
        token = k > 0
        at, k, request = at[token], k[token], request[token]
        if len(k):
            first = np.ones(len(k), dtype=bool)  # each request's first token chunk
            first[1:] = request[1:] != request[:-1]
            later = ~first[1:]
            spans, weights = np.diff(at)[later], k[1:][later]
            zeros = float((k[first] - 1).sum())
            itl = sk["itl"]
            itl.add_keyed(*itl.bin_array(spans / NS / weights, weights.astype(np.float64), zeros))
        self._at, self._k, self._counts = array("q"), array("q"), array("q")

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
            "validated": self.validated,
            "invalid": self.invalid,
            "sketches": {m: s.to_wire() for m, s in self.sketches.items() if s.count > 0},
        }

    # -- master side ------------------------------------------------------------------
    def merge_wire(self, wire: dict[str, Any]) -> dict[str, Sketch]:
        """Add a worker's delta; returns its sketches (for the time series)."""
        delta = {m: Sketch.from_wire(w) for m, w in (wire.get("sketches") or {}).items()}
        for metric, sketch in delta.items():
            if metric in self._sketches:
                self._sketches[metric].merge(sketch)  # what waits to be binned adds later
        self.concurrency = int(wire.get("concurrency") or self.concurrency)
        self.requests += int(wire.get("requests") or 0)
        for outcome, n in (wire.get("outcomes") or {}).items():
            self.outcomes[str(outcome)] = self.outcomes.get(str(outcome), 0) + int(n)
        self.output_tokens += int(wire.get("output_tokens") or 0)
        self.input_tokens += int(wire.get("input_tokens") or 0)
        self.busy_s += float(wire.get("busy_s") or 0.0)
        self.validated += int(wire.get("validated") or 0)
        self.invalid += int(wire.get("invalid") or 0)
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

    @property
    def valid_share(self) -> float | None:
        """Of the ok answers checked, the share that were valid (None: none checked)."""
        return (self.validated - self.invalid) / self.validated if self.validated else None

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
