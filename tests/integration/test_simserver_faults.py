"""Injected faults, each at rate 1 so every request suffers it."""

from __future__ import annotations

import json

from tests.support.sim import SimFactory, chat_body, request, stream_request


def test_500_before_streaming(sim_factory: SimFactory) -> None:
    sim = sim_factory("--fault-500-rate", "1")
    status, _, raw = request(sim.port, "POST", "/v1/chat/completions", chat_body(max_tokens=5))
    assert status == 500
    assert json.loads(raw)["error"]["type"] == "server_error"
    assert sim.metrics()['llmload_sim_faults_injected_total{kind="error_500"}'] == 1


def test_drop_mid_stream(sim_factory: SimFactory) -> None:
    sim = sim_factory("--fault-drop-rate", "1")
    stream = stream_request(sim.port, chat_body(max_tokens=20, ignore_eos=True))
    assert stream.status == 200
    assert not stream.complete
    assert 1 <= len(stream.content_events()) < 20
    assert b"[DONE]" not in stream.events
    assert sim.wait_metric("llmload_sim_requests_running", lambda v: v == 0) == 0


def test_malformed_event(sim_factory: SimFactory) -> None:
    sim = sim_factory("--fault-malformed-rate", "1")
    stream = stream_request(sim.port, chat_body(max_tokens=20, ignore_eos=True))
    assert stream.complete
    bad = []
    for raw in stream.events:
        try:
            json.loads(raw)
        except ValueError:
            bad.append(raw)
    assert len(bad) == 2  # the malformed event and [DONE]
    assert bad[-1] == b"[DONE]"


def test_stall_and_slow_header(sim_factory: SimFactory) -> None:
    sim = sim_factory("--fault-stall-rate", "1", "--stall-seconds", "0.3",
                      "--fault-slow-header-rate", "1", "--slow-header-seconds", "0.3")  # fmt: skip
    stream = stream_request(sim.port, chat_body(max_tokens=10, ignore_eos=True))
    assert stream.complete
    assert stream.headers_ns > 0.25e9
    gaps = [b - a for a, b in zip(stream.arrivals_ns, stream.arrivals_ns[1:], strict=False)]
    assert max(gaps) > 0.25e9
    assert len(stream.content_events()) == 10
