"""Servers that answer, but with numbers no server should send (issue 36): every request
keeps its row, with a kind that says what was wrong, and the report counts them.

A small OpenAI-compatible server on 127.0.0.1 (port 0) streams three tokens per request;
chosen by each request's id, its `usage` is fine, or 10**15 tokens (the sink refused such
rows before: the report showed 0 requests), or negative (stored as an ok row with -7
tokens), or a cumulative count that goes down. A real headless Locust run, then
`llmload report`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.support.chat import BIN, run_locust
from tests.support.store import S3Target
from tests.support.targets import TargetHandler, serving

VARIANTS = ("fine", "huge", "negative", "down")
KEY = "k3y-of-MYAUTH-not-named-like-a-secret"  # --api-key-env MYAUTH: redacted all the same
USAGE = {  # the usage each variant puts on its three content events, then on its last event
    "fine": ((None, None, None), {"prompt_tokens": 5, "completion_tokens": 3}),
    "huge": ((None, None, None), {"prompt_tokens": 5, "completion_tokens": 10**15}),
    "negative": ((None, None, None), {"prompt_tokens": 5, "completion_tokens": -7}),
    "down": ((1, 2, 3), {"prompt_tokens": 5, "completion_tokens": 2}),
}


class _OddUsage(TargetHandler):
    answered: ClassVar[dict[str, str]] = {}  # request id -> variant (streamed requests)
    lock = threading.Lock()
    echo = False  # some requests fail with an error event that echoes the Authorization
    page = False  # the load's requests (not the probes) are answered with an HTML page

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        words = len(str(request["messages"][-1]["content"]).split())
        if not request.get("stream"):  # the probes: a plain, sound answer
            self.answer_json(200, {"id": "x", "choices": [{"index": 0, "finish_reason": "stop",
                                                     "message": {"role": "assistant", "content": "a"}}],
                             "usage": {"prompt_tokens": words, "completion_tokens": 1}})  # fmt: skip
            return
        rid = self.headers.get("X-Request-Id", "")
        probe = rid.startswith("probe-")
        if self.page and not probe:
            with self.lock:
                self.answered[rid] = "page"
            page = b"<!DOCTYPE html><html><body>Sign in</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        digest = int(hashlib.sha256(rid.encode()).hexdigest(), 16)
        variant = "fine" if probe else VARIANTS[digest % len(VARIANTS)]
        if not probe:
            with self.lock:
                self.answered[rid] = variant
        per_event, last = USAGE[variant]
        events: list[dict[str, Any]] = []
        if self.echo and not probe and digest % 2:  # the server echoes the key in its error
            events.append({"error": {"message": f"bad {self.headers.get('Authorization')}"}})
        for i, used in enumerate(per_event):
            doc: dict[str, Any] = {"id": "x", "choices": [{"index": 0, "delta": {"content": f"t{i} "},
                                                           "finish_reason": None}]}  # fmt: skip
            if used is not None:
                doc["usage"] = {"prompt_tokens": 5, "completion_tokens": used}
            events.append(doc)
        events.append({"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "usage": last})  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with contextlib.suppress(OSError):
            for doc in events:
                payload = b"data: " + json.dumps(doc).encode() + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            done = b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            self.wfile.flush()


@pytest.fixture
def odd_usage() -> Iterator[str]:
    _OddUsage.answered.clear()
    _OddUsage.echo = _OddUsage.page = False
    with serving(_OddUsage) as url:
        yield url


def test_usage_that_is_no_token_count_is_recorded_invalid_and_no_row_is_lost(
    odd_usage: str, tmp_path: Path
) -> None:
    result = run_locust(
        odd_usage, tmp_path / "events", "--steps", "2", "--step-duration", "2",
        "--step-warmup", "0", "--cold-requests", "0", "--workload", "D(8,3)",
        "--exit-code-on-error", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output and "rejected" not in result.output
    requests, _chunks, manifest = result.events()
    assert manifest["status"] == "finished"
    answered = dict(_OddUsage.answered)
    rows = requests.set_index("request_id")
    answered = {rid: v for rid, v in answered.items() if rows.loc[rid, "status"] != "aborted"}
    assert set(answered) <= set(rows.index)  # every answered request has its row
    assert {v for v in answered.values()} == set(VARIANTS)  # each shape was served
    for rid, variant in answered.items():
        row = rows.loc[rid]
        if variant == "fine":
            assert row["status"] == "ok" and row["completion_tokens"] == 3, (rid, row.to_dict())
            continue
        assert row["status"] == "error" and row["error_kind"] == "invalid_usage", (rid, variant)
        expected = {"huge": "1000000000000000", "negative": "-7", "down": "went down from 3 to 2"}
        assert expected[variant] in row["error_detail"], row["error_detail"]
        assert not (row["completion_tokens"] or 0) < 0  # no negative count stored

    out = tmp_path / "report"
    report = subprocess.run(
        [str(BIN / "llmload"), "report", str(result.run_dir()), "--out", str(out), "--no-html",
         "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout + report.stderr
    steps = [s for s in json.loads((out / "summary.json").read_text())["steps"]
             if s["group"] == "step"]  # fmt: skip
    invalid = sum(1 for v in answered.values() if v != "fine")
    assert sum(s["errors_invalid_usage"] for s in steps) <= invalid
    assert sum(s["errors_invalid_usage"] for s in steps) > 0


def test_a_key_the_server_echoes_is_in_no_file_and_no_log(odd_usage: str, tmp_path: Path) -> None:
    """Issue 36: with --api-key-env MYAUTH the key's value reached 4,316 rows' error_detail
    and Locust's log when the server echoed it: redaction went by the variable's name."""
    _OddUsage.echo = True
    result = run_locust(
        odd_usage, tmp_path / "events", "--steps", "1", "--step-duration", "2",
        "--step-warmup", "0", "--cold-requests", "0", "--workload", "D(8,3)",
        "--api-key-env", "MYAUTH", "--loglevel", "DEBUG", "--exit-code-on-error", "0",
        "--report-dir", str(tmp_path / "report"),
        env={"MYAUTH": KEY},
    )  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    requests, _chunks, _manifest = result.events()
    echoed = requests[requests["error_kind"] == "stream_error"]
    assert len(echoed) > 0 and echoed["error_detail"].str.contains("<redacted>").all()
    assert KEY not in result.output
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in written) and (tmp_path / "report").is_dir()
    assert [p for p in written if KEY.encode() in p.read_bytes()] == []


def test_a_target_that_answers_the_load_with_pages_stops_the_run(
    odd_usage: str, tmp_path: Path
) -> None:
    """Issue 36: the probes pass, then every request of the load gets a 200 page (a proxy's
    sign-in): the first REFUSED_AT_START such answers stop the run, as refusals do, instead
    of thousands of stream_truncated rows and a valid report."""
    _OddUsage.page = True
    result = run_locust(
        odd_usage, tmp_path / "events", "--steps", "2", "--step-duration", "30",
        "--step-warmup", "0", "--cold-requests", "0", "--workload", "D(8,3)", timeout=60,
    )  # fmt: skip
    errors = [line for line in result.output.splitlines() if line.startswith("llmload: error:")]
    assert result.returncode == 2, result.output[-3000:]
    assert errors and "the target answered its first 5 requests with no completion" in errors[0]
    assert "the answer's Content-Type was 'text/html', not text/event-stream" in errors[0]
    requests, _chunks, manifest = result.events()
    assert manifest["status"] == "aborted"
    assert len(requests) < 200 and (requests["error_kind"] == "stream_truncated").all()
    assert set(_OddUsage.answered) <= set(requests["request_id"])  # every answer has its row


def test_store_keys_stay_out_of_a_debug_log_and_the_store(
    odd_usage: str, tmp_path: Path, s3_target: S3Target
) -> None:
    """Issue 36: `--loglevel DEBUG` logged the S3 access-key id (boto3's own lines). Every log
    record now passes the redacting filter: neither key reaches the output or an object."""
    env = s3_target.env
    assert len(env["AWS_ACCESS_KEY_ID"]) >= 6 and len(env["AWS_SECRET_ACCESS_KEY"]) >= 6
    result = run_locust(
        odd_usage, tmp_path / "events", "--steps", "1", "--step-duration", "1",
        "--step-warmup", "0", "--cold-requests", "0", "--workload", "D(8,3)",
        "--loglevel", "DEBUG", "--exit-code-on-error", "0", "--events-uri", s3_target.uri,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    assert "botocore" in result.output  # boto3 did log at DEBUG
    objects = s3_target.objects()
    assert any(key.endswith("manifest.json") for key in objects)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name] not in result.output, name
        assert [k for k, data in objects.items() if env[name].encode() in data] == [], name
