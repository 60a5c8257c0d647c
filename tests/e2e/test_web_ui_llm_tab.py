"""The LLM tab, the live page and the report link, in headless Chromium against the simulator."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infra.ports import free_port
from tests.e2e.test_web_ui import CHROMIUM_ARGS, start_staircase, wait_http
from tests.support.chat import BIN, LOCUSTFILE, start_sim

pytestmark = pytest.mark.slow  # long (10-35 s a test): `make test-slow`


def _wait_manifest_done(events: Path, timeout: float) -> dict[str, object] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in events.glob("*/manifest.json"):
            manifest = json.loads(path.read_text())
            if manifest["status"] != "running":
                return manifest  # type: ignore[no-any-return]
        time.sleep(0.2)
    return None


def test_the_llm_tab_shows_live_steps_and_links_the_report(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    events, reports = tmp_path / "runs", tmp_path / "reports"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with start_sim(tmp_path / "sim") as sim:
        log = (tmp_path / "locust.log").open("w")
        locust = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--host", sim.url, "--web-host", "127.0.0.1",
             "--web-port", str(port), "--events-uri", str(events), "--cold-requests", "1",
             "--spool-dir", str(tmp_path / "spool"), "--report-dir", str(reports)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_http(f"{base}/")
            errors: list[str] = []
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.goto(f"{base}/")
                start_staircase(page, "1,2", 4, 0.5, "D(12,8)")

                page.get_by_role("tab", name="LLM").click()
                table = page.locator("table").first
                # the current step, marked with its time left, while the run goes
                expect(table).to_contain_text(
                    re.compile(r"step \d ▶ now, \d+ s left"), timeout=20_000
                )
                expect(table).to_contain_text("step 0", timeout=10_000)
                running_text = table.inner_text()
                headers = table.locator("th").all_inner_texts()
                assert "TTFT ms p50 / p90 / p99" in headers and "Failures by kind" in headers
                ttft_col = headers.index("TTFT ms p50 / p90 / p99")
                step0 = table.locator("tr", has_text="step 0").first.locator("td").all_inner_texts()
                assert re.fullmatch(r"[\d.]+ / [\d.]+ / [\d.]+", step0[ttft_col]), step0
                assert "SIMULATED target" in running_text and "live sketch ±1%" in running_text

                manifest = _wait_manifest_done(events, 40)
                assert manifest is not None and manifest["status"] == "finished"

                # the links Locust's extension points allow: the Download Data tab
                page.get_by_role("tab", name="Download Data").click()
                expect(
                    page.get_by_role("link", name="LLM: report (built when the run stops)")
                ).to_be_visible()

                live = browser.new_page()
                live.on("pageerror", lambda e: errors.append(str(e)))
                live.goto(f"{base}/llmload/live")
                expect(live.locator("#steps tbody tr")).to_have_count(
                    3, timeout=10_000
                )  # cold, 0, 1
                expect(live.locator("#chart-ttft polyline").first).to_be_attached()
                live.locator("#report-link").click(timeout=60_000)  # shown once the build is done
                expect(live.locator("h1")).to_contain_text(
                    "llmload report: " + str(manifest["run_id"])
                )
                report_html = live.content()
                live.screenshot(path=str(tmp_path / "report.png"))
                browser.close()
        finally:
            locust.send_signal(signal.SIGINT)
            locust.wait(20)
            log.close()
    assert errors == [], errors
    assert "<figure" in report_html  # the report's plots
    assert (reports / str(manifest["run_id"]) / "summary.csv").exists()
