"""Counters of the simulator and their Prometheus text rendering (`GET /metrics`).

Names are listed in docs/simserver.md. vLLM-style aliases (`vllm:*`) are exported next to
the `llmload_sim_*` names so tools that look for vLLM's gauges find them. With the prefix
cache off its metrics are absent (not zero); the hit rate has no sample before a query.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from infra.simserver.gpus import SimGpus
from infra.simserver.prefix_cache import PrefixCache
from infra.simserver.tracing import SpanStats


@dataclass
class SimStats:
    """Monotonic counters, updated by the engine and the API layer (single event loop)."""

    finished: Counter[str] = field(default_factory=Counter)  # by finish reason
    cancelled: int = 0  # client went away (or shutdown) before the end
    rejected: Counter[str] = field(default_factory=Counter)  # by reason
    faults: Counter[str] = field(default_factory=Counter)  # injected, by kind
    prompt_tokens: int = 0  # of admitted requests
    generation_tokens: int = 0
    events: int = 0  # SSE events written (all kinds, [DONE] included)
    steps: int = 0  # engine steps
    tool_calls: int = 0  # answers that are tool calls
    invalid_answers: int = 0  # structured answers broken on purpose (--invalid-rate)
    # speculative decoding (--spec-draft-tokens): vLLM's counters
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    lag_seconds: float = 0.0  # time the engine ran behind its virtual schedule
    spans: SpanStats | None = None  # None: no --otlp-traces-endpoint (metrics absent)
    gpus: SimGpus | None = None  # None: --sim-gpus 0 (no DCGM series)


class EngineGauges(Protocol):
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_reserved_tokens(self) -> int: ...
    @property
    def kv_used_tokens(self) -> int: ...
    @property
    def kv_capacity_tokens(self) -> int: ...
    @property
    def cache(self) -> PrefixCache | None: ...


PREFIX = "llmload_sim_"
REJECT_REASONS = ("bad_request", "max_model_len", "queue_full", "not_found", "draining")
FINISH_REASONS = ("stop", "length")


Labelled = Sequence[tuple[Sequence[str], float]]
"""Samples of one family: (label values, value)."""


Kind = type[GaugeMetricFamily] | type[CounterMetricFamily]


def _one(value: float) -> Labelled:
    return [((), value)]


def _family(
    kind: Kind, name: str, help_: str, samples: Labelled, labels: Sequence[str] = ()
) -> Metric:
    """One family; with no samples it is still written (HELP and TYPE), as an absent value."""
    family = kind(name, help_, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _gauge(name: str, help_: str, value: float) -> Metric:
    return _family(GaugeMetricFamily, name, help_, _one(value))


def _counter(name: str, help_: str, value: float) -> Metric:
    return _family(CounterMetricFamily, name, help_, _one(value))


@dataclass(frozen=True)
class SimCollector:
    """The simulator's metric families (a prometheus_client collector), read at each scrape."""

    stats: SimStats
    engine: EngineGauges
    model_name: str

    def collect(self) -> Iterator[Metric]:
        yield from self._engine_families()
        yield from self._prefix_cache_families()
        yield from self._span_families()
        yield from self._gpu_families()
        yield from self._vllm_aliases()

    @property
    def _kv_ratio(self) -> float:
        capacity = self.engine.kv_capacity_tokens
        return self.engine.kv_reserved_tokens / capacity if capacity else 0.0

    @property
    def _hit_rate(self) -> Labelled:
        cache = self.engine.cache
        return _one(cache.hits / cache.queries) if cache is not None and cache.queries else []

    def _engine_families(self) -> Iterator[Metric]:
        stats, engine, p = self.stats, self.engine, PREFIX
        yield _gauge(f"{p}requests_running", "Sequences in the running batch.", engine.num_running)
        yield _gauge(f"{p}requests_waiting", "Requests in the waiting queue.", engine.num_waiting)
        yield _gauge(
            f"{p}kv_cache_usage_ratio",
            "KV tokens reserved by running sequences / capacity (0..1).",
            self._kv_ratio,
        )
        yield _gauge(
            f"{p}kv_cache_reserved_tokens",
            "KV tokens reserved (prompt + max_tokens of running sequences).",
            engine.kv_reserved_tokens,
        )
        yield _gauge(
            f"{p}kv_cache_used_tokens",
            "KV tokens holding data (prompt + generated of running sequences).",
            engine.kv_used_tokens,
        )
        yield _gauge(
            f"{p}kv_cache_capacity_tokens", "KV budget in tokens.", engine.kv_capacity_tokens
        )
        yield _family(
            CounterMetricFamily,
            f"{p}requests_finished_total",
            "Requests that ran to the end.",
            [((r,), stats.finished[r]) for r in FINISH_REASONS],
            labels=("reason",),
        )
        yield _counter(
            f"{p}requests_cancelled_total",
            "Requests whose client disconnected before the end (slot and KV freed at once).",
            stats.cancelled,
        )
        reasons = sorted(set(REJECT_REASONS) | set(stats.rejected))
        yield _family(
            CounterMetricFamily,
            f"{p}requests_rejected_total",
            "Requests refused, by reason.",
            [((r,), stats.rejected[r]) for r in reasons],
            labels=("reason",),
        )
        yield _family(
            CounterMetricFamily,
            f"{p}faults_injected_total",
            "Injected faults, by kind.",
            [((k,), n) for k, n in sorted(stats.faults.items())],
            labels=("kind",),
        )
        yield _counter(
            f"{p}prompt_tokens_total", "Prompt tokens of admitted requests.", stats.prompt_tokens
        )
        yield _counter(f"{p}generation_tokens_total", "Generated tokens.", stats.generation_tokens)
        yield _counter(f"{p}sse_events_total", "SSE events written.", stats.events)
        yield _counter(
            f"{p}tool_calls_total", "Chat answers that are tool calls.", stats.tool_calls
        )
        yield _counter(f"{p}engine_steps_total", "Engine steps.", stats.steps)
        yield _counter(
            f"{p}engine_lag_seconds_total",
            "Time the engine ran behind its virtual schedule (CPU saturated).",
            stats.lag_seconds,
        )

    def _prefix_cache_families(self) -> Iterator[Metric]:
        """None with the prefix cache off: absent, not zero."""
        cache, p = self.engine.cache, PREFIX
        if cache is None:
            return
        yield _counter(
            f"{p}prefix_cache_queries_total",
            "Prompt tokens of admitted requests looked up in the prefix cache.",
            cache.queries,
        )
        yield _counter(
            f"{p}prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache (no prefill needed).",
            cache.hits,
        )
        yield _family(
            GaugeMetricFamily,
            f"{p}prefix_cache_hit_ratio",
            "Cumulative hits / queries of the prefix cache (no sample before a query).",
            self._hit_rate,
        )
        blocks = cache.capacity_blocks
        yield _gauge(
            f"{p}prefix_cache_usage_ratio",
            "Prefix cache blocks held / capacity (0..1).",
            cache.cached_blocks / blocks if blocks else 0.0,
        )
        yield _gauge(
            f"{p}prefix_cache_blocks", "Blocks held by the prefix cache.", cache.cached_blocks
        )
        yield _gauge(f"{p}prefix_cache_capacity_blocks", "Prefix cache capacity in blocks.", blocks)
        yield _counter(
            f"{p}prefix_cache_evicted_blocks_total",
            "Blocks evicted from the prefix cache (least recently used).",
            cache.evicted_blocks,
        )
        yield _counter(
            f"{p}prefix_cache_resets_total",
            "Times the prefix cache was emptied (POST /reset_prefix_cache or /flush_cache).",
            cache.resets,
        )

    def _span_families(self) -> Iterator[Metric]:
        """None without --otlp-traces-endpoint: absent, not zero."""
        spans, p = self.stats.spans, PREFIX
        if spans is None:
            return
        yield _counter(
            f"{p}spans_exported_total", "Spans the OTLP endpoint accepted.", spans.exported
        )
        yield _counter(
            f"{p}spans_dropped_total",
            "Spans dropped because the export queue was full.",
            spans.dropped,
        )
        yield _counter(
            f"{p}spans_failed_total", "Spans whose export failed (not resent).", spans.failed
        )

    def _gpu_families(self) -> Iterator[Metric]:
        """DCGM's names for the simulated GPUs (infra/simserver/gpus.py), as a DCGM exporter
        labels them, plus simulated="true"; none with --sim-gpus 0."""
        gpus = self.stats.gpus
        if gpus is None:
            return
        labels = ("gpu", "UUID", "modelName", "simulated")
        for name, samples in gpus.reading(self.engine.kv_reserved_tokens).items():
            values = [((str(i), f"GPU-llmload-sim-{i:04d}", "llmload-sim", "true"), v)
                      for i, v in samples]  # fmt: skip
            yield _family(GaugeMetricFamily, name, "Simulated GPU (DCGM name).", values, labels)

    def _vllm_aliases(self) -> Iterator[Metric]:
        """vLLM's names for ours, labelled with the served model (`model_name`) first."""
        stats, engine, cache = self.stats, self.engine, self.engine.cache
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        aliases: list[tuple[Kind, str, str, Labelled]] = [
            (gauge, "vllm:num_requests_running", "requests_running", _one(engine.num_running)),
            (gauge, "vllm:num_requests_waiting", "requests_waiting", _one(engine.num_waiting)),
            (gauge, "vllm:kv_cache_usage_perc", "kv_cache_usage_ratio", _one(self._kv_ratio)),
            (gauge, "vllm:gpu_cache_usage_perc", "kv_cache_usage_ratio", _one(self._kv_ratio)),
            (counter, "vllm:prompt_tokens_total", "prompt_tokens_total", _one(stats.prompt_tokens)),
            (
                counter,
                "vllm:generation_tokens_total",
                "generation_tokens_total",
                _one(stats.generation_tokens),
            ),
        ]
        for kind, name, of, samples in aliases:
            yield self._alias(kind, name, of, samples)
        success = [((r,), stats.finished[r]) for r in FINISH_REASONS]
        yield self._alias(
            counter,
            "vllm:request_success_total",
            "requests_finished_total",
            success,
            "finished_reason",
        )
        if getattr(engine, "speculation", None) is not None:  # absent without it, as vLLM's
            for name, value in (("num_drafts_total", stats.spec_drafts),
                                ("num_draft_tokens_total", stats.spec_draft_tokens),
                                ("num_accepted_tokens_total", stats.spec_accepted_tokens)):  # fmt: skip
                yield _counter(f"{PREFIX}spec_decode_{name}", "Speculative decoding.", value)
                yield self._alias(counter, f"vllm:spec_decode_{name}", f"spec_decode_{name}",
                                  _one(value))  # fmt: skip
        if cache is not None:
            yield self._alias(
                counter,
                "vllm:prefix_cache_queries_total",
                "prefix_cache_queries_total",
                _one(cache.queries),
            )
            yield self._alias(
                counter, "vllm:prefix_cache_hits_total", "prefix_cache_hits_total", _one(cache.hits)
            )
            yield self._alias(
                gauge, "vllm:gpu_prefix_cache_hit_rate", "prefix_cache_hit_ratio", self._hit_rate
            )

    def _alias(self, kind: Kind, name: str, of: str, samples: Labelled, *labels: str) -> Metric:
        model = [((self.model_name, *values), value) for values, value in samples]
        return _family(kind, name, f"Alias of {PREFIX}{of}.", model, ("model_name", *labels))


def render(stats: SimStats, engine: EngineGauges, model_name: str) -> str:
    """Prometheus text exposition format 0.0.4, written by prometheus_client."""
    return generate_latest(SimCollector(stats, engine, model_name)).decode()
