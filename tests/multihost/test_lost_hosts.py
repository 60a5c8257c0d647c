"""Hosts lost mid-run: a worker's cable pulled, the master's host cut off.

What each loses, and what it does not, is written in docs/reliability.md ("Link faults
between hosts": "Worker link cut mid-step", "Master cut off"). The cluster:
tests/support/cluster.py. Each worker gets a temporary folder of its own (TMPDIR), so its
spool (`<system temp>/llmload-spool`) is its own and can be looked at.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from locustfiles.worker.masterwatch import EXIT_MASTER_LOST, MASTER_LOST_S
from tests.support.chat import unseen_by_server, wait_for
from tests.support.cluster import (
    BIN,
    MASTER_PORT,
    Cluster,
    load_run_from,
    logs,
    write_campaign,
)

pytestmark = pytest.mark.multihost

LOST_MESSAGE = "llmload: error: lost the master {address}:{port} (no heartbeat for"


def start_campaign(cluster: Cluster, config: Path) -> subprocess.Popen[Any]:
    cmd = [str(BIN / "llmload"), "campaign", str(config), "--out", str(cluster.work / "reports")]
    return cluster.hosts.popen("master", cmd, log=cluster.work / "campaign.log", env=cluster.env,
                               cwd=cluster.work)  # fmt: skip


def step_started(cluster: Cluster, step: int) -> bool:
    line = f"llmload: step {step} at"
    return any(line in p.read_text(errors="replace")
               for p in (cluster.work / "reports").glob("*/logs/master.log"))  # fmt: skip


def worker_with_temp(cluster: Cluster, name: str) -> tuple[subprocess.Popen[Any], Path]:
    temp = cluster.work / f"tmp-{name}"
    temp.mkdir()
    return cluster.worker(name, {"TMPDIR": str(temp)}), temp / "llmload-spool"


def log_of(cluster: Cluster, name: str) -> str:
    return (cluster.work / f"{name}.log").read_text(errors="replace")


def flushed_worker_id(cluster: Cluster, name: str) -> str:
    match = re.search(r"llmload: worker (\S+) flushed", log_of(cluster, name))
    assert match, log_of(cluster, name)[-3000:]
    return match.group(1)


def report_again(cluster: Cluster, run_id: str, host: str = "master") -> dict[str, Any]:
    """`llmload report` of the run, built in `host`: its summary.json."""
    out_dir = cluster.work / "report-again"
    cmd = [str(BIN / "llmload"), "report", f"s3://llmload/runs/{run_id}", "--out", str(out_dir)]
    out = cluster.hosts.run(host, cmd, timeout=120, env=cluster.env, cwd=cluster.work)
    assert out.returncode == 0, out.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out_dir / "summary.json").read_text())
    return summary


def test_a_worker_cut_off_mid_step_is_named_and_its_spool_completes_the_run(
    cluster: Cluster,
) -> None:
    """worker-b's cable is pulled 3 s into step 0: the run goes on with worker-a and ends,
    the report names worker-b and how to recover its events; worker-b gives up on its master,
    keeps its parts in its spool, and uploads them when its cable is back: the run is then
    complete, every request the server saw a row once."""
    worker_a, spool_a = worker_with_temp(cluster, "worker-a")
    worker_b, spool_b = worker_with_temp(cluster, "worker-b")
    campaign = start_campaign(cluster, write_campaign(cluster, steps="[2, 2]", duration=8))
    wait_for(lambda: step_started(cluster, 0), 90, "step 0 starts\n" + logs(cluster))
    time.sleep(3)
    cluster.hosts.link_down("worker-b")
    cut, cut_ns = time.monotonic(), time.time_ns()

    # worker-b stops sending and says why; its parts wait in its spool
    lost = LOST_MESSAGE.format(address=cluster.hosts.ip("master"), port=MASTER_PORT)
    wait_for(lambda: lost in log_of(cluster, "worker-b"), MASTER_LOST_S + 10, "worker-b gives up")
    gave_up_after = time.monotonic() - cut
    assert MASTER_LOST_S - 1 <= gave_up_after <= MASTER_LOST_S + 4, gave_up_after

    # the campaign goes on with worker-a and ends: exit 0, worker-b named with the remedy
    assert campaign.wait(120) == 0, logs(cluster)
    assert worker_a.wait(30) == 0
    (run_dir,) = [p for p in (cluster.work / "reports").iterdir() if p.is_dir()]
    run_id = run_dir.name
    master_log = (run_dir / "logs" / "master.log").read_text(errors="replace")
    assert "failed to send heartbeat, setting state to missing" in master_log
    assert "did not confirm their events" in master_log and "(lost: no heartbeat)" in master_log
    summary = json.loads((run_dir / "summary.json").read_text())
    completeness = summary["completeness"]
    assert completeness["complete"] is False
    ((id_b, host_b),) = completeness["workers_unconfirmed"].items()
    warning = next(w for w in summary["warnings"] if id_b in w)
    assert f"worker {id_b} on {host_b} did not confirm its events" in warning
    assert (
        "llmload upload-spool <system temp>/llmload-spool --events-uri s3://llmload/runs" in warning
    )
    campaign_out = (cluster.work / "campaign.log").read_text(errors="replace")
    assert f"llmload: warning: {warning}" in campaign_out
    parts_waiting = list(spool_b.glob(f"{run_id}/requests/worker={id_b}/part-*.parquet"))
    assert worker_b.poll() is None and parts_waiting, log_of(cluster, "worker-b")[-3000:]
    rows_before, _ = load_run_from(cluster, run_id)
    truth = cluster.truth()
    assert set(truth) - set(rows_before["request_id"])  # the gap: worker-b's requests

    # the cable back: worker-b's sink uploads its spool itself, then the worker exits
    cluster.hosts.link_up("worker-b")
    assert worker_b.wait(90) == EXIT_MASTER_LOST, log_of(cluster, "worker-b")[-3000:]
    assert flushed_worker_id(cluster, "worker-b") == id_b
    assert "NOT UPLOADED" not in log_of(cluster, "worker-b")
    assert not list(spool_b.rglob("*.parquet")) and not list(spool_a.rglob("*.parquet"))

    rows, _ = load_run_from(cluster, run_id)
    assert rows["request_id"].is_unique
    unseen = unseen_by_server(rows, truth)  # every request the server saw, exactly once
    rows_b = rows[rows["worker_id"] == id_b]
    assert len(rows_b) > 10 and rows_b["request_id"].isin(list(truth)).sum() > 10
    assert set(unseen["worker_id"]) <= {id_b, flushed_worker_id(cluster, "worker-a")}
    # worker-b sent nothing after the cut; its one request in flight then is `aborted`
    assert (rows_b["sent_at_ns"] < cut_ns + 1e9).all()
    assert set(rows_b["status"]) <= {"ok", "aborted"} and (rows_b["status"] == "aborted").sum() <= 1
    again = report_again(cluster, run_id)
    assert again["completeness"]["complete"] is True, again["warnings"]
    assert again["completeness"]["workers_unconfirmed"] == {}
    assert not [w for w in again["warnings"] if id_b in w], again["warnings"]


def test_workers_cut_off_from_their_master_stop_flush_and_exit(cluster: Cluster) -> None:
    """The master's cable is pulled mid-run: within MASTER_LOST_S (+ a heartbeat) each worker
    stops sending, flushes its events to the store and exits EXIT_MASTER_LOST naming the
    master; its rows are in the store and match the server's truth log."""
    workers = {name: worker_with_temp(cluster, name)[0] for name in ("worker-a", "worker-b")}
    campaign = start_campaign(cluster, write_campaign(cluster, steps="[2, 2]", duration=20))
    wait_for(lambda: step_started(cluster, 0), 90, "step 0 starts\n" + logs(cluster))
    time.sleep(3)
    cluster.hosts.link_down("master")
    cut, cut_ns = time.monotonic(), time.time_ns()

    exited: dict[str, float] = {}

    def all_exited() -> bool:
        for name, proc in workers.items():
            if name not in exited and proc.poll() is not None:
                exited[name] = time.monotonic() - cut
        return len(exited) == len(workers)

    wait_for(all_exited, MASTER_LOST_S + 40, "the workers exit\n" + logs(cluster))
    lost = LOST_MESSAGE.format(address=cluster.hosts.ip("master"), port=MASTER_PORT)
    for name, proc in workers.items():
        assert proc.returncode == EXIT_MASTER_LOST, log_of(cluster, name)[-3000:]
        assert lost in log_of(cluster, name)
        assert "NOT UPLOADED" not in log_of(cluster, name)
        assert MASTER_LOST_S - 1 <= exited[name] <= MASTER_LOST_S + 10, exited

    run_id = wait_for(lambda: next((p.name for p in (cluster.work / "reports").iterdir()
                                    if p.is_dir()), None), 5, "the run's folder")  # fmt: skip
    rows, manifest = load_run_from(cluster, run_id, host="worker-a")
    truth = cluster.truth()
    assert rows["request_id"].is_unique and manifest["status"] == "running"
    unseen_by_server(rows, truth)  # every request the server saw is a row, exactly once
    ids = {flushed_worker_id(cluster, name) for name in workers}
    assert set(rows["worker_id"]) == ids
    # they went on sending until they gave up, and not after
    arrivals = sorted(r["arrival_unix_ns"] for r in truth.values())
    last_arrival_s = (arrivals[-1] - cut_ns) / 1e9
    ended = pd.to_numeric(rows["sent_at_ns"] + rows["end_ns"].fillna(0))
    last_end_s = (int(ended.max()) - cut_ns) / 1e9
    assert MASTER_LOST_S - 2 <= last_arrival_s <= MASTER_LOST_S + 2, last_arrival_s
    assert last_end_s <= MASTER_LOST_S + 3, last_end_s
    # the report, from a host that reaches the store: complete, and says the run has no end
    again = report_again(cluster, run_id, host="worker-a")
    assert again["completeness"]["complete"] is True, again["warnings"]
    assert any(w.startswith("the run has no recorded end") for w in again["warnings"])
    # the master, alone on its host, lost both workers: a failed run (exit 1), named
    assert campaign.wait(90) == 1, logs(cluster)
    campaign_out = (cluster.work / "campaign.log").read_text(errors="replace")
    assert "exited with status 1: run " in campaign_out, campaign_out[-3000:]
    assert ": no worker confirmed its events (" in campaign_out
