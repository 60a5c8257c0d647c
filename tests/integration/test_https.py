"""https targets: the request goes through urllib3 (TLS), not the lean plain-http path.

A raw TLS server on 127.0.0.1 with a self-signed certificate the test's pool trusts: a whole
stream reads as over plain http, and a head trickled a byte at a time is cut at the first
token's deadline (issue 36: http.client's per-read timeout let it run for the whole trickle).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from locustfiles.request.client import Limits, execute, new_pool
from locustfiles.request.record import RequestRecord
from tests.support.raw import END, HEAD, chunk, self_signed, sse_event, trickle_head
from tests.support.sim import chat_body


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    """(the server's TLS context, the certificate a client must trust)."""
    cert, key = self_signed(tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, cert


def _send(port: int, cert: Path, limits: Limits) -> tuple[RequestRecord, float]:
    pool = new_pool()
    pool.connection_pool_kw["ca_certs"] = str(cert)  # trust the test's own certificate
    record = RequestRecord("req-tls", 0, 1, False, "s", "chat", "m", True, None, 8, "")
    started = time.monotonic()
    execute(pool, f"https://127.0.0.1:{port}/v1/chat/completions", chat_body(), {}, record, limits)
    return record, time.monotonic() - started


def test_an_https_stream_is_read_whole_with_its_phases(
    raw_server: Callable[..., int], tls: tuple[ssl.SSLContext, Path]
) -> None:
    server, cert = tls

    def stream(conn: socket.socket) -> None:
        conn.sendall(HEAD)
        for word in ("one", " two", " three"):
            time.sleep(0.05)
            conn.sendall(chunk(sse_event(word)))
        conn.sendall(chunk(sse_event("", "stop")) + chunk(b"data: [DONE]\n\n") + END)

    record, _ = _send(raw_server(stream, tls=server), cert, Limits(request_timeout=5.0))
    assert record.status == "ok", (record.error_kind, record.error_detail)
    assert record.http_status == 200 and record.connect_ns is not None  # TLS set up, timed
    assert record.chunk_chars[:3] == [3, 4, 6] and sum(record.chunk_tokens) >= 3
    offsets = record.chunk_offsets
    assert offsets == sorted(offsets) and offsets[-1] - offsets[0] >= 80_000_000  # 2 x 50 ms


def test_https_headers_that_trickle_are_cut_at_the_first_token_deadline(
    raw_server: Callable[..., int], tls: tuple[ssl.SSLContext, Path]
) -> None:
    server, cert = tls
    record, elapsed = _send(raw_server(trickle_head, tls=server), cert,
                            Limits(request_timeout=2.0, ttft_timeout=1.0))  # fmt: skip
    assert record.error_kind == "ttft_timeout", (record.error_kind, record.error_detail)
    assert record.http_status is None
    assert record.error_detail == "no response headers within 1.0 s (ReadTimeoutError)"
    assert elapsed < 5.0  # the deadline, with room for a loaded machine; it ran ~20 s before
