"""Small misbehaving targets for tests, on 127.0.0.1 port 0: a handler base that lists one
model and answers JSON, and a threaded server to run one.

    class Odd(TargetHandler):
        def do_POST(self) -> None: ...
    with serving(Odd) as url: ...
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit


class TargetHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive; GET /v1/models lists model `m`, any other GET is 404; quiet."""

    protocol_version = "HTTP/1.1"

    def answer_json(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self.answer_json(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
        else:
            self.answer_json(404, {"detail": "Not Found"})

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on 127.0.0.1, any free port, in threads: its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name=handler.__name__, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed(url: str) -> bool:
    """Whether nothing accepts connections at the URL's host and port any more."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 0), timeout=1):
            return False
    except OSError:
        return True
