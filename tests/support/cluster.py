"""The multi-host cluster: every role in a network namespace of its own (tests/support/netns.py).

Hosts: `target` (the simulated engine with its truth log, behind a relay that adds
DELAY_MS ± JITTER_MS each way; the SeaweedFS store behind a plain relay on the target's
second address STORE_IP), `master` (`llmload campaign`, external workers), `worker-a` and
`worker-b` (Locust workers, started by each test with `cluster.worker(name)`). Nothing
listens on or talks to the machine's own namespace: each process's 127.0.0.1 is its
namespace's own loopback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from tests.support.chat import ROOT

if TYPE_CHECKING:
    from tests.support.netns import Hosts

PY = sys.executable
BIN = Path(PY).parent
LOCUSTFILE = ROOT / "locustfiles" / "chat.py"
DELAY_MS, JITTER_MS = 5.0, 1.0
STORE_IP = "10.213.77.9"  # the target's second address (netns.SUBNET): the store
MASTER_PORT = 5557
ACCESS_KEY, SECRET_KEY = "LLMLOADMULTIHOST", "multihost-secret-not-real"
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def _skip_reason() -> str | None:
    from tests.support.netns import available  # (imported late: netns is a plugin too)

    why = available()
    return f"multi-host tests need network namespaces: {why}" if why else None


@dataclass
class Cluster:
    hosts: Hosts
    work: Path
    env: dict[str, str]  # the store's credentials and endpoint, for every llmload process
    target_url: str
    truth_path: Path

    def truth(self) -> dict[str, dict[str, Any]]:
        rows = [json.loads(line) for line in self.truth_path.read_text().splitlines() if line]
        return {r["request_id"]: r for r in rows if not r["request_id"].startswith("probe-")}

    def worker(self, name: str, extra_env: dict[str, str] | None = None) -> Any:
        cmd = [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--worker", "--master-host",
               self.hosts.ip("master"), "--master-port", str(MASTER_PORT)]  # fmt: skip
        return self.hosts.popen(name, cmd, log=self.work / f"{name}.log",
                                env={**self.env, **(extra_env or {})}, cwd=self.work)  # fmt: skip


def _wait_tcp(hosts: Hosts, name: str, address: str, port: int, timeout: float = 30) -> None:
    code = (
        "import socket,time,sys\n"
        f"end=time.monotonic()+{timeout}\n"
        "while True:\n"
        "    try:\n"
        f"        socket.create_connection(('{address}',{port}),timeout=1).close(); break\n"
        "    except OSError:\n"
        "        if time.monotonic()>end: sys.exit(1)\n"
        "        time.sleep(0.1)\n"
    )
    out = hosts.run(name, [PY, "-c", code], timeout=timeout + 5)
    assert out.returncode == 0, f"{address}:{port} not reachable from {name}"


@contextmanager
def start_cluster(tmp_path: Path, reset_rate: float = 0.0) -> Iterator[Cluster]:
    """The cluster's hosts and services, ready; skips the test where namespaces cannot be made.

    `reset_rate`: the fraction of worker-to-target connections the link resets (relay.py)."""
    from tests.support.netns import Hosts

    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    names = ["target", "master", "worker-a", "worker-b"]
    with Hosts(names, extra_ips={"target": [STORE_IP]}) as hosts:
        target_ip = hosts.ip("target")
        truth = tmp_path / "truth.jsonl"
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        hosts.popen("target", [PY, "-m", "infra", "sim", "--host", "127.0.0.1", "--port", "8001",
                               "--profile", "tiny", "--truth-log", str(truth)],
                    log=tmp_path / "sim.log", env=base_env, cwd=ROOT)  # fmt: skip
        hosts.popen("target", [PY, "-m", "tests.support.relay", "--listen", f"{target_ip}:8000",
                               "--to", "127.0.0.1:8001", "--delay-ms", str(DELAY_MS),
                               "--jitter-ms", str(JITTER_MS), "--reset-rate", str(reset_rate)],
                    log=tmp_path / "relay.log", env=base_env, cwd=ROOT)  # fmt: skip
        store_env = {
            **base_env,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        }
        hosts.popen("target", [str(BIN / "llmload"), "store", "--dir", str(tmp_path / "store"),
                               "--port", "8334"],
                    log=tmp_path / "store.log", env=store_env, cwd=tmp_path)  # fmt: skip
        hosts.popen("target", [PY, "-m", "tests.support.relay", "--listen", f"{STORE_IP}:8333",
                               "--to", "127.0.0.1:8334"],
                    log=tmp_path / "store-relay.log", env=base_env, cwd=ROOT)  # fmt: skip
        _wait_tcp(hosts, "master", target_ip, 8000)
        _wait_tcp(hosts, "master", STORE_IP, 8333, timeout=60)
        env = {**store_env, "AWS_ENDPOINT_URL_S3": f"http://{STORE_IP}:8333",
               "AWS_DEFAULT_REGION": "us-east-1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
        _wait_bucket(hosts, env)
        yield Cluster(hosts, tmp_path, env, f"http://{target_ip}:8000", truth)


def _wait_bucket(hosts: Hosts, env: dict[str, str], timeout: float = 60) -> None:
    code = (
        "import boto3,time,sys\n"
        f"end=time.monotonic()+{timeout}\n"
        "while True:\n"
        "    try:\n"
        "        boto3.client('s3').head_bucket(Bucket='llmload'); break\n"
        "    except Exception:\n"
        "        if time.monotonic()>end: raise\n"
        "        time.sleep(0.5)\n"
    )
    out = hosts.run("master", [PY, "-c", code], timeout=timeout + 10, env=env)
    assert out.returncode == 0, out.stderr[-2000:]


def write_campaign(cluster: Cluster, steps: str = "[1, 2]", duration: float = 4) -> Path:
    path = cluster.work / "c.yaml"
    path.write_text(
        f"""
name: multihost
target: {{url: "{cluster.target_url}"}}
workload: "D(24,12)"
steps: {steps}
step_duration: {duration}
step_warmup: 0.5
cold_requests: 2
workers: external
expect_workers: 2
worker_wait: 60
master_bind_host: {cluster.hosts.ip("master")}
master_port: {MASTER_PORT}
events_uri: s3://llmload/runs
report_dir: {cluster.work / "reports"}
"""
    )
    return path


def run_campaign(cluster: Cluster, config: Path, timeout: float = 180) -> tuple[Any, Path]:
    out = cluster.hosts.run("master", [str(BIN / "llmload"), "campaign", str(config), "--out",
                                       str(cluster.work / "reports")],
                            timeout=timeout, env=cluster.env, cwd=cluster.work)  # fmt: skip
    reports = cluster.work / "reports"
    run_dirs = [p for p in reports.iterdir() if p.is_dir()] if reports.exists() else []
    return out, (run_dirs[0] if len(run_dirs) == 1 else reports)


def load_run_from(cluster: Cluster, run_id: str, host: str = "master") -> Any:
    """The run's request rows and manifest, loaded from the store in `host`."""
    code = (
        "import sys,json\nfrom analysis import load_run\n"
        f"run=load_run('s3://llmload/runs/{run_id}',progress=False)\n"
        f"run.requests.to_parquet('{cluster.work}/rows.parquet')\n"
        f"open('{cluster.work}/manifest.json','w').write(json.dumps(run.manifest))\n"
    )
    out = cluster.hosts.run(host, [PY, "-c", code], timeout=120, env=cluster.env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = pd.read_parquet(cluster.work / "rows.parquet")
    manifest = json.loads((cluster.work / "manifest.json").read_text())
    return rows, manifest


def logs(cluster: Cluster) -> str:
    return "\n".join(
        f"--- {p.name} ---\n{p.read_text(errors='replace')[-2500:]}"
        for p in sorted(cluster.work.glob("*.log"))
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A started cluster (start_cluster), torn down after the test."""
    with start_cluster(tmp_path) as running:
        yield running
