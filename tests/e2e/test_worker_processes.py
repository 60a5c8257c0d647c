"""Locust's `--processes N` on a worker host: one `locust --worker --processes 2` command
forks two llmload workers, each a worker of its own (its own id, events and flush), as
docs/campaigns.md (sizing) and the compose and k8s files say. And what a worker process loads:
only the shared kernel of `analysis/`, never the report stack. Real processes, the simulator.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infra.ports import free_port
from tests.support.chat import BIN, LOCUSTFILE, ROOT, LocustResult, reap, start_sim

REPORT_LIBRARIES = ("pandas", "duckdb", "matplotlib")


def test_one_worker_command_with_processes_2_is_two_workers(tmp_path: Path) -> None:
    events = tmp_path / "runs"
    modules = tmp_path / "modules"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LLMLOAD_TEST_MODULES_OUT": str(modules)}
    port = free_port()
    recording = ROOT / "tests" / "e2e" / "modules_locustfile.py"
    with start_sim(tmp_path, "--profile", "tiny") as sim:
        host = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(recording), "--worker", "--processes", "2",
             "--master-host", "127.0.0.1", "--master-port", str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        try:
            master = subprocess.run(
                [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
                 "--host", sim.url, "--events-uri", str(events),
                 "--spool-dir", str(tmp_path / "spool"), "--master",
                 "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                 "--expect-workers", "2", "--expect-workers-max-wait", "30",
                 "--steps", "2", "--step-duration", "3", "--step-warmup", "0",
                 "--cold-requests", "0", "--workload", "D(16,4)"],
                capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            host_status = host.wait(timeout=30)  # the parent exits once both children have
        finally:
            host_out = reap(host)
    output = master.stdout + master.stderr + "\n--- worker host ---\n" + host_out
    assert master.returncode == 0, output[-4000:]
    assert host_status == 0, output[-4000:]
    result = LocustResult(master.returncode, output, events)
    requests, _chunks, manifest = result.events()
    assert manifest["status"] == "finished", manifest["status"]
    workers = manifest["workers"]
    assert len(workers) == 2, workers
    assert len({w["pid"] for w in workers}) == 2 and len({w["host"] for w in workers}) == 1
    ids = {w["worker_id"] for w in workers}
    assert len(ids) == 2
    assert set(requests["worker_id"]) == ids  # both forked processes sent and flushed

    # What a worker process that ran requests had loaded when it quit (the last child to quit
    # wrote it): the runtime imports only analysis' shared kernel (issue 35).
    loaded = modules.read_text().split()
    assert "locustfiles.worker.context" in loaded and "analysis.kernel.schema" in loaded
    heavy = [m for m in loaded if m.split(".")[0] in REPORT_LIBRARIES]
    assert heavy == [], heavy[:10]
    rooms = [m for m in loaded if m.startswith("analysis.") and not m.startswith("analysis.kernel")]
    assert rooms == [], rooms
