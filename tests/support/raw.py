"""A raw HTTP server whose every byte the test places (`raw_server`), and SSE bytes for it.

    port = raw_server(lambda conn: conn.sendall(HEAD + chunk(sse_event("a")) + END))

It reads one request (headers, and a body of its Content-Length) and hands the connection
to `respond`; what `respond` raises fails the test at teardown.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

TIMEOUT = 10.0  # seconds, for any single socket operation of the server
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
END = b"0\r\n\r\n"  # the chunked body's last chunk

Respond = Callable[[socket.socket], None]


def sse_event(content: str, finish: str | None = None) -> bytes:
    obj = {"id": "c1", "choices": [{"index": 0, "delta": {"content": content},
                                    "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def reset(conn: socket.socket) -> None:
    """Drop the connection with a TCP reset (SO_LINGER 0), not a clean close."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.fixture
def raw_server() -> Iterator[Callable[[Respond], int]]:
    """`start(respond)`: a server on 127.0.0.1, port 0, that reads one request and hands the
    connection to `respond`; returns the port. Its errors fail the test at teardown."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def start(respond: Respond) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(TIMEOUT)
        listeners.append(listener)

        def run() -> None:
            try:
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(TIMEOUT)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    head, _, body = data.partition(b"\r\n\r\n")
                    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
                    length = int(
                        {k.lower(): v for k, v in fields.items()}.get(b"content-length", 0)
                    )
                    while len(body) < length:
                        body += conn.recv(65536)
                    respond(conn)
            except BaseException as exc:  # reported at teardown
                errors.append(exc)

        thread = threading.Thread(target=run, name="raw-sse-server", daemon=True)
        thread.start()
        threads.append(thread)
        return int(listener.getsockname()[1])

    yield start
    for thread in threads:
        thread.join(TIMEOUT)
    for listener in listeners:
        listener.close()
    assert not errors, errors
