"""Free TCP ports on the loopback (or a given) address, for the servers llmload starts, and
the probes that tell whether such a server listens and answers."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


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


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def answers_200(url: str, timeout: float = 2.0) -> bool:
    """Whether GET `url` answers 200 (a server's readiness probe: /health, /v1/models)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
