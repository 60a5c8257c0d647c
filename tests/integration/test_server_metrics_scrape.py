"""Server metrics of a run: the master's scraper writes parts, analysis reads them back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import urllib3

from analysis.kernel.storage import open_store
from analysis.read.server_metrics import read_server_metrics
from locustfiles.master.server_metrics import ServerMetricsScraper, scrape_once
from tests.support.sim import RunningSim


def keys(root: Path) -> list[str]:
    return [o.key for o in open_store(str(root)).list("")]


def test_scrapes_of_the_simulator_round_trip_through_analysis(
    sim: RunningSim, tmp_path: Path
) -> None:
    store = open_store(str(tmp_path))
    url = f"http://127.0.0.1:{sim.port}/metrics"
    scraper = ServerMetricsScraper(store, "r1", url, 1.0, flush_every=0)
    scraper._pool = urllib3.PoolManager(retries=False)  # scrape by hand: no greenlet
    scraper.scrape()
    scraper.flush()
    scraper.url = f"http://127.0.0.1:{sim.port}/broken"  # the server stops answering
    scraper.scrape()
    scraper.flush()
    assert (scraper.samples, scraper.failures, scraper.parts) == (1, 1, 2)
    run_keys = keys(tmp_path / "r1")
    assert run_keys == ["server_metrics/part-000000.jsonl", "server_metrics/part-000001.jsonl"]
    line = json.loads(store.get("r1/server_metrics/part-000000.jsonl"))
    assert line["ok"] is True and line["running"] == 0 and line["kv_cache_usage"] == 0
    assert line["sources"]["running"] == "vllm:num_requests_running"
    assert "llmload_sim_requests_cancelled_total" in line["values"]

    metrics = read_server_metrics(open_store(str(tmp_path / "r1")), run_keys)
    assert metrics is not None and (metrics.samples, metrics.failures) == (1, 1)
    assert list(metrics.frame["ok"]) == [True, False]
    assert metrics.frame["running"].isna().tolist() == [False, True]  # missing, not 0
    assert any("1 of 2 scrapes" in w for w in metrics.warnings)


def test_a_target_without_metrics_is_left_alone(sim: RunningSim, tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    url = f"http://127.0.0.1:{sim.port}/nothing-here"
    scraper = ServerMetricsScraper(store, "r1", url, 1.0)
    scraper._pool = urllib3.PoolManager(retries=False)
    scraper.scrape()
    scraper.flush()
    assert scraper.absent == "HTTP 404" and scraper.failures == 0
    assert keys(tmp_path) == []
    assert read_server_metrics(store, []) is None


def test_one_scrape_line(sim: RunningSim) -> None:
    pool = urllib3.PoolManager(retries=False)
    line: dict[str, Any] = scrape_once(
        pool, f"http://127.0.0.1:{sim.port}/metrics", {}, 5.0, ("llmload_sim_*",)
    )
    assert line["waiting"] == 0 and line["elapsed_ms"] > 0
    assert all(k.startswith("llmload_sim_") for k in line["values"])
