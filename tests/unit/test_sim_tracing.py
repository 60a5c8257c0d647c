"""The simulator's span export (infra/simserver/tracing.py): trace context, endpoints, the
spans' attributes, and the exporter's queue, batches and flush against a real receiver."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from analysis.kernel.errors import UsageError
from analysis.kernel.spans import decode_export, span_rows
from infra.simserver.config import SimConfig
from infra.simserver.tracing import (
    Endpoint,
    RequestRecord,
    SpanExporter,
    SpanStats,
    parse_traceparent,
    start_up_record,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "valid"),
    [
        (f"00-{TRACE}-{PARENT}-01", True),
        (f"00-{TRACE.upper()}-{PARENT}-00", True),
        (f"01-{TRACE}-{PARENT}-01-future", True),
        (None, False),
        ("", False),
        (f"00-{TRACE}-{PARENT}-01-extra", False),
        (f"ff-{TRACE}-{PARENT}-01", False),
        (f"00-{'0' * 32}-{PARENT}-01", False),
        (f"00-{TRACE}-{'0' * 16}-01", False),
        (f"00-{TRACE[:-1]}x-{PARENT}-01", False),
        (f"00-{TRACE}-{PARENT}", False),
    ],
)
def test_traceparent(header: str | None, valid: bool) -> None:
    parsed = parse_traceparent(header)
    if valid:
        assert parsed == (bytes.fromhex(TRACE), bytes.fromhex(PARENT))
    else:
        assert parsed is None


def test_endpoints() -> None:
    assert Endpoint.parse("http://collector:4318/v1/traces").path == "/v1/traces"
    bare = Endpoint.parse("http://collector:4318")
    assert (bare.host, bare.port, bare.path, bare.tls) == ("collector", 4318, "/v1/traces", False)
    tls = Endpoint.parse("https://otel.example/x")
    assert (tls.port, tls.path, tls.tls) == (443, "/x", True)
    for bad in ("grpc://collector:4317", "collector:4318", "http://", "http://h:99999/"):
        with pytest.raises(UsageError, match="--otlp-traces-endpoint"):
            Endpoint.parse(bad)
    with pytest.raises(UsageError, match="--otlp-traces-endpoint"):
        SimConfig(otlp_traces_endpoint="localhost:4318").check()
    with pytest.raises(UsageError, match="--otlp-service-name"):
        SimConfig(otlp_service_name=" ").check()


def _record(**changes: object) -> RequestRecord:
    record = RequestRecord(
        traceparent=f"00-{TRACE}-{PARENT}-01",
        request_id="chatcmpl-r1",
        model="m",
        arrival_unix_ns=1_000_000_000_000,
        arrival_ns=5_000,
        scheduled_ns=1_005_000,
        first_token_ns=3_005_000,
        end_ns=10_005_000,
        prompt_tokens=7,
        completion_tokens=4,
        max_tokens=4,
    )
    for name, value in changes.items():
        setattr(record, name, value)
    return record


def _rows(records: list[RequestRecord]) -> list[dict[str, object]]:
    stats = SpanStats()
    exporter = SpanExporter(Endpoint.parse("http://127.0.0.1:1/"), "svc", stats)
    body = asyncio.run(exporter._encode(list(records)))
    return list(span_rows(decode_export(body, "protobuf"), "run", "test"))


def test_a_finished_request_span() -> None:
    (row,) = _rows([_record()])
    assert (row["trace_id"], row["parent_span_id"]) == (TRACE, PARENT)
    assert row["start_ns"] == 1_000_000_000_000
    assert row["end_ns"] == 1_000_000_000_000 + 10_000_000
    assert row["queue_s"] == 0.001 and row["prefill_s"] == 0.002 and row["ttft_s"] == 0.003
    assert row["decode_s"] == 0.007 and row["inference_s"] == 0.009 and row["e2e_s"] == 0.01
    assert (row["prompt_tokens"], row["completion_tokens"]) == (7, 4)
    assert row["server_request_id"] == "chatcmpl-r1" and row["service_name"] == "svc"
    assert "error.type" not in json.loads(str(row["attributes"]))


def test_a_request_that_never_got_far_has_what_is_known() -> None:
    never = _record(scheduled_ns=0, first_token_ns=0, traceparent="junk", error="queue_full",
                    prompt_tokens=None, max_tokens=None, completion_tokens=0)  # fmt: skip
    prefilling = _record(first_token_ns=0, traceparent=None, error="cancelled")
    a, b = _rows([never, prefilling])
    assert a["parent_span_id"] is None and a["trace_id"] != TRACE
    assert a["queue_s"] == a["e2e_s"] == 0.01
    assert a["prefill_s"] is None and a["ttft_s"] is None and a["decode_s"] is None
    assert a["prompt_tokens"] is None
    assert json.loads(str(a["attributes"]))["error.type"] == "queue_full"
    assert b["trace_id"] not in (TRACE, a["trace_id"])
    assert b["queue_s"] == 0.001 and b["prefill_s"] == 0.009 and b["ttft_s"] is None
    assert json.loads(str(b["attributes"]))["error.type"] == "cancelled"


class _Receiver:
    """A one-answer-per-connection OTLP/HTTP receiver on the test's loop."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/traces"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        self.bodies.append(await reader.readexactly(length))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    def names(self) -> list[str]:
        return [
            row["name"]
            for body in self.bodies
            for row in span_rows(decode_export(body, "protobuf"), "run", "test")
        ]

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def test_exporter_batches_drops_when_full_and_flushes_on_close() -> None:
    async def main() -> tuple[SpanStats, _Receiver, int]:
        receiver = _Receiver()
        url = await receiver.start()
        stats = SpanStats()
        exporter = SpanExporter(
            Endpoint.parse(url), "svc", stats, interval=60, batch_size=3, max_queue=4
        )
        exporter.start()
        exporter.add(start_up_record(1, "tiny", "m"))
        for _ in range(2):
            exporter.add(_record())
        # A full batch goes out at once, long before the interval.
        for _ in range(200):
            if stats.exported == 3:
                break
            await asyncio.sleep(0.01)
        batches = len(receiver.bodies)
        for _ in range(5):  # the queue holds 4: the fifth is dropped
            exporter.add(_record())
        await exporter.close()
        exporter.add(_record())  # after close: dropped, counted
        await receiver.close()
        return stats, receiver, batches

    stats, receiver, batches = asyncio.run(main())
    assert batches == 1
    assert (stats.exported, stats.dropped, stats.failed) == (7, 2, 0)
    assert receiver.names() == ["Overall Loading"] + ["llm_request"] * 6


def test_a_failing_endpoint_is_counted_and_reported_once() -> None:
    async def main(err: io.StringIO) -> SpanStats:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()  # nothing listens there now
        stats = SpanStats()
        url = f"http://127.0.0.1:{port}/v1/traces"
        exporter = SpanExporter(Endpoint.parse(url), "svc", stats, interval=0.01, err=err)
        exporter.start()
        for _ in range(3):
            exporter.add(_record())
            await asyncio.sleep(0.05)
        await exporter.close()
        return stats

    err = io.StringIO()
    stats = asyncio.run(main(err))
    assert (stats.exported, stats.failed) == (0, 3)
    assert err.getvalue().count("cannot export spans") == 1
