"""Run a campaign: per workload, a Locust master (and local workers), then the report.

    results = run_campaign(campaign, out_root=Path("reports"), echo=print)
    results[0].report.summary, results[0].out_dir

One workload is one run (its own run id, events under `<events_uri>/<run_id>/`, report in
`<out_root>/<run_id>/`, process logs in `<out_root>/<run_id>/logs/`). Workloads run one after
another; with `repeat: N` each runs N times in a row (new run ids), and then each workload's
runs get a repeats report in `<out_root>/repeats-<workload>/` (analysis/compare/repeats.py). Every
run's manifest config records the campaign's id (`campaign_id`, one per `run_campaign`) and
its `repeat` index. Every process started here is stopped before `run_campaign` returns or raises,
Ctrl-C included (see procs.py). SIGTERM or SIGINT ends the run going as `aborted` through its
master, its events kept, runs no further workload and raises CampaignStopped (stop.py).

A run with a capacity search (`search: rate|concurrency`) may end with the master's exit
status 3 (EXIT_SEARCH_LOWEST_FAILED): even the lowest level missed the SLO. That run is
complete, not crashed: it is reported like any other and its RunResult says `lowest_failed`.
"""

from __future__ import annotations

import json
import math
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
from typing import Any, Final

import locustfiles
from analysis.kernel.errors import LlmloadError
from analysis.kernel.storage import join_uri, open_store
from analysis.report.summary import Report
from infra.campaign.config import AUTO, Campaign, NamedWorkload, usable_cpus
from infra.campaign.procs import Children
from infra.campaign.report import (
    level_text,
    repeats_reports,
    report_run,
    search_block,
    search_line,
)
from infra.campaign.stop import StopSignals
from infra.ports import free_port
from locustfiles.options.rules import DRAIN_TIMEOUT_S
from locustfiles.options.table import OPTION, command_line
from locustfiles.run.manifest import run_taken

LOCUSTFILE = Path(locustfiles.__file__).parent / "chat.py"
MASTER_GRACE_S = 30.0
"""After a stop signal: how long the master may take, beyond its --finish-timeout (its wait
for the workers' events), to end the run (stop users, write the final manifest)."""
WORKER_EXIT_S = 15.0
"""After the master ended: how long workers may take to quit on their own."""
EXIT_SEARCH_LOWEST_FAILED: Final = 3
"""The master's exit status when a capacity search found even its lowest level missing the SLO."""
SEARCH_PROBE_STEPS: Final = 4
"""A search probe lasts at least step_duration and at most this many times it."""
SEARCH_BISECT_PROBES: Final = 12
"""Bisection probes a run's deadline allows for (more when rates and precision need more)."""

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
    master_status: int = 0  # 0, or EXIT_SEARCH_LOWEST_FAILED after a capacity search
    repeat: int = 1  # which run of the workload (campaign key `repeat`), from 1
    campaign_id: str = ""  # the campaign invocation's id, in every run's manifest config

    @property
    def search(self) -> dict[str, Any] | None:
        """The run's capacity search as its manifest records it (None: no search)."""
        return search_block(self.report)

    @property
    def lowest_failed(self) -> bool:
        """A capacity search found that even its lowest level missed the SLO."""
        status = (self.search or {}).get("status")
        return self.master_status == EXIT_SEARCH_LOWEST_FAILED or status == "lowest_failed"


def run_campaign(
    campaign: Campaign,
    out_root: Path,
    *,
    env: Mapping[str, str] | None = None,
    echo: Echo = print,
    tags: Mapping[str, Any] | None = None,
    label: str = "",
) -> list[RunResult]:
    """Run every workload of the campaign in turn and report each; see the module docstring.

    `tags` join every run's manifest config (a sweep's `engine_config` and `sweep_id`);
    `label` goes into its run ids (`<name>-<time>-<hex>-<label>[-<workload>]`)."""
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    results = []
    campaign_id = new_campaign_id(campaign)
    times = f"; each workload runs {campaign.repeat} times" if campaign.repeat > 1 else ""
    echo(f"campaign id {campaign_id} (in each run's manifest config: campaign_id){times}")
    plan = [(w, n) for w in campaign.workload for n in range(1, campaign.repeat + 1)]
    with StopSignals() as stop:  # SIGTERM/SIGINT: the run going ends aborted (stop.py)
        for workload, repeat in plan:
            with scoped_environ(env or {}):
                run_id = free_run_id(campaign, workload, label=label)
            out_dir = out_root / run_id
            run_uri = join_uri(campaign.events_uri, run_id)
            run_tags = {**(tags or {}), "campaign_id": campaign_id, "repeat": repeat}
            status = run_workload(
                campaign, workload, run_id, out_dir / "logs", child_env, echo, stop=stop,
                tags=run_tags,
            )  # fmt: skip
            echo(f"run {run_id} ended; building the report from {run_uri}")
            with scoped_environ(env or {}):
                report = report_run(run_uri, out_dir, campaign.slo)
            result = RunResult(workload, run_id, run_uri, out_dir, report, status, repeat,
                               campaign_id)  # fmt: skip
            line = _search_outcome(campaign, result)
            if line is not None:
                echo(line)
            results.append(result)
    if campaign.repeat > 1:  # each workload's runs, summarised again with chunks in memory
        echo(f"campaign {campaign_id}: building the repeats reports")
        with scoped_environ(env or {}):
            runs = [(r.workload.name, r.run_uri) for r in results]
            for line in repeats_reports(runs, out_root, campaign.slo):
                echo(line)
    return results


def _search_outcome(campaign: Campaign, result: RunResult) -> str | None:
    """What the run's capacity search found, in one line (None: no search)."""
    if result.lowest_failed and (result.search or {}).get("status") != "lowest_failed":
        # the master's exit status says so, but the manifest holds no such search record
        return (
            "capacity search: even the lowest level "
            f"({level_text(campaign.mode, min(campaign.levels))}) missed the SLO "
            f"{campaign.slo} (master exit status {result.master_status})"
        )
    return search_line(result.report)


def new_run_id(campaign: Campaign, workload: NamedWorkload, label: str = "") -> str:
    """`<name>-20261129T153012Z-1a2b3c[-<label>][-<workload>]`: time-ordered, unique,
    readable (a sweep's label is its configuration's name)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    suffix = f"-{label}" if label else ""
    suffix += f"-{workload.name}" if len(campaign.workload) > 1 else ""
    return f"{campaign.name}-{stamp}-{uuid.uuid4().hex[:6]}{suffix}"


def new_campaign_id(campaign: Campaign) -> str:
    """`<name>-20261129T153012Z-c1a2b3c4`: one per `run_campaign`, recorded in the manifest
    config of each of its runs (`campaign_id`, with `repeat`): `llmload report --campaign`."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{campaign.name}-{stamp}-c{uuid.uuid4().hex[:8]}"


def free_run_id(
    campaign: Campaign, workload: NamedWorkload, tries: int = 100, label: str = ""
) -> str:
    """A new run id that no run in the events store holds (a run id names one run).

    Where the store cannot say, the id is used: the master's preflight reports the store."""
    run_id = new_run_id(campaign, workload, label)
    try:
        store = open_store(campaign.events_uri)  # once: each try only lists its own id
        for _ in range(tries):
            if not run_taken(store, run_id):
                break
            run_id = new_run_id(campaign, workload, label)
    except (LlmloadError, OSError):
        pass
    return run_id


def run_workload(
    campaign: Campaign,
    workload: NamedWorkload,
    run_id: str,
    log_dir: Path,
    env: Mapping[str, str],
    echo: Echo,
    *,
    stop: StopSignals | None = None,
    tags: Mapping[str, Any] | None = None,
) -> int:
    """One run: master (+ local workers) until the master exits; raises CampaignError.

    `tags` (campaign_id, repeat) join the run's metadata in its manifest config.

    Returns the master's exit status: 0, or EXIT_SEARCH_LOWEST_FAILED after a search. With
    `stop`, a SIGTERM or SIGINT ends the run through its master as `aborted` and raises
    CampaignStopped once the master and workers have ended (stop.py).
    """
    port = campaign.master_port or free_port(campaign.master_bind_host)
    with Children(log_dir) as children:
        command = (master_command(campaign, workload, run_id, port, tags) if tags
                   else master_command(campaign, workload, run_id, port))  # fmt: skip
        master = children.start("master", command, env)
        workers = {
            f"worker-{i + 1}": children.start(
                f"worker-{i + 1}", worker_command(campaign, port), env
            )
            for i in range(campaign.local_workers)
        }
        _announce(campaign, workload, run_id, port, echo)
        if stop is None:
            try:
                ended = _wait_for_master(children, master, workers, run_deadline(campaign))
            except KeyboardInterrupt:
                echo(f"interrupted: stopping run {run_id} (the master collects the events first)")
                children.stop("master", MASTER_GRACE_S)
                raise
        else:
            run_uri = join_uri(campaign.events_uri, run_id)
            grace = finish_timeout(campaign) + MASTER_GRACE_S
            with stop.watching(run_id, run_uri, master, children, grace):
                ended = _wait_for_master(children, master, workers, run_deadline(campaign), stop)
                if ended:
                    _wait_for_workers(workers)
            stop.raise_if_stopped()  # the run ended as aborted: no report, no next workload
        if not ended:
            raise CampaignError(
                f"run {run_id} did not end within {run_deadline(campaign):.0f} s; "
                f"see {children.log_path('master')}"
            )
        if stop is None:
            _wait_for_workers(workers)
        if not _completed(campaign, master.returncode):
            said = _error_lines(children.log_path("master"))  # its own words, if it said any
            tail = children.log_tail("master")
            raise CampaignError(
                f"the Locust master of run {run_id} exited with status {master.returncode}"
                + (f": {said}" if said else "")
                + f"; log {children.log_path('master')}:\n{tail}"
            )
        for name, worker in workers.items():  # a worker that failed while its master ended
            if worker.returncode not in (None, 0):
                raise CampaignError(
                    f"{name} of run {run_id} exited with status {worker.returncode}; "
                    f"log {children.log_path(name)}:\n{children.log_tail(name)}"
                )
        return int(master.returncode)


def _wait_for_workers(workers: Mapping[str, subprocess.Popen[bytes]]) -> None:
    """After the master ended: workers quit on their own within WORKER_EXIT_S (else the
    Children block stops them). Polls, so that stop signals are acted on meanwhile."""
    deadline = time.monotonic() + WORKER_EXIT_S
    while any(w.poll() is None for w in workers.values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def finish_timeout(campaign: Campaign) -> float:
    """The master's --finish-timeout (its wait for the workers' flush): `extra`, else the
    option's default."""
    extra = list(campaign.extra)
    value: object = OPTION["finish_timeout"].default
    for i, arg in enumerate(extra):
        if arg == "--finish-timeout" and i + 1 < len(extra):
            value = extra[i + 1]
        elif arg.startswith("--finish-timeout="):
            value = arg.split("=", 1)[1]
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = float(OPTION["finish_timeout"].default)
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _error_lines(log: Path) -> str:
    """The `llmload: error:` lines of a child's log, joined (at most three)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    prefix = "llmload: error: "
    said = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
    return " / ".join(said[:3])[:2000]


def _completed(campaign: Campaign, status: int | None) -> bool:
    """Whether the master's exit status means a complete run (a failed search is one)."""
    return status == 0 or (status == EXIT_SEARCH_LOWEST_FAILED and campaign.search != "off")


def _wait_for_master(
    children: Children,
    master: subprocess.Popen[bytes],
    workers: Mapping[str, subprocess.Popen[bytes]],
    timeout: float,
    stop: StopSignals | None = None,
) -> bool:
    """True when the master ended within `timeout`; a worker that fails first fails the run.

    Once a stop signal came, the master has its grace (stop.deadline) to end the run, and a
    worker's exit is left to the master to account for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < (deadline if stop is None else stop.deadline(deadline)):
        if master.poll() is not None:
            return True
        for name, worker in workers.items():
            if stop is not None and stop.requested:
                break
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
    levels = ",".join(_levels(campaign))
    if campaign.rates:
        cap = campaign.max_concurrency
        limit = f", at most {cap} in flight ({campaign.over_cap} over it)" if cap else ""
        what = f"rates {levels} requests/s ({campaign.arrival}{limit})"
    else:
        what = f"steps {levels}"
    timing = f"{campaign.step_duration:g} s (warmup {campaign.step_warmup:g} s)"
    if campaign.search == "off":
        plan = f"{what} x {timing}; about {estimated_seconds(campaign):.0f} s"
    else:
        plan = (
            f"capacity search by {campaign.search} for the SLO {campaign.slo}: coarse {what}, "
            f"then bisection; each probe {timing}, longer until "
            f"{campaign.search_min_requests} requests finished (at most "
            f"{SEARCH_PROBE_STEPS * campaign.step_duration:g} s); at most "
            f"{search_probes(campaign)} probes, {longest_seconds(campaign):.0f} s in all"
        )
    echo(f"run {run_id}: workload {workload.spec} against {campaign.target.url}; {plan}")
    if campaign.external_workers:
        echo(
            f"waiting up to {campaign.worker_wait:g} s for {campaign.expect_workers} worker(s): "
            f"start each with `locust -f locustfiles/chat.py --worker --master-host <this host> "
            f"--master-port {port}` (master bound to {campaign.master_bind_host}:{port}; "
            "`--processes N` starts N on a host, each one counts)"
        )
    else:
        echo(workers_line(campaign))


def workers_line(campaign: Campaign) -> str:
    """How many local worker processes the run starts, and why (`workers_per_host`)."""
    count = campaign.local_workers
    noun = "worker process" if count == 1 else "worker processes"
    if campaign.workers_per_host == AUTO:
        return f"{count} {noun}: one per CPU (workers_per_host: auto)"
    cpus = usable_cpus()
    shared = (f"; more than the {cpus} CPU(s) here: they share cores, so watch the report's "
              "worker_cpu_max_pct") if count > cpus else ""  # fmt: skip
    return f"{count} {noun} (workers_per_host: {campaign.workers_per_host}){shared}"


def master_command(
    campaign: Campaign,
    workload: NamedWorkload,
    run_id: str,
    port: int,
    tags: Mapping[str, Any] | None = None,
) -> list[str]:
    """The master's command line: Locust's flags, then the campaign's chat options as the
    option table writes them (table.py), then the file's `extra`. `tags` (campaign_id,
    repeat) join the metadata, top-level keys of the manifest config."""
    metadata: dict[str, Any] = {"campaign": campaign.name, "workload_name": workload.name}
    metadata.update(tags or {})
    metadata.update(campaign.engine.metadata())
    args = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--master", "--master-bind-host", campaign.master_bind_host,
        "--master-bind-port", str(port),
        "--expect-workers", str(campaign.expect_workers),
        "--expect-workers-max-wait", f"{campaign.worker_wait:g}",
        "--exit-code-on-error", "0",  # request failures are data in the report, not a failed run
        "--enable-rebalancing",  # a lost worker's users move to the others: the step keeps its load
        "--host", campaign.target.url,
    ]  # fmt: skip
    run = {"workload": workload.spec, "run_id": run_id,
           "metadata": json.dumps(metadata, sort_keys=True)}  # fmt: skip
    return [*args, *command_line({**campaign.settings(), **run}), *campaign.extra]


def _levels(campaign: Campaign) -> list[str]:
    return [f"{level:g}" for level in campaign.levels]


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
    return len(campaign.levels) * (campaign.step_duration + 0.5) + 5


def search_probes(campaign: Campaign) -> int:
    """The most probes a capacity search can run: every coarse level, then the bisection.

    Bisection between a passing level `lo` and the next coarse level `hi` halves the gap
    until it is at most precision x the last pass (>= lo), or 1 for concurrencies.
    """
    levels = sorted(campaign.levels)
    bisect = SEARCH_BISECT_PROBES
    for lo, hi in zip(levels, levels[1:], strict=False):
        if hi > lo:
            gap = (hi - lo) / (campaign.search_precision * lo)
            if campaign.mode == "concurrency":
                gap = min(gap, hi - lo)
            bisect = max(bisect, math.ceil(math.log2(max(gap, 1.0))))
    return len(levels) + bisect


def longest_seconds(campaign: Campaign) -> float:
    """The longest the steps can take: the estimate, or every search probe at its longest."""
    if campaign.search == "off":
        return estimated_seconds(campaign)
    probe = SEARCH_PROBE_STEPS * campaign.step_duration + 0.5
    return search_probes(campaign) * probe + 5


def run_deadline(campaign: Campaign) -> float:
    """When a run that has not ended counts as hung: generous, it only guards against hangs
    (a run also waits for its last step's requests in flight, at most DRAIN_TIMEOUT_S)."""
    return campaign.worker_wait + 2 * longest_seconds(campaign) + 180 + DRAIN_TIMEOUT_S


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
