"""A worker's live statistics: per-step sketches and counters of every finished request.

Workers (and the local runner) observe every finished request into a `Recorder`: per step
(and the cold group) DDSketches (locustfiles/live/sketch.py, 1% relative accuracy) of TTFT,
TPOT, per-token ITL, ICL and E2E over ok requests, counts by status and error kind, output
and input tokens. `Recorder.take` hands over what it gathered since the last take as sparse
bins (bounded by groups × metrics × BIN_LIMIT, whatever the request rate) and starts afresh;
`GroupStats.merge_wire` merges them exactly, as if one sketch had seen every request
(the master's side: locustfiles/live/stats.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

import numpy as np

from locustfiles.live.sketch import Sketch
from locustfiles.request.record import RequestRecord

METRICS = ("ttft", "tpot", "itl", "icl", "e2e")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
NS = 1e9

GroupKey = tuple[str, int | None]  # ("cold", None) or ("step", index)
# output events from which a request's intervals are binned by numpy (Sketch.bin_array): the
# Python loop costs 0.2-0.5 µs per event, numpy ~25 µs per request plus ~0.07 µs per event
VECTOR_FROM = 150


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
        if len(offsets) >= VECTOR_FROM:
            self._intervals_vector(offsets, tokens)
            return
        key = self.key  # the same mapping for every sketch
        if tokens.count(1) == len(tokens) > 1:  # one token per event: ITL's samples are ICL's
            gaps = [(b - a) / NS for a, b in zip(offsets, offsets[1:], strict=False)]
            bins = {k: float(n) for k, n in Counter(map(key, gaps)).items()}
            total, value_sum, lo, hi = float(len(gaps)), sum(gaps), min(gaps), max(gaps)
            icl.add_keyed(bins, total, value_sum, lo, hi)
            itl.add_keyed(bins, total, value_sum, lo, hi)
            return
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

    def _intervals_vector(self, offsets: list[int], tokens: list[int]) -> None:
        """`_intervals` by numpy, for requests of many events: the same samples and bins.
        ITL: a token chunk's k samples of (its offset - the previous token chunk's) / k, the
        first token chunk's k-1 samples of 0; chunks without tokens only end ICL intervals."""
        itl, icl = self.sketches["itl"], self.sketches["icl"]
        at = np.array(offsets, dtype=np.int64)
        gaps = np.diff(at) / NS
        icl_bins = icl.bin_array(gaps)
        icl.add_keyed(*icl_bins)
        if len(tokens) == len(offsets) and tokens.count(1) == len(tokens):
            itl.add_keyed(*icl_bins)  # one token per event: ITL's samples are ICL's
            return
        k = np.array(tokens, dtype=np.int64)
        token = k > 0
        at, k = at[token], k[token]
        if len(k):
            itl.add_keyed(*itl.bin_array(np.diff(at) / NS / k[1:], k[1:], float(k[0] - 1)))

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
