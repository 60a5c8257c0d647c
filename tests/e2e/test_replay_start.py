"""A trace replay starts on time: its schedule begins once every worker is ready to meet it.

A worker probes its target (models, ignore_eos, continuous usage, prompt calibration) before
its first request. Against an engine whose every answer takes 40 ms those probes take a few
hundred ms; when they waited for the first arrival, the first arrivals of a replay were sent
that much behind their schedule (issue 36: 63-193 ms against vLLM, 165-281 ms here), while
the rest were a few ms late. Now the workers probe when the run starts and tell the master,
which starts a rate step's schedule (a trace's too) once all of them are ready.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chat import run_locust, start_sim

ROWS, GAP_MS = 40, 10


@pytest.mark.alone  # punctuality in ms: another test's load beside it makes the first late
def test_the_first_arrivals_of_a_replay_are_as_punctual_as_the_rest(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        json.dumps({"timestamp": i * GAP_MS, "input_length": 32, "output_length": 4}) + "\n"
        for i in range(ROWS)
    ))  # fmt: skip
    with start_sim(tmp_path / "sim", "--profile", "tiny", "--decode-base-ms", "40") as sim:
        result = run_locust(sim.url, tmp_path / "runs", "--workload", f"trace:{trace}",
                            "--cold-requests", "0", "--seed", "0", workers=2, timeout=120)  # fmt: skip
        truth = sim.raw_truth()  # the workers' probes included
    assert result.returncode == 0, result.output[-3000:]
    requests, _, manifest = result.events()
    assert sorted(requests["arrival_index"]) == list(range(ROWS))
    (step,) = manifest["steps"]
    # the mechanism: every worker's probes reached the engine before the schedule began
    # (those the engine logs: its chat completions, not GET /v1/models)
    probes = [p for p in manifest["probes"] if p.get("worker_id") and p["request_id"] in truth]
    assert {p["worker_id"] for p in probes} == set(requests["worker_id"])
    assert len(probes) >= 2 * 3  # ignore_eos, continuous usage, calibration: each worker's
    assert all(truth[p["request_id"]]["arrival_unix_ns"] < step["started_at_ns"] for p in probes)
    # the effect: the first arrivals are not late by the probes' time
    requests = requests.sort_values("arrival_index")
    slip_ms = (requests["sent_at_ns"] - requests["intended_ns"] - requests["queued_ns"]) / 1e6
    first, rest = slip_ms.iloc[:5], slip_ms.iloc[5:]
    assert first.max() < max(40.0, 2 * rest.max()), (first.tolist(), rest.describe())
