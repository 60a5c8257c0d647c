"""`llmload sim --otlp-traces-endpoint`: vLLM's spans, with the simulator's true times.

A real OTLP/HTTP receiver (http.server on port 0, bodies decoded with analysis.kernel.spans) and a
real `llmload sim` process; requests carry llmload's `traceparent` and `X-Request-Id`.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from analysis.kernel.prometheus import parse_prometheus
from analysis.kernel.spans import (
    CONTENT_TYPES,
    REQUEST_SPAN,
    START_UP_SPANS,
    decode_export,
    span_rows,
    traceparent,
)
from infra.ports import free_port
from tests.support.chat import SimProcess, start_sim, wait_for
from tests.support.sim import Stream, chat_body, open_stream, read_stream, request, stream_request

TOKENS = 8


class Receiver:
    """An OTLP/HTTP traces receiver on 127.0.0.1, port 0: every span row it was sent."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.content_types: list[str] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                content_type = self.headers.get("Content-Type", "")
                export = decode_export(body, CONTENT_TYPES[content_type])
                rows = list(span_rows(export, "run", "sim"))
                with receiver.lock:
                    receiver.rows += rows
                    receiver.content_types.append(content_type)
                    receiver.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def spans(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [row for row in self.rows if row["name"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def _stream(sim: SimProcess, rid: str, headers: dict[str, str]) -> Stream:
    body = chat_body(max_tokens=TOKENS, ignore_eos=True)
    return stream_request(sim.port, body, headers={"X-Request-Id": rid, **headers})


def _metrics(sim: SimProcess) -> dict[str, float]:
    status, _, body = request(sim.port, "GET", "/metrics")
    assert status == 200
    return {s.key: s.value for s in parse_prometheus(body.decode())}


def _content_offsets(truth: dict[str, Any]) -> list[int]:
    return [offset for offset, tokens in truth["events"] if tokens]


def test_every_request_has_one_span_in_its_trace_with_true_times(
    receiver: Receiver, tmp_path: Path
) -> None:
    # One running sequence at a time: concurrent requests wait in the queue.
    sim = start_sim(
        tmp_path, "--otlp-traces-endpoint", receiver.url, "--otlp-service-name", "sim-under-test",
        "--max-num-seqs", "1", "--decode-base-ms", "4",
    )  # fmt: skip
    with sim:
        traced = [uuid.uuid4().hex for _ in range(5)]
        with ThreadPoolExecutor(len(traced) + 2) as pool:
            futures = [pool.submit(_stream, sim, rid, {"traceparent": traceparent(rid)})
                       for rid in traced]  # fmt: skip
            bare = pool.submit(_stream, sim, "no-trace", {})
            invalid = pool.submit(_stream, sim, "bad-trace", {"traceparent": "00-zz-nothex-01"})
            streams = [f.result() for f in [*futures, bare, invalid]]
        assert all(s.status == 200 and s.complete for s in streams)
        # A request that fails (bad request) and one the client abandons.
        status, _, _ = request(sim.port, "POST", "/v1/chat/completions", chat_body(n=3),
                               headers={"X-Request-Id": "rejected"})  # fmt: skip
        assert status == 400
        sock, reader, sent, status, head = open_stream(
            sim.port, chat_body(max_tokens=500, ignore_eos=True), headers={"X-Request-Id": "gone"}
        )
        with sock:
            read_stream(reader, Stream(status, head), sent, max_events=3)
        exported = len(streams) + 3  # and the start-up span, the rejected and the gone
        wait_for(
            lambda: _metrics(sim)["llmload_sim_spans_exported_total"] >= exported, 10, "exports"
        )
        metrics = _metrics(sim)
        assert len(receiver.spans(REQUEST_SPAN)) == exported - 1
        assert metrics["llmload_sim_spans_dropped_total"] == 0
        assert metrics["llmload_sim_spans_failed_total"] == 0
        # The last request's span goes out with the flush on SIGTERM at the latest.
        _stream(sim, "last", {})
    assert sim.proc.returncode == 0
    truth = sim.raw_truth()

    assert set(receiver.content_types) == {"application/x-protobuf"}
    assert set(receiver.paths) == {"/v1/traces"}
    spans = receiver.spans(REQUEST_SPAN)
    by_id: dict[str, list[dict[str, Any]]] = {}
    for row in spans:
        by_id.setdefault(row["server_request_id"], []).append(row)
    assert sorted(by_id) == sorted(f"chatcmpl-{rid}" for rid in truth)
    assert all(len(rows) == 1 for rows in by_id.values()), "one span per request"
    assert {row["service_name"] for row in spans} == {"sim-under-test"}

    for rid, record in truth.items():
        row = by_id[f"chatcmpl-{rid}"][0]
        attrs = json.loads(row["attributes"])
        assert row["start_ns"] == record["arrival_unix_ns"]
        assert abs(row["e2e_s"] * 1e9 - (row["end_ns"] - row["start_ns"])) < 1.0
        if rid in traced:
            trace_id, parent = traceparent(rid).split("-")[1:3]
            assert (row["trace_id"], row["parent_span_id"]) == (trace_id, parent)
        else:
            assert row["parent_span_id"] is None
            assert len(row["trace_id"]) == 32 and row["trace_id"] != "0" * 32
        if record["outcome"] != "finished":
            continue
        assert "error.type" not in attrs
        # Queue, prefill and decode add up, as vLLM's attributes do.
        assert abs(row["queue_s"] + row["prefill_s"] - row["ttft_s"]) < 1e-6
        assert abs(row["prefill_s"] + row["decode_s"] - row["inference_s"]) < 1e-6
        assert abs(row["queue_s"] + row["inference_s"] - row["e2e_s"]) < 1e-6
        assert row["queue_s"] > 0 and row["prefill_s"] > 0 and row["decode_s"] > 0
        # The truth log's times, to the nanosecond: admission, first token, last event.
        content = _content_offsets(record)
        assert round(row["queue_s"] * 1e9) == record["scheduled_offset_ns"]
        assert round(row["ttft_s"] * 1e9) == content[0]
        assert round(row["e2e_s"] * 1e9) == record["events"][-1][0]
        assert row["prompt_tokens"] == record["prompt_tokens"]
        assert row["completion_tokens"] == record["completion_tokens"] == TOKENS
        assert attrs["gen_ai.request.max_tokens"] == TOKENS
        assert attrs["gen_ai.response.model"] == "llmload-sim-tiny"

    # With one running sequence, later requests spend most of their TTFT queued.
    queued = [by_id[f"chatcmpl-{rid}"][0] for rid in [*traced, "no-trace", "bad-trace"]]
    dominated = [r for r in queued if r["queue_s"] > 0.5 * r["ttft_s"]]
    assert len(dominated) >= 3, [(r["queue_s"], r["ttft_s"]) for r in queued]
    assert max(r["queue_s"] for r in queued) > 2 * TOKENS * 0.004

    rejected = json.loads(by_id["chatcmpl-rejected"][0]["attributes"])
    assert rejected["error.type"] == "bad_request"
    assert by_id["chatcmpl-rejected"][0]["ttft_s"] is None
    gone = by_id["chatcmpl-gone"][0]
    assert json.loads(gone["attributes"])["error.type"] == "cancelled"
    assert (
        gone["ttft_s"] is not None
        and gone["completion_tokens"] == truth["gone"]["completion_tokens"]
    )

    # The simulator's own start, before any request.
    (start_up,) = [row for row in receiver.rows if row["name"] in START_UP_SPANS]
    assert start_up["name"] == "Overall Loading"
    assert start_up["service_name"] == "sim-under-test"
    assert 0 < start_up["end_ns"] - start_up["start_ns"] < 30e9
    assert start_up["end_ns"] <= min(r["arrival_unix_ns"] for r in truth.values())


def test_an_endpoint_with_nothing_listening_does_not_break_serving(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    sim = start_sim(tmp_path, "--otlp-traces-endpoint", dead, "--decode-base-ms", "2")
    with sim:
        for i in range(3):
            stream = _stream(sim, f"dead-{i}", {"traceparent": traceparent(f"dead-{i}")})
            assert stream.status == 200 and stream.complete
        wait_for(lambda: _metrics(sim)["llmload_sim_spans_failed_total"] >= 4, 10, "failures")
        stream = _stream(sim, "after", {})
        assert stream.status == 200 and stream.complete
        assert _metrics(sim)["llmload_sim_spans_exported_total"] == 0
    assert sim.proc.returncode == 0
    log = sim.log_path.read_text()
    assert log.count("cannot export spans") == 1, log
    assert len(sim.raw_truth()) == 4
