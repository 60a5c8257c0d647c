"""The simulator's prefix cache over real sockets: cached_tokens in usage follows the
documented block rule, TTFT follows the uncached prompt tokens, LRU eviction, metrics and
the truth log (docs/simserver.md, "The prefix cache")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.sim import RunningSim, SimFactory, request, stream_request

CHAT = "/v1/chat/completions"


def _words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def _ask(sim: RunningSim, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True}
    status, _, raw = request(sim.port, "POST", CHAT, body)
    assert status == 200, raw
    return json.loads(raw)


def _cached(answer: dict[str, Any]) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def _ttft_ms(sim: RunningSim, messages: list[dict[str, Any]], max_tokens: int) -> float:
    body = {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    stream = stream_request(sim.port, body)
    assert stream.complete
    first = next(i for i, e in enumerate(stream.events) if b'"content":" ' in e)
    return stream.arrivals_ns[first] / 1e6


def test_next_turn_hits_prompt_and_reply(sim: RunningSim) -> None:
    first = [{"role": "user", "content": _words("a", 40)}]
    answer = _ask(sim, first, 10)
    assert (answer["usage"]["prompt_tokens"], _cached(answer)) == (40, 0)
    reply = answer["choices"][0]["message"]["content"]
    # Turn two resends prompt + reply + a new message: 40 + 10 + 3 = 53 tokens, of which the
    # 3 full blocks of the first turn's 50 tokens (48) are cached.
    second = [*first, {"role": "assistant", "content": reply},
              {"role": "user", "content": "what next now"}]  # fmt: skip
    answer = _ask(sim, second, 4)
    assert (answer["usage"]["prompt_tokens"], _cached(answer)) == (53, 48)
    # The same 32-token prompt twice: at most prompt_tokens - 1, block-aligned, so 16.
    aligned = [{"role": "user", "content": _words("b", 32)}]
    _ask(sim, aligned, 1)
    assert _cached(_ask(sim, aligned, 1)) == 16
    # Legacy completions with token ids cache too.
    ids = {"prompt": list(range(1000, 1040)), "max_tokens": 2, "ignore_eos": True}
    request(sim.port, "POST", "/v1/completions", ids)
    status, _, raw = request(sim.port, "POST", "/v1/completions", ids)
    assert status == 200 and json.loads(raw)["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 32
    }

    metrics = sim.metrics()
    model = f'{{model_name="{sim.config.served_model}"}}'
    queries = 40 + 53 + 32 + 32 + 40 + 40
    hits = 48 + 16 + 32
    assert metrics["llmload_sim_prefix_cache_queries_total"] == queries
    assert metrics["llmload_sim_prefix_cache_hits_total"] == hits
    assert metrics[f"vllm:prefix_cache_queries_total{model}"] == queries
    assert metrics[f"vllm:prefix_cache_hits_total{model}"] == hits
    assert metrics[f"vllm:gpu_prefix_cache_hit_rate{model}"] == pytest.approx(hits / queries)
    assert metrics["llmload_sim_prefix_cache_blocks"] > 0


def test_streamed_usage_carries_cached_tokens(sim: RunningSim) -> None:
    messages = [{"role": "user", "content": _words("s", 20)}]
    _ask(sim, messages, 1)
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"messages": messages, "max_tokens": 3, "ignore_eos": True, "stream": True,
            "stream_options": options}  # fmt: skip
    events = stream_request(sim.port, body).json_events()
    # The role event is written before admission: no details yet; every later one has them.
    assert "prompt_tokens_details" not in events[0]["usage"]
    assert all(e["usage"]["prompt_tokens_details"] == {"cached_tokens": 16} for e in events[1:])


def test_ttft_difference_follows_uncached_tokens(sim_factory: SimFactory) -> None:
    # prefill 400 µs/token at time scale 0.5: 0.2 ms per uncached prompt token.
    sim = sim_factory("--prefill-per-token-us", "400", "--time-scale", "0.5")
    per_token_ms = 400e-3 * 0.5
    errors = []
    for tag in ("x", "y"):
        cold = [{"role": "user", "content": _words(tag, 400)}]
        cold_ms = _ttft_ms(sim, cold, 8)  # 400 uncached tokens
        reply = " ".join(f"r{i}" for i in range(8))  # the words do not matter: a new block
        warm = [{"role": "user", "content": _words(tag, 400)},
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "and then"}]  # fmt: skip
        # 410 tokens: the first turn's 25 prompt blocks (400 tokens) hit, 10 are uncached.
        warm_ms = _ttft_ms(sim, warm, 8)
        predicted = per_token_ms * (400 - 10)  # 78 ms
        errors.append(abs((cold_ms - warm_ms) - predicted) / predicted)
    assert min(errors) < 0.2, errors


def test_lru_eviction_keeps_the_head(sim_factory: SimFactory) -> None:
    sim = sim_factory("--block-size", "4", "--prefix-cache-tokens", "8")  # two blocks
    a = [{"role": "user", "content": _words("a", 9)}]
    b = [{"role": "user", "content": _words("b", 9)}]
    _ask(sim, a, 1)  # inserts a's blocks 1-2 (10 tokens)
    assert _cached(_ask(sim, a, 1)) == 8
    _ask(sim, b, 1)  # b's two blocks evict a's
    assert _cached(_ask(sim, a, 1)) == 0
    assert _cached(_ask(sim, b, 1)) == 0  # a's turn evicted b again
    # 13 + 1 tokens are 3 blocks; with room for 2 the tail goes, the head stays.
    c = [{"role": "user", "content": _words("c", 13)}]
    _ask(sim, c, 1)
    assert _cached(_ask(sim, c, 1)) == 8
    metrics = sim.metrics()
    assert metrics["llmload_sim_prefix_cache_capacity_blocks"] == 2
    assert metrics["llmload_sim_prefix_cache_usage_ratio"] == 1.0
    assert metrics["llmload_sim_prefix_cache_evicted_blocks_total"] >= 4


def test_prefix_cache_off(sim_factory: SimFactory) -> None:
    sim = sim_factory("--prefix-cache", "off")
    messages = [{"role": "user", "content": _words("o", 40)}]
    _ask(sim, messages, 1)
    assert _cached(_ask(sim, messages, 1)) == 0
    assert not any("prefix_cache" in name for name in sim.metrics())  # absent, not zero


def test_truth_log_records_cached_tokens(sim_factory: SimFactory, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    sim = sim_factory("--truth-log", str(truth))
    messages = [{"role": "user", "content": _words("t", 20)}]
    for rid in ("t-1", "t-2"):
        body = {"messages": messages, "max_tokens": 2, "ignore_eos": True}
        request(sim.port, "POST", CHAT, body, headers={"X-Request-Id": rid})
    sim.stop()
    records = {r["request_id"]: r for r in map(json.loads, truth.read_text().splitlines())}
    assert records["t-1"]["cached_tokens"] == 0 and records["t-2"]["cached_tokens"] == 16
    assert records["t-2"]["tool_call"] is False
