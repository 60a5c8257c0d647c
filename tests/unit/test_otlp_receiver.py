"""The master's OTLP/HTTP trace receiver (locustfiles/master/otlp.py): real POSTs to 127.0.0.1
port 0, real Parquet parts in a local store. The receiver runs in gevent's hub (as in the
Locust master); each POST is made from a native thread of gevent's threadpool, so the hub
serves it meanwhile."""

from __future__ import annotations

import gzip
import io
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gevent
import pyarrow.parquet as pq
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from analysis.kernel.layout import run_key, spans_key
from analysis.kernel.schema import SPANS_SCHEMA
from analysis.kernel.spans import read_spans, trace_id_of
from analysis.kernel.storage import FileStore, ObjectStore, StorageError, open_store
from locustfiles.master import otlp
from locustfiles.master.otlp import OtlpReceiver, split_listen
from locustfiles.options.table import OPTION

RUN = "r-otlp"


def export(*names: str, request_ids: tuple[str, ...] = (), start_ns: int = 10**18) -> bytes:
    """An ExportTraceServiceRequest (protobuf bytes) of one span per name."""
    message = ExportTraceServiceRequest()
    resource = message.resource_spans.add()
    attr = resource.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", "vllm"
    scope = resource.scope_spans.add()
    for i, name in enumerate(names):
        span = scope.spans.add()
        rid = request_ids[i] if i < len(request_ids) else f"{i:032x}"
        span.trace_id = bytes.fromhex(trace_id_of(rid))
        span.span_id = (i + 1).to_bytes(8, "big")
        span.name = name
        span.start_time_unix_nano = start_ns + i
        span.end_time_unix_nano = start_ns + i + 2_000_000_000
        ttft = span.attributes.add()
        ttft.key, ttft.value.double_value = "gen_ai.latency.time_to_first_token", 0.25
    return message.SerializeToString()


def as_json(body: bytes) -> bytes:
    """The OTLP JSON of a protobuf export (ids in hex, as OTLP/JSON spells them)."""
    message = ExportTraceServiceRequest()
    message.ParseFromString(body)
    doc = json_format.MessageToDict(message)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId"):
                    span[key] = __import__("base64").b64decode(span[key]).hex()
    return json.dumps(doc).encode()


def post(
    receiver: OtlpReceiver,
    body: bytes,
    content_type: str = "application/x-protobuf",
    path: str = "/v1/traces",
    encoding: str = "",
) -> tuple[int, str, bytes]:
    """POST from a native thread while the hub serves; (status, content type, body)."""

    def send() -> tuple[int, str, bytes]:
        headers = {"Content-Type": content_type}
        if encoding:
            headers["Content-Encoding"] = encoding
        request = urllib.request.Request(
            f"http://127.0.0.1:{receiver.port}{path}", data=body, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, resp.headers["Content-Type"], resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read()

    result: tuple[int, str, bytes] = gevent.get_hub().threadpool.spawn(send).get()
    return result


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store(str(tmp_path / "events"))


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OtlpReceiver]:
    """A started receiver on 127.0.0.1, any free port; a short linger and flush period."""
    rec = OtlpReceiver("127.0.0.1", 0, linger=0.3, flush_every=0.2)
    rec.start()
    yield rec
    rec.stop()


def stored_rows(events: Path) -> list[dict]:
    """The run's spans as read back (analysis.kernel.spans.read_spans)."""
    run = open_store(str(events / RUN))
    frame = read_spans(run, [o.key for o in run.list("spans/")])
    return [] if frame is None else frame.to_dict("records")


def test_the_bound_port_is_known_and_in_the_record(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path
) -> None:
    assert receiver.port > 0
    assert receiver.listen == f"127.0.0.1:{receiver.port}"
    receiver.begin_run(store, RUN, tmp_path / "spool")
    assert receiver.end_run()["listen"] == receiver.listen


def test_protobuf_json_and_gzip_bodies_are_all_stored(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path
) -> None:
    receiver.begin_run(store, RUN, tmp_path / "spool")
    status, ctype, body = post(receiver, export("llm_request", request_ids=("a" * 32,)))
    assert (status, ctype) == (200, "application/x-protobuf")
    ExportTraceServiceResponse().ParseFromString(body)  # an (empty) response message
    status, ctype, body = post(receiver, as_json(export("llm_request")), "application/json")
    assert (status, ctype, json.loads(body)) == (200, "application/json", {})
    zipped = gzip.compress(export("llm_request", "llm_request"))
    assert post(receiver, zipped, encoding="gzip")[0] == 200
    record = receiver.end_run()
    assert record == {
        "listen": receiver.listen,
        "received": 4,
        "stored": 4,
        "parts": record["parts"],
        "rejected_bodies": 0,
    }
    assert record["parts"] >= 1
    rows = stored_rows(tmp_path / "events")
    assert len(rows) == 4
    assert {r["run_id"] for r in rows} == {RUN}
    assert {r["source"] for r in rows} == {"otlp"}
    assert trace_id_of("a" * 32) in {r["trace_id"] for r in rows}
    assert all(r["ttft_s"] == 0.25 and r["service_name"] == "vllm" for r in rows)
    part = store.get(run_key(RUN, spans_key("otlp", 0)))
    assert pq.read_table(io.BytesIO(part)).schema.names == SPANS_SCHEMA.names
    assert not list((tmp_path / "spool").rglob("*.parquet"))  # put, then off the spool


def test_refusals_are_answered_and_counted(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path
) -> None:
    receiver.begin_run(store, RUN, tmp_path / "spool")
    assert post(receiver, export("x"), "text/plain")[0] == 415
    status, _, body = post(receiver, b"\x0a\xff\xff garbage")
    assert status == 400 and b"not an OTLP trace export" in body
    assert post(receiver, b"[1, 2]", "application/json")[0] == 400
    assert post(receiver, b"not gzip", encoding="gzip")[0] == 400
    assert post(receiver, export("x"), path="/v1/metrics")[0] == 404
    assert post(receiver, export("x"))[0] == 200  # still serving
    record = receiver.end_run()
    assert (record["rejected_bodies"], record["received"], record["stored"]) == (3, 1, 1)


def test_a_body_over_the_cap_is_refused_whatever_its_framing(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: a chunked body (no Content-Length) was read whole, 1.2 GB of it; and JSON
    nested too deeply was a 500 with a traceback in the master's log."""
    monkeypatch.setattr(otlp, "MAX_BODY_BYTES", 1 << 20)
    receiver.begin_run(store, RUN, tmp_path / "spool")
    pieces = (b"\x0a" * 65536 for _ in range(48))  # 3 MiB sent chunked: urllib has no length
    status, _, body = post(receiver, pieces)  # type: ignore[arg-type]
    assert status == 413 and b"at most 1048576 bytes" in body
    assert post(receiver, b"\x0a" * (2 << 20))[0] == 413  # with a Content-Length too
    nested = b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, _, body = post(receiver, nested, "application/json")
    assert status == 400 and b"nested too deeply" in body
    assert post(receiver, export("x"))[0] == 200  # still serving
    record = receiver.end_run()
    assert (record["rejected_bodies"], record["received"], record["stored"]) == (3, 1, 1)


def test_parts_every_flush_and_start_up_spans_in_the_record(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path
) -> None:
    receiver.begin_run(store, RUN, tmp_path / "spool")
    post(receiver, export("Load model", "Overall Loading"))
    gevent.sleep(0.5)  # a flush period or two: a part of its own
    post(receiver, export("llm_request"))
    record = receiver.end_run()
    assert record["parts"] == 2 and record["stored"] == 3
    assert sorted(record["engine"]["spans"]) == ["Load model", "Overall Loading"]
    assert record["engine"]["spans"]["Load model"]["seconds"] == 2.0
    keys = sorted(o.key for o in store.list(f"{RUN}/spans/"))
    assert keys == [run_key(RUN, spans_key("otlp", 0)), run_key(RUN, spans_key("otlp", 1))]


def test_spans_before_the_run_go_with_it(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path
) -> None:
    assert post(receiver, export("Load model"))[0] == 200  # the engine starts first
    gevent.sleep(0.3)
    receiver.begin_run(store, RUN, tmp_path / "spool")
    record = receiver.end_run()
    assert (record["received"], record["stored"]) == (1, 1)
    assert "Load model" in record["engine"]["spans"]
    assert [r["run_id"] for r in stored_rows(tmp_path / "events")] == [RUN]


def test_the_end_lingers_for_late_batches(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path
) -> None:
    receiver.begin_run(store, RUN, tmp_path / "spool")
    late = gevent.spawn_later(0.15, post, receiver, export("llm_request"))
    began = gevent.get_hub().loop.now()
    record = receiver.end_run()  # linger 0.3 s: the batch at 0.15 s restarts the quiet time
    took = gevent.get_hub().loop.now() - began
    late.join()
    assert record["stored"] == 1
    assert 0.4 <= took < 1.0  # quiet 0.3 s after the late batch, below the cap of 0.9 s


def test_the_linger_is_capped(receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path) -> None:
    receiver.begin_run(store, RUN, tmp_path / "spool")

    def chatty() -> None:
        while True:
            post(receiver, export("llm_request"))
            gevent.sleep(0.05)

    sender = gevent.spawn(chatty)
    began = gevent.get_hub().loop.now()
    record = receiver.end_run()
    took = gevent.get_hub().loop.now() - began
    sender.kill()
    assert 0.85 <= took < 1.5  # 3 x 0.3 s, spans or not
    assert record["received"] >= 2


class _Down(FileStore):
    """A store that refuses every put while `down`."""

    down = True

    def put(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        if self.down:
            raise StorageError("the store is down")
        super().put(key, data, overwrite=overwrite)


def test_a_refused_part_stays_in_the_spool_and_is_retried(
    receiver: OtlpReceiver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    down = _Down(tmp_path / "events")
    receiver.begin_run(down, RUN, tmp_path / "spool")
    post(receiver, export("llm_request"))
    receiver.flush()
    spooled = list((tmp_path / "spool").rglob("*.parquet"))
    assert len(spooled) == 1
    down.down = False
    receiver.flush()  # the next flush puts it
    down.down = True
    assert not list((tmp_path / "spool").rglob("*.parquet"))
    post(receiver, export("llm_request"))
    record = receiver.end_run()  # this part is refused: kept, named once at the end
    assert (record["received"], record["stored"], record["parts"]) == (2, 1, 1)
    err = capsys.readouterr().err
    assert err.count("llmload: error:") == 1 and "wait in the spool" in err
    assert len(list((tmp_path / "spool").rglob("*.parquet"))) == 1


@pytest.mark.parametrize(
    ("text", "ok"),
    [("127.0.0.1:0", True), ("0.0.0.0:4318", True), ("[::1]:4318", True), ("", True),
     ("4318", False), ("host:", False), ("host:99999", False), ("a b:1", False)],
)  # fmt: skip
def test_listen_option_is_checked(text: str, ok: bool) -> None:
    from analysis.kernel.errors import UsageError

    option = OPTION["otlp_listen"]
    if ok:
        assert option.kind.value(text, option.cli()) == text
        if text:
            assert split_listen(text)[1] in (0, 4318)
    else:
        with pytest.raises(UsageError, match="--otlp-listen .* must be HOST:PORT"):
            option.kind.value(text, option.cli())


def test_the_coordinator_records_spans_and_the_engine_cold_start(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """At the run's end the coordinator lingers, then writes `spans` and `cold_start.engine`
    into the final manifest (the receiver's run began at the first tick, begun here)."""
    import argparse
    from types import SimpleNamespace

    from locustfiles.master.coordinator import RunCoordinator
    from locustfiles.options.options import OPTIONS, from_parsed

    values = {flag.lstrip("-").replace("-", "_"): kw.get("default") for flag, kw in OPTIONS}
    values.update(events_uri=str(tmp_path / "events"), otlp_listen=receiver.listen)
    options = from_parsed(argparse.Namespace(**values))
    runner = SimpleNamespace(send_message=lambda *a, **k: None,
                             clients=SimpleNamespace(all=[], missing=[]),
                             stats=SimpleNamespace(total=SimpleNamespace(num_requests=0)))  # fmt: skip
    environment = SimpleNamespace(runner=runner, host="http://127.0.0.1:9")
    c = RunCoordinator(environment, options, RUN, otlp=receiver)
    receiver.begin_run(c.store, RUN, tmp_path / "spool")
    post(receiver, export("Allocate KV cache", "llm_request"))
    doc = c.finish({"worker_id": "w1", "sent": 1, "sink": None})
    stored = json.loads((tmp_path / "events" / RUN / "manifest.json").read_text())
    for manifest in (doc, stored):
        assert manifest["spans"] == {"listen": receiver.listen, "received": 2, "stored": 2,
                                     "parts": 1, "rejected_bodies": 0}  # fmt: skip
        assert list(manifest["cold_start"]["engine"]["spans"]) == ["Allocate KV cache"]
        assert "requests" in manifest["cold_start"]  # the staircase's own keys kept
    assert receiver.run is None  # spans from now on wait for the next run


def test_events_md_lists_the_spans_columns() -> None:
    import re

    text = (Path(__file__).parents[2] / "docs" / "events.md").read_text()
    body = text.split("## `spans`", 1)[1].split("\n#", 1)[0]
    assert re.findall(r"^\| `([a-z_0-9]+)` \|", body, flags=re.MULTILINE) == SPANS_SCHEMA.names


def test_without_a_spool_parts_go_straight_to_the_store(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path
) -> None:
    (tmp_path / "spool").write_text("a file, not a folder\n")  # every spool write fails
    receiver.begin_run(store, RUN, tmp_path / "spool")
    post(receiver, export("llm_request"))
    record = receiver.end_run()
    assert (record["stored"], record["parts"]) == (1, 1)
    assert len(stored_rows(tmp_path / "events")) == 1


def test_a_span_arrow_cannot_hold_is_a_refused_body(
    receiver: OtlpReceiver, store: ObjectStore, tmp_path: Path
) -> None:
    receiver.begin_run(store, RUN, tmp_path / "spool")
    assert post(receiver, export("llm_request", start_ns=2**64 - 10**10))[0] == 400
    record = receiver.end_run()
    assert (record["rejected_bodies"], record["received"], record["parts"]) == (1, 0, 0)
