"""Several tokens per SSE event (`--tokens-per-event`)."""

from __future__ import annotations

from infra.simserver.tokens import count_tokens
from tests.support.sim import SimFactory, Stream, chat_body, stream_request


def _tokens_per_event(stream: Stream) -> list[int]:
    counts = []
    previous = 0
    for event in stream.content_events():
        used = event["usage"]["completion_tokens"]
        text = event["choices"][0]["delta"]["content"]
        assert count_tokens(text) == used - previous
        counts.append(used - previous)
        previous = used
    return counts


def test_fixed_tokens_per_event(sim_factory: SimFactory) -> None:
    sim = sim_factory("--tokens-per-event", "3")
    body = chat_body(
        max_tokens=10, ignore_eos=True, stream_options={"continuous_usage_stats": True}
    )
    assert _tokens_per_event(stream_request(sim.port, body)) == [3, 3, 3, 1]


def test_tokens_per_event_distribution(sim_factory: SimFactory) -> None:
    sim = sim_factory("--tokens-per-event", "1-4", "--seed", "7")
    body = chat_body(
        max_tokens=200, ignore_eos=True, stream_options={"continuous_usage_stats": True}
    )
    counts = _tokens_per_event(stream_request(sim.port, body))
    assert sum(counts) == 200
    assert set(counts[:-1]) == {1, 2, 3, 4}
