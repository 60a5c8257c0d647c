"""Prometheus text exposition format (0.0.4): a small parser and the engine gauges llmload reads.

    samples = parse_prometheus(text)                 # [Sample(name, labels, value), ...]
    gauges = engine_gauges(samples)                  # EngineGauges(running=3.0, ...)

Pure functions, no I/O, no gevent: used by the master's scraper during a run
(`locustfiles/master/server_metrics.py`) and by `llmload check` (`infra/check/`).

The gauges of interest have one meaning across engines, found under the first name present:

    running         sequences being decoded       vllm:num_requests_running, llmload_sim_requests_running, ...
    waiting         requests queued               vllm:num_requests_waiting, llmload_sim_requests_waiting, ...
    kv_cache_usage  KV cache in use, 0..1         vllm:kv_cache_usage_perc (vLLM >= 0.10),
                                                  vllm:gpu_cache_usage_perc, llmload_sim_kv_cache_usage_ratio

Several label sets of one name (models, data-parallel engines) are summed for running and
waiting; for KV usage the highest is kept (the fullest cache is the one that limits).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


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


def _labels(text: str, line: str) -> tuple[tuple[str, str], ...]:
    inner = text[1:-1]
    out = []
    pos = 0
    while pos < len(inner):
        match = _LABEL.match(inner, pos)
        if match is None:
            if inner[pos:].strip() in ("", ","):
                break
            raise PrometheusFormatError(f"bad labels in {line[:120]!r}")
        value = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], match.group(2))
        out.append((match.group(1), value))
        pos = match.end()
    return tuple(sorted(out))


def _value(text: str, line: str) -> float:
    try:
        return float(text)  # accepts NaN, +Inf, -Inf, 1e3
    except ValueError:
        raise PrometheusFormatError(f"bad sample value in {line[:120]!r}") from None


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a text exposition, in order. Comments (HELP, TYPE) are skipped.

    Raises PrometheusFormatError for a line that is neither a comment nor a sample (an HTML
    error page, JSON): the answer is not Prometheus text at all.
    """
    samples = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise PrometheusFormatError(f"not a Prometheus sample: {line[:120]!r}")
        name, labels, value = match.groups()
        samples.append(Sample(name, _labels(labels, line) if labels else (), _value(value, line)))
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
