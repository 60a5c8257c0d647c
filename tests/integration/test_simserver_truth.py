"""The truth log matches what a raw client received, event for event."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.sim import (
    SimFactory,
    Stream,
    chat_body,
    open_stream,
    read_stream,
    request,
    stream_request,
)


def test_truth_log_matches_raw_client(sim_factory: SimFactory, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    sim = sim_factory("--truth-log", str(truth), "--tokens-per-event", "1-4",
                      "--decode-base-ms", "3")  # fmt: skip
    body = chat_body(
        max_tokens=40,
        ignore_eos=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    streams = {rid: stream_request(sim.port, body, headers={"X-Request-Id": rid})
               for rid in ("truth-a", "truth-b")}  # fmt: skip
    request(sim.port, "POST", "/v1/chat/completions", chat_body(n=3),
            headers={"X-Request-Id": "truth-bad"})  # fmt: skip
    sim.stop()

    records = {r["request_id"]: r for r in map(json.loads, truth.read_text().splitlines())}
    assert records["truth-bad"]["status"] == 400
    assert records["truth-bad"]["outcome"] == "rejected"
    for rid, stream in streams.items():
        record = records[rid]
        assert record["outcome"] == "finished" and record["status"] == 200
        assert record["completion_tokens"] == 40
        events = record["events"]
        assert len(events) == len(stream.events)
        # Token counts per event, as the client can derive them from usage deltas.
        client_tokens = []
        previous = 0
        for raw in stream.events:
            if raw == b"[DONE]":
                client_tokens.append(0)
                continue
            event = json.loads(raw)
            used = event["usage"]["completion_tokens"]
            client_tokens.append(used - previous if event["choices"] else 0)
            previous = used
        assert [n for _, n in events] == client_tokens
        # Same timeline: intervals between content events agree within a few ms.
        server = [t for t, n in events if n]
        client = [t for t, n in zip(stream.arrivals_ns, client_tokens, strict=True) if n]
        gaps = [abs((s2 - s1) - (c2 - c1)) / 1e6
                for s1, s2, c1, c2 in zip(server, server[1:], client, client[1:], strict=False)]  # fmt: skip
        assert sorted(gaps)[len(gaps) // 2] < 2.0, gaps
        assert all(b >= a for a, b in zip(server, server[1:], strict=False))
        assert events[0][0] >= record["headers_offset_ns"]


def test_ended_requests_leave_no_cycle_for_the_garbage_collector(
    sim_factory: SimFactory, tmp_path: Path
) -> None:
    # The reference server frees each request by reference counting when it ends
    # (finished, whole JSON body, client gone): cyclic garbage made its full collections
    # hold the loop 15-50 ms at load, delaying the reads the truth log times from.
    import gc

    from infra.simserver.generation import Generation

    sim = sim_factory("--truth-log", str(tmp_path / "truth.jsonl"), "--decode-base-ms", "2")
    gc.collect()
    gc.disable()
    try:
        stream_request(sim.port, chat_body(max_tokens=20, stream=True))
        request(sim.port, "POST", "/v1/chat/completions", chat_body(max_tokens=5))
        sock, reader, sent, status, _ = open_stream(
            sim.port, chat_body(max_tokens=2000, ignore_eos=True, stream=True)
        )
        assert status == 200
        read_stream(reader, Stream(status, {}), sent, max_events=3)
        sock.close()  # cancelled mid-stream
        assert sim.wait_metric("llmload_sim_requests_cancelled_total", lambda v: v == 1) == 1
        sim.stop()
        alive = [o for o in gc.get_objects() if isinstance(o, Generation)]
    finally:
        gc.enable()
    assert alive == []
    lines = (tmp_path / "truth.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["outcome"] for line in lines) == [
        "cancelled",
        "finished",
        "finished",
    ]
