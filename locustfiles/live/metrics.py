"""`GET /llmload/metrics`: the master's live statistics in Prometheus' text format
(`GET BASE/llmload/metrics` with Locust's `--web-base-path BASE`).

A custom collector (its own CollectorRegistry, never the global one) reads the merged
sketches of `LiveStats` (locustfiles/live/stats.py) at each scrape:

    llmload_ttft_seconds, llmload_tpot_seconds,    histograms, label step ("cold", "0", ...):
    llmload_itl_seconds, llmload_e2e_seconds       cumulative counts at BUCKETS, _sum, _count
    llmload_requests_total{status,error_kind}      counter (error_kind "" for ok requests)
    llmload_output_tokens_total                    counter
    llmload_step, llmload_concurrency,             gauges: current step (-1 cold, NaN none),
    llmload_workers                                target users, connected workers

Bucket counts come from the sketch's bins: an edge is as fuzzy as the sketch (1%). Counts
start again from zero with each run (Prometheus' rate() treats that as a counter reset).
Grafana: infra/grafana/llmload-dashboard.json; docs/live.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

if TYPE_CHECKING:
    from locustfiles.live.groups import GroupKey
    from locustfiles.live.stats import LiveStats

PATH = "/llmload/metrics"
BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
HISTOGRAMS = {
    "ttft": "Time to first token (s), ok requests",
    "tpot": "Time per output token after the first (s), ok requests",
    "itl": "Inter-token latency per token (s): a chunk of k tokens gives k samples",
    "e2e": "End-to-end request time (s), ok requests",
}
EXPORTED = (
    *(f"llmload_{m}_seconds" for m in HISTOGRAMS),
    "llmload_requests_total",
    "llmload_output_tokens_total",
    "llmload_step",
    "llmload_concurrency",
    "llmload_workers",
)
"""Every metric name the endpoint exports (the dashboard's test checks against it)."""


def step_label(key: GroupKey) -> str:
    return "cold" if key[0] == "cold" else str(key[1])


class LiveCollector:
    """prometheus_client collector over a LiveStats (read at each scrape)."""

    def __init__(self, live: LiveStats) -> None:
        self.live = live

    def collect(self) -> Iterator[Metric]:
        groups = self.live.export()
        for metric, help_text in HISTOGRAMS.items():
            family = HistogramMetricFamily(f"llmload_{metric}_seconds", help_text, labels=["step"])
            for key, group in groups:
                sketch = group.sketches[metric]
                counts = sketch.cumulative(BUCKETS)
                buckets = [(_le(b), c) for b, c in zip(BUCKETS, counts, strict=True)]
                buckets.append(("+Inf", sketch.count))
                family.add_metric([step_label(key)], buckets, sketch.sum)
            yield family
        requests = CounterMetricFamily(
            "llmload_requests", "Finished requests by status and error kind",
            labels=["status", "error_kind"],
        )  # fmt: skip
        totals: dict[tuple[str, str], int] = {}
        tokens = 0
        for _, group in groups:
            for status, kind, n in group.by_outcome():
                totals[(status, kind)] = totals.get((status, kind), 0) + n
            tokens += group.output_tokens
        for (status, kind), n in sorted(totals.items()):
            requests.add_metric([status, kind], n)
        yield requests
        yield CounterMetricFamily(
            "llmload_output_tokens", "Output tokens of finished requests", value=tokens
        )
        current = self.live.current()
        step = current["step"]
        step_value = -1.0 if current["cold"] else (math.nan if step is None else float(step))
        yield GaugeMetricFamily("llmload_step", "Current step (-1: cold group)", value=step_value)
        yield GaugeMetricFamily(
            "llmload_concurrency", "Target concurrency of the current step",
            value=math.nan if step is None and not current["cold"] else float(current["concurrency"]),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "llmload_workers", "Connected workers", value=float(self.live.workers())
        )


def _le(bound: float) -> str:
    return repr(float(bound))


def registry_for(live: LiveStats) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LiveCollector(live))
    return registry


def register_endpoint(web_ui: Any, live: LiveStats) -> None:
    """`GET /llmload/metrics` on Locust's web UI (behind its login when --web-login is on),
    under `--web-base-path` like Locust's own pages and /llmload/* (locustfiles/live/webtab.py)."""
    from flask import Response

    registry = registry_for(live)

    def metrics() -> Response:
        return Response(generate_latest(registry), mimetype=None, content_type=CONTENT_TYPE_LATEST)

    parsed = getattr(web_ui.environment, "parsed_options", None)
    base = getattr(parsed, "web_base_path", None) or ""
    view = web_ui.auth_required_if_enabled(metrics)
    web_ui.app.add_url_rule(base + PATH, "llmload_metrics", view, methods=["GET"])
