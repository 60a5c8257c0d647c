"""A run against the simulator stores the server's /metrics over the run; the report plots them."""

from __future__ import annotations

import json
from pathlib import Path

from analysis import build_report
from tests.support.chat import run_locust, start_sim


def test_a_run_stores_server_metrics_and_the_report_plots_them(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim") as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--steps", "1,4", "--step-duration", "2",
            "--step-warmup", "0.5", "--cold-requests", "0", "--workload", "D(16,400)",
            "--scrape-interval", "0.25",
        )  # fmt: skip
    assert result.returncode == 0, result.output
    run = result.run_dir()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["scrape_interval"] == 0.25
    parts = sorted((run / "server_metrics").glob("part-*.jsonl"))
    assert parts, result.output
    lines = [json.loads(x) for p in parts for x in p.read_text().splitlines()]
    assert all(x["ok"] for x in lines)
    at = [x["scraped_at_ns"] for x in lines]
    assert at == sorted(at) and len(at) >= 10
    steps = manifest["steps"]
    assert at[0] <= steps[0]["spawned_at_ns"] and at[-1] >= steps[-1]["ended_at_ns"] - 0.5e9
    # The server saw the load: four users in the second step, the first step one.
    second = [x["running"] for x in lines if x["scraped_at_ns"] > steps[1]["spawned_at_ns"] + 0.3e9
              and x["scraped_at_ns"] < steps[1]["ended_at_ns"]]  # fmt: skip
    assert second and max(second) >= 3
    assert max(x["kv_cache_usage"] for x in lines) > 0

    report = build_report(str(run), tmp_path / "out", progress=False)
    assert report.server_metrics is not None and report.server_metrics.failures == 0
    html = report.files["report.html"].read_text()
    assert 'id="plot-server-metrics"' in html
    assert not any("scrape" in w for w in report.warnings)
