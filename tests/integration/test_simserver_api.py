"""The simulator's OpenAI-compatible API over real sockets: framing, usage, endpoints."""

from __future__ import annotations

import http.client
import json

from infra.simserver.tokens import count_tokens
from tests.support.sim import RunningSim, SimFactory, chat_body, request, stream_request


def test_streaming_chat_framing_and_usage(sim: RunningSim) -> None:
    prompt = "one two three four five"
    body = chat_body(prompt, max_tokens=7, ignore_eos=True, stream_options={"include_usage": True})
    stream = stream_request(sim.port, body, headers={"X-Request-Id": "req-framing-1"})

    assert stream.status == 200
    assert stream.headers["content-type"] == "text/event-stream"
    assert stream.headers["x-request-id"] == "req-framing-1"
    assert stream.headers["x-llmload-simulated"] == "true"
    assert stream.complete, "the chunked body must end with a zero-size chunk"
    assert stream.events[-1] == b"[DONE]"
    events = stream.json_events()
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["id"] == "chatcmpl-req-framing-1" for e in events)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    content = stream.content_events()
    assert len(content) == 7  # one token per event by default
    finish = events[-2]
    assert finish["choices"][0]["finish_reason"] == "length"
    usage = events[-1]
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 7,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 0},  # 5 tokens: not one full block
    }
    assert count_tokens(stream.text()) == 7


def test_continuous_usage_is_cumulative(sim: RunningSim) -> None:
    body = chat_body(
        "a b c",
        max_tokens=5,
        ignore_eos=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    events = stream_request(sim.port, body).json_events()
    assert all("usage" in e for e in events)
    completions = [e["usage"]["completion_tokens"] for e in events]
    assert completions == [0, 1, 2, 3, 4, 5, 5, 5]  # role, 5 tokens, finish, usage
    assert {e["usage"]["prompt_tokens"] for e in events} == {3}


def test_legacy_completions_stream(sim: RunningSim) -> None:
    body = {"prompt": "x y", "max_tokens": 4, "ignore_eos": True, "stream": True}
    stream = stream_request(sim.port, body, path="/v1/completions")
    events = stream.json_events()
    assert events[0]["object"] == "text_completion"
    assert len(stream.content_events()) == 4
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert count_tokens(stream.text()) == 4


def test_non_streaming_usage_matches_text_and_keep_alive(sim: RunningSim) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    try:
        for path, body in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}]}),
            ("/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 6}),
        ):
            conn.request("POST", path, json.dumps(body), {"X-Request-Id": "nonstream"})
            response = conn.getresponse()
            data = json.loads(response.read())
            assert response.status == 200
            assert response.getheader("X-Request-Id") == "nonstream"
            choice = data["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            assert data["usage"]["completion_tokens"] == count_tokens(text)
            assert data["usage"]["prompt_tokens"] == (2 if "message" in choice else 4)
    finally:
        conn.close()


def test_output_length_is_sampled_unless_ignore_eos(sim_factory: SimFactory) -> None:
    sim = sim_factory("--output-len", "3")
    stop = stream_request(sim.port, chat_body(max_tokens=10)).json_events()
    assert stop[-1]["choices"][0]["finish_reason"] == "stop"
    assert len([e for e in stop if e["choices"][0]["delta"].get("content")]) == 3
    forced = stream_request(sim.port, chat_body(max_tokens=10, ignore_eos=True))
    assert len(forced.content_events()) == 10
    at_least = stream_request(sim.port, chat_body(max_tokens=10, min_tokens=6))
    assert len(at_least.content_events()) == 6
    capped = stream_request(sim.port, chat_body(max_completion_tokens=2, max_tokens=9))
    assert len(capped.content_events()) == 2


def test_labelled_simulated_endpoints(sim: RunningSim) -> None:
    status, headers, body = request(sim.port, "GET", "/version")
    assert status == 200 and headers["x-llmload-simulated"] == "true"
    version = json.loads(body)
    assert version["simulated"] is True
    assert version["engine"] == "llmload-sim"
    assert version["profile"] == "tiny"
    status, _, body = request(sim.port, "GET", "/v1/models")
    assert json.loads(body)["data"][0]["id"] == "llmload-sim-tiny"
    status, _, _ = request(sim.port, "GET", "/health")
    assert status == 200
    metrics = sim.metrics()
    for name in (
        "llmload_sim_requests_running",
        "llmload_sim_requests_waiting",
        "llmload_sim_kv_cache_usage_ratio",
        "llmload_sim_requests_cancelled_total",
        'vllm:num_requests_running{model_name="llmload-sim-tiny"}',
        'vllm:num_requests_waiting{model_name="llmload-sim-tiny"}',
    ):
        assert name in metrics


def test_bad_requests_get_openai_errors(sim: RunningSim) -> None:
    cases = [
        (chat_body(n=2), 400, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "stream_options": {}}, 400, None),
        (b"{not json", 400, None),
        ({"messages": []}, 400, "messages"),
        (chat_body(model="some-other-model"), 404, "model"),
    ]
    for body, status, param in cases:
        got, headers, raw = request(sim.port, "POST", "/v1/chat/completions", body)
        assert got == status, raw
        error = json.loads(raw)["error"]
        assert error["message"]
        if param:
            assert error["param"] == param
        assert headers["x-llmload-simulated"] == "true"
    assert request(sim.port, "GET", "/nowhere")[0] == 404
    assert request(sim.port, "GET", "/v1/chat/completions")[0] == 405
    rejected = sim.metrics()['llmload_sim_requests_rejected_total{reason="bad_request"}']
    assert rejected == 4
