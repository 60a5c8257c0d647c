"""Issue 12, done when: a master with the web UI and two workers; the run started from the UI
in headless Chromium; the LLM tab's values agree with the final report (counts exactly,
percentiles within the sketch's 1% plus the tab's rounding); the report opens from the link
the UI offers; the Prometheus endpoint parses; a screenshot; no console errors."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra.ports import free_port
from tests.e2e.test_web_ui import CHROMIUM_ARGS, start_staircase, wait_http
from tests.support.chat import BIN, LOCUSTFILE, start_sim

pytestmark = pytest.mark.slow  # long (10-35 s a test): `make test-slow`

STEP_S = 8
FAULTS = ("--fault-500-rate", "0.1")  # some step-0 requests fail: failures are compared too
REPORT_LINK = "LLM: report (built when the run stops)"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _start_worker(master_port: int, log: IO[str], cwd: Path) -> subprocess.Popen[bytes]:
    """A worker as tests.support.chat.start_worker starts one, its output to `log`: a pipe
    that nobody reads fills at 64 KiB and then blocks the worker."""
    return subprocess.Popen(
        [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--worker", "--master-host", "127.0.0.1",
         "--master-port", str(master_port)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={"PYTHONUNBUFFERED": "1"}, cwd=cwd,
    )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for `proc` to exit; kill it after `timeout` seconds (then False)."""
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return False


@contextmanager
def _logs_on_failure(paths: list[Path]) -> Iterator[None]:
    """Print the processes' logs (their last 20,000 characters each) when the block fails."""
    try:
        yield
    except BaseException:
        for path in paths:
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            print(f"----- {path.name} -----\n{text[-20_000:]}")
        raise


def _exact_bounds(values: pd.Series, q: float) -> tuple[float, float]:
    """The exact q-quantile's neighbourhood: the values at the ranks either definition picks."""
    ordered = values.sort_values().to_numpy()
    n = len(ordered)
    low = ordered[max(0, math.floor(q * (n - 1)) - 1)]
    high = ordered[min(n - 1, math.ceil(q * n))]
    return float(low), float(high)


def _shown(cell: str) -> list[float]:
    """A tab cell `p50 / p90 / p99` (3 significant digits, thousands with commas)."""
    return [float(v.replace(",", "")) for v in cell.split(" / ")]


def _assert_percentiles(name: str, cell: str, exact: pd.Series) -> None:
    """The tab's p50/p90/p99 within the sketch's 1% and the tab's rounding to 3 significant
    digits (0.5%) of the exact quantile's neighbourhood."""
    assert len(exact) > 10, (name, len(exact))
    for q, shown in zip((0.5, 0.9, 0.99), _shown(cell), strict=True):
        low, high = _exact_bounds(exact, q)
        assert low * 0.99 * 0.995 <= shown <= high * 1.01 * 1.005, (name, q, shown, low, high)


def _kinds(cell: str) -> dict[str, int]:
    """The tab's `Failures by kind` cell (`http_5xx 3, timeout 1`, or `–` for none)."""
    if cell == "–":
        return {}
    return {kind: int(n) for kind, n in (part.rsplit(" ", 1) for part in cell.split(", "))}


def _wait_report_job(base: str, timeout: float) -> dict[str, Any]:
    """The end-of-run report job's status once the run has stopped and the build began."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = json.loads(_get(f"{base}/llmload/report/status"))
        if job["status"] != "none":
            return job
        assert time.monotonic() < deadline, "the run did not stop"
        time.sleep(0.5)


def test_the_tab_agrees_with_the_report_and_the_endpoint_parses(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    events, reports = tmp_path / "runs", tmp_path / "reports"
    web, master_port = free_port(), free_port()
    base = f"http://127.0.0.1:{web}"
    errors: list[str] = []
    logs = [tmp_path / "master.log", tmp_path / "worker-0.log", tmp_path / "worker-1.log"]

    documents: list[int] = []  # the HTTP status of each report page the report tab loads

    def listen(page: Any) -> None:
        page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
        page.on("console", lambda m: console_error(page, m))

    def console_error(page: Any, message: Any) -> None:
        # every llmload page names its icon: Chromium asks for no /favicon.ico (a 404 here)
        if message.type == "error":
            errors.append(f"{page.url}: {message.text} ({message.location.get('url', '')})")

    def loaded(response: Any) -> None:
        if response.request.is_navigation_request() and "/llmload/report" in response.url:
            documents.append(response.status)

    with _logs_on_failure(logs), start_sim(tmp_path / "sim", *FAULTS) as sim:
        files = [path.open("w") for path in logs]
        master = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--master", "--master-bind-host",
             "127.0.0.1", "--master-bind-port", str(master_port), "--web-host", "127.0.0.1",
             "--web-port", str(web), "--host", sim.url, "--events-uri", str(events),
             "--spool-dir", str(tmp_path / "spool"), "--report-dir", str(reports)],
            stdout=files[0], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        workers = [_start_worker(master_port, log, tmp_path) for log in files[1:]]
        try:
            wait_http(f"{base}/")
            deadline = time.monotonic() + 30
            while json.loads(_get(f"{base}/stats/requests")).get("workers", []).__len__() < 2:
                assert time.monotonic() < deadline, "the workers did not connect"
                time.sleep(0.2)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1600, "height": 900})
                listen(page)
                page.goto(f"{base}/")
                start_staircase(page, "1,2", STEP_S, 1, "D(12,8)")
                page.get_by_role("tab", name="LLM").click()
                table = page.locator("table").first
                # step 1 running with at most 3 s left: step 0 ended > one worker report ago
                expect(table).to_contain_text(
                    re.compile(r"step 1 ▶ now, [0-3] s left"), timeout=60_000
                )
                headers = table.locator("th").all_inner_texts()
                step0 = table.locator("tr", has_text="step 0").first.locator("td").all_inner_texts()
                page.screenshot(path=str(tmp_path / "llm-tab.png"))
                tab = dict(zip(headers, step0, strict=True))
                # the run ends and the master builds the report; a user opens it from the
                # link on the Download Data tab, in a page of its own
                job = _wait_report_job(base, 30)
                report = browser.new_page()
                listen(report)
                report.on("response", loaded)
                report.goto(f"{base}/")
                report.get_by_role("tab", name="Download Data").click()
                report.get_by_role("link", name=REPORT_LINK).click()
                deadline = time.monotonic() + 90
                while not documents or documents[-1] != 200:  # 202 "building", reloading itself
                    assert set(documents) <= {200, 202}, (documents, report.content()[:500])
                    assert time.monotonic() < deadline, (documents, report.content()[:500])
                    report.wait_for_timeout(250)  # Playwright's events arrive while it waits
                expect(report.locator("h1")).to_contain_text(
                    f"llmload report: {job['run_id']} · verdict: "
                )
                report.screenshot(path=str(tmp_path / "report.png"))
                metrics_text = _get(f"{base}/llmload/metrics")
                browser.close()
        finally:
            master.send_signal(signal.SIGINT)
            stopped = [_stop(proc, 30) for proc in (master, *workers)]
            for file in files:
                file.close()
        assert stopped == [True, True, True], "master, workers: killed after 30 s"
        assert errors == [], errors
        run_dir = reports / job["run_id"]
        summary = pd.read_csv(run_dir / "summary.csv")
        per_request = pd.read_csv(run_dir / "requests.csv")
        row0 = summary[(summary["group"] == "step") & (summary["step"] == 0)].iloc[0]
        # counts exactly: the tab counts every request tagged with step 0, as the report's
        # requests_total and requests.csv do (not only the step's steady window)
        tagged0 = per_request[(per_request["step"] == 0) & ~per_request["cold"]]
        assert int(tab["Requests"]) == int(row0["requests_total"]) == len(tagged0), (tab, row0)
        failed0 = tagged0[tagged0["status"] != "ok"]
        assert len(failed0) > 0, "no step-0 request failed: the fault injection did not work"
        assert int(tab["Failed"]) == int((failed0["status"] == "error").sum()), (tab, failed0)
        assert _kinds(tab["Failures by kind"]) == failed0["error_kind"].value_counts().to_dict()
        # percentiles within the sketch's 1% (and the tab's rounding to 3 significant digits),
        # over the same requests: step 0's ok requests, all of them (not the steady window)
        ok0 = tagged0[tagged0["status"] == "ok"]
        _assert_percentiles("ttft", tab["TTFT ms p50 / p90 / p99"], ok0["ttft_s"] * 1000)
        _assert_percentiles("tpot", tab["TPOT ms p50 / p90 / p99"], ok0["tpot_s"].dropna() * 1000)
        _assert_percentiles("e2e", tab["E2E s p50 / p90 / p99"], ok0["e2e_s"])
        # the Prometheus endpoint parses, and agrees on step 0's successful requests
        families = {f.name: f for f in text_string_to_metric_families(metrics_text)}
        ttft = families["llmload_ttft_seconds"]
        count0 = [
            s.value
            for s in ttft.samples
            if s.name.endswith("_count") and s.labels.get("step") == "0"
        ]
        assert count0 == [len(ok0)], (count0, len(ok0))
        assert {"llmload_requests", "llmload_workers", "llmload_step"} <= set(families)
        assert (tmp_path / "llm-tab.png").stat().st_size > 10_000
