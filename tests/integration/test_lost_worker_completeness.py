"""A worker the master lost mid-run: the report names it, its host and the command that
recovers its events; once its parts and final index are in the store the run is complete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analysis import load_run
from analysis.kernel.storage import open_store
from tests.support.runs import RunBuilder


def lost_w2(status: str = "finished") -> RunBuilder:
    """w1 confirmed its events at the end; w2 (on host-b) never did: its sink report is null."""
    b = RunBuilder("lost", workers=("w1", "w2"))
    b.add_step(0, 2, started_s=0, spawned_s=0, ended_s=10)
    for i, worker in enumerate(("w1", "w2", "w1", "w2")):
        b.add_request(sent_s=1.0 + i, worker=worker, chunks=[(0.1, 1)], end_s=0.2, concurrency=2)
    confirmed: dict[str, Any] = {"rows_rejected": 0, "rows_dropped": 0, "sink_errors": []}
    unconfirmed: dict[str, Any] = {"rows_rejected": None, "rows_dropped": None, "sink_errors": []}
    b.manifest_extra.update(
        status=status,
        config={"events_uri": "s3://bench/runs", "spool_dir": ""},
        workers=[{"worker_id": "w1", "host": "host-a", "pid": 1, **confirmed},
                 {"worker_id": "w2", "host": "host-b", "pid": 2, **unconfirmed}],
    )  # fmt: skip
    return b


def hold_back(uri: str, worker: str) -> dict[str, bytes]:
    """Take a worker's parts and index out of the store (as if still in its spool)."""
    store = open_store(uri)
    held = {}
    for obj in store.list(""):
        if f"worker={worker}" in obj.key:
            held[obj.key] = store.get(obj.key)
            store.delete(obj.key)
    return held


def test_a_lost_worker_is_named_with_its_host_and_the_upload_command(events_dir: Path) -> None:
    uri = lost_w2().write(events_dir)
    held = hold_back(uri, "w2")
    run = load_run(uri, progress=False)
    c = run.completeness
    assert not c.complete and c.workers_unconfirmed == {"w2": "host-b"}
    assert c.to_dict()["workers_unconfirmed"] == {"w2": "host-b"}
    (line,) = [w for w in run.warnings if "w2" in w]  # one line says it all
    assert line == (
        "worker w2 on host-b did not confirm its events to the master (it was lost during the "
        "run, or did not flush within --finish-timeout): its parts may be missing here, waiting "
        "in its spool; on host-b run `llmload upload-spool <system temp>/llmload-spool "
        "--events-uri s3://bench/runs`, then report again"
    )
    assert len(run.requests) == 2

    store = open_store(uri)  # its spool uploaded: parts and final index in the store
    for key, data in held.items():
        store.put(key, data)
    run = load_run(uri, progress=False)
    assert run.completeness.complete and run.completeness.workers_unconfirmed == {}
    assert run.warnings == [] and len(run.requests) == 4


def test_a_final_index_outweighs_the_missing_confirmation(events_dir: Path) -> None:
    """The worker flushed after its master had gone: its own final index is the proof."""
    run = load_run(lost_w2().write(events_dir), progress=False)
    assert run.completeness.complete and run.warnings == []


def test_a_run_still_going_claims_nothing_about_confirmations(events_dir: Path) -> None:
    uri = lost_w2(status="running").write(events_dir)
    hold_back(uri, "w2")
    run = load_run(uri, progress=False)
    assert run.completeness.workers_unconfirmed == {}
    assert any("left no parts: w2" in w for w in run.warnings)
    assert run.warnings[0].startswith("the run has no recorded end (manifest status running)")
    assert json.loads(open_store(uri).get("manifest.json"))["status"] == "running"
