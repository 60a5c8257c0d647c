"""Two small LLM services of their own kind, for the extension examples (examples/*_locustfile.py):
real HTTP servers on 127.0.0.1, port 0, in a thread, each keeping a truth log per request.

- `RagService`: `POST /auth/login` ({"user", "password"} -> {"token"}; 401 otherwise), then
  `POST /v1/rag/ask` with `Authorization: Bearer TOKEN` and {"question", "top_k",
  "max_answer_tokens"}: an SSE stream of JSON events `{"kind": "retrieval", "docs": [...]}`,
  `{"kind": "token", "text": " word"}` (one per token), `{"kind": "done", "usage":
  {"question_tokens", "answer_tokens"}}`; 401 without a valid token.
- `GenerateService`: `POST /generate` with {"prompt", "max_new_tokens"}: a chunked
  `text/plain` body, one word per line, ended by the body's end.

    with RagService() as rag:
        rag.url, rag.truth   # {request id (X-Request-Id): {"tokens", "path", "logins"}}
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_S = 0.002
"""Time between two output tokens."""

PASSWORD = "s3cret-password"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each token leaves when written, as an engine's do
    service: _Service

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _json_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return None

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
        self.wfile.flush()

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def do_POST(self) -> None:
        self.service.handle(self)


class _Service:
    """A server in a thread; `truth` holds what it sent, by request id."""

    def __init__(self) -> None:
        handler = type("Handler", (_Handler,), {"service": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.truth: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Service:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def note(self, handler: _Handler, **row: Any) -> None:
        rid = handler.headers.get("X-Request-Id") or f"anon-{len(self.truth)}"
        with self.lock:
            self.truth[rid] = {"path": handler.path, **row}

    def handle(self, handler: _Handler) -> None:
        raise NotImplementedError


def _words(n: int) -> list[str]:
    return [f" w{i % 97}" for i in range(n)]


class RagService(_Service):
    def __init__(self) -> None:
        super().__init__()
        self.tokens: set[str] = set()
        self.logins = 0

    def handle(self, handler: _Handler) -> None:
        body = handler._json_body()
        if handler.path == "/auth/login":
            if not isinstance(body, dict) or body.get("password") != PASSWORD:
                handler._reply(401, {"error": "bad credentials"})
                return
            with self.lock:
                self.logins += 1
                token = f"tok-{self.logins}"
                self.tokens.add(token)
            handler._reply(200, {"token": token})
            return
        if handler.path != "/v1/rag/ask":
            handler._reply(404, {"error": f"no route {handler.path}"})
            return
        auth = handler.headers.get("Authorization", "")
        if auth.removeprefix("Bearer ") not in self.tokens:
            handler._reply(401, {"error": "log in first"})
            return
        if not isinstance(body, dict) or not isinstance(body.get("question"), str):
            handler._reply(400, {"error": "a question is required"})
            return
        n = int(body.get("max_answer_tokens") or 16)
        question_tokens = len(body["question"].split())
        handler._start_stream("text/event-stream")
        docs = [
            {"id": f"doc-{i}", "score": round(1 - i / 10, 2)} for i in range(body.get("top_k", 3))
        ]
        handler._chunk(b"data: %b\n\n" % json.dumps({"kind": "retrieval", "docs": docs}).encode())
        for word in _words(n):
            time.sleep(TOKEN_S)
            handler._chunk(b'data: {"kind":"token","text":"%b"}\n\n' % word.encode())
        usage = {"question_tokens": question_tokens, "answer_tokens": n}
        handler._chunk(b"data: %b\n\n" % json.dumps({"kind": "done", "usage": usage}).encode())
        handler.wfile.write(b"0\r\n\r\n")
        self.note(handler, tokens=n, question_tokens=question_tokens, token=auth)


class GenerateService(_Service):
    def handle(self, handler: _Handler) -> None:
        body = handler._json_body()
        if handler.path != "/generate":
            handler._reply(404, {"error": f"no route {handler.path}"})
            return
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            handler._reply(400, {"error": "a prompt is required"})
            return
        n = int(body.get("max_new_tokens") or 16)
        handler._start_stream("text/plain; charset=utf-8")
        for word in _words(n):
            time.sleep(TOKEN_S)
            handler._chunk(word.strip().encode() + b"\n")
        handler.wfile.write(b"0\r\n\r\n")
        self.note(handler, tokens=n, prompt_words=len(body["prompt"].split()))
