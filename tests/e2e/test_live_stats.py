"""Live statistics of a real distributed run: a master (web UI, --autostart) and two worker
processes against the simulator; `/llmload/metrics` agrees with the stored events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from analysis.derive.metrics import compute_request_metrics
from analysis.derive.stats import weighted_quantiles
from infra.ports import free_port
from locustfiles.live.sketch import RELATIVE_ACCURACY
from tests.support.chat import BIN, LOCUSTFILE, LocustResult, start_sim, start_worker, wait_for


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def finished_manifest(events: Path) -> dict | None:
    found = list(events.glob("*/manifest.json"))
    if not found:
        return None
    manifest = json.loads(found[0].read_text())
    return manifest if manifest["status"] != "running" else None


@pytest.mark.slow  # long (10-20 s): `make test-slow` keeps the default suite near 10 min
def test_metrics_endpoint_of_a_distributed_run_matches_the_events(tmp_path: Path) -> None:
    events = tmp_path / "runs"
    web_port, master_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with start_sim(tmp_path / "sim") as sim:
        log = (tmp_path / "master.log").open("w")
        master = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--host", sim.url, "--autostart",
             "--web-host", "127.0.0.1", "--web-port", str(web_port), "--master",
             "--master-bind-host", "127.0.0.1", "--master-bind-port", str(master_port),
             "--expect-workers", "2", "--expect-workers-max-wait", "30",
             "--events-uri", str(events), "--spool-dir", str(tmp_path / "spool"),
             "--steps", "1,3", "--step-duration", "3", "--step-warmup", "0.5",
             "--cold-requests", "2", "--workload", "D(16,24)"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        workers = [start_worker(master_port, env) for _ in range(2)]
        url = f"http://127.0.0.1:{web_port}/llmload/metrics"
        try:
            during = wait_for(lambda: _scrape_with_requests(url), 60, "live requests in /metrics")
            manifest = wait_for(lambda: finished_manifest(events), 60, "the end of the run")
            time.sleep(0.5)  # the workers' last deltas precede their finish acknowledgements
            text = get(url)
        finally:
            master.send_signal(signal.SIGINT)
            master.wait(30)
            for w in workers:
                try:
                    w.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.communicate()
            log.close()
    output = (tmp_path / "master.log").read_text()
    assert manifest["status"] == "finished", output[-3000:]
    assert during  # figures were there while the run went
    families = {f.name: f for f in text_string_to_metric_families(text)}
    gauges = {s.name: s.value for s in families["llmload_workers"].samples}
    assert gauges["llmload_workers"] == 2

    requests, chunks, _ = LocustResult(0, output, events).events()
    metrics = compute_request_metrics(requests, chunks).per_request
    ok = (requests["status"] == "ok").to_numpy()
    label = np.where(requests["cold"], "cold", requests["step"].astype(str))
    ttft = families["llmload_ttft_seconds"].samples
    e2e = families["llmload_e2e_seconds"].samples
    for step in ("cold", "0", "1"):
        members = ok & (label == step)
        count = _sample(ttft, "llmload_ttft_seconds_count", step)
        assert count == members.sum() > 0, step  # exactly the ok requests the events hold
        assert _sample(e2e, "llmload_e2e_seconds_count", step) == members.sum()
        for name, samples in (("ttft", ttft), ("e2e", e2e)):
            values = metrics[f"{name}_s"].to_numpy()[members]
            exact_p50 = _bucket_quantile(samples, f"llmload_{name}_seconds", step, 0.5)
            lo, hi = weighted_quantiles(values, None, [0.49, 0.51])
            # the bucket holding the median from the sketch's counts holds the exact one too
            assert exact_p50[0] <= hi * (1 + RELATIVE_ACCURACY), (name, step)
            assert exact_p50[1] >= lo * (1 - RELATIVE_ACCURACY), (name, step)
    counted = sum(
        s.value for s in families["llmload_requests"].samples if s.name.endswith("_total")
    )
    assert counted == len(requests)
    out_tokens = families["llmload_output_tokens"].samples[0].value
    assert out_tokens == requests["output_tokens"].fillna(0).sum()


def _scrape_with_requests(url: str) -> bool:
    try:
        text = get(url)
    except OSError:
        return False
    return any(
        s.value > 0
        for f in text_string_to_metric_families(text)
        if f.name == "llmload_requests"
        for s in f.samples
    )


def _sample(samples: list, name: str, step: str) -> float:
    (value,) = [s.value for s in samples if s.name == name and s.labels.get("step") == step]
    return value


def _bucket_quantile(samples: list, metric: str, step: str, q: float) -> tuple[float, float]:
    """(lower, upper) edge of the bucket that holds quantile q by the exported counts."""
    buckets = sorted(
        (float(s.labels["le"]), s.value)
        for s in samples
        if s.name == f"{metric}_bucket" and s.labels.get("step") == step
    )
    total = buckets[-1][1]
    lower = 0.0
    for le, count in buckets:
        if count >= q * total:
            return lower, le
        lower = le
    raise AssertionError("no bucket reaches the quantile")
