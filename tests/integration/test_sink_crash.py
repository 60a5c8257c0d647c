"""A worker killed with SIGKILL leaves a spool that `llmload upload-spool` recovers."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from infra.cli import main
from infra.ports import free_ports
from tests.support.events import RUN_ID, request_id
from tests.support.store import S3Target

ROOT = Path(__file__).parents[2]
WORKER = "crash-host-1-w"


def wait_for_spooled(proc: subprocess.Popen[bytes], at_least: int, timeout: float) -> int:
    """Read the worker's `spooled <n>` lines until n >= at_least; return n."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    spooled = 0
    while spooled < at_least:
        left = deadline - time.monotonic()
        assert left > 0, f"worker spooled only {spooled} requests in {timeout} s"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            data = os.read(fd, 4096)
            assert data, f"worker exited early with {proc.wait(5)}"
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.startswith(b"spooled "):
                    spooled = int(line.split()[1])
    return spooled


def read_back(target: S3Target) -> tuple[list[str], dict[str, int], dict[str, object]]:
    ids: list[str] = []
    chunks: dict[str, int] = {}
    index: dict[str, object] = {}
    for key, data in target.objects().items():
        if key.endswith(".json"):
            index = json.loads(data)
        elif "/requests/" in key:
            ids += pq.read_table(io.BytesIO(data)).column("request_id").to_pylist()
        else:
            for rid in pq.read_table(io.BytesIO(data)).column("request_id").to_pylist():
                chunks[rid] = chunks.get(rid, 0) + 1
    return ids, chunks, index


@pytest.mark.parametrize("store_up", [True, False], ids=["store-up", "store-down"])
def test_sigkilled_worker_spool_is_recovered(
    store_up: bool, s3_target: S3Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool"
    env = dict(os.environ)
    if not store_up:  # nothing can be uploaded: every part must wait in the spool
        env["AWS_ENDPOINT_URL_S3"] = f"http://127.0.0.1:{free_ports(1)[0]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.sink_worker", s3_target.uri, str(spool), WORKER],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        spooled = wait_for_spooled(proc, at_least=1000, timeout=60)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    left = list(spool.rglob("part-*.parquet"))
    before, _, _ = read_back(s3_target)
    if not store_up:
        assert left and not before
    print(f"killed after {spooled} spooled; {len(left)} parts in the spool, {len(before)} in S3")

    assert main(["upload-spool", str(spool), "--events-uri", s3_target.uri]) == 0

    ids, chunks, index = read_back(s3_target)
    assert len(ids) == len(set(ids)), "a request row was written twice"
    # parts are sealed in order: what survived is exactly the first n requests, n >= spooled
    assert sorted(ids) == [request_id(i) for i in range(len(ids))]
    assert len(ids) >= spooled
    assert sorted(chunks) == [request_id(i) for i in range(len(chunks))]
    assert len(chunks) >= spooled and set(chunks.values()) == {10}
    assert index["run_id"] == RUN_ID and index["worker_id"] == WORKER
    assert index["rows"] == {
        "requests": len(ids),
        "chunks": 10 * len(chunks),
        "samples": 0,
        "stalls": 0,
    }
    assert not list(spool.rglob("*.parquet"))
