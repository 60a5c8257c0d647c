"""A campaign across hosts: every role in a network namespace of its own, on a private bridge
(the cluster: tests/support/cluster.py). Run by `make test-multihost`."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from tests.support.chat import assert_steps_match_the_truth
from tests.support.cluster import (
    DELAY_MS,
    FAKETIME_LIB,
    Cluster,
    load_run_from,
    logs,
    run_campaign,
    write_campaign,
)

pytestmark = pytest.mark.multihost


def test_a_campaign_across_hosts_counts_every_request_and_times_the_link(cluster: Cluster) -> None:
    workers = [cluster.worker("worker-a"), cluster.worker("worker-b")]
    out, run_dir = run_campaign(cluster, write_campaign(cluster))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + logs(cluster)
    for w in workers:
        w.wait(30)
    rows, manifest = load_run_from(cluster, run_dir.name)
    truth = cluster.truth()
    # every worker took part, with its clock offset measured over the link
    assert len(manifest["workers"]) == 2
    hosts = {w["host"] for w in manifest["workers"]}
    assert len(manifest["hosts"]) >= 1 and hosts
    for worker in manifest["workers"]:
        assert worker["clock_offset_ms"] is not None and abs(worker["clock_offset_ms"]) < 5
        assert worker["clock_rtt_ms"] is not None
    # per step, the report's counts are the server's
    assert_steps_match_the_truth(rows, truth, json.loads((run_dir / "summary.json").read_text()))
    # TTFT = the server's TTFT + the link's round trip (a delay each way)
    ok = rows[(rows["status"] == "ok") & rows["request_id"].isin(list(truth))]
    extra_ms = []
    for row in ok.itertuples():
        first = next(e for e in truth[row.request_id]["events"] if e[1] > 0)
        extra_ms.append((row.first_token_ns - first[0]) / 1e6)
    median = float(pd.Series(extra_ms).median())
    assert 2 * DELAY_MS - 1 <= median <= 2 * DELAY_MS + 5, median


def test_a_worker_with_a_shifted_clock_is_measured_and_flagged(cluster: Cluster) -> None:
    """worker-b's wall clock runs 250 ms ahead (libfaketime): the master measures it, the
    report warns, and its requests still fall in the right steps."""
    if not FAKETIME_LIB.exists():
        pytest.skip("libfaketime is not installed (Debian package faketime)")
    skewed = {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": "+0.25",
              "FAKETIME_DONT_FAKE_MONOTONIC": "1"}  # fmt: skip
    workers = [cluster.worker("worker-a"), cluster.worker("worker-b", skewed)]
    out, run_dir = run_campaign(cluster, write_campaign(cluster))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + logs(cluster)
    for w in workers:
        w.wait(30)
    rows, manifest = load_run_from(cluster, run_dir.name)
    offsets = sorted(w["clock_offset_ms"] for w in manifest["workers"])
    assert abs(offsets[0]) < 5 and abs(offsets[1] - 250) < 5, offsets
    summary = json.loads((run_dir / "summary.json").read_text())
    said = [re.search(r"clock was ([+-][\d.]+) ms", w) for w in summary["warnings"]]
    shifts = [float(m.group(1)) for m in said if m]  # (249.9 is as right as 250)
    assert len(shifts) == 1 and abs(shifts[0] - 250) < 5, summary["warnings"]
    # the requests land in the right steps: each was sent while its step ran (master's clock)
    truth = cluster.truth()
    steps = {s["step"]: s for s in manifest["steps"]}
    for row in rows[rows["request_id"].isin(list(truth)) & (rows["step"] >= 0)].itertuples():
        arrived = truth[row.request_id]["arrival_unix_ns"]  # the target's (true) clock
        step = steps[row.step]
        assert step["started_at_ns"] - 50e6 <= arrived <= step["ended_at_ns"] + 2e9
    # and its timings stay right: TTFT is the server's plus the link, not shifted by 250 ms
    skewed_rows = rows[rows["worker_id"] == max(manifest["workers"],
                                                key=lambda w: w["clock_offset_ms"])["worker_id"]]  # fmt: skip
    ok = skewed_rows[(skewed_rows["status"] == "ok") & skewed_rows["request_id"].isin(list(truth))]
    assert len(ok) > 5
    extra = [(r.first_token_ns - next(e for e in truth[r.request_id]["events"] if e[1] > 0)[0]) / 1e6
             for r in ok.itertuples()]  # fmt: skip
    assert 2 * DELAY_MS - 1 <= float(pd.Series(extra).median()) <= 2 * DELAY_MS + 5
