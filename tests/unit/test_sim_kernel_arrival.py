"""The simulator's truth log can say when the kernel had a connection's first request
(`kernel_arrival_unix_ns`): the time it waited in the accept queue is the server's, and the
client is measured against it (bench/bench_chat.py). Real sockets on loopback."""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

import pytest

from infra.simserver.http import kernel_arrival_ns, stamp_arrivals

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS")


class _Transport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None


def test_a_request_waiting_in_the_accept_queue_keeps_its_kernel_arrival() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        stamp_arrivals(listener)
        # the kernel turns receive timestamps on a moment after the first socket asks (a
        # deferred static key): a packet in that moment carries none (the simulator asks at
        # start-up, long before its first request); test-min met that race once
        time.sleep(0.05)
        with socket.create_connection(listener.getsockname()) as client:
            sent = time.time_ns()
            client.sendall(b"POST / HTTP/1.1\r\n\r\n")
            time.sleep(0.05)  # the server is slow to accept
            conn, _ = listener.accept()
            with conn:
                arrival = kernel_arrival_ns(_Transport(conn))  # type: ignore[arg-type]
                assert 0 <= arrival - sent < 20_000_000  # the kernel's time, not the accept's
                assert conn.recv(100).startswith(b"POST")  # peeked: nothing consumed
                assert kernel_arrival_ns(_Transport(conn)) == 0  # nothing waits now  # type: ignore[arg-type]


def test_every_request_on_a_kept_connection_knows_its_kernel_arrival() -> None:
    """The second request on a connection reaches the kernel while the server's loop is busy
    (a handler blocks it 150 ms): its kernel arrival is when it was sent, its `received` is
    when the loop read it, and the gap is the server's time."""
    import asyncio
    import threading

    from infra.simserver.http import HttpConnection, Request

    seen: list[Request] = []
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def handle(request: Request, conn: HttpConnection) -> None:
        seen.append(request)
        if request.path == "/block":
            time.sleep(0.15)  # the loop is busy: nothing else is read meanwhile
        conn.respond(200, b"{}")

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: HttpConnection(handle, set()), "127.0.0.1", 0)
        for sock in server.sockets:
            stamp_arrivals(sock)
        holder["port"] = server.sockets[0].getsockname()[1]
        holder["stop"] = loop.create_future()
        holder["loop"] = loop
        ready.set()
        await holder["stop"]
        server.close()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    time.sleep(0.05)  # receive stamps switch on a moment after the first socket asks
    try:
        addr = ("127.0.0.1", holder["port"])
        with socket.create_connection(addr) as kept, socket.create_connection(addr) as other:
            kept.sendall(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
            assert kept.recv(4096).startswith(b"HTTP/1.1 200")
            other.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.05)  # the handler now blocks the loop
            sent = time.time_ns()
            kept.sendall(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
            assert kept.recv(4096).startswith(b"HTTP/1.1 200")
            assert other.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set_result, None)
        thread.join(10)
    by_path = {r.path: r for r in seen}
    first, second = by_path["/first"], by_path["/second"]
    assert first.kernel_arrival_unix_ns > 0
    assert 0 <= second.kernel_arrival_unix_ns - sent < 20_000_000  # the kernel's, not the read's
    waited = second.received_unix_ns - second.kernel_arrival_unix_ns
    assert 50_000_000 < waited < 1_000_000_000, waited  # the loop read it ~100 ms later
