"""Prometheus text exposition format (0.0.4): the samples of a scrape and the engine gauges llmload reads.

    samples = parse_prometheus(text)                 # [Sample(name, labels, value), ...]
    gauges = engine_gauges(samples)                  # EngineGauges(running=3.0, ...)

Pure functions, no I/O, no gevent: used by the master's scraper during a run
(`locustfiles/master/server_metrics.py`), by `llmload check` (`infra/check/`) and by the
simulator's tests. The text is read by prometheus_client's parser
(`prometheus_client.parser.text_fd_to_metric_families`); llmload only flattens its families
into samples, each under the name the server wrote (vLLM's `vllm:` names, a histogram's
`_bucket`/`_sum`/`_count` series, a counter declared without `_total` as it stands).

The gauges of interest have one meaning across engines, found under the first name present:

    running         sequences being decoded       vllm:num_requests_running, llmload_sim_requests_running, ...
    waiting         requests queued               vllm:num_requests_waiting, llmload_sim_requests_waiting, ...
    kv_cache_usage  KV cache in use, 0..1         vllm:kv_cache_usage_perc (vLLM >= 0.10),
                                                  vllm:gpu_cache_usage_perc, llmload_sim_kv_cache_usage_ratio

Several label sets of one name (models, data-parallel engines) are summed for running and
waiting; for KV usage the highest is kept (the fullest cache is the one that limits).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_fd_to_metric_families

RUNNING_NAMES: tuple[str, ...] = (
    "vllm:num_requests_running",
    "llmload_sim_requests_running",
    "sglang:num_running_reqs",
    "tgi_batch_current_size",
)
WAITING_NAMES: tuple[str, ...] = (
    "vllm:num_requests_waiting",
    "llmload_sim_requests_waiting",
    "sglang:num_queue_reqs",
    "tgi_queue_size",
)
KV_USAGE_NAMES: tuple[str, ...] = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "llmload_sim_kv_cache_usage_ratio",
    "sglang:token_usage",
)
"""Candidate names per gauge, most specific first; all report a fraction (0..1)."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def key(self) -> str:
        """`name{a="x",b="y"}` (labels sorted), or the bare name."""
        if not self.labels:
            return self.name
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels)
        return f"{self.name}{{{inner}}}"


class PrometheusFormatError(ValueError):
    """The text is not in the Prometheus exposition format."""


class _Lines(io.StringIO):
    """The text, line by line, remembering the line being read and the counters declared
    without `_total` (prometheus_client renames their samples to `<name>_total`)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.number = 0
        self.line = ""
        self.bare_counters: set[str] = set()

    def __next__(self) -> str:  # type: ignore[override]  # typeshed: IOBase's says bytes
        self.line = super().__next__()
        self.number += 1
        words = self.line.split() if self.line.lstrip().startswith("#") else []
        if words[1:2] == ["TYPE"] and words[3:] == ["counter"] and not words[2].endswith("_total"):
            self.bare_counters.add(words[2])
        return self.line


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a text exposition, in order, labels sorted; a trailing timestamp is ignored.

    Raises PrometheusFormatError for text prometheus_client cannot read (an HTML error page,
    JSON): the answer is not Prometheus text at all.
    """
    lines = _Lines(text)
    samples = []
    try:
        for family in text_fd_to_metric_families(lines):
            bare = family.type == "counter" and family.name in lines.bare_counters
            for s in family.samples:
                name = s.name.removesuffix("_total") if bare else s.name
                samples.append(Sample(name, tuple(sorted(s.labels.items())), float(s.value)))
    except (ValueError, IndexError) as exc:  # the parser's error for a line it cannot read
        why = f": {str(exc)[:120]}" if str(exc) else ""
        line = lines.line.strip()[:120]
        raise PrometheusFormatError(f"line {lines.number} {line!r}{why}") from None
    return samples


@dataclass(frozen=True)
class EngineGauges:
    """The engine's load as one scrape saw it; None where the server exports no such gauge."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    sources: tuple[tuple[str, str], ...] = ()  # (gauge, metric name it was read from)

    @property
    def empty(self) -> bool:
        return self.running is None and self.waiting is None and self.kv_cache_usage is None


def _finite(samples: Iterable[Sample]) -> list[Sample]:
    return [s for s in samples if math.isfinite(s.value)]


def gauge_value(
    samples: Sequence[Sample], names: Sequence[str], combine: str = "sum"
) -> tuple[float, str] | None:
    """(value, name) of the first name in `names` present in `samples`; label sets combined."""
    for name in names:
        values = [s.value for s in _finite(samples) if s.name == name]
        if values:
            return (max(values) if combine == "max" else sum(values)), name
    return None


def engine_gauges(
    samples: Sequence[Sample], running_names: Sequence[str] = RUNNING_NAMES
) -> EngineGauges:
    """running, waiting and KV-cache usage from a scrape (each None when absent)."""
    found = {
        "running": gauge_value(samples, running_names),
        "waiting": gauge_value(samples, WAITING_NAMES),
        "kv_cache_usage": gauge_value(samples, KV_USAGE_NAMES, combine="max"),
    }
    return EngineGauges(
        running=found["running"][0] if found["running"] else None,
        waiting=found["waiting"][0] if found["waiting"] else None,
        kv_cache_usage=found["kv_cache_usage"][0] if found["kv_cache_usage"] else None,
        sources=tuple((k, v[1]) for k, v in found.items() if v is not None),
    )


def allowed(name: str, allowlist: Sequence[str]) -> bool:
    """`name` matches an entry of `allowlist` exactly, or a prefix entry ending in `*`."""
    return any(name.startswith(a[:-1]) if a.endswith("*") else name == a for a in allowlist)
