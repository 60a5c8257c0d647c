"""Every wait has a bound: a server that answers 200 and then sends only `: ping` comments,
or nothing, or one endless line, is reported within the client's timeouts, never waited on.

The servers are raw sockets (`raw_server`): every byte is the test's.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable

from infra.check.client import Target
from locustfiles.request.client import Limits, execute, new_pool
from locustfiles.request.record import RequestRecord
from locustfiles.run.probe import reply_outcome, send_probe
from tests.support.raw import HEAD, Respond, chunk, sse_event, trickle_head
from tests.support.sim import chat_body

PLAIN_CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _pings(conn: socket.socket, head: bytes = HEAD, every_s: float = 0.05) -> None:
    """Answer 200, then `: ping` comments until the client hangs up (at most 5 s)."""
    conn.sendall(head)
    end = time.monotonic() + 5.0
    with contextlib.suppress(OSError):
        while time.monotonic() < end:
            conn.sendall(chunk(b": ping\n\n"))
            time.sleep(every_s)


def test_check_reports_a_ping_forever_stream_within_its_timeout(
    raw_server: Callable[[Respond], int],
) -> None:
    """Comments keep every read short of the check's read timeout; the TTFT deadline (the
    check's --timeout) still holds: comments are not tokens."""
    started = time.monotonic()
    answer = Target(f"http://127.0.0.1:{raw_server(_pings)}", None, 0.5).stream(
        "/v1/chat/completions", chat_body(), True
    )
    assert time.monotonic() - started < 2.0
    assert answer.error_kind == "timeout" and answer.tokens == 0, answer.detail
    assert answer.detail == "no first token within 0.5 s"


def test_check_reports_a_silent_stream_as_no_first_token(
    raw_server: Callable[[Respond], int],
) -> None:
    def silent(conn: socket.socket) -> None:
        conn.sendall(HEAD)
        conn.settimeout(5.0)
        with contextlib.suppress(OSError):
            conn.recv(1)

    started = time.monotonic()
    answer = Target(f"http://127.0.0.1:{raw_server(silent)}", None, 0.5).stream(
        "/v1/chat/completions", chat_body(), True
    )
    assert time.monotonic() - started < 2.0
    assert answer.error_kind == "timeout" and answer.detail == "no first token within 0.5 s"


def test_a_probe_whose_body_never_ends_times_out_within_its_bound(
    raw_server: Callable[[Respond], int],
) -> None:
    """A non-streamed probe (and every `exchange`): the timeout bounds the whole answer."""
    url = f"http://127.0.0.1:{raw_server(lambda c: _pings(c, PLAIN_CHUNKED))}/v1/models"
    started = time.monotonic()
    sent = send_probe(new_pool(), "models", "GET", url, timeout=0.5)
    assert time.monotonic() - started < 2.0
    assert sent.reply.status is None and sent.reply.failure == "timeout"
    assert reply_outcome(sent.reply) == (
        "TimeoutError: HTTP 200, but the response did not end within 0.5 s"
    )


def test_an_endless_line_is_a_malformed_event_and_closes_the_connection(
    raw_server: Callable[[Respond], int],
) -> None:
    closed: list[bool] = []

    def endless(conn: socket.socket) -> None:
        conn.sendall(HEAD + chunk(sse_event("a")))
        with contextlib.suppress(OSError):
            for _ in range(400):  # 400 x 16 KiB, never a line end
                conn.sendall(chunk(b"x" * 16384))
            conn.settimeout(5.0)
            closed.append(conn.recv(1) == b"")  # the client hung up
            return
        closed.append(True)  # reset by the client

    record = RequestRecord("req-long", 0, 1, False, "s", "chat", "m", True, None, 8, "")
    url = f"http://127.0.0.1:{raw_server(endless)}/v1/chat/completions"
    execute(new_pool(), url, chat_body(), {}, record, Limits(max_event_bytes=65536))
    assert record.error_kind == "malformed_event", record.error_detail
    assert record.error_detail == "an event line longer than 65536 bytes (--max-event-bytes)"
    assert record.chunk_tokens == [1]
    deadline = time.monotonic() + 5.0
    while not closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert closed == [True]


def test_headers_that_trickle_are_cut_at_the_first_token_deadline(
    raw_server: Callable[[Respond], int],
) -> None:
    """Issue 36: a byte of the response head every 0.2 s kept each read under its timeout,
    so `--request-timeout 2 --ttft-timeout 1` never fired and the request stayed open until
    the run ended. The head's deadline now covers all of it."""
    record = RequestRecord("req-trickle", 0, 1, False, "s", "chat", "m", True, None, 8, "")
    url = f"http://127.0.0.1:{raw_server(trickle_head)}/v1/chat/completions"
    started = time.monotonic()
    execute(new_pool(), url, chat_body(), {}, record,
            Limits(request_timeout=2.0, ttft_timeout=1.0))  # fmt: skip
    elapsed = time.monotonic() - started
    assert record.error_kind == "ttft_timeout", (record.error_kind, record.error_detail)
    assert record.http_status is None
    assert elapsed < 5.0  # the deadline, with room for a loaded machine; it ran 38 s before
