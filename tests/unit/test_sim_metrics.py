"""The simulator's /metrics exposition (infra/simserver/metrics.py), read back by llmload's parser."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from analysis.kernel.prometheus import engine_gauges, parse_prometheus
from infra.simserver.metrics import SimStats, render


@dataclass
class Cache:
    queries: int = 0
    hits: int = 0
    cached_blocks: int = 3
    capacity_blocks: int = 8
    evicted_blocks: int = 1
    resets: int = 0


@dataclass
class Engine:
    num_running: int = 3
    num_waiting: int = 1
    kv_reserved_tokens: int = 250
    kv_used_tokens: int = 200
    kv_capacity_tokens: int = 1000
    cache: Cache | None = None


def scrape(engine: Engine, stats: SimStats | None = None) -> dict[str, float]:
    return {s.key: s.value for s in parse_prometheus(render(stats or SimStats(), engine, "m"))}


def test_gauges_counters_and_their_vllm_aliases() -> None:
    stats = SimStats(cancelled=2, prompt_tokens=12_345_678, lag_seconds=0.25)
    stats.finished.update(stop=5, length=1)
    stats.faults["drop"] = 1
    got = scrape(Engine(), stats)
    model = 'model_name="m"'
    assert got["llmload_sim_requests_running"] == 3
    assert got["llmload_sim_kv_cache_usage_ratio"] == 0.25
    assert got['llmload_sim_requests_finished_total{reason="stop"}'] == 5
    assert got['llmload_sim_requests_rejected_total{reason="queue_full"}'] == 0  # always listed
    assert got['llmload_sim_faults_injected_total{kind="drop"}'] == 1
    assert got["llmload_sim_prompt_tokens_total"] == 12_345_678
    assert got["llmload_sim_engine_lag_seconds_total"] == 0.25
    assert got[f"vllm:num_requests_running{{{model}}}"] == 3
    assert got[f"vllm:kv_cache_usage_perc{{{model}}}"] == 0.25
    assert got[f'vllm:request_success_total{{finished_reason="length",{model}}}'] == 1
    samples = parse_prometheus(render(stats, Engine(), 'sim "tiny" \\ 1'))
    gauges = engine_gauges(samples)
    assert (gauges.running, gauges.waiting, gauges.kv_cache_usage) == (3, 1, 0.25)
    assert {dict(s.labels).get("model_name") for s in samples} == {None, 'sim "tiny" \\ 1'}


def test_prefix_cache_metrics_are_absent_when_off_and_the_hit_rate_before_a_query() -> None:
    assert not any("prefix_cache" in key for key in scrape(Engine()))
    fresh = scrape(Engine(cache=Cache()))
    assert fresh["llmload_sim_prefix_cache_queries_total"] == 0
    assert not any("hit_ratio" in key or "hit_rate" in key for key in fresh)
    used = scrape(Engine(cache=Cache(queries=8, hits=2)))
    assert used["llmload_sim_prefix_cache_hit_ratio"] == 0.25
    assert used['vllm:gpu_prefix_cache_hit_rate{model_name="m"}'] == 0.25


@pytest.mark.parametrize("capacity", [0, 1000])
def test_the_exposition_declares_every_family_once(capacity: int) -> None:
    text = render(SimStats(), Engine(kv_capacity_tokens=capacity, cache=Cache()), "m")
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)) == 34
    assert "llmload_sim_requests_finished_total" in types and "vllm:num_requests_running" in types
