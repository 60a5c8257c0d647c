"""Length limits (400) and a full waiting queue (429 or 503), with their bodies."""

from __future__ import annotations

import json
import socket

from tests.support.sim import RunningSim, SimFactory, chat_body, open_stream, request


def test_over_max_model_len_is_400(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "64")
    body = chat_body("w " * 60, max_tokens=10)
    status, headers, raw = request(sim.port, "POST", "/v1/chat/completions", body)
    assert status == 400
    error = json.loads(raw)["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "64" in error["message"] and "60" in error["message"]
    ok, _, _ = request(
        sim.port, "POST", "/v1/chat/completions", chat_body("w " * 54, max_tokens=10, stream=False)
    )
    assert ok == 200
    assert sim.metrics()['llmload_sim_requests_rejected_total{reason="max_model_len"}'] == 1


def _fill_queue(sim: RunningSim) -> list[socket.socket]:
    """One running and one waiting long stream (max_num_seqs 1, max_waiting 1)."""
    held = []
    for _ in range(2):
        sock, *_ = open_stream(sim.port, chat_body(max_tokens=5000, ignore_eos=True))
        held.append(sock)
        sim.wait_metric("llmload_sim_requests_running", lambda v: v >= 1)
    sim.wait_metric("llmload_sim_requests_waiting", lambda v: v >= 1)
    return held


def test_full_queue_is_429_then_503_when_configured(sim_factory: SimFactory) -> None:
    for status_flag, expected in (("429", 429), ("503", 503)):
        sim = sim_factory(
            "--max-num-seqs", "1", "--max-waiting", "1", "--queue-full-status", status_flag
        )
        held = _fill_queue(sim)
        try:
            status, headers, raw = request(
                sim.port,
                "POST",
                "/v1/chat/completions",
                chat_body(max_tokens=3),
                headers={"X-Request-Id": "turned-away"},
            )
            assert status == expected
            assert headers["x-request-id"] == "turned-away"
            assert headers["retry-after"] == "1"
            error = json.loads(raw)["error"]
            assert error["code"] == "queue_full"
            metrics = sim.metrics()
            assert metrics['llmload_sim_requests_rejected_total{reason="queue_full"}'] == 1
        finally:
            for sock in held:
                sock.close()
