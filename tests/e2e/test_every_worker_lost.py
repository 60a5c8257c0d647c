"""A master whose every worker is lost mid-run stops with a failure, never a clean exit.

Locust stops a run whose last worker went missing as if the user had asked it to; without
llmload's check the master exited 0 with a manifest that only said `aborted`. A pipeline
must see exit status 1 and one line naming the lost worker and the way to recover its
events. (A run that loses some workers but ends with the others is not a failure: it exits
0 and its report says which worker did not confirm its events; tests/multihost.)
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from infra.ports import free_port
from tests.support.chat import start_master, start_sim, start_worker


@pytest.mark.slow  # long (10-20 s): `make test-slow` keeps the default suite near 10 min
def test_a_master_that_loses_its_only_worker_fails_naming_it(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with start_sim(tmp_path / "sim") as sim:
        master = start_master(port, sim.url, tmp_path, workers=1, env=env)
        worker = start_worker(port, env)
        try:
            runs = tmp_path / "runs"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not list(runs.glob("*/requests/*/*.parquet")):
                time.sleep(0.2)  # the worker has sealed and stored requests: it is running
            assert list(runs.glob("*/requests/*/*.parquet")), "the run never started"
            worker.send_signal(signal.SIGKILL)
            worker.communicate(timeout=10)
            out, _ = master.communicate(timeout=60)  # the run was planned for 2 x 60 s
        finally:
            for proc in (master, worker):
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate(timeout=10)
    errors = [line for line in out.splitlines() if line.startswith("llmload: error:")]
    assert master.returncode == 1, out[-3000:]
    assert len(errors) == 1, out[-3000:]
    assert ": no worker confirmed its events (" in errors[0]
    assert "(lost: no heartbeat)" in errors[0] and "llmload upload-spool" in errors[0]
    (manifest_path,) = (tmp_path / "runs").glob("*/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    assert manifest["status"] == "aborted"
    (lost,) = manifest["workers"]
    assert lost["worker_id"] in errors[0]
