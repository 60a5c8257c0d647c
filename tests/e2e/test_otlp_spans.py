"""A headless run with `--otlp-listen` against the simulator sending its spans to the master:
the run's `spans` parts hold an `llm_request` span per request, joined by trace id, and the
manifest records the receiver's counts."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from analysis.read.load import load_run
from tests.support.chat import run_locust, start_sim


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_run_stores_the_engines_spans(tmp_path: Path) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    with start_sim(tmp_path / "sim", "--otlp-traces-endpoint", endpoint) as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--steps", "2", "--step-duration", "2",
            "--step-warmup", "0.5", "--cold-requests", "0", "--workload", "D(16,32)",
            "--otlp-listen", f"127.0.0.1:{port}", "--otlp-linger", "1",
        )  # fmt: skip
    assert result.returncode == 0, result.output
    run = result.run_dir()
    manifest = json.loads((run / "manifest.json").read_text())
    spans = manifest["spans"]
    assert spans["listen"] == f"127.0.0.1:{port}", spans
    assert spans["received"] == spans["stored"] > 0 and spans["rejected_bodies"] == 0
    assert spans["parts"] == len(list((run / "spans").glob("part-otlp-*.parquet")))
    data = load_run(str(run), progress=False)
    assert data.spans is not None
    requests = data.spans[data.spans["name"] == "llm_request"]
    joined = set(requests["trace_id"]) & set(data.requests["request_id"])
    ok = data.requests[data.requests["status"] == "ok"]
    assert len(joined) >= len(ok) > 0  # every finished request's span arrived (the linger)


def test_a_taken_port_stops_the_run_before_anything_is_written(tmp_path: Path) -> None:
    with socket.socket() as taken, start_sim(tmp_path / "sim") as sim:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_locust(sim.url, tmp_path / "runs", "--steps", "1", "--step-duration", "1", "--step-warmup", "0",
                            "--otlp-listen", f"127.0.0.1:{port}")  # fmt: skip
    assert result.returncode == 2, result.output
    errors = [x for x in result.output.splitlines() if x.startswith("llmload: error:")]
    assert len(errors) == 1 and f"--otlp-listen 127.0.0.1:{port}: cannot listen" in errors[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
