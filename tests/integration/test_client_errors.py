"""Every request is accounted for: a bug in llmload becomes a `client_error` row that the sink
keeps, every HTTP status has a kind of its own, and a transport failure is named alike by the
load, the probes and `llmload check` (one classifier, `locustfiles/request/errors.py`)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable

import pytest
import urllib3

from analysis.kernel.schema import ERROR_KINDS
from infra.check.client import Target
from infra.ports import free_port
from locustfiles.request.client import Limits, classify_status, execute, new_pool
from locustfiles.request.errors import transport_kind
from locustfiles.request.record import RequestRecord
from locustfiles.request.tokenizer import TokenCounter
from locustfiles.run.probe import send_probe
from locustfiles.sink.encode import EncodeContext, encode_requests
from tests.support.raw import HEAD, Respond, chunk, reset, sse_event
from tests.support.sim import SimFactory, chat_body


def _broken_encode(text: str) -> list[int]:
    raise RuntimeError("tokenizer blew up")


def test_a_bug_while_reading_is_recorded_as_client_error_and_kept(sim_factory: SimFactory) -> None:
    sim = sim_factory()
    pool = urllib3.PoolManager(retries=False)
    model = sim.config.served_model
    record = RequestRecord("req-client-error", 0, 1, False, "D(8,8)", "chat", model, True, 8, 8, "")
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"X-Request-Id": record.request_id}
    url = f"http://127.0.0.1:{sim.port}/v1/chat/completions"
    counter = TokenCounter(_broken_encode, "broken")
    execute(pool, url, body, headers, record, Limits(request_timeout=10.0), counter)
    assert record.http_status == 200
    assert record.status == "error" and record.error_kind == "client_error"
    assert record.error_detail and "RuntimeError: tokenizer blew up" in record.error_detail
    # The row goes through the sink's encoder unharmed: kept, not rejected.
    result = encode_requests([record.row()], EncodeContext("run-1", "w1"))
    assert result.rejected == 0 and result.errors == []
    assert result.table.column("error_kind").to_pylist() == ["client_error"]
    assert result.table.column("request_id").to_pylist() == ["req-client-error"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (100, "http_unexpected_status"),
        (201, "http_unexpected_status"),
        (204, "http_unexpected_status"),
        (299, "http_unexpected_status"),
        (301, "http_3xx"),
        (307, "http_3xx"),
        (399, "http_3xx"),
        (400, "http_4xx_input"),
        (413, "http_4xx_input"),
        (422, "http_4xx_input"),
        (401, "http_4xx_other"),
        (404, "http_4xx_other"),
        (499, "http_4xx_other"),
        (429, "queue_rejected"),
        (503, "queue_rejected"),
        (500, "http_5xx"),
        (502, "http_5xx"),
        (599, "http_5xx"),
        (600, "http_unexpected_status"),
    ],
)
def test_every_status_class_has_its_kind(status: int, kind: str) -> None:
    assert classify_status(status) == kind
    assert kind in ERROR_KINDS


def test_no_non_200_status_falls_outside_the_schema() -> None:
    kinds = {classify_status(s) for s in range(100, 600) if s != 200}
    assert kinds <= set(ERROR_KINDS)
    assert "http_5xx" not in {classify_status(s) for s in range(200, 400) if s != 200}


# -- one classifier: the load, the probes and `llmload check` name a failure alike --------


def _silent(conn: socket.socket) -> None:
    """Read the request, answer nothing until the client gives up."""
    conn.settimeout(5.0)
    with contextlib.suppress(OSError):
        conn.recv(1)


def _reset_before_answer(conn: socket.socket) -> None:
    reset(conn)


def _reset_mid_body(conn: socket.socket) -> None:
    conn.sendall(HEAD + chunk(sse_event("a")))
    time.sleep(0.1)
    reset(conn)


@pytest.mark.parametrize(
    ("respond", "load_kind", "kind", "check_kind"),
    [
        (None, "connect", "connect", "connect"),  # nothing listens: refused
        (_reset_before_answer, "connect", "connect", "connect"),
        (_reset_mid_body, "stream_truncated", "transport", "stream_truncated"),
        (_silent, "total_timeout", "timeout", "timeout"),
    ],
    ids=["refused", "reset-before-answer", "reset-mid-body", "no-answer"],
)
def test_every_client_names_a_transport_failure_alike(
    raw_server: Callable[[Respond], int],
    respond: Respond | None,
    load_kind: str,
    kind: str,
    check_kind: str,
) -> None:
    def target() -> str:
        return f"http://127.0.0.1:{free_port() if respond is None else raw_server(respond)}"

    pool = new_pool()
    record = RequestRecord("req-transport", 0, 1, False, "s", "chat", "m", True, None, 8, "")
    url = target() + "/v1/chat/completions"
    execute(pool, url, chat_body(stream=True), {}, record, Limits(request_timeout=0.5))
    assert record.error_kind == load_kind, record.error_detail

    sent = send_probe(new_pool(), "calibration", "POST", target() + "/v1/chat/completions",
                      body=chat_body(stream=True), timeout=0.5)  # fmt: skip
    assert sent.reply.status is None and sent.reply.failure == kind
    assert sent.record.http_status is None
    assert sent.record.outcome.startswith("connect error: ") == (kind == "connect")

    answer = Target(target(), None, 0.5).stream("/v1/chat/completions", chat_body(), True)
    assert answer.error_kind == check_kind, answer.detail
    assert not answer.cancelled


def test_check_keeps_a_read_timeout_on_a_stalled_stream(
    raw_server: Callable[[Respond], int],
) -> None:
    """`llmload check` runs without gevent: the watchdog's greenlet never runs there, so each
    read of the shared request path has the check's timeout instead (Limits.read_timeout)."""

    def stall(conn: socket.socket) -> None:
        conn.sendall(HEAD + chunk(sse_event("a")))
        _silent(conn)

    started = time.monotonic()
    answer = Target(f"http://127.0.0.1:{raw_server(stall)}", None, 0.5).stream(
        "/v1/chat/completions", chat_body(), True
    )
    assert answer.error_kind == "timeout" and answer.tokens == 1, answer.detail
    assert answer.detail == "no data within 0.5 s (TimeoutError)"
    assert time.monotonic() - started < 4


def test_the_classes_of_socket_errors() -> None:
    assert transport_kind(ValueError("a bug")) is None
    assert transport_kind(ConnectionRefusedError()) == "connect"
    assert transport_kind(ConnectionRefusedError(), responded=True) == "transport"
    assert transport_kind(TimeoutError()) == "timeout"
    assert transport_kind(BrokenPipeError()) == "transport"
