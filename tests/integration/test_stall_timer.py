"""The stall timer restarts on a data event only (README: "--stall-timeout … without a data
event").

A server sends one token, then for longer than the stall timeout either only SSE comments
(`: ping`, keep-alives that complete no event: a server that never finishes must not hold a
request until --request-timeout), or nothing, or a token every 0.1 s, then the rest. The
client, as in a worker (gevent monkey-patched, the watchdog greenlet keeping deadlines),
calls the first two a stall, the third not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SERVER = r"""
import socket, sys, time
mode = sys.argv[1]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
data = b""
while b"\r\n\r\n" not in data:
    data += conn.recv(65536)
head, _, body = data.partition(b"\r\n\r\n")
length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
while len(body) < length:
    body += conn.recv(65536)
def chunk(payload):
    conn.sendall(b"%x\r\n%s\r\n" % (len(payload), payload))
conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
event = lambda obj: b"data: " + obj + b"\n\n"
chunk(event(b'{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}'))
for _ in range(8):  # 0.8 s after the first token, with the stall timeout at 0.3 s
    time.sleep(0.1)
    if mode == "ping":
        chunk(b": ping\n\n")
    elif mode == "tokens":
        chunk(event(b'{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}'))
chunk(event(b'{"choices":[{"delta":{"content":"b"},"finish_reason":"stop"}]}'))
chunk(event(b"[DONE]"))
conn.sendall(b"0\r\n\r\n")
time.sleep(0.5)
"""

CLIENT = r"""
from gevent import monkey
monkey.patch_all()
import json, sys
sys.path.insert(0, sys.argv[2])
from locustfiles.request.client import Limits, execute, new_pool
from locustfiles.request.record import RequestRecord
record = RequestRecord("r", 0, 1, False, "s", "chat", "m", True, None, 2, "")
body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
execute(new_pool(), f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions", body, {}, record,
        Limits(stall_timeout=0.3))
print(json.dumps({"status": record.status, "error_kind": record.error_kind}))
"""


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("ping", "stall_timeout"), ("silent", "stall_timeout"), ("tokens", None)],
)
def test_only_a_data_event_restarts_the_stall_timer(mode: str, expected: str | None) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, mode], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        out = subprocess.run(
            [sys.executable, "-c", CLIENT, port, str(ROOT)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        server.kill()
        server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error_kind"] == expected, result
    assert result["status"] == ("ok" if expected is None else "error")
