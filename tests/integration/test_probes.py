"""Probes of the target (the master's, its preflight's, a worker's: one helper,
`locustfiles/run/probe.py`) carry their own request ids and are listed, whatever happens to
them (a real HTTP server on port 0, the simulator, and a port where nothing listens)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from infra.ports import free_port
from locustfiles.master.target import probe_target
from locustfiles.request.client import Limits, new_pool
from locustfiles.run.manifest import ProbeRecord
from locustfiles.run.probe import send_probe, send_stream_probe
from tests.support.sim import SimFactory, chat_body


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


@pytest.fixture
def pool() -> Iterator[urllib3.PoolManager]:
    manager = new_pool()
    yield manager
    manager.clear()


def test_a_workers_probe_is_listed_with_its_worker_and_reply(
    target: str, pool: urllib3.PoolManager
) -> None:
    url = target + "/v1/models"
    sent = send_probe(pool, "models", "GET", url, api_key="sk-x", worker_id="w1")
    assert sent.reply.status == 200 and sent.reply.json() == {"data": [{"id": "m1"}]}
    record = sent.record
    assert (record.purpose, record.outcome, record.worker_id) == ("models", "ok", "w1")
    assert Target.seen == [("/v1/models", record.request_id)]


def test_a_streamed_probe_is_recorded_from_its_request(
    sim_factory: SimFactory, pool: urllib3.PoolManager
) -> None:
    sim = sim_factory()
    body = chat_body(max_tokens=4, stream=True, model=sim.config.served_model,
                     stream_options={"include_usage": True, "continuous_usage_stats": True})  # fmt: skip
    record, probe = send_stream_probe(
        pool, "continuous_usage", f"http://127.0.0.1:{sim.port}/v1/chat/completions",
        body, Limits(request_timeout=10.0), endpoint="chat", model=sim.config.served_model,
    )  # fmt: skip
    assert record.status == "ok" and record.output_tokens_source == "usage", record.error_detail
    assert (probe.request_id, probe.http_status, probe.outcome) == (record.request_id, 200, "ok")
    assert probe.request_id.startswith("probe-") and record.scenario == "probe"
