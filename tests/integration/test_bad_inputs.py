"""A table of bad inputs (issue 11): each is refused with one line naming the problem and the fix.

Every case runs the real command as a subprocess (`locust -f locustfiles/chat.py --headless`,
`llmload ...`) in an empty directory of its own and asserts: the documented exit status
(2 for bad input; 1 where docs/reports.md says the events cannot be used), exactly one error
line (`llmload: error: ...`, or argparse's `<prog>: error: ...`) holding the expected
fragment, no traceback, nothing written (the directory, the events folder and TMPDIR are
unchanged), no process left behind, and an end within 30 s.

Locust cases point `--host` at a real simulator, so they fail on the option, not on the
target. The table is listed in docs/reliability.md ("Bad input"); a test keeps the two in
step.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.kernel.schema import CHUNKS_SCHEMA, METADATA_KEY
from analysis.kernel.storage import open_store
from infra.ports import free_port
from tests.support.chat import BIN, LOCUSTFILE, ROOT, SimProcess
from tests.support.runs import RunBuilder
from tests.support.targets import TargetHandler

TIME_LIMIT_S = 30
ERROR_LINE = re.compile(r"^(?:llmload|locust)(?: [a-z-]+)?: error: ")
# A short run, so that an input wrongly accepted ends in seconds instead of hanging the suite.
LOCUST = (str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
          "--steps", "1", "--step-duration", "1", "--step-warmup", "0", "--cold-requests", "0")  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One bad input. `argv` starts with `locust` (LOCUST above, `--host` the simulator
    unless given), `locust-open` (the same without `--steps`: a trace's own step) or
    `llmload`; `{sim}`, `{sim_port}` and `{free_port}` are filled in."""

    id: str
    argv: tuple[str, ...]
    status: int
    fragment: str | tuple[str, ...]
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    store: bool = False  # the session's SeaweedFS endpoint and credentials, before `env`


# -- setups: files a case needs, written before the "nothing written" snapshot ------------


def _write(name: str, text: str) -> Callable[[Path], None]:
    def setup(cwd: Path) -> None:
        (cwd / name).write_text(text)

    return setup


def _run(cwd: Path) -> RunBuilder:
    run = RunBuilder("r1", simulated=True)
    run.add_step(0, 1, started_s=0, spawned_s=0, ended_s=10, warmup_s=0)
    run.add_request(step=0, concurrency=1, sent_s=2.0, chunks=[(0.1, 1), (0.3, 2)], end_s=0.35)
    run.write(cwd / "ev")
    return run


def _a_run(cwd: Path) -> None:
    _run(cwd)


def _a_run_and_a_file(cwd: Path) -> None:
    _run(cwd)
    (cwd / "d.jsonl").write_text("{}\n")


def _corrupt_parts(cwd: Path) -> None:
    run = _run(cwd)
    for key in run.keys:
        if key.startswith("requests/"):
            (cwd / "ev" / "r1" / key).write_bytes(b"not parquet at all")


def _future_schema(cwd: Path) -> None:
    _run(cwd)
    sink = pa.BufferOutputStream()
    pq.write_table(CHUNKS_SCHEMA.with_metadata({METADATA_KEY: b"2.0"}).empty_table(), sink)
    open_store(str(cwd / "ev" / "r1")).put(
        "chunks/worker=w1/part-000009.parquet", sink.getvalue().to_pybytes()
    )


def _parts_missing(cwd: Path) -> None:
    run = _run(cwd)
    for key in run.keys:
        if key.endswith(".parquet"):
            (cwd / "ev" / "r1" / key).unlink()


def _spool_dir(cwd: Path) -> None:
    (cwd / "spool").mkdir()


def _run_in_spool(cwd: Path) -> None:
    """Parts of a run r1 that never reached the store: still in the spool folder `spool`."""
    _run(cwd).write(cwd / "spool")


MINIMAL_CAMPAIGN = "target: {url: 'http://127.0.0.1:9'}\nworkload: D(16,8)\n"
S3_UNREACHABLE = {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:{free_port}",
                  "AWS_ACCESS_KEY_ID": "dummy", "AWS_SECRET_ACCESS_KEY": "dummy"}  # fmt: skip

CASES = [
    # -- workload specs ------------------------------------------------------------------
    Case("workload-negative-length", ("locust", "--workload", "D(-5,10)"), 2,
         "workload D(-5,10): the prompt length must be >= 1 token, not -5; e.g. D(128,64)"),
    Case("workload-zero-output", ("locust", "--workload", "D(128,0)"), 2,
         "workload D(128,0): the output length must be >= 1 token, not 0"),
    Case("workload-normal-mean", ("locust", "--workload", "N(0,5)/(10,2)"), 2,
         "the prompt mean of N(mean,sd) must be >= 1 token, not 0"),
    Case("workload-uniform-min", ("locust", "--workload", "U(0,10)/(5,9)"), 2,
         "the prompt min of U(min,max) must be >= 1 token, not 0"),
    Case("workload-weight-zero", ("locust", "--workload", "0*D(8,4)"), 2,
         "workload D(8,4): weight must be positive, not 0"),
    Case("workload-syntax", ("locust", "--workload", "D(8"), 2,
         "workload component 'D(8' is not understood; use D(in,out)"),
    # -- datasets ------------------------------------------------------------------------
    Case("dataset-missing", ("locust", "--workload", "dataset:missing.jsonl"), 2,
         "workload dataset missing.jsonl does not exist; give dataset:PATH.jsonl"),
    Case("dataset-bad-json-line", ("locust", "--workload", "dataset:d.jsonl"), 2,
         "d.jsonl:2: not valid JSON", setup=_write("d.jsonl", '{"prompt": "hi"}\n{"prompt": \n')),
    Case("dataset-empty", ("locust", "--workload", "dataset:d.jsonl"), 2,
         "workload dataset d.jsonl has no prompts", setup=_write("d.jsonl", "\n")),
    Case("dataset-zero-max-tokens", ("locust", "--workload", "dataset:d.jsonl"), 2,
         'd.jsonl:1: max_tokens must be an integer >= 1, not 0; give e.g. "max_tokens": 128',
         setup=_write("d.jsonl", '{"prompt": "hi", "max_tokens": 0}\n')),
    Case("dataset-max-tokens-too-large", ("locust", "--workload", "dataset:d.jsonl"), 2,
         "d.jsonl:2: max_tokens 1000000000000 is above 2147483647, the most a request row "
         "records (max_tokens)",
         setup=_write("d.jsonl", '{"prompt": "hi"}\n{"prompt": "hi", "max_tokens": 1000000000000}\n')),
    Case("trace-output-length-too-large", ("locust-open", "--workload", "trace:t.jsonl"), 2,
         "t.jsonl:2: output_length 3000000000 is above 2147483647, the most a request row "
         "records (max_tokens); fix or remove the line",
         setup=_write("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                                 '{"timestamp": 10, "input_length": 10, "output_length": 3000000000}\n')),
    Case("trace-gap-of-ages", ("locust-open", "--workload", "trace:t.jsonl"), 2,
         "trace t.jsonl: the window replays over 1e+12 s after --trace-speedup 1, more than a "
         "week (604,800 s); give --trace-duration",
         setup=_write("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                                 '{"timestamp": 1e15, "input_length": 10, "output_length": 5}\n')),
    Case("conversations-no-user-turn", ("locust", "--workload", "conversations:c.jsonl"), 2,
         'c.jsonl:1: the conversation has no user (human) turn to replay; give it at least one '
         'non-empty turn {"from": "human", "value": ...}',
         setup=_write("c.jsonl", '{"conversations": [{"from": "gpt", "value": "hi"}]}\n')),
    Case("conversations-not-a-list", ("locust", "--workload", "conversations:c.jsonl"), 2,
         'c.jsonl:1: each line needs a "conversations" list',
         setup=_write("c.jsonl", '{"prompt": "hi"}\n')),
    # -- locust options ------------------------------------------------------------------
    Case("turns-zero", ("locust", "--turns", "0"), 2, "--turns '0': must be an integer >= 1"),
    Case("think-time-negative", ("locust", "--think-time", "N(-1,1)"), 2,
         "--think-time 'N(-1,1)': N(mean,sd) needs mean >= 0 and sd >= 0"),
    Case("history-window-zero", ("locust", "--history", "window:0"), 2,
         "--history 'window:0' must be full or window:N with N >= 1 turns"),
    Case("tool-rate-above-one", ("locust", "--tool-rate", "2"), 2,
         "--tool-rate must be between 0 and 1, not 2.0"),
    Case("steps-too-many-users", ("locust", "--steps", "1,100000"), 2,
         "--steps (1,100000) asks for 100,000 users in a step: users spawn at 100/s, and a step "
         "waits 60 s for them, so at most 6,000 a step"),
    Case("prefix-groups-times-tokens-too-large",
         ("locust", "--prefix-groups", "1000000", "--prefix-tokens", "1000000"), 2,
         "--prefix-groups × --prefix-tokens make 1,000,000,000,000 prefix tokens, about "
         "23,283.1 GiB in every worker process; give at most 10,000,000 in all"),
    Case("steps-zero", ("locust", "--steps", "0,2"), 2,
         "--steps '0,2' needs at least one concurrency, each >= 1"),
    Case("rates-zero", ("locust", "--rates", "0,2"), 2,
         "--rates '0,2' needs rates > 0 requests/s"),
    Case("rates-tiny", ("locust", "--rates", "1e-300"), 2,
         "--rates '1e-300': each rate must be between 0.001 (one request in 1,000 s) and 100,000"),
    Case("rates-huge", ("locust", "--rates", "1,2e6"), 2,
         "--rates '1,2e6': each rate must be between 0.001"),
    Case("rates-and-steps", ("locust", "--rates", "1,2"), 2,  # LOCUST gives --steps 1
         "give --steps (concurrency) or --rates (requests/s), not both"),
    Case("arrival-gamma-zero", ("locust", "--arrival", "gamma:0"), 2,
         "--arrival 'gamma:0' must be poisson, constant or gamma:CV with CV > 0"),
    Case("arrival-gamma-cv-huge", ("locust", "--arrival", "gamma:1e9"), 2,
         "--arrival 'gamma:1e9': CV must be at most 10; gamma arrivals come in bursts of about"),
    Case("max-concurrency-without-rates", ("locust", "--max-concurrency", "8"), 2,
         "--max-concurrency applies to open-loop steps: give --rates too"),
    Case("search-without-slo", ("locust", "--search", "concurrency"), 2,
         "--search needs --slo with at least one step objective"),
    Case("search-rate-without-rates", ("locust", "--search", "rate", "--slo", "ttft_p99=1"), 2,
         "--search rate needs --rates (the coarse levels)"),
    Case("step-duration-zero", ("locust", "--step-duration", "0"), 2,
         "--step-duration must be > 0 seconds, not 0.0; e.g. --step-duration 30"),
    Case("step-warmup-too-long", ("locust", "--step-duration", "30", "--step-warmup", "40"), 2,
         "--step-warmup (40.0) must be shorter than --step-duration (30.0); lower --step-warmup "
         "or raise --step-duration, e.g. --step-warmup 5"),
    Case("request-timeout-zero", ("locust", "--request-timeout", "0"), 2,
         "--request-timeout must be > 0 seconds, not 0.0; e.g. --request-timeout 600"),
    Case("cancel-rate-above-one", ("locust", "--cancel-rate", "1.5"), 2,
         "--cancel-rate must be between 0 and 1, not 1.5"),
    Case("cancel-after-zero-tokens", ("locust", "--cancel-after-tokens", "0"), 2,
         "--cancel-after-tokens must be an integer >= 1, not 0; e.g. --cancel-after-tokens 1"),
    Case("extra-body-not-json", ("locust", "--extra-body", "{bad"), 2,
         "--extra-body is not valid JSON"),
    Case("response-format-not-json-schema",
         ("locust", "--response-format", "json_schema:s.json"), 2,
         ("--response-format json_schema:s.json is not a valid JSON Schema: 'objekt' is not "
          "valid", "; fix the schema"), setup=_write("s.json", '{"type": "objekt"}')),
    Case("response-format-not-json", ("locust", "--response-format", "json_schema:s.json"), 2,
         "--response-format json_schema:s.json: the file is not JSON",
         setup=_write("s.json", "type: object")),
    Case("response-format-on-messages", ("locust", "--response-format", "json_object",
                                         "--endpoint", "messages"), 2,
         "--response-format json_object applies to --endpoint chat, completions, responses: "
         "the messages API has no structured-output request"),
    Case("extra-body-nan", ("locust", "--extra-body", '{"temperature": NaN}'), 2,
         "--extra-body is not valid JSON (NaN is not a JSON value)"),
    Case("extra-body-infinity", ("locust", "--extra-body", '{"top_p": -Infinity}'), 2,
         "--extra-body is not valid JSON (-Infinity is not a JSON value)"),
    Case("api-key-env-not-a-name", ("locust", "--api-key-env", "MY-KEY"), 2,
         "--api-key-env 'MY-KEY' must be an environment variable name"),
    Case("run-id-path", ("locust", "--run-id", "../x"), 2,
         "--run-id '../x' must be letters, digits, '.', '_' or '-'"),
    Case("run-id-exists", ("locust", "--events-uri", "ev", "--run-id", "r1"), 2,
         ("run r1 already exists in the events store ev", "choose another --run-id, or leave "
          "--run-id out for a generated one"), setup=_a_run),
    Case("run-id-in-spool", ("locust", "--spool-dir", "spool", "--run-id", "r1"), 2,
         ("run r1 already has events waiting in the spool folder spool/r1 (a run of this id "
          "whose upload did not finish)", "upload them (llmload upload-spool spool "
          "--events-uri file://./runs) or choose another --run-id"), setup=_run_in_spool),
    Case("option-not-a-number", ("locust", "--step-duration", "abc"), 2,
         "argument --step-duration: invalid float value: 'abc'"),
    Case("no-host", ("locust", "--host", ""), 2, "no target: give --host URL"),
    # -- set-up mistakes the preflight catches (issue 20) ----------------------------------
    Case("host-v1-path", ("locust", "--host", "{sim}/v1"), 2,
         ("/v1 has a path: give the server's base URL without /v1 (llmload adds "
          "/v1/chat/completions): --host http://127.0.0.1:")),
    Case("host-endpoint-path", ("locust", "--host", "{sim}/v1/chat/completions"), 2,
         "/v1/chat/completions has a path: give the server's base URL without /v1"),
    Case("host-prefix-path", ("locust", "--host", "{sim}/llm"), 2,
         ("/llm has a path: give the server's base URL without one (llmload adds "
          "/v1/chat/completions; a server behind a path prefix must be reachable at the root "
          "of a host or port): --host http://127.0.0.1:")),
    Case("host-query", ("locust", "--host", "{sim}?key=1"), 2,
         "?key=1 has a query: give the server's base URL without one"),
    Case("model-not-served", ("locust", "--model", "nope"), 2,
         ("--model 'nope' is not served by http://127.0.0.1:", "it serves 'llmload-sim-tiny'; "
          "give one of them (e.g. --model llmload-sim-tiny) or leave --model out for the first")),
    Case("extra-body-sets-messages", ("locust", "--extra-body", '{"messages": []}'), 2,
         "--extra-body sets 'messages', which llmload owns (--workload decides it); leave it "
         "out of --extra-body"),
    Case("extra-body-stream-false", ("locust", "--extra-body", '{"stream": false}'), 2,
         "--extra-body sets 'stream', which llmload owns (--no-stream decides it)"),
    Case("extra-body-stream-options-null",
         ("locust", "--extra-body", '{"stream_options": null}'), 2,
         "--extra-body sets 'stream_options', which llmload owns (--continuous-usage decides it)"),
    Case("extra-body-sets-input", ("locust", "--endpoint", "responses", "--extra-body",
                                   '{"input": "x"}'), 2,
         "--extra-body sets 'input', which llmload owns (--workload decides it)"),
    Case("continuous-usage-on-messages", ("locust", "--endpoint", "messages",
                                          "--continuous-usage", "on"), 2,
         "--continuous-usage on applies to --endpoint chat and completions: the messages API "
         "has no such stream option; leave it at auto"),
    # -- URIs and credentials --------------------------------------------------------------
    Case("events-uri-scheme", ("locust", "--events-uri", "ftp://host/runs"), 2,
         "events URI scheme 'ftp' is not supported; use s3://bucket/prefix"),
    Case("events-uri-credentials", ("locust", "--events-uri", "s3://key:secret@bucket/runs"), 2,
         "events URI must not carry credentials; set AWS_ACCESS_KEY_ID"),
    Case("accelerator-metrics-not-a-url", ("locust", "--accelerator-metrics", "gpu-host:9400"), 2,
         "--accelerator-metrics 'gpu-host:9400' must be a DCGM exporter's http(s) URL"),
    # -- unreachable targets and stores, missing tokenizer (start-up preflight) ------------
    Case("target-not-listening", ("locust", "--host", "http://127.0.0.1:{free_port}"), 2,
         "did not answer"),
    Case("target-wait-ready-timeout",
         ("locust", "--host", "http://127.0.0.1:{free_port}", "--wait-ready", "1"), 2,
         ("did not answer in 1 s (--wait-ready)", "start the server, fix --host")),
    Case("target-answers-a-page", ("locust", "--host", "{page}"), 2,
         ("answered this run's first request with HTTP 200 but no completion",
          "the answer's Content-Type was 'text/html; charset=utf-8', not text/event-stream",
          "Check --host (the server's root URL, without /v1) and --endpoint")),
    Case("target-answers-a-page-no-stream", ("locust", "--host", "{page}", "--no-stream"), 2,
         ("answered this run's first request with HTTP 200 but no completion",
          "not application/json")),
    Case("target-pings-forever", ("locust", "--host", "{pinger}", "--connect-timeout", "2"), 2,
         ("did not answer", "(TimeoutError: HTTP 200, but the response did not end within")),
    Case("first-request-unauthorized", ("locust", "--host", "{refuser}"), 2,
         ("refused this run's first request (HTTP 401: ", "Incorrect API key provided",
          "give the API key the server expects: --api-key-env NAME")),
    Case("first-request-no-endpoint",
         ("locust", "--host", "{refuser}", "--endpoint", "completions"), 2,
         ("refused this run's first request (HTTP 404: ", "the server has no POST "
          "/v1/completions: check --endpoint")),
    Case("first-request-refused", ("locust", "--extra-body", '{"min_tokens": -1}'), 2,
         ("refused this run's first request (HTTP 400: ", "min_tokens", "fix what the server "
          "names (--extra-body")),
    Case("target-not-resolvable", ("locust", "--host", "http://nonexistent.invalid:8000"), 2,
         "did not answer"),
    Case("events-store-unwritable", ("locust", "--events-uri", "file:///proc/llmload-x"), 2,
         "cannot write to the events store"),
    Case("s3-store-unreachable", ("locust", "--events-uri", "s3://bucket/prefix"), 2,
         "cannot write to the events store", env=S3_UNREACHABLE),
    Case("s3-secret-wrong", ("locust", "--events-uri", "s3://llmload/runs"), 2,
         ("cannot write to the events store s3://llmload/runs (", "SignatureDoesNotMatch "
          "(credentials refused: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"),
         env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, store=True),
    Case("tokenizer-missing", ("locust", "--tokenizer", "/nonexistent/tok.json"), 2,
         "cannot load tokenizer"),
    Case("spool-dir-unwritable", ("locust", "--spool-dir", "f/spool"), 2,
         ("cannot write to the spool folder f/spool (", "/f is not a folder); fix --spool-dir"),
         setup=_write("f", "a file, not a folder\n")),
    Case("report-dir-unwritable", ("locust", "--report-dir", "f/reports"), 2,
         ("cannot write the report to --report-dir f/reports (", "/f is not a folder); fix "
          "--report-dir"), setup=_write("f", "a file, not a folder\n")),
    Case("report-dir-unknown-home", ("locust", "--report-dir", "~llmload-nobody/r"), 2,
         "--report-dir ~llmload-nobody/r: ~llmload-nobody names no home folder (no such user)"),
    # -- campaign files --------------------------------------------------------------------
    Case("campaign-unknown-keys", ("llmload", "campaign", "c.yaml"), 2,
         ("c.yaml: unknown keys 'stpes' (did you mean 'steps'?), 'target.modle' (did you mean "
          "'model'?), 'workload[0].wieght'", "(docs/campaign-config.md)"),
         setup=_write("c.yaml", "stpes: [1]\ntarget: {url: 'http://127.0.0.1:9', modle: m}\n"
                                "workload: [{name: a, spec: 'D(8,4)', wieght: 1}]\n")),
    Case("campaign-missing-keys", ("llmload", "campaign", "c.yaml"), 2,
         "c.yaml: missing required keys 'target', 'workload'", setup=_write("c.yaml", "name: x\n")),
    Case("campaign-zero-step-duration", ("llmload", "campaign", "c.yaml"), 2,
         "key 'step_duration' must be > 0, not 0; give seconds, e.g. step_duration: 30",
         setup=_write("c.yaml", MINIMAL_CAMPAIGN + "step_duration: 0\n")),
    Case("campaign-zero-step", ("llmload", "campaign", "c.yaml"), 2,
         "key 'steps' must be a list of integers >= 1",
         setup=_write("c.yaml", MINIMAL_CAMPAIGN + "steps: [0, 2]\n")),
    Case("campaign-bad-workload", ("llmload", "campaign", "c.yaml"), 2,
         "key 'workload' is not a valid workload: workload D(0,8): the prompt length",
         setup=_write("c.yaml", "target: {url: 'http://127.0.0.1:9'}\nworkload: D(0,8)\n")),
    Case("campaign-bad-yaml", ("llmload", "campaign", "c.yaml"), 2,
         "c.yaml: not valid YAML at line", setup=_write("c.yaml", "target: [\n")),
    Case("campaign-unknown-extra-flag", ("llmload", "campaign", "c.yaml"), 2,
         "c.yaml: key 'extra' has unknown flag(s) '--stpo-timeout' (did you mean "
         "'--stop-timeout'?)",
         setup=_write("c.yaml", MINIMAL_CAMPAIGN + "extra: ['--stpo-timeout', '10']\n")),
    Case("campaign-extra-bad-value", ("llmload", "campaign", "c.yaml", "--validate"), 2,
         "c.yaml: key 'extra': --request-timeout must be > 0 seconds, not -5.0",
         setup=_write("c.yaml", MINIMAL_CAMPAIGN + "extra: ['--request-timeout=-5']\n")),
    Case("campaign-extra-sets-stream", ("llmload", "campaign", "c.yaml"), 2,
         "c.yaml: key 'extra': --extra-body sets 'stream', which llmload owns",
         setup=_write("c.yaml", MINIMAL_CAMPAIGN + "extra: ['--extra-body', '{\"stream\": false}']\n")),
    Case("campaign-report-dir-unwritable", ("llmload", "campaign", "c.yaml", "--validate"), 2,
         "c.yaml: report_dir /proc/llmload-nope cannot be made (/proc: ",
         setup=_write("c.yaml", MINIMAL_CAMPAIGN + "report_dir: /proc/llmload-nope\n")),
    Case("campaign-missing-file", ("llmload", "campaign", "none.yaml"), 2,
         "cannot read campaign file none.yaml"),
    Case("campaign-url-path", ("llmload", "campaign", "c.yaml"), 2,
         ("c.yaml: key 'target.url' has a path: give the server's base URL without /v1",
          "url: 'http://127.0.0.1:9', not 'http://127.0.0.1:9/v1'"),
         setup=_write("c.yaml", "target: {url: 'http://127.0.0.1:9/v1'}\nworkload: D(16,8)\n")),
    # -- llmload report and compare, event files -------------------------------------------
    Case("report-unknown-run", ("llmload", "report", "ev/none"), 2,
         "no llmload run at ev/none: found no manifest.json and no event parts"),
    Case("report-bad-slo", ("llmload", "report", "ev/r1", "--slo", "ttft_p99=fast"), 2,
         "'fast' is not a number", setup=_a_run),
    Case("report-bad-memory-limit", ("llmload", "report", "ev/r1", "--memory-limit", "lots"), 2,
         "--memory-limit 'lots' is not a size; give a number and a unit, e.g. --memory-limit 2GB",
         setup=_a_run),
    Case("sql-unknown-column", ("llmload", "sql", "ev/r1", "SELECT stepp FROM requests"), 2,
         ("the query failed: Binder Error: Referenced column \"stepp\" not found",
          "the views are requests, chunks, samples, stalls, request_metrics, itl_samples"),
         setup=_a_run),
    Case("sql-empty-query", ("llmload", "sql", "ev/r1", ""), 2,
         "the query '' returns no result; give one query that returns rows", setup=_a_run),
    Case("sql-out-unwritable", ("llmload", "sql", "ev/r1", "SELECT 1 AS one", "--out",
                                "/proc/llmload-x.csv"), 2,
         "--out /proc/llmload-x.csv: cannot write it (", setup=_a_run),
    Case("report-fail-on-slo-without-objective", ("llmload", "report", "ev/r1", "--fail-on-slo"),
         2, "--fail-on-slo needs step objectives; add e.g. --slo ttft_p99=0.5",
         setup=_a_run),
    Case("report-out-unwritable", ("llmload", "report", "ev/r1", "--out", "/proc/llmload-x"), 2,
         "cannot create the output directory /proc/llmload-x", setup=_a_run),
    Case("report-corrupt-parquet", ("llmload", "report", "ev/r1"), 1,
         "none of the 1 requests part(s) of ev/r1 can be read", setup=_corrupt_parts),
    Case("report-schema-version", ("llmload", "report", "ev/r1"), 1,
         "2.0 is not supported", setup=_future_schema),
    Case("report-all-parts-missing", ("llmload", "report", "ev/r1"), 1,
         ("run r1 at ev/r1: all 2 part(s) the workers' indexes list are missing",
          "run `llmload upload-spool"), setup=_parts_missing),
    Case("report-root", ("llmload", "report", "/"), 2,
         "no llmload run at / (it names no run id: is a variable in it unset?)"),
    Case("report-a-file", ("llmload", "report", "d.jsonl"), 2,
         "no llmload run at d.jsonl: found no manifest.json", setup=_write("d.jsonl", "{}\n")),
    Case("report-s3-no-credentials", ("llmload", "report", "s3://bucket/runs/r1"), 1,
         "NoCredentialsError (no credentials found: set AWS_ACCESS_KEY_ID",
         env={"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:{free_port}"}),
    Case("report-s3-unreachable", ("llmload", "report", "s3://bucket/runs/r1"), 1,
         "EndpointConnectionError (store unreachable: check AWS_ENDPOINT_URL_S3",
         env=S3_UNREACHABLE),
    Case("report-unknown-home", ("llmload", "report", "~llmload-nobody/runs/r1"), 2,
         "events URI ~llmload-nobody/runs/r1: ~llmload-nobody names no home folder"),
    Case("compare-unknown-run", ("llmload", "compare", "ev/a", "ev/b"), 2,
         "no llmload run at ev/a"),
    Case("compare-negative-threshold", ("llmload", "compare", "ev/r1", "ev/r1", "--threshold=-1"),
         2, "regression thresholds must be >= 0: --threshold -1.0"),
    Case("compare-out-is-a-file", ("llmload", "compare", "ev/r1", "ev/r1", "--out", "d.jsonl"),
         2, "cannot create the output directory d.jsonl (a file of that name exists)",
         setup=_a_run_and_a_file),
    # -- llmload check, sim, store, upload-spool -------------------------------------------
    Case("check-not-http", ("llmload", "check", "ftp://host"), 2,
         "URL 'ftp://host' is not an http(s) URL"),
    Case("check-timeout-zero", ("llmload", "check", "{sim}", "--timeout", "0"), 2,
         "--timeout must be > 0 seconds, not 0.0; e.g. --timeout 60"),
    Case("check-ready-timeout-alone", ("llmload", "check", "{sim}", "--ready-timeout", "5"), 2,
         "--ready-timeout needs --wait-ready; add --wait-ready"),
    Case("check-url-v1-path", ("llmload", "check", "{sim}/v1"), 2,
         ("/v1' has a path: give the server's base URL without /v1 (llmload adds "
          "/v1/chat/completions): llmload check http://127.0.0.1:")),
    Case("check-model-not-served", ("llmload", "check", "{sim}", "--model", "nope"), 2,
         ("--model 'nope' is not served by http://127.0.0.1:", "it serves 'llmload-sim-tiny'")),
    Case("check-wait-ready-model-not-served",
         ("llmload", "check", "{sim}", "--wait-ready", "--ready-timeout", "60", "--model", "nope"),
         2, ("--model 'nope' is not served by http://127.0.0.1:", "it serves 'llmload-sim-tiny'")),
    Case("sim-port-out-of-range", ("llmload", "sim", "--port", "70000"), 2,
         "--port must be in 0..65535 (0: any free port), not 70000"),
    Case("sim-fault-rate-above-one", ("llmload", "sim", "--fault-500-rate", "2"), 2,
         "--fault-500-rate must be in [0, 1]"),
    Case("sim-time-scale-zero", ("llmload", "sim", "--time-scale", "0"), 2,
         "--time-scale must be > 0"),
    Case("sim-tokens-per-event-zero", ("llmload", "sim", "--tokens-per-event", "0"), 2,
         "--tokens-per-event: '0' needs 1 <= A <= B; give an integer K >= 1 or a range A-B, "
         "e.g. --tokens-per-event 1-3"),
    Case("sim-unknown-profile", ("llmload", "sim", "--profile", "huge"), 2,
         "unknown profile 'huge'"),
    Case("sim-port-in-use", ("llmload", "sim", "--port", "{sim_port}"), 2,
         "choose another --port (0: any free one)"),
    Case("sim-truth-log-folder-missing",
         ("llmload", "sim", "--port", "0", "--truth-log", "/proc/llmload-x/t.jsonl"), 2,
         "--truth-log /proc/llmload-x/t.jsonl: folder /proc/llmload-x does not exist"),
    Case("store-dir-unwritable", ("llmload", "store", "--dir", "/proc/llmload-x"), 2,
         "cannot use /proc/llmload-x as the store's data directory"),
    Case("store-port-out-of-range", ("llmload", "store", "--dir", "s", "--port", "70000"), 2,
         "port 70000 is not a TCP port"),
    Case("store-bad-bucket-name", ("llmload", "store", "--dir", "s", "--bucket", "My_Bucket"), 2,
         "bucket name 'My_Bucket' is not valid in S3"),
    Case("upload-spool-missing-dir", ("llmload", "upload-spool", "none", "--events-uri", "ev"), 2,
         "spool directory none does not exist"),
    Case("upload-spool-no-events-uri", ("llmload", "upload-spool", "spool"), 2,
         "no events URI: give --events-uri or set LLMLOAD_EVENTS_URI", setup=_spool_dir),
    Case("upload-spool-bad-uri", ("llmload", "upload-spool", "spool", "--events-uri", "ftp://x"),
         2, "events URI scheme 'ftp' is not supported", setup=_spool_dir),
    Case("unknown-subcommand", ("llmload", "frobnicate"), 2, "invalid choice: 'frobnicate'"),
]  # fmt: skip


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with SimProcess(tmp_path_factory.mktemp("bad-inputs-sim")) as server:
        yield server


class _Pings(http.server.BaseHTTPRequestHandler):
    """Answers every request 200, then sends `: ping` SSE comments until the client leaves."""

    protocol_version = "HTTP/1.1"
    stop = threading.Event()

    def _pings(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with contextlib.suppress(OSError):
            while not self.stop.wait(0.1):
                self.wfile.write(b"8\r\n: ping\n\n\r\n")
                self.wfile.flush()

    do_GET = do_POST = _pings

    def log_message(self, *args: object) -> None:
        pass


class _Page(http.server.BaseHTTPRequestHandler):
    """Answers everything 200 with a web page, as a UI or a proxy's login page would."""

    protocol_version = "HTTP/1.1"

    def _page(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"<!DOCTYPE html><html><body><h1>Welcome</h1></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _page

    def log_message(self, *args: object) -> None:
        pass


class _Refuses(TargetHandler):
    """Lists model `m`; refuses every chat completion with 401 (a key it does not take) and
    has no other POST endpoint (404), as a server behind a key, or not OpenAI-compatible."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/chat/completions":
            self.answer_json(401, {"error": {"message": "Incorrect API key provided",
                                             "type": "invalid_request_error"}})  # fmt: skip
        else:
            self.answer_json(404, {"detail": "Not Found"})


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A small misbehaving target on 127.0.0.1 for the module's cases: its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name=handler.__name__, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Pings.stop.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def pinger() -> Iterator[str]:
    """A target that answers 200 and then only `: ping` comments, forever: its URL."""
    yield from _serve(_Pings)


@pytest.fixture(scope="module")
def refuser() -> Iterator[str]:
    """A target that refuses every completion request (401, or 404 off the chat path)."""
    yield from _serve(_Refuses)


@pytest.fixture(scope="module")
def page() -> Iterator[str]:
    """A target that answers every request 200 with an HTML page."""
    yield from _serve(_Page)


TARGETS = ("pinger", "refuser", "page")  # fixtures a case names as {pinger}, {refuser}, {page}


def _command(case: Case, sim: SimProcess, port: int, targets: dict[str, str]) -> list[str]:
    def fill(arg: str) -> str:
        arg = arg.replace("{sim}", sim.url).replace("{sim_port}", str(sim.port))
        arg = arg.replace("{free_port}", str(port))
        for name, url in targets.items():
            arg = arg.replace("{" + name + "}", url)
        return arg

    args = [fill(a) for a in case.argv[1:]]
    if case.argv[0] in ("locust", "locust-open"):
        host = [] if "--host" in args else ["--host", sim.url]
        at = LOCUST.index("--steps")
        base = [*LOCUST[:at], *LOCUST[at + 2 :]]  # a trace makes its own step
        return [*(LOCUST if case.argv[0] == "locust" else base), *host, *args]
    return [str(BIN / "llmload"), *args]


def _environment(
    case: Case, cwd: Path, port: int, marker: str, store: dict[str, str]
) -> dict[str, str]:
    """The parent's environment without llmload, Locust or AWS settings, plus the store's
    (a case that needs one) and the case's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOCUST_", "LLMLOAD_", "AWS_")) and k != "OPENAI_API_KEY"}  # fmt: skip
    env.update(
        TMPDIR=str(cwd / "tmp"),  # the default spool lives here: inside the snapshot
        AWS_SHARED_CREDENTIALS_FILE=str(cwd / "no-aws-credentials"),
        AWS_CONFIG_FILE=str(cwd / "no-aws-config"),
        AWS_EC2_METADATA_DISABLED="true",
        LLMLOAD_BAD_INPUT_CASE=marker,
    )
    env.update(store)
    env.update({k: v.replace("{free_port}", str(port)) for k, v in case.env.items()})
    return env


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        out[str(path.relative_to(root))] = (
            (stat.st_size, stat.st_mtime_ns) if path.is_file() else (0, 0)
        )
    return out


def _left_behind(pgid: int, marker: str) -> list[psutil.Process]:
    """Processes of the case still alive: in its process group or carrying its marker."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if (
                os.getpgid(proc.pid) == pgid
                or proc.environ().get("LLMLOAD_BAD_INPUT_CASE") == marker
            ):
                found.append(proc)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return found


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.id) for c in CASES],
)
def test_bad_input_is_one_line_and_nothing_else(
    case: Case, sim: SimProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "tmp").mkdir(parents=True)
    if case.setup is not None:
        case.setup(cwd)
    port, marker = free_port(), uuid.uuid4().hex
    store = request.getfixturevalue("seaweed").env() if case.store else {}
    targets = {name: request.getfixturevalue(name) for name in TARGETS
               if "{" + name + "}" in case.argv}  # fmt: skip
    before = _snapshot(cwd)
    start = time.monotonic()
    proc = subprocess.Popen(
        _command(case, sim, port, targets), cwd=cwd, env=_environment(case, cwd, port, marker, store),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{case.id}: still running after {TIME_LIMIT_S} s:\n{output[-3000:]}")
    elapsed = time.monotonic() - start
    leftovers = _left_behind(proc.pid, marker)
    for leftover in leftovers:
        leftover.kill()

    errors = [line for line in output.splitlines() if ERROR_LINE.match(line)]
    assert proc.returncode == case.status, output[-3000:]
    assert len(errors) == 1, output[-3000:]
    fragments = (case.fragment,) if isinstance(case.fragment, str) else case.fragment
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert "Traceback" not in output, output[-3000:]
    after = _snapshot(cwd)
    assert after == before, f"written: {sorted(set(after.items()) ^ set(before.items()))}"
    assert not leftovers, [p.info for p in leftovers]
    assert elapsed < TIME_LIMIT_S


def test_the_table_is_large_and_every_case_is_documented() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 40
    doc = (ROOT / "docs" / "reliability.md").read_text()
    section = doc.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    assert [i for i in ids if f"`{i}`" not in section] == []
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M)
    assert sorted(documented) == sorted(ids)


def test_every_status_and_fragment_is_in_the_doc() -> None:
    """The doc's exit column is each case's status; its message holds the expected fragment."""
    doc = (ROOT / "docs" / "reliability.md").read_text().split("## Bad input", 1)[1]
    row = re.compile(r"^\| `([a-z0-9-]+)` \| .* \| (\d+) \| (.*) \|$", flags=re.M)
    rows = {m[0]: (int(m[1]), m[2].replace("\\|", "|")) for m in row.findall(doc)}
    for case in CASES:
        status, message = rows[case.id]
        fragments = (case.fragment,) if isinstance(case.fragment, str) else case.fragment
        assert status == case.status, case.id
        assert [f for f in fragments if f not in message] == [], case.id
