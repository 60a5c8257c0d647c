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
