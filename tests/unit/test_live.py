"""Live statistics: sketch accounting, exact merging of worker deltas, the snapshot, the
Prometheus endpoint and the Grafana dashboard (locustfiles/live/sketch.py, live.py, live_metrics.py)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import msgpack
import numpy as np
import pandas as pd
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from analysis.derive.metrics import compute_request_metrics
from analysis.derive.stats import weighted_quantiles
from locustfiles.live.board import Board
from locustfiles.live.groups import Recorder
from locustfiles.live.metrics import BUCKETS, EXPORTED, registry_for
from locustfiles.live.sketch import BIN_LIMIT, RELATIVE_ACCURACY, Sketch
from locustfiles.live.stats import LiveStats
from locustfiles.master.staircase import Staircase
from locustfiles.request.record import RequestRecord

ROOT = Path(__file__).parents[2]
MS = 1_000_000


def record(
    rid: str,
    offsets_ms: list[float],
    tokens: list[int],
    *,
    end_ms: float | None = None,
    step: int = 0,
    cold: bool = False,
    status: str = "ok",
    kind: str | None = None,
) -> RequestRecord:
    r = RequestRecord(rid, -1 if cold else step, 1 if cold else 2 ** (step + 1), cold, "D(8,8)",
                      "chat", "m", True, 8, 8, "h")  # fmt: skip
    r.chunk_offsets = [int(o * MS) for o in offsets_ms]
    r.chunk_tokens = list(tokens)
    token_offsets = [o for o, k in zip(r.chunk_offsets, tokens, strict=True) if k > 0]
    r.first_token_ns = token_offsets[0] if token_offsets else None
    r.last_token_ns = token_offsets[-1] if token_offsets else None
    r.end_ns = int((end_ms if end_ms is not None else offsets_ms[-1] + 0.5) * MS)
    r.output_tokens = sum(tokens)
    r.prompt_tokens = 8
    r.status, r.error_kind = status, kind
    return r


def random_records(n: int, seed: int, step: int = 0) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = rng.uniform(5, 400)
        offsets, tokens = [], []
        for _ in range(rng.randint(1, 40)):
            offsets.append(t)
            tokens.append(rng.choice([0, 1, 1, 1, 2, 3]))
            t += rng.expovariate(1 / 15)
        if not any(tokens):
            tokens[-1] = 1
        out.append(record(f"{seed}-{i}", offsets, tokens, step=step))
    return out


def frames(records: list[RequestRecord]) -> tuple[pd.DataFrame, pd.DataFrame]:
    requests = pd.DataFrame([r.row() for r in records])
    chunks = pd.DataFrame(
        [
            {"request_id": r.request_id, "seq": i, "offset_ns": o, "tokens": k}
            for r in records
            for i, (o, k) in enumerate(zip(r.chunk_offsets, r.chunk_tokens, strict=True))
        ]
    )
    return requests, chunks


def within(value: float | None, exact: float) -> bool:
    return value is not None and abs(value - exact) <= RELATIVE_ACCURACY * exact + 1e-12


class FakeRunner:
    state = "running"


def live_env(steps: tuple[int, ...] = (2, 4)) -> tuple[SimpleNamespace, Staircase]:
    staircase = Staircase(steps, 30.0, 1.0, 0, announce=lambda *a: None,
                          finished_requests=lambda: 0)  # fmt: skip
    coordinator = SimpleNamespace(run_id="run-a", staircase=staircase, current=None)
    env = SimpleNamespace(runner=FakeRunner(), board=Board(run=coordinator))  # type: ignore[arg-type]
    return env, staircase


# -- accounting -------------------------------------------------------------------------
def test_handbook_example_and_per_token_itl_weights() -> None:
    # sent 0.0; tokens at 0.8, 0.9, 1.2; end 1.25 (docs/metrics.md)
    rec = Recorder()
    rec.observe(record("a", [800, 900, 1200], [1, 1, 1], end_ms=1250))
    # chunks of 2 then 3 tokens 300 ms apart: 1 sample of 0, then 3 samples of 0.1
    rec.observe(record("b", [800, 1100], [2, 3], end_ms=1150))
    group = rec.groups[("step", 0)]
    itl, icl = group.sketches["itl"], group.sketches["icl"]
    assert itl.count == 2 + 4 and itl.sum == pytest.approx(0.1 + 0.3 + 3 * 0.1)
    assert icl.count == 3 and icl.sum == pytest.approx(0.1 + 0.3 + 0.3)
    assert group.sketches["tpot"].sum == pytest.approx(0.2 + 0.3 / 4)
    assert group.sketches["ttft"].quantile(0.5) == pytest.approx(0.8, rel=RELATIVE_ACCURACY)
    assert group.sketches["e2e"].count == 2 and group.output_tokens == 8

    # the same weights as the report's definition (analysis/derive/metrics.py)
    records = random_records(200, seed=1)
    rec = Recorder()
    for r in records:
        rec.observe(r)
    exact = compute_request_metrics(*frames(records))
    group = rec.groups[("step", 0)]
    for name in ("itl", "icl"):
        samples = getattr(exact, name)
        sketch = group.sketches[name]
        assert sketch.count == pytest.approx(samples.weight.sum())
        assert sketch.sum == pytest.approx(float(np.dot(samples.value_s, samples.weight)))
    tpot = exact.per_request["tpot_s"].dropna()
    assert group.sketches["tpot"].count == len(tpot)


def long_records(n: int, seed: int) -> list[RequestRecord]:
    """Requests of 150 to 600 events (the numpy path): shared reads (equal offsets), bursts
    of sub-microsecond gaps, one token per event or mixed counts, a first chunk of several."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t, offsets, tokens = rng.uniform(5, 400), [], []
        mixed = rng.random() < 0.5
        for _ in range(rng.randint(150, 600)):
            offsets.append(t)
            tokens.append(rng.choice([0, 1, 1, 2, 5]) if mixed else 1)
            t += rng.choice([0.0, 0.0, 1e-4, rng.expovariate(1 / 15)])
        if not any(tokens):
            tokens[-1] = 1
        out.append(record(f"long-{seed}-{i}", offsets, tokens))
    return out


@pytest.mark.parametrize("pending", [10**9, 1_000, 1])
def test_observations_bin_exactly_as_one_add_per_sample(
    pending: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buffered and binned in bulk by numpy (whenever `pending` events wait, and on every
    read): the same bins, counts, zeros, min and max as a sketch given each of the report's
    samples (analysis/derive/metrics.py) by `add`, one at a time."""
    import locustfiles.live.groups as groups

    monkeypatch.setattr(groups, "PENDING_EVENTS", pending)
    records = long_records(30, seed=11) + random_records(300, seed=12)
    rec = Recorder()
    for i, r in enumerate(records):
        rec.observe(r)
        if i == 100:  # a read in the middle: what waited is binned, the rest comes after
            assert rec.groups[("step", 0)].sketches["icl"].count > 0
    group = rec.groups[("step", 0)]
    exact = compute_request_metrics(*frames(records))
    for name in ("itl", "icl"):
        samples = getattr(exact, name)
        reference = Sketch()
        for value, weight in zip(samples.value_s, samples.weight, strict=True):
            reference.add(float(value), float(weight))
        got = group.sketches[name]
        assert got.bins() == reference.bins() and got.count == reference.count > 0
        assert got._dd._zero_count == reference._dd._zero_count > 0
        assert got._dd._min == pytest.approx(reference._dd._min, rel=1e-12, abs=1e-15)
        assert got._dd._max == pytest.approx(reference._dd._max, rel=1e-12)
        assert got.sum == pytest.approx(reference.sum, rel=1e-12)
    per_request = exact.per_request
    for name, column in (("ttft", "ttft_s"), ("e2e", "e2e_s"), ("tpot", "tpot_s")):
        reference = Sketch()
        for value in per_request[column].dropna():
            reference.add(float(value))
        got = group.sketches[name]
        assert got.bins() == reference.bins() and got.count == reference.count > 0
        assert got.sum == pytest.approx(reference.sum, rel=1e-9)


class _SkewedLog:
    """numpy, with a log one unit in the last place off (another machine's log)."""

    def __init__(self, toward: float) -> None:
        self.toward = toward

    def __getattr__(self, name: str) -> object:
        return getattr(np, name)

    def log(self, x: np.ndarray) -> np.ndarray:
        return np.nextafter(np.log(x), self.toward)


@pytest.mark.parametrize("skew", [None, np.inf, -np.inf])
def test_bin_array_keys_values_at_bin_edges_as_key_does(
    skew: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import locustfiles.live.sketch as sketch_module

    if skew is not None:
        monkeypatch.setattr(sketch_module, "np", _SkewedLog(skew))
    sketch = Sketch()
    mapping = sketch._dd._mapping
    key = sketch.key_function()
    edges = [2 ** (n / mapping._multiplier) for n in range(-1000, 400, 7)]
    values = np.array([np.nextafter(e, d) for e in edges for d in (0.0, e, np.inf)] + [0.0, 1e-300])
    weights = np.arange(1, len(values) + 1, dtype=np.float64)
    bins, total, value_sum, lo, hi = sketch.bin_array(values, weights, zeros=2.0)
    want: dict[int | None, float] = {}
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        want[key(v)] = want.get(key(v), 0.0) + w
    want[None] += 2.0
    assert bins == want
    assert total == weights.sum() + 2.0 and (lo, hi) == (0.0, values.max())
    assert value_sum == pytest.approx(float(np.dot(values, weights)))


def test_failed_requests_are_counted_by_kind_not_timed() -> None:
    rec = Recorder()
    rec.observe(record("a", [10, 20], [1, 1]))
    rec.observe(record("b", [10], [1], status="error", kind="http_5xx"))
    rec.observe(record("c", [10], [1], status="cancelled", kind="cancelled"))
    rec.observe(record("d", [5], [1], cold=True))
    step = rec.groups[("step", 0)]
    assert step.requests == 3 and step.count("ok") == 1 and step.count("error") == 1
    assert step.errors() == {"cancelled": 1, "http_5xx": 1}
    assert step.sketches["ttft"].count == 1 and step.sketches["e2e"].count == 1
    assert rec.groups[("cold", None)].requests == 1


def test_merged_worker_deltas_equal_one_sketch_of_everything() -> None:
    records = random_records(300, seed=2) + random_records(200, seed=3, step=1)
    random.Random(4).shuffle(records)
    one, workers = Recorder(), [Recorder(), Recorder()]
    env, _ = live_env()
    live = LiveStats(env.runner, lambda: env.board.run)
    for i, r in enumerate(records):
        one.observe(r)
        workers[i % 2].observe(r)
        if i % 97 == 0:  # reports at arbitrary moments, through Locust's wire format
            for w in workers:
                delta = w.take("run-a")
                if delta is not None:
                    assert live.merge(msgpack.unpackb(msgpack.packb(delta)))
    for w in workers:
        assert live.merge(msgpack.unpackb(msgpack.packb(w.take("run-a"))))
        assert w.take("run-a") is None  # a delta: nothing left once taken

    exact = compute_request_metrics(*frames(records))
    for key, group in one.groups.items():
        merged = live.groups[key]
        assert merged.requests == group.requests and merged.outcomes == group.outcomes
        members = np.asarray([r.step == key[1] for r in records])
        for name in ("ttft", "tpot", "itl", "icl", "e2e"):
            a, b = group.sketches[name], merged.sketches[name]
            assert a.bins() == b.bins() and a.count == b.count
            assert a.sum == pytest.approx(b.sum)
            if name in ("itl", "icl"):
                s = getattr(exact, name).select(members)
                values, weights = s.value_s, s.weight
            else:
                values, weights = exact.per_request[f"{name}_s"].to_numpy()[members], None
            for q in (0.5, 0.9, 0.99):
                # nearest-rank: the sketch's rank convention may pick the neighbour sample
                lo, hi = weighted_quantiles(values, weights, [q - 0.005, q + 0.005])
                value = b.quantile(q)
                assert value is not None
                assert lo * (1 - RELATIVE_ACCURACY) <= value <= hi * (1 + RELATIVE_ACCURACY)


def test_sparse_round_trip_and_bounded_size() -> None:
    s = Sketch()
    rng = np.random.default_rng(5)
    for v in rng.lognormal(-3, 1, 2000):
        s.add(float(v))
    s.add(0.0, 3)
    wire = s.to_wire()
    assert len(wire["k"]) == len(s.bins()) < 1024 and wire["z"] == 3
    t = Sketch.from_wire(msgpack.unpackb(msgpack.packb(wire)))
    assert t.bins() == s.bins() and t.count == s.count and t.sum == pytest.approx(s.sum)
    assert [t.quantile(q) for q in (0.0, 0.5, 0.99)] == [s.quantile(q) for q in (0.0, 0.5, 0.99)]
    assert Sketch().quantile(0.5) is None  # no data is None, never 0
    fast = s.key_function()  # the per-event fast path bins exactly as the library does
    for v in [0.0, 1e-300, *rng.lognormal(-5, 3, 500)]:
        assert fast(float(v)) == s.key(float(v))

    wide = Sketch()
    for exp in np.linspace(-9, 4, 20000):  # 1 ns .. 3 h: more bins than the limit
        wide.add(float(10**exp))
    assert wide.size <= BIN_LIMIT and len(wide.to_wire()["k"]) <= BIN_LIMIT
    assert within(wide.quantile(0.99), float(np.quantile(10 ** np.linspace(-9, 4, 20000), 0.99)))
    with pytest.raises(ValueError):
        Sketch.from_wire({"k": [1, 2], "n": [1.0], "c": 1, "s": 1.0, "lo": 1.0, "hi": 1.0})


# -- the master's view ------------------------------------------------------------------
def test_snapshot_rows_current_step_and_series() -> None:
    env, staircase = live_env()
    live = LiveStats(env.runner, lambda: env.board.run)
    assert live.snapshot()["steps"] == []
    staircase.tick()  # step 0 begins (2 users)
    staircase.on_spawned(2)
    env.board.run.current = {"step": 0, "concurrency": 2, "cold": False}
    for r in random_records(50, seed=6):
        live.observe(r)  # the local runner: no messages
    assert not live.merge({"run": "run-old", "groups": []})  # a late report of another run
    live.sample()
    snap = json.loads(json.dumps(live.snapshot(), allow_nan=False))
    assert snap["relative_accuracy"] == 0.01 and snap["workers"] == 1
    assert snap["current"]["step"] == 0 and snap["current"]["concurrency"] == 2
    assert 29 < snap["current"]["time_left_s"] <= 30
    (row,) = snap["steps"]
    assert row["group"] == "step" and row["step"] == 0 and row["concurrency"] == 2
    assert row["requests"] == row["ok"] == 50 and row["failed"] == 0 and row["errors"] == {}
    assert set(row["ttft"]) == {"p50", "p90", "p99"} and row["ttft"]["p50"] > 0
    assert row["output_tokens"] > 0 and row["output_tokens_per_s"] > 0
    assert row["actual_concurrency"] > 0 and row["elapsed_s"] >= 0
    (point,) = snap["series"]
    assert point["ttft_p50"] > 0 and point["output_tokens_per_s"] > 0
    assert live.step_summary(0)["requests"] == 50 and live.step_summary(7) is None

    # a step with no request yet: None, never 0
    staircase._end_current()
    staircase._begin(1)
    empty = live.snapshot()["steps"][1]
    assert empty["requests"] == 0 and empty["ttft"]["p50"] is None
    # a new run starts fresh
    env.board.run.run_id = "run-b"
    assert live.snapshot()["series"] == [] and live.groups == {}


def test_prometheus_endpoint_histograms_counters_gauges() -> None:
    env, staircase = live_env()
    staircase.tick()
    env.board.run.current = {"step": 0, "concurrency": 2, "cold": False}
    live = LiveStats(env.runner, lambda: env.board.run)
    records = random_records(80, seed=7)
    records.append(record("x", [10], [1], status="error", kind="http_5xx"))
    for r in records:
        live.observe(r)
    text = generate_latest(registry_for(live)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    names = {f.name for f in families.values()}
    assert {"llmload_ttft_seconds", "llmload_requests", "llmload_step"} <= names
    ttft = families["llmload_ttft_seconds"].samples
    buckets = [s for s in ttft if s.name.endswith("_bucket") and s.labels["step"] == "0"]
    assert len(buckets) == len(BUCKETS) + 1
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and counts[-1] == 80  # ok requests only
    exact = [r.first_token_ns / 1e9 for r in records if r.status == "ok"]
    for sample in buckets[:-1]:  # each edge within the sketch's accuracy
        le = float(sample.labels["le"])
        assert (
            sum(v <= le * 0.99 for v in exact) <= sample.value <= sum(v <= le * 1.01 for v in exact)
        )
    requests = {(s.labels["status"], s.labels["error_kind"]): s.value
                for s in families["llmload_requests"].samples}  # fmt: skip
    assert requests == {("ok", ""): 80, ("error", "http_5xx"): 1}
    gauges = {s.name: s.value for f in families.values() for s in f.samples if f.type == "gauge"}
    assert gauges == {"llmload_step": 0, "llmload_concurrency": 2, "llmload_workers": 1}


def test_grafana_dashboard_plots_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "infra" / "grafana" / "llmload-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    variables = dashboard["templating"]["list"]
    exprs += [v["query"] for v in variables if "llmload_" in str(v.get("query"))]
    assert len(exprs) >= 6
    allowed = {f"{n}{suffix}" for n in EXPORTED for suffix in ("", "_bucket", "_sum", "_count")}
    for expr in exprs:
        names = set(re.findall(r"\bllmload_[a-z0-9_]+", expr))
        assert names and names <= allowed, expr
    joined = " ".join(exprs)
    for needed in ("llmload_ttft_seconds_bucket", "llmload_tpot_seconds_bucket",
                   "llmload_output_tokens_total", "llmload_requests_total", "llmload_step",
                   "llmload_concurrency"):  # fmt: skip
        assert needed in joined
