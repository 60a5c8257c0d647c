"""The "LLM" tab of Locust's web UI, the live page with charts, and the report at the end.

Through Locust's supported extension points (locust/web.py, examples/extend_web_ui.py):
- `template_args["extended_tabs"]` / `["extended_tables"]`: a tab "LLM" showing one table;
- `extended_stats` added to `/stats/requests` (a Flask `after_request`), which the UI polls
  every 2 s while a run goes: the table's rows, from the board's `stats.snapshot()`;
- `template_args["extended_csv_files"]`: links on the "Download Data" tab.
Locust's extended tables show plain text only (no links, no charts), so the tab's last row
names the two pages served here, which the "Download Data" tab links to:
- `/llmload/live`: the same table, the current step, charts of TTFT and TPOT p50/p99 and
  output tokens/s over time (locustfiles/live/page.py), and the report's status and link;
- `/llmload/report`: the report built when the run stops (locustfiles/live/endreport.py): a
  status page while it builds, then report.html; `?run=RUN_ID` for an earlier run.
"""

from __future__ import annotations

import html
import json
from typing import Any

from locustfiles.live.board import Board
from locustfiles.live.endreport import Reports
from locustfiles.live.page import PAGE

TAB_KEY = "llmload"
MAX_BODY_BYTES = 1 << 20
"""The largest request body the master's web UI reads (its start form is a few KiB): werkzeug
refuses more with 413, whatever the framing (a chunked body has no Content-Length to check)."""

# keys are single lowercase words: Locust's UI camel-cases the keys of what it polls
TABLE = [
    ("name", "Step"),
    ("concurrency", "Concurrency (or rate) target / actual in flight"),
    ("requests", "Requests"),
    ("failed", "Failed"),
    ("failures", "Failures by kind"),
    ("ttft", "TTFT ms p50 / p90 / p99"),
    ("tpot", "TPOT ms p50 / p90 / p99"),
    ("itl", "ITL ms p50 / p90 / p99"),
    ("e2e", "E2E s p50 / p90 / p99"),
    ("tokens", "Output tok/s"),
    ("rps", "Req/s"),
]


def _num(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def _sig(value: Any, scale: float) -> str:
    """Three significant digits (as the report shows latencies); missing as a dash."""
    if value is None:
        return "–"
    v = value * scale
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _pcts(dist: dict[str, Any] | None, scale: float) -> str:
    dist = dist or {}
    return " / ".join(_sig(dist.get(p), scale) for p in ("p50", "p90", "p99"))


def _is_current(row: dict[str, Any], current: dict[str, Any]) -> bool:
    if row.get("group") == "cold":
        return bool(current.get("cold"))
    return not current.get("cold") and row.get("step") == current.get("step")


def _now_label(current: dict[str, Any]) -> str:
    left = current.get("time_left_s")
    return "now" + ("" if left is None else f", {left:.0f} s left")


def step_row(row: dict[str, Any], current: dict[str, Any]) -> dict[str, str]:
    """One live step (a snapshot's `steps` entry) as the tab's text cells."""
    name = "cold" if row.get("group") == "cold" else f"step {row.get('step')}"
    if _is_current(row, current):
        name += f" ▶ {_now_label(current)}"
    errors = row.get("errors") or {}
    return {
        "name": name,
        "concurrency": f"{_load(row)} / {_num(row.get('actual_concurrency'), digits=2)}",
        "requests": str(row.get("requests", 0)),
        "failed": str(row.get("failed", 0)),
        "failures": ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "–",
        "ttft": _pcts(row.get("ttft"), 1000),
        "tpot": _pcts(row.get("tpot"), 1000),
        "itl": _pcts(row.get("itl"), 1000),
        "e2e": _pcts(row.get("e2e"), 1),
        "tokens": _num(row.get("output_tokens_per_s")),
        "rps": _num(row.get("requests_per_s"), digits=2),
    }


def _load(row: dict[str, Any]) -> str:
    """A step's target: its concurrency, or its rate (open loop) as `4/s`."""
    rate = row.get("rate")
    return f"{rate:g}/s" if rate is not None else str(row.get("concurrency"))


def _blank(name: str, **cells: str) -> dict[str, str]:
    return {**{key: "" for key, _ in TABLE}, "name": name, **cells}


def tab_rows(snapshot: dict[str, Any] | None, about: str) -> list[dict[str, str]]:
    """The tab's rows: one per step (cold first), the current step marked, then a note row."""
    if snapshot is None:
        return [_blank("live statistics unavailable", failures=about)]
    current = snapshot.get("current") or {}
    steps = snapshot.get("steps") or []
    rows = [step_row(r, current) for r in steps]
    if (current.get("step") is not None or current.get("cold")) and not any(
        _is_current(r, current) for r in steps
    ):  # the step began and none of its requests is in yet
        label = "cold" if current.get("cold") else f"step {current.get('step')}"
        rows.append(_blank(f"{label} ▶ {_now_label(current)}", concurrency=_load(current)))
    return [*rows, _blank("about", failures=about)]


def _about(board: Board, reports: Reports, snapshot: dict[str, Any] | None) -> str:
    parts = []
    if board.simulated():
        parts.append("SIMULATED target: not inference performance")
    if snapshot is not None:
        acc = snapshot.get("relative_accuracy")
        acc_text = f"±{acc * 100:g}%" if acc is not None else "approximate"
        parts.append(f"live sketch {acc_text}, exact figures in the report")
    job = reports.get()
    report = "built when the run stops" if job is None else job.status
    parts.append(f"charts: /llmload/live; report ({report}): /llmload/report (Download Data tab)")
    return "; ".join(parts)


def _snapshot(board: Board) -> dict[str, Any] | None:
    if board.stats is None:
        return None
    return board.stats.snapshot()


def live_payload(board: Board, reports: Reports) -> dict[str, Any]:
    """What /llmload/live.json serves: the snapshot, the report's status, the simulated flag."""
    job = reports.get()
    snap = _snapshot(board)
    return {
        "live": snap is not None,
        "snapshot": snap,
        "simulated": board.simulated(),
        "report": job.to_dict() if job is not None else None,
    }


def _status_page(title: str, body: str, refresh: bool) -> str:
    meta = '<meta http-equiv="refresh" content="2">' if refresh else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">{meta}'
        f"<title>{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1>"
        f'{body}<p><a href="live">live statistics</a></p></body></html>'
    )


def register(environment: Any, board: Board, reports: Reports) -> None:
    """Add the LLM tab, /llmload/live(.json) and /llmload/report to the master's web UI."""
    from flask import Blueprint, Response, jsonify, request, send_from_directory

    web_ui = environment.web_ui
    web_ui.app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    web_ui.template_args["extended_tabs"] = [{"title": "LLM", "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB_KEY, "structure": [{"key": k, "title": t} for k, t in TABLE]}
    ]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "./llmload/live", "title": "LLM: live statistics and charts"},
        {"href": "./llmload/report", "title": "LLM: report (built when the run stops)"},
    ]
    auth = web_ui.auth_required_if_enabled
    base = getattr(environment.parsed_options, "web_base_path", None) or None
    pages = Blueprint("llmload", __name__, url_prefix=(base or "") + "/llmload")

    @web_ui.app.after_request
    def _extend_stats(response: Response) -> Response:
        if not request.path.endswith("/stats/requests") or response.status_code != 200:
            return response
        snap = _snapshot(board)
        data = response.get_json(silent=True) or {}
        rows = tab_rows(snap, _about(board, reports, snap))
        data["extended_stats"] = [{"key": TAB_KEY, "data": rows}]
        response.set_data(json.dumps(data))
        return response

    @pages.route("/live")
    @auth
    def live_page() -> Response:
        return Response(PAGE, mimetype="text/html")

    @pages.route("/live.json")
    @auth
    def live_json() -> Response:
        return jsonify(live_payload(board, reports))

    @pages.route("/report")
    @auth
    def report() -> Any:
        job = reports.get(request.args.get("run"))
        if job is None:
            body = "<p>No report yet: it is built when a run stops.</p>"
            return Response(_status_page("llmload report", body, True), 404, mimetype="text/html")
        if job.status == "done":
            return send_from_directory(job.out_dir.resolve(), "report.html")
        if job.status == "failed":
            body = (
                f"<p>The report of run {html.escape(job.run_id)} failed:</p>"
                f"<pre>{html.escape(job.error or '')}</pre>"
                f"<p>Build it again with <code>{html.escape(job.command)}</code></p>"
            )
            return Response(_status_page("llmload report failed", body, False), 500,
                            mimetype="text/html")  # fmt: skip
        elapsed = job.to_dict()["elapsed_s"]
        body = (
            f"<p id='status'>Building the report of run {html.escape(job.run_id)} "
            f"({elapsed or 0} s so far)…</p><p>This page reloads itself.</p>"
        )
        return Response(_status_page("llmload report: building", body, True), 202,
                        mimetype="text/html")  # fmt: skip

    @pages.route("/report/status")
    @auth
    def report_status() -> Response:
        job = reports.get(request.args.get("run"))
        return jsonify(job.to_dict() if job is not None else {"status": "none"})

    @pages.route("/report/files/<path:name>")
    @auth
    def report_file(name: str) -> Any:
        job = reports.get(request.args.get("run"))
        if job is None or job.status != "done":
            return Response("no report yet", 404)
        return send_from_directory(job.out_dir.resolve(), name)  # refuses paths outside it

    web_ui.app.register_blueprint(pages)
