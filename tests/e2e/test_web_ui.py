"""The chat user from Locust's web UI, driven in headless Chromium (Debian's, via Playwright)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from infra.ports import free_port
from tests.support.chat import BIN, LOCUSTFILE, start_sim, unseen_by_server

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]  # fmt: skip


def start_staircase(page: Any, steps: str, duration: float, warmup: float, workload: str,
                    **fields: str) -> None:  # fmt: skip
    """Set llmload's staircase in Locust's start form (its custom parameters) and start;
    `fields`: more of the form's inputs by name (e.g. rates="5,10")."""
    page.get_by_text("Custom parameters").click()
    page.fill("input[name=steps]", steps)
    for name, value in fields.items():
        page.fill(f"input[name={name}]", value)
    page.fill("input[name=stepDuration]", f"{duration:g}")
    page.fill("input[name=stepWarmup]", f"{warmup:g}")
    page.fill("input[name=workload]", workload)
    page.get_by_role("button", name="START").click()


def wait_http(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def ended_manifest(events: Path, timeout: float = 40) -> dict[str, Any] | None:
    """The run's manifest once it no longer says running (the last one read at the timeout)."""
    manifest = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(events.glob("*/manifest.json"))
        if found:
            manifest = json.loads(found[0].read_text())
            if manifest["status"] != "running":
                break
        time.sleep(0.2)
    return manifest


def test_a_run_started_from_the_web_ui_steps_and_records_events(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    events = tmp_path / "runs"
    port = free_port()
    with start_sim(tmp_path / "sim") as sim:
        log = (tmp_path / "locust.log").open("w")
        locust = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--host", sim.url, "--web-host", "127.0.0.1",
             "--web-port", str(port), "--events-uri", str(events), "--cold-requests", "1",
             "--spool-dir", str(tmp_path / "spool")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{port}/")
            errors: list[str] = []
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"http://127.0.0.1:{port}/")
                # llmload's options are in the form; set the staircase there.
                start_staircase(page, "1,2", 2, 0.5, "D(12,8)")
                manifest = ended_manifest(events)
                page.wait_for_timeout(1500)  # the UI's stats poll
                stats_text = page.inner_text("body")
                browser.close()
        finally:
            locust.send_signal(signal.SIGINT)
            locust.wait(20)
            log.close()
        truth = sim.truth()
    assert errors == []
    assert manifest is not None and manifest["status"] == "finished", (
        tmp_path / "locust.log"
    ).read_text()[-3000:]
    assert [s["concurrency"] for s in manifest["steps"]] == [1, 2]
    assert manifest["config"]["workload"] == "D(12,8)"
    run = events / manifest["run_id"]
    import pyarrow.parquet as pq

    requests = pq.read_table(run / "requests").to_pandas()
    unseen_by_server(requests, truth)
    assert len(truth) > 10
    assert set(requests["step"]) == {-1, 0, 1}
    assert "D(12,8)" in stats_text  # Locust's stats table shows the scenario, once per request


@pytest.mark.slow  # long (10-20 s): `make test-slow` keeps the default suite near 10 min
def test_a_rate_run_started_from_the_web_ui_sends_its_schedule(tmp_path: Path) -> None:
    """Open loop from the form: --rates and --arrival are text fields of the start form."""
    from playwright.sync_api import sync_playwright

    events = tmp_path / "runs"
    port = free_port()
    with start_sim(tmp_path / "sim") as sim:
        log = (tmp_path / "locust.log").open("w")
        locust = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--host", sim.url, "--web-host", "127.0.0.1",
             "--web-port", str(port), "--events-uri", str(events), "--cold-requests", "0",
             "--spool-dir", str(tmp_path / "spool")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{port}/")
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{port}/")
                start_staircase(page, "1,2,4,8", 2, 0.5, "D(12,4)", rates="5,10",
                                arrival="constant")  # fmt: skip
                manifest = ended_manifest(events)
                browser.close()
        finally:
            locust.send_signal(signal.SIGINT)
            locust.wait(20)
            log.close()
        truth = sim.truth()
    log_text = (tmp_path / "locust.log").read_text()[-3000:]
    assert manifest is not None and manifest["status"] == "finished", log_text
    assert [(s["rate"], s["arrival"]) for s in manifest["steps"]] == [
        (5.0, "constant"),
        (10.0, "constant"),
    ]
    import pyarrow.parquet as pq

    requests = pq.read_table(events / manifest["run_id"] / "requests").to_pandas()
    unseen_by_server(requests, truth)
    for step in manifest["steps"]:  # constant arrivals: exactly rate x length, give or take one
        rows = requests[requests["step"] == step["step"]]
        length_s = (step["ended_at_ns"] - step["started_at_ns"]) / 1e9
        assert abs(len(rows) - step["rate"] * length_s) <= 1.5
        assert rows["intended_ns"].notna().all()


def test_the_master_web_ui_caps_a_body_whatever_its_framing(tmp_path: Path) -> None:
    """Issue 36 (every body the master receives is capped): a chunked POST of 64 MiB to the
    start form, with no Content-Length to refuse it by, is not read whole: the master's
    memory does not grow by it, and it keeps serving."""
    import http.client

    import psutil

    port = free_port()
    log = (tmp_path / "locust.log").open("w")
    locust = subprocess.Popen(
        [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--host", "http://127.0.0.1:9",
         "--web-host", "127.0.0.1", "--web-port", str(port),
         "--events-uri", str(tmp_path / "runs"), "--spool-dir", str(tmp_path / "spool")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/")
        before = psutil.Process(locust.pid).memory_info().rss
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        pieces = (b"user_count=1&" + b"x" * (1 << 20) for _ in range(64))  # 64 MiB, chunked
        try:
            conn.request("POST", "/swarm", body=pieces, encode_chunked=True,
                         headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
            status = conn.getresponse().status
        except (BrokenPipeError, ConnectionResetError):
            status = 413  # refused and closed while the rest was still being sent
        finally:
            conn.close()
        grown = psutil.Process(locust.pid).memory_info().rss - before
        assert grown < 16 << 20, (status, grown)  # a body held whole would be 64 MiB or more
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).close()  # still serving
    finally:
        locust.send_signal(signal.SIGINT)
        locust.wait(20)
        log.close()
