"""Worker clock offsets from the manifest move send times onto the master's clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.read.clocks import aligned_sent_ns, clock_warnings, worker_offsets_ns
from analysis.read.load import load_run
from analysis.report.summary import summarize_run
from tests.support.runs import T0_NS, RunBuilder, ns

MS = 1_000_000


def manifest(**offsets: float | None) -> dict:
    return {
        "workers": [
            {"worker_id": w, "host": "h", "pid": 1, "clock_offset_ms": off, "clock_rtt_ms": 0.4}
            for w, off in offsets.items()
        ]
    }


def test_offsets_of_measured_workers_only() -> None:
    doc = manifest(w1=250.0, w2=None, w3=-0.0004)
    doc["workers"].append({"worker_id": "w4", "host": "h", "pid": 4})  # an older manifest
    assert worker_offsets_ns(doc) == {"w1": 250 * MS, "w3": -400}
    assert worker_offsets_ns({}) == {}


def test_aligned_send_times_take_off_each_workers_offset() -> None:
    requests = pd.DataFrame(
        {
            "worker_id": ["w1", "w2", "w1", "w9", None],
            "sent_at_ns": [T0_NS, T0_NS, T0_NS + 5, T0_NS, T0_NS],
        }
    )
    got = aligned_sent_ns(requests, manifest(w1=250.0, w2=-1.5))
    want = [T0_NS - 250 * MS, T0_NS + int(1.5 * MS), T0_NS + 5 - 250 * MS, T0_NS, T0_NS]
    assert got.tolist() == want
    # unknown offsets: the times are left alone
    assert aligned_sent_ns(requests, {}).tolist() == requests["sent_at_ns"].tolist()
    empty = pd.DataFrame({"worker_id": [], "sent_at_ns": np.array([], np.int64)})
    assert len(aligned_sent_ns(empty, manifest(w1=250.0))) == 0


def test_warning_names_the_worker_and_its_offset() -> None:
    warnings = clock_warnings(manifest(w1=250.0, w2=4.9, w3=-5.2, w4=None))
    assert len(warnings) == 2
    assert "worker w1" in warnings[0] and "+250.0 ms" in warnings[0]
    assert "corrected" in warnings[0]
    assert "worker w3" in warnings[1] and "-5.2 ms" in warnings[1]
    assert clock_warnings({}) == []


def test_a_fast_workers_requests_land_in_the_step_they_were_sent_in(tmp_path: Path) -> None:
    """w2's clock runs 250 ms ahead of the master's: its send times read 250 ms late."""
    run = RunBuilder("clocks", workers=("w1", "w2"))
    run.add_step(0, 2, started_s=0, spawned_s=1, ended_s=11, warmup_s=1)  # steady [2, 11]
    run.add_step(1, 4, started_s=11, spawned_s=12, ended_s=22, warmup_s=1)  # steady [13, 22]
    skew = 0.25
    # master times: 1.9 (warmup: out), 2.1 (in), 10.9 (in); w2 stamps them 250 ms later
    for master_s, rid in ((1.9, "warmup"), (2.1, "early"), (10.9, "late")):
        run.add_request(sent_s=master_s + skew, worker="w2", step=0, concurrency=2,
                        chunks=[(0.05, 1)], request_id=rid)  # fmt: skip
    run.add_request(sent_s=5.0, worker="w1", step=0, concurrency=2, chunks=[(0.05, 1)])
    run.add_request(sent_s=14.0, worker="w2", step=1, concurrency=4, chunks=[(0.05, 1)])
    run.manifest_extra["workers"] = [
        {"worker_id": "w1", "host": "h", "pid": 1, "clock_offset_ms": 0.1, "clock_rtt_ms": 0.3},
        {"worker_id": "w2", "host": "h", "pid": 2, "clock_offset_ms": 250.0, "clock_rtt_ms": 0.4},
    ]
    report = summarize_run(load_run(run.write(tmp_path / "events"), progress=False))
    per = report.per_request.set_index("request_id")
    assert per.loc["warmup", "steady"] == False  # noqa: E712 (numpy bool)
    assert per.loc["early", "steady"] and per.loc["late", "steady"]
    step0 = report.step_rows[0]
    assert step0["requests_total"] == 4 and step0["requests"] == 3
    assert report.step_rows[1]["requests"] == 1
    assert any("worker w2" in w and "+250.0 ms" in w for w in report.warnings)
    assert not any("worker w1" in w for w in report.warnings)
    # the raw column stays the worker's own clock
    assert per.loc["early", "sent_at_ns"] == T0_NS + ns(2.1 + skew)
