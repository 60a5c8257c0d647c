"""A streaming chat server cheap enough that the client, not the server, runs out of CPU.

`llmload sim` models an engine (a step loop, queues, KV, a truth log) and costs about 10 µs of
Python per event: on a 2-core machine it saturates its core before one llmload worker does,
so a capacity figure measured against it is the pair's. This server does nothing but stream:
one thread, non-blocking sockets and `selectors`, every event's bytes built once at start, one
`send` per event. Each pass of its loop writes the next event of every open stream (as an
engine's step does), so events reach the client one by one, as fast as the server can write
them (about 3 µs each here), never a whole response at once (a stream whose socket buffer is
full waits for the client).

    python bench/fast_sse_server.py [--port 0] [--port-file F] [--tokens 100]
        [--events-per-write 1]

Answers `GET /v1/models` and `GET /version` (both say simulated), and `POST
/v1/chat/completions` (streamed or not; `max_tokens` events of content " tok" each, then a
finish reason with usage and `[DONE]`, keep-alive, chunked). Anything else is a 404. Bounded:
it stops by itself after --max-seconds. Simulated: figures against it describe the client.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import selectors
import socket
import time
from collections import deque
from pathlib import Path

MODEL = "fast-sse"
HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"x-llmload-simulated: true\r\nServer: fast-sse\r\n\r\n"
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _delta(content: str | None, finish: str | None, usage: dict[str, int] | None) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj: dict[str, object] = {
        "id": "chatcmpl-fast",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        obj["usage"] = usage
    return _event(obj)


def _json(status: str, obj: object, close: bool = False) -> bytes:
    body = json.dumps(obj).encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"x-llmload-simulated: true\r\nServer: fast-sse\r\n"
        f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
    ).encode() + body


class Stream:
    """One connection: bytes to write (a queue of pieces) and the request being read."""

    __slots__ = ("inbuf", "out", "sock", "events_left", "pending_close")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = b""
        self.out: deque[bytes] = deque()  # pieces not yet written
        self.events_left: deque[bytes] = deque()  # the response's events, one per pass
        self.pending_close = False


def _respond(stream: Stream, method: str, path: str, body: bytes, tokens: int) -> None:
    if method == "GET" and path == "/v1/models":
        doc = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
        stream.out.append(_json("200 OK", doc))
    elif method == "GET" and path == "/version":
        stream.out.append(_json("200 OK", {"version": "fast-sse", "simulated": True}))
    elif method == "POST" and path.endswith("/chat/completions"):
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            stream.out.append(_json("400 Bad Request", {"error": {"message": "bad JSON"}}))
            return
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or tokens)
        usage = {"prompt_tokens": 32, "completion_tokens": n, "total_tokens": 32 + n}
        if not req.get("stream"):
            doc = {
                "id": "chatcmpl-fast",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": " tok" * n},
                        "finish_reason": "length",
                    }
                ],
                "usage": usage,
            }
            stream.out.append(_json("200 OK", doc))
            return
        stream.out.append(HEAD + ROLE)
        stream.events_left.extend([TOKEN] * (n - 1))
        stream.events_left.append(_delta(" tok", "length", usage) + DONE + b"0\r\n\r\n")
    else:
        stream.out.append(_json("404 Not Found", {"error": {"message": "not found"}}))


ROLE = _delta("", None, None)
TOKEN = _delta(" tok", None, None)
DONE = _chunk(b"data: [DONE]\n\n")


def _parse(stream: Stream, tokens: int) -> None:
    """Every complete request in the input buffer gets its response queued."""
    while True:
        end = stream.inbuf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = stream.inbuf[:end].decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip() or 0)
        if len(stream.inbuf) < end + 4 + length:
            return
        body = stream.inbuf[end + 4 : end + 4 + length]
        stream.inbuf = stream.inbuf[end + 4 + length :]
        parts = head[0].split()
        if len(parts) < 2:
            stream.pending_close = True
            return
        _respond(stream, parts[0], parts[1].split("?")[0], body, tokens)


def serve(
    port: int, port_file: Path | None, tokens: int, max_seconds: float, per_write: int = 1
) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1024)
    listener.setblocking(False)
    if port_file is not None:
        port_file.write_text(str(listener.getsockname()[1]))
    print(f"fast-sse on 127.0.0.1:{listener.getsockname()[1]}", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    streams: dict[int, Stream] = {}
    deadline = time.monotonic() + max_seconds

    def close(stream: Stream) -> None:
        streams.pop(stream.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(stream.sock)
        stream.sock.close()

    while time.monotonic() < deadline:
        busy = any(s.events_left or s.out for s in streams.values())
        for key, _ in sel.select(0 if busy else 0.5):
            if key.data is None:
                while True:
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(False)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    stream = Stream(conn)
                    streams[conn.fileno()] = stream
                    sel.register(conn, selectors.EVENT_READ, stream)
                continue
            stream = key.data
            try:
                data = stream.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                close(stream)
                continue
            stream.inbuf += data
            _parse(stream, tokens)
        # one pass: each open stream writes what it has queued, then its next event(s)
        for stream in list(streams.values()):
            if stream.events_left and not stream.out:
                left = stream.events_left
                stream.out.append(
                    b"".join(left.popleft() for _ in range(min(per_write, len(left))))
                )
            while stream.out:
                piece = stream.out[0]
                try:
                    sent = stream.sock.send(piece)
                except (BlockingIOError, InterruptedError):
                    break  # the client's buffer is full: it waits
                except OSError:
                    close(stream)
                    break
                if sent < len(piece):
                    stream.out[0] = piece[sent:]
                    break
                stream.out.popleft()
            if stream.pending_close and not stream.out:
                close(stream)
    for stream in list(streams.values()):
        close(stream)
    listener.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--tokens", type=int, default=100, help="events when max_tokens is unset")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop after this long")
    parser.add_argument(
        "--events-per-write", type=int, default=1,
        help="events each stream writes per pass, in one send (1: one by one, as an engine's "
        "steps do; more: a server that spends less per event, where one send per event would "
        "saturate its core before the client's)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.events_per_write < 1:
        parser.error("--events-per-write must be at least 1")
    serve(args.port, args.port_file, args.tokens, args.max_seconds, args.events_per_write)


if __name__ == "__main__":
    main()
