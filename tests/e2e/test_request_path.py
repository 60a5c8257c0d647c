"""The request path end to end (issue 22): a master and two workers drive the simulator, which
emits its true queue, prefill and decode times as OTLP spans to the master's receiver
(`--otlp-listen`); the report joins every successful request with its span, and the parts add
up to the client's TTFT and E2E. With the engine's batch forced small, queue time dominates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import build_report
from analysis.derive.path import E2E_PARTS, PARTS, TTFT_PARTS
from analysis.read.engine import Engine
from infra.ports import free_port
from tests.support.chat import run_locust, start_sim

RUN = ("--steps", "4", "--step-duration", "5", "--step-warmup", "1", "--cold-requests", "0",
       "--workload", "D(32,16)", "--otlp-linger", "2")  # fmt: skip


def _run(tmp_path: Path, *sim_args: str) -> tuple[pd.DataFrame, dict, list[str], Path]:  # type: ignore[type-arg]
    port = free_port()
    events = tmp_path / "runs"
    with start_sim(tmp_path / "sim", "--output-len", "16",
                   "--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces",
                   *sim_args) as sim:  # fmt: skip
        result = run_locust(sim.url, events, *RUN, "--otlp-listen", f"127.0.0.1:{port}",
                            workers=2, timeout=150)  # fmt: skip
        assert result.returncode == 0, result.output[-3000:]
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False)
    html = (tmp_path / "report" / "report.html").read_text()
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert 'id="plot-request-path"' in html and 'id="request-path"' in html
    assert "## Request path" in markdown and "1st-token delivery p50/p99" in markdown
    assert "| engine spans |" in markdown
    per = report.per_request
    step = report.step_rows[0]
    return per[(per["status"] == "ok") & per["steady"]], step, report.warnings, result.run_dir()


def test_every_request_has_its_span_and_the_parts_add_up(tmp_path: Path) -> None:
    ok, step, warnings, run = _run(tmp_path)
    assert len(ok) >= 20
    assert ok["span"].all(), ok.loc[~ok["span"], "request_id"].tolist()[:5]
    assert step["span_share"] == 1.0
    ttft = sum(ok[f"{p}_s"] for p in TTFT_PARTS)
    e2e = sum(ok[f"{p}_s"] for p in E2E_PARTS)
    assert np.allclose(ttft, ok["ttft_s"], atol=1e-3, rtol=0)
    assert np.allclose(e2e, ok["e2e_s"], atol=1e-3, rtol=0)
    # the boundaries are where they belong: the wire is fast on loopback, the engine's parts
    # are its own, every part is a time between two instants: nothing negative beyond a
    # clock tick (the tail, the last token's delivery, included)
    # (a request whose client or engine process was preempted between two of its clock
    # readings, or in flight while the wall clock was stepped, may be off by that much: at
    # most one in a hundred, where the former tail was negative for half)
    for part in PARTS:
        below = ok.loc[ok[f"{part}_s"] <= -1e-3, f"{part}_s"]
        assert len(below) <= max(1, len(ok) // 100), (part, below.tolist()[:10], len(ok))
        assert float(ok[f"{part}_s"].median()) >= 0, part
    assert float(ok["first_token_delivery_s"].median()) < 0.005
    assert float(ok["tail_s"].median()) < 0.005
    assert float(ok["server_prefill_s"].median()) > 0
    assert step["client_delay_p99_ms"] == step["client_delay_p99_ms"]  # measured (1.4)
    assert step["connections_new"] >= 0
    assert not [w for w in warnings if "no engine span" in w], warnings
    # `llmload sql`'s request_path view: the same join and the same parts as the report
    with Engine() as engine:
        engine.attach([str(run)])
        columns = ", ".join(f"{p}_s" for p in PARTS)
        view = engine.sql(f"SELECT request_id, span, {columns} FROM request_path").to_pandas()
    both = ok.merge(view, on="request_id", suffixes=("", "_sql"))
    assert len(both) == len(ok) and both["span_sql"].all()
    for part in PARTS:
        assert np.allclose(both[f"{part}_s"], both[f"{part}_s_sql"], atol=1e-9, rtol=0), part


@pytest.mark.slow  # long (10-20 s): `make test-slow` keeps the default suite near 10 min
def test_a_forced_queue_shows_as_queue_time(tmp_path: Path) -> None:
    ok, step, _, _ = _run(tmp_path, "--max-num-seqs", "1", "--decode-base-ms", "4")
    assert ok["span"].all()
    # four users, one sequence at a time: most of a request's TTFT is waiting its turn
    assert step["server_queue_p50_s"] > 0.5 * step["ttft_p50_s"], step
    assert step["server_queue_p50_s"] > step["server_prefill_p50_s"]
