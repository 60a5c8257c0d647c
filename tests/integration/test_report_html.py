"""report.html renders in headless Chromium: no console errors, every plot present and drawn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from analysis import build_report
from tests.support.runs import known_run

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
PLOTS = ("plot-latency", "plot-throughput", "plot-knee", "plot-distributions", "plot-timeline")

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium")


def test_html_report_renders_in_chromium(
    events_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    monkeypatch.setenv("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    uri = known_run(simulated=True).write(events_dir, parts_per_worker=2)
    report = build_report(uri, tmp_path / "out", slo="ttft_p99=0.45,ttft=0.4", progress=False)
    html = report.files["report.html"]
    text = html.read_text()
    # self-contained: nothing fetched (its one link is the empty inline icon, so that a
    # browser asks for no /favicon.ico)
    links = text.count("<link")
    assert 'src="http' not in text and "<script" not in text
    assert links == text.count('<link rel="icon" href="data:,">') == 1

    problems: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto(html.resolve().as_uri(), wait_until="load")
            for plot in PLOTS:
                img = page.locator(f"img#{plot}")
                assert img.count() == 1, plot
                assert img.get_attribute("title"), plot
                width = img.evaluate("el => el.complete ? el.naturalWidth : 0")
                assert width > 100, (plot, width)
            banner = page.locator("#simulated-banner")
            assert banner.is_visible() and "SIMULATED" in banner.inner_text()
            assert page.locator("table.steps tbody tr").count() == 4
            assert "highest concurrency meeting the SLO: 4" in page.inner_text("body")
        finally:
            browser.close()
    assert problems == []
    assert os.path.getsize(html) < 2_000_000
