"""The master's probes of the target carry their own request ids and are listed, whatever
happens to them (a real HTTP server on port 0, and a port where nothing listens)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.ports import free_port
from locustfiles.master.coordinator import probe_target
from locustfiles.run.manifest import ProbeRecord


class Target(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:  # http.server's name for GET
        Target.seen.append((self.path, self.headers.get("X-Request-Id")))
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "m1"}]}).encode()
            self.send_response(200)
        else:
            body = b'{"error": "no such route"}'
            self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def target() -> Iterator[str]:
    Target.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_each_probe_has_its_id_and_outcome(target: str) -> None:
    probes: list[ProbeRecord] = []
    info = probe_target(target, probes=probes)
    assert info["model"] == "m1"
    assert [(p.purpose, p.http_status, p.outcome) for p in probes] == [
        ("target_models", 200, "ok"),
        ("target_version", 404, "http 404"),
    ]
    assert all(p.worker_id is None for p in probes)
    # the server saw exactly these ids, one per request
    assert Target.seen == [("/v1/models", probes[0].request_id), ("/version", probes[1].request_id)]
    assert probes[0].request_id != probes[1].request_id
    assert all(p.request_id.startswith("probe-") for p in probes)


def test_probes_that_cannot_connect_are_listed_and_never_raise() -> None:
    probes: list[ProbeRecord] = []
    info = probe_target(f"http://127.0.0.1:{free_port()}", timeout=2.0, probes=probes)
    assert info["model"] is None
    assert [p.purpose for p in probes] == ["target_models", "target_version"]
    for p in probes:
        assert p.http_status is None and p.outcome.startswith("connect error: "), p
