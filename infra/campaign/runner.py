"""Run a campaign: per workload, a Locust master (and local workers), then the report.

    results = run_campaign(campaign, out_root=Path("reports"), echo=print)
    results[0].report.summary, results[0].out_dir

One workload is one run (its own run id, events under `<events_uri>/<run_id>/`, report in
`<out_root>/<run_id>/`, process logs in `<out_root>/<run_id>/logs/`). Workloads run one after
another. Every process started here is stopped before `run_campaign` returns or raises,
Ctrl-C included (see procs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import locustfiles
from analysis.errors import LlmloadError
from analysis.report import Report
from analysis.storage import join_uri
from infra.campaign.config import Campaign, NamedWorkload
from infra.campaign.procs import Children
from infra.campaign.report import report_run
from infra.ports import free_port

LOCUSTFILE = Path(locustfiles.__file__).parent / "chat.py"
MASTER_GRACE_S = 30.0
"""After Ctrl-C: how long the master may take to collect the workers' events."""
WORKER_EXIT_S = 15.0
"""After the master ended: how long workers may take to quit on their own."""

Echo = Callable[[str], None]


class CampaignError(LlmloadError):
    """A run could not be completed (the master failed, workers never came, a timeout)."""


@dataclass
class RunResult:
    workload: NamedWorkload
    run_id: str
    run_uri: str
    out_dir: Path
    report: Report


def run_campaign(
    campaign: Campaign,
    out_root: Path,
    *,
    env: Mapping[str, str] | None = None,
    echo: Echo = print,
) -> list[RunResult]:
    """Run every workload of the campaign in turn and report each; see the module docstring."""
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    results = []
    for workload in campaign.workload:
        run_id = new_run_id(campaign, workload)
        out_dir = out_root / run_id
        run_uri = join_uri(campaign.events_uri, run_id)
        run_workload(campaign, workload, run_id, out_dir / "logs", child_env, echo)
        echo(f"run {run_id} ended; building the report from {run_uri}")
        with scoped_environ(env or {}):
            report = report_run(run_uri, out_dir, campaign.slo)
        results.append(RunResult(workload, run_id, run_uri, out_dir, report))
    return results


def new_run_id(campaign: Campaign, workload: NamedWorkload) -> str:
    """`<name>-20261129T153012Z-1a2b3c[-<workload>]`: time-ordered, unique, readable."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    suffix = f"-{workload.name}" if len(campaign.workload) > 1 else ""
    return f"{campaign.name}-{stamp}-{uuid.uuid4().hex[:6]}{suffix}"


def run_workload(
    campaign: Campaign,
    workload: NamedWorkload,
    run_id: str,
    log_dir: Path,
    env: Mapping[str, str],
    echo: Echo,
) -> None:
    """One run: master (+ local workers) until the master exits; raises CampaignError."""
    port = campaign.master_port or free_port(campaign.master_bind_host)
    with Children(log_dir) as children:
        master = children.start("master", master_command(campaign, workload, run_id, port), env)
        workers = {
            f"worker-{i + 1}": children.start(
                f"worker-{i + 1}", worker_command(campaign, port), env
            )
            for i in range(campaign.local_workers)
        }
        _announce(campaign, workload, run_id, port, echo)
        try:
            ended = _wait_for_master(children, master, workers, run_deadline(campaign))
        except KeyboardInterrupt:
            echo(f"interrupted: stopping run {run_id} (the master collects the events first)")
            children.stop("master", MASTER_GRACE_S)
            raise
        if not ended:
            raise CampaignError(
                f"run {run_id} did not end within {run_deadline(campaign):.0f} s; "
                f"see {children.log_path('master')}"
            )
        for worker in workers.values():
            try:
                worker.wait(WORKER_EXIT_S)
            except subprocess.TimeoutExpired:
                break  # stop_all ends it
        if master.returncode != 0:
            tail = children.log_tail("master")
            raise CampaignError(
                f"the Locust master of run {run_id} exited with status {master.returncode}; "
                f"log {children.log_path('master')}:\n{tail}"
            )
        for name, worker in workers.items():  # a worker that failed while its master ended
            if worker.returncode not in (None, 0):
                raise CampaignError(
                    f"{name} of run {run_id} exited with status {worker.returncode}; "
                    f"log {children.log_path(name)}:\n{children.log_tail(name)}"
                )


def _wait_for_master(
    children: Children,
    master: subprocess.Popen[bytes],
    workers: Mapping[str, subprocess.Popen[bytes]],
    timeout: float,
) -> bool:
    """True when the master ended within `timeout`; a worker that fails first fails the run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if master.poll() is not None:
            return True
        for name, worker in workers.items():
            if worker.poll() not in (None, 0):  # workers exit 0 when their master ends the run
                raise CampaignError(
                    f"{name} exited with status {worker.returncode} during the run; "
                    f"log {children.log_path(name)}:\n{children.log_tail(name)}"
                )
        time.sleep(0.1)
    return False


def _announce(
    campaign: Campaign, workload: NamedWorkload, run_id: str, port: int, echo: Echo
) -> None:
    steps = ",".join(str(s) for s in campaign.steps)
    echo(
        f"run {run_id}: workload {workload.spec} against {campaign.target.url}; "
        f"steps {steps} x {campaign.step_duration:g} s (warmup {campaign.step_warmup:g} s); "
        f"about {estimated_seconds(campaign):.0f} s"
    )
    if campaign.external_workers:
        echo(
            f"waiting up to {campaign.worker_wait:g} s for {campaign.expect_workers} worker(s): "
            f"start each with `locust -f locustfiles/chat.py --worker --master-host <this host> "
            f"--master-port {port}` (master bound to {campaign.master_bind_host}:{port})"
        )


def master_command(
    campaign: Campaign, workload: NamedWorkload, run_id: str, port: int
) -> list[str]:
    metadata = {"campaign": campaign.name, "workload_name": workload.name}
    metadata.update(campaign.engine.metadata())
    target = campaign.target
    args = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--master", "--master-bind-host", campaign.master_bind_host,
        "--master-bind-port", str(port),
        "--expect-workers", str(campaign.expect_workers),
        "--expect-workers-max-wait", f"{campaign.worker_wait:g}",
        "--exit-code-on-error", "0",  # request failures are data in the report, not a failed run
        "--host", target.url, "--api-key-env", target.api_key_env,
        "--workload", workload.spec, "--steps", ",".join(str(s) for s in campaign.steps),
        "--step-duration", f"{campaign.step_duration:g}",
        "--step-warmup", f"{campaign.step_warmup:g}",
        "--cold-requests", str(campaign.cold_requests),
        "--events-uri", campaign.events_uri, "--run-id", run_id,
        "--metadata", json.dumps(metadata, sort_keys=True),
    ]  # fmt: skip
    if target.model:
        args += ["--model", target.model]
    return [*args, *campaign.extra]


def worker_command(campaign: Campaign, port: int) -> list[str]:
    host = (
        "127.0.0.1"
        if campaign.master_bind_host in ("*", "0.0.0.0", "")
        else campaign.master_bind_host
    )
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker",
            "--master-host", host, "--master-port", str(port)]  # fmt: skip


def estimated_seconds(campaign: Campaign) -> float:
    """Steps plus a few seconds for spawning, cold requests and the end handshake."""
    return len(campaign.steps) * (campaign.step_duration + 0.5) + 5


def run_deadline(campaign: Campaign) -> float:
    """When a run that has not ended counts as hung: generous, it only guards against hangs."""
    return campaign.worker_wait + 2 * estimated_seconds(campaign) + 180


@contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for this process (the report's S3 client), then restore."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
