"""Fixtures and raw clients for the simulated engine (infra/simserver).

`sim_factory(*flags)` starts a real server on 127.0.0.1, port 0, in a thread with its own
event loop, configured with the same flags as `llmload sim`; every server is stopped at
teardown. The clients below speak HTTP/1.1 over a plain socket so tests see the exact bytes
(chunk framing, SSE events) and when each event arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from analysis.kernel.prometheus import parse_prometheus
from infra.simserver.options import add_arguments, build_config
from infra.simserver.server import SimServer

TIMEOUT = 10.0  # seconds, for any single socket operation in these tests


class RunningSim:
    """A SimServer running in a background thread."""

    def __init__(self, flags: tuple[str, ...]) -> None:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--port", "0", *flags])
        self.config = build_config(args)
        self.server = SimServer(self.config)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sim-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(TIMEOUT):
            raise RuntimeError("simulator did not start")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            await self.server.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.server.shutdown(drain_seconds=0)

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        if self._thread.is_alive():
            assert self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(TIMEOUT)

    def metrics(self) -> dict[str, float]:
        """{"name{labels}": value} (labels sorted), as llmload's scraper reads them."""
        status, _, body = request(self.port, "GET", "/metrics")
        assert status == 200
        return {s.key: s.value for s in parse_prometheus(body.decode())}

    def wait_metric(
        self, name: str, predicate: Callable[[float], bool], timeout: float = 5.0
    ) -> float:
        deadline = time.monotonic() + timeout
        value = self.metrics()[name]
        while not predicate(value) and time.monotonic() < deadline:
            time.sleep(0.01)
            value = self.metrics()[name]
        return value


SimFactory = Callable[..., "RunningSim"]


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., RunningSim]]:
    servers: list[RunningSim] = []

    def start(*flags: str) -> RunningSim:
        server = RunningSim(flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def sim(sim_factory: Callable[..., RunningSim]) -> RunningSim:
    """A default `tiny` simulator."""
    return sim_factory()


# --- raw HTTP clients ---------------------------------------------------------------------


def request_bytes(
    method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> bytes:
    raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(raw)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + raw


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Reader:
    """Buffered reads from a socket, with the time each read returned."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.closed = False

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
            return False
        self.buf += data
        return True

    def read_until(self, marker: bytes) -> bytes | None:
        while marker not in self.buf:
            if not self._fill():
                return None
        head, _, self.buf = self.buf.partition(marker)
        return head

    def read_exact(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self._fill():
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def read_head(reader: Reader) -> tuple[int, dict[str, str]]:
    head = reader.read_until(b"\r\n\r\n")
    assert head is not None, "connection closed before the response head"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def request(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One whole (non-streamed) request on a fresh connection."""
    with connect(port) as sock:
        sock.sendall(request_bytes(method, path, body, headers))
        reader = Reader(sock)
        status, head = read_head(reader)
        if "content-length" in head:
            data = reader.read_exact(int(head["content-length"]))
            assert data is not None
            return status, head, data
        chunks: list[bytes] = []
        while True:
            size_line = reader.read_until(b"\r\n")
            assert size_line is not None
            size = int(size_line, 16)
            chunk = reader.read_exact(size + 2)
            assert chunk is not None
            if size == 0:
                return status, head, b"".join(chunks)
            chunks.append(chunk[:-2])


@dataclass
class Stream:
    """A streamed response as the client saw it."""

    status: int
    headers: dict[str, str]
    events: list[bytes] = field(default_factory=list)  # SSE event payloads after "data: "
    arrivals_ns: list[int] = field(default_factory=list)  # perf_counter_ns, from send
    chunks: int = 0
    complete: bool = False  # the chunked body ended properly
    headers_ns: int = 0
    body: bytes = b""  # a response that was not streamed (an error)

    def json_events(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.events if e != b"[DONE]"]

    def content_events(self) -> list[dict[str, Any]]:
        out = []
        for event in self.json_events():
            choices = event.get("choices") or []
            if choices and ("content" in choices[0].get("delta", {}) or "text" in choices[0]):
                text = choices[0].get("delta", {}).get("content", choices[0].get("text"))
                if text:
                    out.append(event)
        return out

    def text(self) -> str:
        parts = []
        for event in self.content_events():
            choice = event["choices"][0]
            parts.append(choice.get("delta", {}).get("content", choice.get("text", "")))
        return "".join(parts)


def chat_body(content: str = "hello simulated world", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "stream": True, **extra}


def open_stream(
    port: int, body: Any, path: str = "/v1/chat/completions", headers: dict[str, str] | None = None
) -> tuple[socket.socket, Reader, int, int, dict[str, str]]:
    """Send a streaming request; returns the socket, reader, send time, status and headers."""
    sock = connect(port)
    reader = Reader(sock)
    sent = time.perf_counter_ns()
    sock.sendall(request_bytes("POST", path, body, headers))
    status, head = read_head(reader)
    return sock, reader, sent, status, head


def read_stream(
    reader: Reader, stream: Stream, sent_ns: int, max_events: int | None = None
) -> Stream:
    """Read chunks, splitting SSE events and timing each one, until the body ends (or
    `max_events` events were read)."""
    pending = b""
    while max_events is None or len(stream.events) < max_events:
        size_line = reader.read_until(b"\r\n")
        if size_line is None:
            return stream
        size = int(size_line.split(b";")[0], 16)
        chunk = reader.read_exact(size + 2)
        if chunk is None:
            return stream
        if size == 0:
            stream.complete = True
            return stream
        now = time.perf_counter_ns() - sent_ns
        stream.chunks += 1
        pending += chunk[:-2]
        while b"\n\n" in pending:
            event, _, pending = pending.partition(b"\n\n")
            assert event.startswith(b"data: "), event
            stream.events.append(event[len(b"data: ") :])
            stream.arrivals_ns.append(now)
    return stream


def stream_request(
    port: int, body: Any, path: str = "/v1/chat/completions", headers: dict[str, str] | None = None
) -> Stream:
    sock, reader, sent, status, head = open_stream(port, body, path, headers)
    with sock:
        stream = Stream(status, head, headers_ns=time.perf_counter_ns() - sent)
        if head.get("transfer-encoding") != "chunked":
            stream.body = reader.read_exact(int(head.get("content-length", "0"))) or b""
            return stream
        return read_stream(reader, stream, sent)
