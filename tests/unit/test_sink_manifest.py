"""manifest.json: documented fields, secrets removed, replaced whole at the end."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from analysis.kernel.schema import SCHEMA_VERSION
from analysis.kernel.storage import FileStore
from locustfiles.run.manifest import (
    PROBE_PURPOSES,
    ProbeRecord,
    RunManifest,
    StepRecord,
    WorkerInfo,
    scrub_config,
    write_manifest,
)
from locustfiles.run.secrets import RedactingFilter, is_secret_name, secret_values

SECRET = "sk-live-0123456789abcdef"


def test_secret_names_are_matched_word_by_word() -> None:
    for name in ("api_key", "apiKey", "OPENAI_API_KEY", "hf_token", "password", "Authorization"):
        assert is_secret_name(name), name
    for name in ("max_tokens", "tokenizer", "prompt_tokens", "keep_alive", "model"):
        assert not is_secret_name(name), name


def test_scrub_config_drops_secrets_keeps_env_var_names() -> None:
    config = {
        "host": "https://user:pw@api.example.com/v1?api_key=abc&x=1",
        "api_key": SECRET,
        "api_key_env": "OPENAI_API_KEY",
        "max_tokens": 64,
        "headers": {"Authorization": f"Bearer {SECRET}", "X-Trace": "1"},
        "tokenizer": "/models/tiny",
        "steps": [{"users": 1, "aws_secret_access_key": "x"}],
    }
    clean = scrub_config(config)
    assert clean == {
        "host": "https://api.example.com/v1?x=1",
        "api_key_env": "OPENAI_API_KEY",
        "max_tokens": 64,
        "headers": {"X-Trace": "1"},
        "tokenizer": "/models/tiny",
        "steps": [{"users": 1}],
    }


def test_secret_env_values_are_redacted_anywhere() -> None:
    secrets = secret_values({"OPENAI_API_KEY": SECRET, "HOME": "/root", "SHORT_KEY": "abc"})
    assert secrets == (SECRET,)
    manifest = RunManifest("r1", config={"note": f"curl -H 'x: {SECRET}'"})
    assert SECRET not in json.dumps(manifest.to_dict(secrets))


def test_the_api_key_variable_is_secret_whatever_its_name() -> None:
    environ = {"MYAUTH": SECRET, "HOME": "/root", "OPENAI_API_KEY": "other-secret-value"}
    assert secret_values(environ) == ("other-secret-value",)  # by name alone: MYAUTH missed
    assert set(secret_values(environ, ("MYAUTH",))) == {SECRET, "other-secret-value"}
    assert secret_values({"MYAUTH": "abc"}, ("MYAUTH",)) == ()  # too short to redact by value


def test_log_records_lose_their_secrets_whoever_logs_them() -> None:
    log_filter = RedactingFilter((SECRET,))
    record = logging.LogRecord(
        "botocore", logging.DEBUG, __file__, 1, "key %s, %d", (SECRET, 3), None
    )
    assert log_filter.filter(record) and record.getMessage() == "key <redacted>, 3"
    try:
        raise ValueError(f"echoed {SECRET}")
    except ValueError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom", None, sys.exc_info())
    assert log_filter.filter(failed) and SECRET not in (failed.exc_text or "")
    assert "echoed <redacted>" in (failed.exc_text or "")


def test_write_manifest_start_and_end(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    manifest = RunManifest(
        "r1",
        config={"users": 8, "api_key": SECRET},
        target={"url": "http://127.0.0.1:8000", "model": "tiny", "simulated": True},
        cold_start={"requests": 4, "concurrency": 1},
    )
    env = {"OPENAI_API_KEY": SECRET}
    first = write_manifest(store, manifest, environ=env)
    assert first["status"] == "running" and first["ended_at"] is None
    manifest.workers.append(WorkerInfo("h-1-a", "h", 1))
    manifest.workers.append(
        WorkerInfo(
            "h-2-b",
            "h",
            2,
            clock_offset_ms=-0.25,
            clock_rtt_ms=0.5,
            rows_rejected=1,
            rows_dropped=0,
            sink_errors=(f"row rejected: key {SECRET}",),
            sse_reader="native",
        )  # fmt: skip
    )
    manifest.probes.append(ProbeRecord("probe-ab", "calibration", 422, "http 422", "h-2-b"))
    manifest.steps.append(StepRecord(0, 8, 1, 2, 3, 1.5))
    manifest.finish()
    write_manifest(store, manifest, environ=env)
    raw = (tmp_path / "r1" / "manifest.json").read_text()
    assert SECRET not in raw
    doc = json.loads(raw)
    assert set(doc) == {
        "schema_version", "kind", "run_id", "status", "created_at", "ended_at", "target",
        "config", "versions", "hosts", "workers", "steps", "cold_start", "probes", "search", "stopped_by",
        "stopped",
    }  # fmt: skip
    assert doc["schema_version"] == SCHEMA_VERSION and doc["kind"] == "llmload.manifest"
    assert doc["status"] == "finished" and doc["ended_at"].endswith("Z")
    assert doc["config"] == {"users": 8}
    assert doc["target"]["simulated"] is True and doc["target"]["server_version"] is None
    assert set(doc["versions"]) == {"llmload", "locust", "python"}
    assert doc["workers"] == [
        {"worker_id": "h-1-a", "host": "h", "pid": 1, "clock_offset_ms": None,
         "clock_rtt_ms": None, "rows_rejected": None, "rows_dropped": None, "sink_errors": [],
         "sse_reader": None},
        {"worker_id": "h-2-b", "host": "h", "pid": 2, "clock_offset_ms": -0.25,
         "clock_rtt_ms": 0.5, "rows_rejected": 1, "rows_dropped": 0,
         "sink_errors": ["row rejected: key <redacted>"], "sse_reader": "native"},
    ]  # fmt: skip
    assert doc["probes"] == [{"request_id": "probe-ab", "purpose": "calibration",
                              "http_status": 422, "outcome": "http 422", "worker_id": "h-2-b"}]  # fmt: skip
    assert doc["steps"][0] == {
        "step": 0, "concurrency": 8, "started_at_ns": 1, "spawned_at_ns": 2,
        "ended_at_ns": 3, "warmup_s": 1.5, "rate": None, "arrival": None,
        "max_concurrency": None, "over_cap": None, "share_workers": None,
    }  # fmt: skip
    assert doc["search"] is None  # no capacity search
    assert doc["stopped_by"] is None  # not stopped by a signal
    assert doc["stopped"] is None  # nor by --stop-when overloaded
    assert "h" in doc["hosts"]
    assert not list(tmp_path.rglob(".tmp-*"))


def test_docs_describe_every_worker_field_and_probe_purpose() -> None:
    text = (Path(__file__).parents[2] / "docs" / "events.md").read_text()
    manifest = text.split("## `manifest.json`", 1)[1].split("\n## ", 1)[0]
    fields = set(vars(WorkerInfo("w", "h", 1)))
    for name in fields:
        assert f"`{name}`" in manifest, name
    for purpose in PROBE_PURPOSES:
        assert f"`{purpose}`" in manifest, purpose
