"""A client that disconnects frees its slot and KV at once, visibly in /metrics."""

from __future__ import annotations

from tests.support.sim import SimFactory, Stream, chat_body, open_stream, read_stream


def test_cancelled_stream_frees_its_slot(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-num-seqs", "1")
    sock, reader, sent, status, headers = open_stream(
        sim.port, chat_body(max_tokens=5000, ignore_eos=True)
    )
    stream = read_stream(reader, Stream(status, headers), sent, max_events=5)
    assert len(stream.events) == 5
    before = sim.metrics()
    assert before["llmload_sim_requests_running"] == 1
    assert before["llmload_sim_kv_cache_reserved_tokens"] > 5000
    assert before["llmload_sim_kv_cache_usage_ratio"] > 0

    # A second request waits behind the first (one slot).
    waiting_sock, *_ = open_stream(sim.port, chat_body(max_tokens=3000, ignore_eos=True))
    assert sim.wait_metric("llmload_sim_requests_waiting", lambda v: v == 1) == 1

    sock.close()
    cancelled = sim.wait_metric("llmload_sim_requests_cancelled_total", lambda v: v == 1)
    assert cancelled == 1
    # The freed slot goes to the waiting request at the next engine step.
    assert sim.wait_metric("llmload_sim_requests_waiting", lambda v: v == 0) == 0
    assert sim.metrics()["llmload_sim_requests_running"] == 1
    waiting_sock.close()
    assert sim.wait_metric("llmload_sim_requests_running", lambda v: v == 0) == 0
    final = sim.metrics()
    assert final["llmload_sim_kv_cache_reserved_tokens"] == 0
    assert final["llmload_sim_kv_cache_used_tokens"] == 0
    assert final["llmload_sim_requests_cancelled_total"] == 2
    assert final['llmload_sim_requests_finished_total{reason="length"}'] == 0
