"""The LLM tab's rows, the console step line, and the web routes, on a stub LiveStats."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from locustfiles.live import console, endreport, webtab
from locustfiles.live.board import Board


def _dist(p50: float, p90: float, p99: float) -> dict[str, float]:
    return {"p50": p50, "p90": p90, "p99": p99}


def _row(step: int | None, concurrency: int, **over: Any) -> dict[str, Any]:
    row = {
        "group": "cold" if step is None else "step", "step": step, "concurrency": concurrency,
        "actual_concurrency": concurrency * 0.98, "requests": 120, "ok": 118, "failed": 2,
        "errors": {"timeout": 1, "http_5xx": 1}, "ttft": _dist(0.012, 0.02, 0.041),
        "tpot": _dist(0.0011, 0.002, 0.0023), "itl": _dist(0.001, 0.002, 0.003),
        "icl": _dist(0.001, 0.002, 0.003), "e2e": _dist(0.2, 0.3, 0.4), "output_tokens": 9000,
        "input_tokens": 15000, "output_tokens_per_s": 1850.25, "requests_per_s": 12.5,
        "elapsed_s": 10.0,
    }  # fmt: skip
    row.update(over)
    return row


class StubLive:
    """The shape of locustfiles.live.stats.LiveStats that the views read."""

    def __init__(self, rows: list[dict[str, Any]], current: dict[str, Any]) -> None:
        self.rows, self.current = rows, current

    def snapshot(self) -> dict[str, Any]:
        return {"relative_accuracy": 0.01, "current": self.current, "workers": 2,
                "steps": self.rows,
                "series": [{"t": 1.0, "ttft_p50": 0.01, "ttft_p99": 0.04, "tpot_p50": 0.001,
                            "tpot_p99": 0.002, "output_tokens_per_s": 1800.0}]}  # fmt: skip

    def step_summary(self, step: int) -> dict[str, Any] | None:
        return next((r for r in self.rows if r["group"] == "step" and r["step"] == step), None)


CURRENT = {"step": 1, "cold": False, "concurrency": 2, "time_left_s": 12.4}


def test_the_console_line_names_the_step_its_figures_and_the_accuracy() -> None:
    line = console.step_line(_row(1, 2), accuracy=0.01, simulated=False)
    assert line.startswith("llmload step 1 [live sketch ±1%, exact figures in the report]: ")
    assert "concurrency 2 (actual 1.96)" in line and "120 requests" in line
    assert "2 errors (http_5xx 1, timeout 1)" in line
    assert "TTFT p50 12.0 ms p99 41.0 ms" in line and "TPOT p50 1.10 ms p99 2.30 ms" in line
    assert line.endswith("1850.2 output tok/s")
    simulated = console.step_line(_row(None, 1), accuracy=0.01, simulated=True)
    assert simulated.startswith("SIMULATED target: llmload cold [")


def test_a_missing_figure_is_shown_as_missing_never_as_zero() -> None:
    row = _row(0, 1, tpot={"p50": None, "p90": None, "p99": None}, output_tokens_per_s=None)
    line = console.step_line(row, accuracy=None, simulated=False)
    assert "TPOT p50 n/a p99 n/a" in line and "output tok/s n/a" in line
    assert "[live sketch approximate," in line


def test_each_step_is_printed_once_in_order_the_last_at_the_end() -> None:
    live = StubLive([_row(None, 1), _row(0, 1), _row(1, 2)], CURRENT)
    coordinator = SimpleNamespace(run_id="r1", current={"step": 1, "concurrency": 2, "cold": False},
                                  manifest=SimpleNamespace(target={"simulated": True}))  # fmt: skip
    board = Board(run=coordinator, stats=live)  # type: ignore[arg-type]
    timers: list[Any] = []
    out = io.StringIO()
    printer = console.StepConsole(board, out, spawn_later=lambda _d, fn: timers.append(fn))
    printer.step_ended({"step": -1, "concurrency": 1, "cold": True})
    printer.step_ended({"step": 0, "concurrency": 1, "cold": False})
    timers[0]()  # the cold phase's line is due
    assert out.getvalue().count("\n") == 1 and "llmload cold" in out.getvalue()
    printer.flush()  # end of run: step 0 (pending) then step 1 (the last)
    timers[1]()  # a late timer prints nothing twice
    lines = out.getvalue().splitlines()
    assert [line.split(" [")[0] for line in lines] == [
        "SIMULATED target: llmload cold",
        "SIMULATED target: llmload step 0",
        "SIMULATED target: llmload step 1",
    ]
    assert "concurrency 2 (" in lines[2]


def test_the_tab_marks_the_current_step_and_ends_with_a_note() -> None:
    live = StubLive([_row(None, 1), _row(0, 1), _row(1, 2)], CURRENT)
    rows = webtab.tab_rows(live.snapshot(), "about text")
    assert [r["name"] for r in rows] == ["cold", "step 0", "step 1 ▶ now, 12 s left", "about"]
    step1 = rows[2]
    assert step1["concurrency"] == "2 / 1.96"
    assert step1["ttft"] == "12 / 20 / 41" and step1["e2e"] == "0.2 / 0.3 / 0.4"
    assert step1["failures"] == "http_5xx 1, timeout 1" and step1["tokens"] == "1850.2"
    assert set(rows[0]) == {key for key, _ in webtab.TABLE}
    assert all(k.isalnum() and k.islower() for k in rows[0])  # Locust camel-cases keys
    # a step that began before any of its requests came in still shows as current
    started = webtab.tab_rows(StubLive([_row(0, 1)], CURRENT).snapshot(), "")
    assert started[1]["name"] == "step 1 ▶ now, 12 s left" and started[1]["concurrency"] == "2"


def _web_env(live: Any, base_path: str | None = None) -> Any:
    """A stand-in for Locust's WebUI (importing locust here would monkey-patch the tests):
    its Flask app with Locust's /stats/requests (under `--web-base-path` as Locust's
    blueprint puts it), template_args, auth decorator and environment."""
    from flask import Flask, jsonify

    app = Flask(__name__)

    @app.route((base_path or "") + "/stats/requests")
    def request_stats() -> Any:
        return jsonify({"stats": [], "state": "running"})

    web_ui = SimpleNamespace(app=app, template_args={}, auth_required_if_enabled=lambda f: f)
    parsed = None if base_path is None else SimpleNamespace(web_base_path=base_path)
    env = SimpleNamespace(web_ui=web_ui, parsed_options=parsed)
    web_ui.environment = env
    run = SimpleNamespace(run_id="r1", manifest=SimpleNamespace(target={"simulated": True}))
    env.board = Board(run=run, stats=live)  # type: ignore[arg-type]
    env.reports = endreport.Reports()
    webtab.register(env, env.board, env.reports)
    return env


def test_the_web_ui_serves_the_tab_the_live_page_and_the_report(tmp_path: Path) -> None:
    env = _web_env(StubLive([_row(0, 1), _row(1, 2)], CURRENT))
    client = env.web_ui.app.test_client()
    args = env.web_ui.template_args
    assert args["extended_tabs"] == [{"title": "LLM", "key": "llmload"}]
    assert args["extended_tables"][0]["key"] == "llmload"
    stats = client.get("/stats/requests").get_json()
    (tab,) = stats["extended_stats"]
    assert tab["key"] == "llmload" and tab["data"][1]["name"].startswith("step 1 ▶ now")
    assert "SIMULATED" in tab["data"][-1]["failures"]
    assert stats["stats"] == []  # Locust's own answer is kept
    page = client.get("/llmload/live")
    assert (
        page.status_code == 200
        and b"<svg" in page.data
        and b"http" not in page.data.replace(b"http://www.w3.org/2000/svg", b"")
    )  # nothing fetched from elsewhere
    payload = client.get("/llmload/live.json").get_json()
    assert payload["simulated"] and payload["snapshot"]["current"]["step"] == 1
    assert client.get("/llmload/report").status_code == 404  # no run has stopped yet

    out = tmp_path / "report"
    job = endreport.ReportJob("r1", "file:///nowhere/r1", out, status="building",
                              started_at=time.time())  # fmt: skip
    env.reports.add(job)
    building = client.get("/llmload/report")
    assert building.status_code == 202 and b"Building the report of run r1" in building.data
    out.mkdir()
    (out / "report.html").write_text("<html>the report</html>")
    (out / "summary.csv").write_text("step\n0\n")
    job.status = "done"
    with client.get("/llmload/report") as done:  # a file response: close it
        assert done.data == b"<html>the report</html>"
    with client.get("/llmload/report/files/summary.csv") as summary:
        assert summary.data == b"step\n0\n"
    assert client.get("/llmload/report/files/../../etc/passwd").status_code == 404
    job.status, job.error = "failed", "no events <here>"
    failed = client.get("/llmload/report")
    assert failed.status_code == 500 and b"no events &lt;here&gt;" in failed.data
    assert json.loads(client.get("/llmload/report/status").data)["status"] == "failed"


def test_a_failed_build_keeps_the_error(tmp_path: Path) -> None:
    job = endreport.ReportJob("r1", str(tmp_path / "no-such-run"), tmp_path / "out")
    job.run()
    assert job.status == "failed" and job.error
    assert job.to_dict()["command"] == f"llmload report {tmp_path / 'no-such-run'}"


def test_the_metrics_endpoint_honours_the_web_base_path() -> None:
    """Locust's `--web-base-path /base` puts its pages and /llmload/* under /base: the
    Prometheus endpoint too, scraped from a real LiveStats."""
    from prometheus_client.parser import text_string_to_metric_families

    from locustfiles.live.metrics import register_endpoint
    from locustfiles.live.stats import LiveStats
    from locustfiles.request.record import RequestRecord

    coordinator = SimpleNamespace(run_id="r1", staircase=None, current=None)
    live = LiveStats(SimpleNamespace(state="running"), lambda: coordinator)  # type: ignore[arg-type,return-value]
    record = RequestRecord("q1", 0, 1, False, "D(8,8)", "chat", "m", True, 8, 8, "h")
    record.first_token_ns, record.last_token_ns, record.end_ns = 20_000_000, 90_000_000, 95_000_000
    record.output_tokens = 8
    live.observe(record)
    for base, scraped, missing in (
        ("/base", "/base/llmload/metrics", "/llmload/metrics"),
        (None, "/llmload/metrics", "/base/llmload/metrics"),
    ):
        env = _web_env(live, base)
        register_endpoint(env.web_ui, live)
        client = env.web_ui.app.test_client()
        answer = client.get(scraped)
        assert answer.status_code == 200 and answer.content_type.startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(answer.get_data(True))}
        counts = [s.value for s in families["llmload_ttft_seconds"].samples
                  if s.name.endswith("_count") and s.labels["step"] == "0"]  # fmt: skip
        assert counts == [1]
        assert client.get(missing).status_code == 404
        # the same prefix as the pages of the LLM tab and Locust's own
        assert client.get(scraped.replace("metrics", "live.json")).status_code == 200
        assert client.get(scraped.replace("llmload/metrics", "stats/requests")).status_code == 200
