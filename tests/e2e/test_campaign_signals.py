"""SIGTERM and SIGINT on `llmload campaign` (issue 20 item 1): the campaign passes the signal on
to its Locust master, which ends the run as `aborted` naming the signal while both workers
flush; the campaign prints one line and exits 128 + the signal. No request the simulator's
truth log answered is missing from the events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.chat import assert_no_answered_request_lost, reap, start_sim, wait_for

pytestmark = pytest.mark.slow  # long (10-35 s a test): `make test-slow`

LLMLOAD = str(Path(sys.executable).parent / "llmload")


def _campaign_file(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"""
name: sig
target: {{url: "{url}"}}
workload: "D(16,64)"
steps: [2, 4]
step_duration: 60
step_warmup: 0
cold_requests: 0
workers: 2
worker_wait: 30
events_uri: {tmp_path / "runs"}
extra: ["--spool-dir", "{tmp_path / "spool"}"]
"""
    )
    return path


@pytest.mark.parametrize(
    ("sig", "times"), [(signal.SIGTERM, 1), (signal.SIGINT, 2)], ids=["sigterm", "sigint-twice"]
)
def test_a_signal_ends_the_campaigns_run_as_aborted_and_keeps_every_answered_request(
    tmp_path: Path, sig: signal.Signals, times: int
) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with (
        start_sim(tmp_path / "sim", "--decode-base-ms", "5") as sim,
        out_path.open("w") as out,
        err_path.open("w") as err,
    ):
        config = _campaign_file(tmp_path, sim.url)
        proc = subprocess.Popen(
            [LLMLOAD, "campaign", str(config), "--out", str(tmp_path / "reports")],
            stdout=out, stderr=err, text=True, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for(lambda: len(sim.truth()) >= 20, 60, "requests answered by the simulator")
            time.sleep(1)
            for _ in range(times):  # a second one says what the campaign waits for
                proc.send_signal(sig)
                time.sleep(0.2)
            proc.wait(90)
        finally:
            reap(proc)
        truth = sim.truth()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    said = stdout + stderr
    assert proc.returncode == 128 + sig, said[-3000:]
    assert "Traceback" not in said and "interrupted" not in said, said[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("llmload: ")]
    assert len(lines) == times, stderr
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert lines[0].startswith(f"llmload: {sig.name}: stopping run {run.name}; "), lines
    if times > 1:
        assert lines[1].startswith(f"llmload: {sig.name} again: waiting for "), lines
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "aborted" and manifest["stopped_by"] == sig.name
    indexes = [json.loads(p.read_text()) for p in (run / "index").glob("*.json")]
    assert len(indexes) == 2 and all(i["final"] for i in indexes)
    rows = assert_no_answered_request_lost(run, truth)
    assert set(rows["status"]) <= {"ok", "aborted"}
    # The master ended the run on the signal the campaign passed on; no report was built.
    logs = tmp_path / "reports" / run.name / "logs"
    assert f"llmload: {sig.name}: stopping the run" in (logs / "master.log").read_text()
    assert sorted(p.name for p in (tmp_path / "reports" / run.name).iterdir()) == ["logs"]
