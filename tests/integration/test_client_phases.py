"""The client's phases (schema 1.4): a request is timed from the moment its bytes were handed
to the kernel, not from the decision to send; the time in between (waiting for a connection,
opening it) is the client's own delay, recorded beside the connection it went on. Checked
against the simulator's truth log (its arrival time of each request)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import urllib3
import urllib3.connection

from analysis.kernel.spans import traceparent
from locustfiles.request.client import Limits, execute, new_pool
from locustfiles.request.record import RequestRecord
from tests.support.sim import SimFactory, chat_body

SLOW_CONNECT_S = 0.08


def _send(pool: urllib3.PoolManager, port: int, request_id: str) -> RequestRecord:
    record = RequestRecord(request_id, 0, 1, False, "D(8,8)", "chat", "m", True, 8, 8, "")
    body = {**chat_body(), "max_tokens": 8, "stream_options": {"include_usage": True}}
    headers = {"X-Request-Id": request_id, "traceparent": traceparent(request_id)}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return execute(pool, url, body, headers, record, Limits(request_timeout=20.0))


def _truth(path: Path) -> dict[str, dict[str, object]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {str(r["request_id"]): r for r in rows}


def test_a_slow_connect_is_the_clients_delay_not_the_servers_time(
    sim_factory: SimFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth_log = tmp_path / "truth.jsonl"
    sim = sim_factory("--truth-log", str(truth_log), "--output-len", "8")
    real_connect = urllib3.connection.HTTPConnection.connect

    def slow_connect(self: urllib3.connection.HTTPConnection) -> None:  # a slow TCP connect
        time.sleep(SLOW_CONNECT_S)
        real_connect(self)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "connect", slow_connect)
    pool = new_pool()
    decided = time.time_ns()
    first = _send(pool, sim.port, "a" * 32)
    second = _send(pool, sim.port, "b" * 32)
    for record in (first, second):
        assert record.status == "ok", record.error_detail
        assert record.first_token_ns is not None and record.end_ns is not None

    # the first request opened the connection: its delay holds the connect, its TTFT not
    assert first.connect_new is True and first.connect_ns is not None
    assert first.connect_ns >= SLOW_CONNECT_S * 1e9
    assert first.client_delay_ns is not None and first.client_delay_ns >= first.connect_ns
    assert first.sent_at_ns - decided >= SLOW_CONNECT_S * 1e9
    assert first.first_token_ns < SLOW_CONNECT_S * 1e9 / 2
    # the second went on the same connection: nothing to open, a small delay
    assert second.connect_new is False and second.connect_ns is None
    assert second.client_delay_ns is not None and second.client_delay_ns < SLOW_CONNECT_S * 1e9

    # the server read each request after the client's write, and within a few ms of it
    sim.stop()
    truth = _truth(truth_log)
    for record in (first, second):
        arrival = int(truth[record.request_id]["arrival_unix_ns"])  # type: ignore[call-overload]
        assert -1_000_000 < arrival - record.sent_at_ns < 20_000_000, record.request_id


def test_a_pool_without_stamps_keeps_the_decision_as_the_origin(sim_factory: SimFactory) -> None:
    """Any urllib3 pool still works (tools pass their own): no phases, times from the decision."""
    sim = sim_factory("--output-len", "4")
    record = _send(urllib3.PoolManager(retries=False), sim.port, "c" * 32)
    assert record.status == "ok"
    assert record.connect_new is None and record.client_delay_ns is None


def test_a_connection_idle_past_the_servers_keep_alive_is_opened_anew(
    sim_factory: SimFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Servers close idle connections after a few seconds (uvicorn: 5 s); a request written
    as they do fails unseen. A connection idle past IDLE_RECONNECT_NS is opened anew first."""
    from locustfiles.request import wire

    monkeypatch.setattr(wire, "IDLE_RECONNECT_NS", 50_000_000)
    sim = sim_factory("--output-len", "4")
    pool = new_pool()
    first = _send(pool, sim.port, "d" * 32)
    at_once = _send(pool, sim.port, "e" * 32)
    time.sleep(0.1)
    after_idle = _send(pool, sim.port, "f" * 32)
    assert [r.status for r in (first, at_once, after_idle)] == ["ok"] * 3
    assert [r.connect_new for r in (first, at_once, after_idle)] == [True, False, True]


def test_bytes_that_came_with_the_headers_keep_their_arrival_time(
    sim_factory: SimFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lean path reads the headers with kernel receive times: when the client gets to
    them late (a busy worker: here 150 ms), the headers and the event that came with them
    (the role event) are timed by their arrival, not by the late read."""
    from locustfiles.request import wire

    late_s = 0.15
    real_read_head = wire._read_head

    def late_read_head(*args: object) -> wire.LeanResponse:
        time.sleep(late_s)  # the response is in the kernel's buffer meanwhile
        return real_read_head(*args)  # type: ignore[arg-type]

    pool = new_pool()
    sim = sim_factory("--output-len", "4")
    _send(pool, sim.port, "1" * 32)  # a warm connection
    monkeypatch.setattr(wire, "_read_head", late_read_head)
    start = time.perf_counter()
    record = _send(pool, sim.port, "2" * 32)
    took_s = time.perf_counter() - start
    assert record.status == "ok", record.error_detail
    assert took_s >= late_s  # the client did read late
    assert record.headers_ns is not None and record.first_event_ns is not None
    assert record.headers_ns < late_s * 1e9 / 3, record.headers_ns
    assert record.first_event_ns == record.headers_ns  # the role event came with them
