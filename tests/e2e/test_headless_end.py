"""The end of a headless run: one console line per step, the report command, --report-dir."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pandas as pd

from tests.support.chat import BIN, LOCUSTFILE, reap, run_locust, start_sim, wait_for


def test_a_headless_run_prints_its_steps_and_writes_its_report(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    with start_sim(tmp_path / "sim") as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--steps", "1,3", "--step-duration", "2",
            "--step-warmup", "0.5", "--cold-requests", "1", "--workload", "D(12,8)",
            "--report-dir", str(report_dir), workers=2,
        )  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    master = result.output.split("\n--- worker ---\n")[0]
    lines = [line for line in master.splitlines() if " [live sketch ±1%, exact figures" in line]
    # the simulator says it is simulated: every line says so
    labels = [re.match(r"SIMULATED target: llmload (cold|step \d+) \[", line) for line in lines]
    assert [m.group(1) for m in labels if m] == ["cold", "step 0", "step 1"], lines
    concurrency = [int(re.search(r": concurrency (\d+)", line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert concurrency == [1, 1, 3]
    for line in lines[1:]:
        assert re.search(r"TTFT p50 [\d.]+ ms p99 [\d.]+ ms", line), line
        assert re.search(r"TPOT p50 [\d.]+ ms p99 [\d.]+ ms", line), line
        assert re.search(r"[1-9]\d* requests", line) and "output tok/s" in line

    run_id = result.run_dir().name
    assert f"llmload: make the report with: llmload report {tmp_path / 'runs' / run_id}" in master
    assert f"llmload: report written to {report_dir}/report.html" in master
    assert master.index("llmload step 1 [") < master.index("llmload: make the report with")
    assert "<html" in (report_dir / "report.html").read_text()[:500].lower()
    summary = pd.read_csv(report_dir / "summary.csv")
    # built after the workers flushed: every request of the events is in it
    requests, _, manifest = result.events()
    assert manifest["run_id"] == run_id and manifest["status"] == "finished"
    assert summary["requests_total"].sum() == len(requests)
    assert list(summary.loc[summary["group"] == "step", "concurrency"]) == [1, 3]


def test_without_report_dir_the_command_is_printed_and_nothing_built(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"  # the processes' TMPDIR: nothing is left there
    temp.mkdir()
    with start_sim(tmp_path / "sim") as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--steps", "1", "--step-duration", "1",
            "--step-warmup", "0", "--cold-requests", "0", "--workload", "D(12,8)",
            env={"TMPDIR": str(temp)},
        )  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    run_id = result.run_dir().name
    assert f"llmload: make the report with: llmload report {tmp_path / 'runs' / run_id}" in (
        result.output
    )
    assert "report written to" not in result.output
    assert not list(temp.glob("llmload-report-*"))  # before: an empty folder for each run
    assert len(re.findall(r"llmload step 0 \[live sketch", result.output)) == 1


def test_a_report_dir_that_goes_away_mid_run_fails_the_run(tmp_path: Path) -> None:
    """Issue 36: --report-dir made unusable mid-run gave an error line and exit 0. Here it is
    replaced by a file while the run goes: the report cannot be built, and the run exits 1."""
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    with start_sim(tmp_path / "sim") as sim:
        proc = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
             "--host", sim.url, "--events-uri", str(tmp_path / "runs"),
             "--spool-dir", str(tmp_path / "spool"), "--steps", "1", "--step-duration", "3",
             "--step-warmup", "0", "--cold-requests", "0", "--workload", "D(12,8)",
             "--report-dir", str(report_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        out = ""
        try:
            wait_for(lambda: (tmp_path / "runs").exists(), 30, "the run's events folder")
            time.sleep(0.5)
            report_dir.rmdir()
            report_dir.write_text("now a file\n")
            out, _ = proc.communicate(timeout=90)
        finally:
            out += reap(proc)
    assert proc.returncode == 1, out[-3000:]
    assert "llmload: error: the report could not be built" in out
    assert "Traceback" not in out
