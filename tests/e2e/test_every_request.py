"""Every request is accounted for, and every worker's clock is measured.

The simulator's truth log holds every generation request it saw, probes included. Each one
must be a request row of the run or a probe the manifest lists: nothing llmload sends to the
target is invisible in the run. One local run and one master + 2 workers run (where probes
and clock exchanges travel as Locust messages) serve every test here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest

from tests.support.chat import run_locust, start_sim

RUN = ("--steps", "2", "--step-duration", "1.5", "--step-warmup", "0.2", "--cold-requests", "0",
       "--workload", "D(16,8)")  # fmt: skip
WORKER_PURPOSES = ["calibration", "calibration", "continuous_usage", "ignore_eos", "models"]
GET_PURPOSES = (
    "models",
    "preflight",
    "target_models",
    "target_version",
)  # the truth log has POSTs only


@dataclass
class Run:
    workers: int
    output: str
    requests: pd.DataFrame
    manifest: dict[str, Any]
    seen: dict[str, dict[str, Any]]  # the server's raw truth log, by request id


@pytest.fixture(scope="module", params=[0, 2], ids=["local", "master+2workers"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    workers: int = request.param
    tmp = tmp_path_factory.mktemp(f"every-request-{workers}")
    with start_sim(tmp / "sim") as sim:
        result = run_locust(sim.url, tmp / "runs", *RUN, workers=workers)
        seen = sim.raw_truth()
    assert result.returncode == 0, result.output
    requests, _, manifest = result.events()
    assert manifest["status"] == "finished", result.output
    return Run(workers, result.output, requests, manifest, seen)


def test_every_probe_is_listed_once_with_its_outcome(run: Run) -> None:
    probes = run.manifest["probes"]
    workers = {w["worker_id"] for w in run.manifest["workers"]}
    assert len(workers) == max(run.workers, 1)
    ids = [p["request_id"] for p in probes]
    assert len(set(ids)) == len(ids)
    assert all(rid.startswith("probe-") and len(rid) == len("probe-") + 32 for rid in ids)
    assert set(run.requests["worker_id"]) == workers  # one user each: each worker probed
    for worker in workers:
        mine = sorted(p["purpose"] for p in probes if p["worker_id"] == worker)
        assert mine == WORKER_PURPOSES, (worker, probes)
    master = sorted(p["purpose"] for p in probes if p["worker_id"] is None)
    assert master == ["first_request", "preflight", "target_models", "target_version"]
    assert {p["worker_id"] for p in probes} == workers | {None}
    for p in probes:
        assert p["http_status"] == 200 and p["outcome"] == "ok", p


def test_every_request_the_server_saw_is_a_row_or_a_listed_probe(run: Run) -> None:
    rows = set(run.requests["request_id"])
    probes = {p["request_id"]: p for p in run.manifest["probes"]}
    assert len(rows) > 0 and not rows & set(probes)
    unaccounted = set(run.seen) - rows - set(probes)
    assert not unaccounted, [run.seen[rid] for rid in unaccounted]
    # the POST probes reached the server under the ids the manifest lists
    posted = {rid for rid, p in probes.items() if p["purpose"] not in GET_PURPOSES}
    assert {rid for rid in run.seen if rid.startswith("probe-")} == posted
    # and the sinks lost nothing
    for worker in run.manifest["workers"]:
        assert worker["rows_rejected"] == 0 and worker["rows_dropped"] == 0, worker
        assert worker["sink_errors"] == []


def test_the_manifest_names_every_workers_sse_reader(run: Run) -> None:
    """The workers of this install ran the C decoder (pip built it), and said so."""
    assert [w["sse_reader"] for w in run.manifest["workers"]] == ["native"] * len(
        run.manifest["workers"]
    )


def test_the_manifest_records_every_workers_clock(run: Run) -> None:
    for worker in run.manifest["workers"]:
        if run.workers == 0:  # one process, one clock
            assert worker["clock_offset_ms"] == 0 and worker["clock_rtt_ms"] == 0
            continue
        # one machine, loopback: the clocks agree and a round trip takes some time
        assert worker["clock_offset_ms"] is not None and abs(worker["clock_offset_ms"]) < 50
        assert worker["clock_rtt_ms"] is not None and 0 < worker["clock_rtt_ms"] < 1000
