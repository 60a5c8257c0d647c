"""Free TCP ports on the loopback (or a given) address, for the servers llmload starts."""

from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` right now (held together while chosen)."""
    bind_host = "0.0.0.0" if host in ("*", "") else host
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((bind_host, 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port free on `host` right now."""
    return free_ports(1, host)[0]
