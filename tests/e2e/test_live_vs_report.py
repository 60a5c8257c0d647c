"""Issue 12, done when: a master with the web UI and two workers; the run started from the UI
in headless Chromium; the LLM tab's values agree with the final report (counts exactly,
percentiles within the sketch's 1% plus the tab's rounding); the report link opens; the
Prometheus endpoint parses; a screenshot; no console errors."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from infra.ports import free_port
from tests.e2e.test_web_ui import CHROMIUM_ARGS, start_staircase, wait_http
from tests.support.chat import BIN, LOCUSTFILE, start_sim, start_worker

STEP_S = 8


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _exact_bounds(values: pd.Series, q: float) -> tuple[float, float]:
    """The exact q-quantile's neighbourhood: the values at the ranks either definition picks."""
    ordered = values.sort_values().to_numpy()
    n = len(ordered)
    low = ordered[max(0, math.floor(q * (n - 1)) - 1)]
    high = ordered[min(n - 1, math.ceil(q * n))]
    return float(low), float(high)


def test_the_tab_agrees_with_the_report_and_the_endpoint_parses(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    events, reports = tmp_path / "runs", tmp_path / "reports"
    web, master_port = free_port(), free_port()
    base = f"http://127.0.0.1:{web}"
    errors: list[str] = []
    with start_sim(tmp_path / "sim") as sim:
        log = (tmp_path / "master.log").open("w")
        master = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--master", "--master-bind-host",
             "127.0.0.1", "--master-bind-port", str(master_port), "--web-host", "127.0.0.1",
             "--web-port", str(web), "--host", sim.url, "--events-uri", str(events),
             "--spool-dir", str(tmp_path / "spool"), "--report-dir", str(reports)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        workers = [start_worker(master_port, {}, tmp_path) for _ in range(2)]
        try:
            wait_http(f"{base}/")
            deadline = time.monotonic() + 30
            while json.loads(_get(f"{base}/stats/requests")).get("workers", []).__len__() < 2:
                assert time.monotonic() < deadline, "the workers did not connect"
                time.sleep(0.2)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1600, "height": 900})
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
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
                tab_requests = int(step0[headers.index("Requests")])
                tab_ttft = [
                    float(v) for v in step0[headers.index("TTFT ms p50 / p90 / p99")].split(" / ")
                ]
                # the run ends; the report is built by the master and linked
                report = browser.new_page()
                report.on("pageerror", lambda e: errors.append(str(e)))
                deadline = time.monotonic() + 90
                while True:  # a 202 "llmload report: building" page first, then the report
                    answer = report.goto(f"{base}/llmload/report")
                    built = answer is not None and answer.status == 200
                    if built and report.locator("h1").filter(has_text="llmload report: ").count():
                        break
                    assert time.monotonic() < deadline, report.content()[:500]
                    time.sleep(1)
                report.screenshot(path=str(tmp_path / "report.png"))
                metrics_text = _get(f"{base}/llmload/metrics")
                browser.close()
        finally:
            master.send_signal(signal.SIGINT)
            master.wait(30)
            for worker in workers:
                worker.wait(30)
                if worker.stdout is not None:
                    worker.stdout.close()
            log.close()
    assert errors == [], errors
    run_dir = next(reports.iterdir())
    summary = pd.read_csv(run_dir / "summary.csv")
    per_request = pd.read_csv(run_dir / "requests.csv")
    row0 = summary[(summary["group"] == "step") & (summary["step"] == 0)].iloc[0]
    # counts exactly: every request tagged with step 0, as the report counts them
    assert tab_requests == int(row0["requests_total"]), (tab_requests, row0["requests_total"])
    # percentiles within the sketch's 1% (and the tab's rounding to 3 significant digits)
    ok0 = per_request[
        (per_request["step"] == 0) & ~per_request["cold"] & (per_request["status"] == "ok")
    ]
    for q, shown in zip((0.5, 0.9, 0.99), tab_ttft, strict=True):
        low, high = _exact_bounds(ok0["ttft_s"] * 1000, q)
        assert low * 0.99 * 0.995 <= shown <= high * 1.01 * 1.005, (q, shown, low, high)
    # the Prometheus endpoint parses, and agrees on step 0's successful requests
    families = {f.name: f for f in text_string_to_metric_families(metrics_text)}
    ttft = families["llmload_ttft_seconds"]
    count0 = [
        s.value for s in ttft.samples if s.name.endswith("_count") and s.labels.get("step") == "0"
    ]
    assert count0 == [len(ok0)], (count0, len(ok0))
    assert {"llmload_requests", "llmload_workers", "llmload_step"} <= set(families)
    assert (tmp_path / "llm-tab.png").stat().st_size > 10_000
