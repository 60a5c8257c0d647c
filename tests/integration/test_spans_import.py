"""`llmload spans import RUN_URI FILE` into a run RunBuilder wrote: the part, the rows as
`load_run` and `llmload sql`'s `spans` view read them, the manifest's `cold_start.engine`, and
the bad inputs that exit 2 with nothing written."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from analysis.kernel.spans import trace_id_of
from analysis.read.engine import Engine
from analysis.read.load import load_run
from infra.cli import main
from tests.support.runs import RunBuilder

IDS = [uuid.UUID(int=i + 1).hex for i in range(3)]


def export(spans: list[tuple[str, str]]) -> ExportTraceServiceRequest:
    """One export of (name, request id) spans, vLLM's attributes on each."""
    message = ExportTraceServiceRequest()
    resource = message.resource_spans.add()
    attr = resource.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", "vllm"
    scope = resource.scope_spans.add()
    for i, (name, rid) in enumerate(spans):
        span = scope.spans.add()
        span.trace_id = bytes.fromhex(trace_id_of(rid))
        span.span_id = (i + 1).to_bytes(8, "big")
        span.name = name
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + i * 1_000_000
        span.end_time_unix_nano = span.start_time_unix_nano + 1_500_000_000
        for key, value in (("gen_ai.latency.time_in_queue", 0.01), ("gen_ai.latency.e2e", 1.5)):
            a = span.attributes.add()
            a.key, a.value.double_value = key, value
        tokens = span.attributes.add()
        tokens.key, tokens.value.int_value = "gen_ai.usage.completion_tokens", 64
    return message


def otlp_json(message: ExportTraceServiceRequest) -> dict:
    """OTLP JSON as a Collector's file exporter writes it (ids in hex)."""
    doc = json_format.MessageToDict(message)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId"):
                    span[key] = base64.b64decode(span[key]).hex()
    return doc


@pytest.fixture
def run_uri(events_dir: Path) -> str:
    run = RunBuilder("r-spans")
    run.add_step(0, 1, started_s=0, spawned_s=0, ended_s=10, warmup_s=0)
    for i, rid in enumerate(IDS):
        run.add_request(sent_s=1.0 + i, chunks=[(0.1, 1), (0.2, 2)], request_id=rid)
    return run.write(events_dir)


def manifest_of(run_uri: str) -> dict:
    return json.loads((Path(run_uri) / "manifest.json").read_text())


def test_import_json_lines(run_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lines = [
        export([("Overall Loading", "boot"), ("Load model", "boot")]),
        export([("llm_request", IDS[0]), ("llm_request", IDS[1])]),
        export([("llm_request", "someone-else")]),
    ]
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(otlp_json(m)) + "\n" for m in lines) + "\n")
    cold_before = manifest_of(run_uri)["cold_start"]

    assert main(["spans", "import", run_uri, str(path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert "5 span(s) imported into run r-spans" in out[0]
    assert "2 join a request by trace id" in out[0]
    assert (Path(run_uri) / "spans" / "part-import-000000.parquet").is_file()

    cold = manifest_of(run_uri)["cold_start"]
    assert {k: v for k, v in cold.items() if k != "engine"} == cold_before
    assert sorted(cold["engine"]["spans"]) == ["Load model", "Overall Loading"]
    assert cold["engine"]["spans"]["Load model"]["seconds"] == 1.5

    spans = load_run(run_uri, progress=False).spans
    assert spans is not None and len(spans) == 5
    requests = spans[spans["name"] == "llm_request"]
    assert set(requests["trace_id"]) >= {IDS[0], IDS[1]}  # a uuid hex is its own trace id
    assert set(spans["source"]) == {"import"} and set(spans["run_id"]) == {"r-spans"}
    assert list(requests["e2e_s"]) == [1.5] * 3
    assert list(requests["completion_tokens"]) == [64] * 3

    with Engine(threads=1) as engine:
        engine.attach([run_uri])
        joined = engine.sql(
            "SELECT count(*) AS n FROM spans s JOIN requests r ON s.trace_id = r.request_id"
        )
        assert joined.column("n").to_pylist() == [2]


def test_a_second_import_never_overwrites(run_uri: str, tmp_path: Path) -> None:
    doc = tmp_path / "one.json"
    doc.write_text(json.dumps(otlp_json(export([("llm_request", IDS[2])])), indent=2))
    pb = tmp_path / "one.pb"
    pb.write_bytes(export([("llm_request", IDS[0])]).SerializeToString())
    assert main(["spans", "import", run_uri, str(doc)]) == 0
    assert main(["spans", "import", run_uri, str(pb)]) == 0
    parts = sorted(p.name for p in (Path(run_uri) / "spans").iterdir())
    assert parts == ["part-import-000000.parquet", "part-import-000001.parquet"]
    spans = load_run(run_uri, progress=False).spans
    assert spans is not None and sorted(spans["trace_id"]) == sorted([IDS[0], IDS[2]])
    assert "engine" not in manifest_of(run_uri)["cold_start"]  # no start-up span


def test_a_run_without_spans_has_an_empty_view(run_uri: str) -> None:
    assert load_run(run_uri, progress=False).spans is None
    with Engine(threads=1) as engine:
        engine.attach([run_uri])
        table = engine.sql("SELECT * FROM spans")
    assert table.num_rows == 0 and "trace_id" in table.column_names


def written(run_uri: str) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in Path(run_uri).rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json\n", "line 1 is not an OTLP trace export"),
        ("GOOD\n[1, 2]\n", "line 2 is not an OTLP trace export"),
        ("GOOD\n{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [{\"traceId\": \"xyz\"}]}]}]}\n",
         "line 2 is not an OTLP trace export"),
        ("\n\n", "holds no OTLP trace export"),
    ],
)  # fmt: skip
def test_bad_files_exit_2_with_nothing_written(
    run_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture, content: str, message: str
) -> None:
    good = json.dumps(otlp_json(export([("Load model", "boot")])))
    path = tmp_path / "bad.jsonl"
    path.write_text(content.replace("GOOD", good))
    before = written(run_uri)
    assert main(["spans", "import", run_uri, str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llmload: error: ") and message in err[0]
    assert written(run_uri) == before


def test_no_run_or_no_file_exit_2(
    run_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(otlp_json(export([("llm_request", IDS[0])]))) + "\n")
    nowhere = tmp_path / "events" / "no-such-run"
    assert main(["spans", "import", str(nowhere), str(path)]) == 2
    assert "no llmload run at" in capsys.readouterr().err
    assert not nowhere.exists()
    before = written(run_uri)
    assert main(["spans", "import", run_uri, str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err and "missing.jsonl" in err
    bad_pb = tmp_path / "bad.pb"
    bad_pb.write_bytes(b"\xff\xff\xff")
    assert main(["spans", "import", run_uri, str(bad_pb)]) == 2
    assert "not a protobuf OTLP trace export" in capsys.readouterr().err
    assert written(run_uri) == before
