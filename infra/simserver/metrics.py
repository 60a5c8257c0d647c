"""Counters of the simulator and their Prometheus text rendering (`GET /metrics`).

Names are listed in docs/simserver.md. vLLM-style aliases (`vllm:*`) are exported next to
the `llmload_sim_*` names so tools that look for vLLM's gauges find them. With the prefix
cache off its metrics are absent (not zero); the hit rate has no sample before a query.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from infra.simserver.prefix_cache import PrefixCache


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
    lag_seconds: float = 0.0  # time the engine ran behind its virtual schedule


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


REJECT_REASONS = ("bad_request", "max_model_len", "queue_full", "not_found", "draining")
FINISH_REASONS = ("stop", "length")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(stats: SimStats, engine: EngineGauges, model_name: str) -> str:
    """Prometheus text exposition format 0.0.4."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: Sequence[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            text = repr(float(value)) if isinstance(value, float) else str(value)
            lines.append(f"{name}{labels} {text}")

    capacity = engine.kv_capacity_tokens
    ratio = engine.kv_reserved_tokens / capacity if capacity else 0.0
    p = "llmload_sim_"
    metric(
        f"{p}requests_running",
        "gauge",
        "Sequences in the running batch.",
        [("", engine.num_running)],
    )
    metric(
        f"{p}requests_waiting",
        "gauge",
        "Requests in the waiting queue.",
        [("", engine.num_waiting)],
    )
    metric(
        f"{p}kv_cache_usage_ratio",
        "gauge",
        "KV tokens reserved by running sequences / capacity (0..1).",
        [("", ratio)],
    )
    metric(
        f"{p}kv_cache_reserved_tokens",
        "gauge",
        "KV tokens reserved (prompt + max_tokens of running sequences).",
        [("", engine.kv_reserved_tokens)],
    )
    metric(
        f"{p}kv_cache_used_tokens",
        "gauge",
        "KV tokens holding data (prompt + generated of running sequences).",
        [("", engine.kv_used_tokens)],
    )
    metric(f"{p}kv_cache_capacity_tokens", "gauge", "KV budget in tokens.", [("", capacity)])
    finished = [(f'{{reason="{r}"}}', stats.finished[r]) for r in FINISH_REASONS]
    metric(f"{p}requests_finished_total", "counter", "Requests that ran to the end.", finished)
    metric(
        f"{p}requests_cancelled_total",
        "counter",
        "Requests whose client disconnected before the end (slot and KV freed at once).",
        [("", stats.cancelled)],
    )
    reasons = sorted(set(REJECT_REASONS) | set(stats.rejected))
    metric(
        f"{p}requests_rejected_total",
        "counter",
        "Requests refused, by reason.",
        [(f'{{reason="{_label(r)}"}}', stats.rejected[r]) for r in reasons],
    )
    metric(
        f"{p}faults_injected_total",
        "counter",
        "Injected faults, by kind.",
        [(f'{{kind="{_label(k)}"}}', n) for k, n in sorted(stats.faults.items())],
    )
    metric(
        f"{p}prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
        [("", stats.prompt_tokens)],
    )
    metric(
        f"{p}generation_tokens_total",
        "counter",
        "Generated tokens.",
        [("", stats.generation_tokens)],
    )
    metric(f"{p}sse_events_total", "counter", "SSE events written.", [("", stats.events)])
    metric(
        f"{p}tool_calls_total",
        "counter",
        "Chat answers that are tool calls.",
        [("", stats.tool_calls)],
    )
    metric(f"{p}engine_steps_total", "counter", "Engine steps.", [("", stats.steps)])
    metric(
        f"{p}engine_lag_seconds_total",
        "counter",
        "Time the engine ran behind its virtual schedule (CPU saturated).",
        [("", stats.lag_seconds)],
    )

    cache = engine.cache
    hit_rate: list[tuple[str, float]] = []
    if cache is not None:
        if cache.queries:
            hit_rate = [("", cache.hits / cache.queries)]
        metric(
            f"{p}prefix_cache_queries_total",
            "counter",
            "Prompt tokens of admitted requests looked up in the prefix cache.",
            [("", cache.queries)],
        )
        metric(
            f"{p}prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache (no prefill needed).",
            [("", cache.hits)],
        )
        metric(
            f"{p}prefix_cache_hit_ratio",
            "gauge",
            "Cumulative hits / queries of the prefix cache (no sample before a query).",
            hit_rate,
        )
        metric(
            f"{p}prefix_cache_usage_ratio",
            "gauge",
            "Prefix cache blocks held / capacity (0..1).",
            [("", cache.cached_blocks / cache.capacity_blocks if cache.capacity_blocks else 0.0)],
        )
        metric(
            f"{p}prefix_cache_blocks",
            "gauge",
            "Blocks held by the prefix cache.",
            [("", cache.cached_blocks)],
        )
        metric(
            f"{p}prefix_cache_capacity_blocks",
            "gauge",
            "Prefix cache capacity in blocks.",
            [("", cache.capacity_blocks)],
        )
        metric(
            f"{p}prefix_cache_evicted_blocks_total",
            "counter",
            "Blocks evicted from the prefix cache (least recently used).",
            [("", cache.evicted_blocks)],
        )

    model = f'{{model_name="{_label(model_name)}"}}'
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Alias of llmload_sim_requests_running.",
        [(model, engine.num_running)],
    )
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Alias of llmload_sim_requests_waiting.",
        [(model, engine.num_waiting)],
    )
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "Alias of llmload_sim_kv_cache_usage_ratio.",
        [(model, ratio)],
    )
    metric(
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "Alias of llmload_sim_kv_cache_usage_ratio.",
        [(model, ratio)],
    )
    metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Alias of llmload_sim_prompt_tokens_total.",
        [(model, stats.prompt_tokens)],
    )
    metric(
        "vllm:generation_tokens_total",
        "counter",
        "Alias of llmload_sim_generation_tokens_total.",
        [(model, stats.generation_tokens)],
    )
    success = [
        (f'{{model_name="{_label(model_name)}",finished_reason="{r}"}}', stats.finished[r])
        for r in FINISH_REASONS
    ]
    metric(
        "vllm:request_success_total",
        "counter",
        "Alias of llmload_sim_requests_finished_total.",
        success,
    )
    if cache is not None:
        metric(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Alias of llmload_sim_prefix_cache_queries_total.",
            [(model, cache.queries)],
        )
        metric(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Alias of llmload_sim_prefix_cache_hits_total.",
            [(model, cache.hits)],
        )
        metric(
            "vllm:gpu_prefix_cache_hit_rate",
            "gauge",
            "Alias of llmload_sim_prefix_cache_hit_ratio.",
            [(model, v) for _, v in hit_rate],
        )
    return "\n".join(lines) + "\n"


def parse_text(text: str) -> dict[str, float]:
    """Parse Prometheus text into {"name{labels}": value} (for tests and the benchmark)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out
