"""`llmload demo`: the embedded end-to-end campaign (store + simulated engine + Locust + report).

Starts SeaweedFS and `llmload sim` on free 127.0.0.1 ports, runs a campaign (a Locust master
and two workers) whose events go to the store over S3, reports it and prints the step table.
Everything it started is stopped on the way out, Ctrl-C and failures included. The numbers
come from a simulated engine and are labelled so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.campaign import Campaign

SIM_PROFILE = "8b-1gpu"
WORKLOAD = "0.7*D(128,64)+0.3*U(256,1024)/(32,128)"
SIM_START_TIMEOUT_S = 20.0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="run the embedded demo campaign end to end (simulated engine, ~1-2 minutes)",
        description=(
            "Start a local S3 store (SeaweedFS) and the simulated engine, run a Locust master "
            "with 2 workers over steps 1,2,4,8,16, report the run and print the step table. "
            "Every number comes from a SIMULATED engine, not real inference."
        ),
    )
    parser.add_argument(
        "--out", metavar="DIR", type=Path, default=Path("llmload-demo"),
        help="the report goes to DIR/<run_id>/ (default: ./llmload-demo)",
    )  # fmt: skip
    hidden = argparse.SUPPRESS  # knobs for tests and the curious; the defaults make the demo
    parser.add_argument("--steps", default="1,2,4,8,16", help=hidden)
    parser.add_argument("--step-duration", type=float, default=8.0, help=hidden)
    parser.add_argument("--step-warmup", type=float, default=2.0, help=hidden)
    parser.add_argument("--cold-requests", type=int, default=3, help=hidden)
    parser.add_argument("--workers", type=int, default=2, help=hidden)
    parser.add_argument("--workload", default=WORKLOAD, help=hidden)
    parser.add_argument("--profile", default=SIM_PROFILE, help=hidden)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from infra.campaign import Target, run_campaign
    from infra.campaign.procs import Children, shielded, sigterm_interrupts
    from infra.campaign.report import describe
    from infra.store import LocalStore

    began = time.monotonic()
    campaign = _campaign(args)  # a bad flag stops here, before anything is created
    workdir = Path(tempfile.mkdtemp(prefix="llmload-demo-"))
    print(
        f"llmload demo: SIMULATED engine (llmload sim, profile {args.profile}): the numbers "
        "below describe llmload and the simulator, not real inference performance.",
        flush=True,
    )
    keep = False  # the store's and simulator's logs, kept when something failed
    stack = contextlib.ExitStack()
    try:
        with sigterm_interrupts():
            store = stack.enter_context(LocalStore(workdir / "store", environ={}))
            _echo(f"S3 store (SeaweedFS) on {store.endpoint_url}")
            sim = stack.enter_context(Children(workdir / "logs"))
            url = _start_sim(sim, workdir, args.profile)
            _echo(f"simulated engine on {url}")
            campaign = replace(
                campaign,
                target=Target(url=url),
                events_uri=store.events_uri("runs"),
                extra=("--spool-dir", str(workdir / "spool")),
            )
            results = run_campaign(campaign, args.out, env=store.env(), echo=_echo)
    except Exception:
        keep = True
        raise
    finally:
        with shielded():
            stack.close()
            if keep:
                print(f"llmload demo: store and simulator logs kept in {workdir}", file=sys.stderr)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    report = results[0].report
    for warning in report.warnings:
        print(f"llmload: warning: {warning}", file=sys.stderr)
    print(describe(report))
    _echo(f"done in {time.monotonic() - began:.0f} s; every process it started has stopped")
    return 0


def _campaign(args: argparse.Namespace) -> Campaign:
    """The demo's campaign, checked like a campaign file (a bad flag: one line, exit 2)."""
    from infra.campaign import parse_campaign

    return parse_campaign(
        {
            "name": "demo",
            "target": {"url": "http://127.0.0.1:8000"},  # replaced by the simulator's
            "workload": [{"name": "mixed", "spec": args.workload}],
            "steps": args.steps,
            "step_duration": args.step_duration,
            "step_warmup": args.step_warmup,
            "cold_requests": args.cold_requests,
            "events_uri": "s3://llmload/runs",  # replaced by the store's
            "workers": args.workers,
            "worker_wait": 30,
            "engine": {
                "model_full_name": f"llmload-sim-{args.profile} (simulated)",
                "hardware": f"none: simulated engine (llmload sim --profile {args.profile})",
            },
        },
        source="llmload demo",
    )


def _start_sim(children: Any, workdir: Path, profile: str) -> str:
    from infra.campaign.runner import CampaignError

    port_file = workdir / "sim.port"
    cmd = [sys.executable, "-m", "infra", "sim", "--port", "0", "--port-file", str(port_file),
           "--profile", profile]  # fmt: skip
    proc = children.start("sim", cmd, {**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + SIM_START_TIMEOUT_S
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise CampaignError(f"the simulated engine did not start: {children.log_tail('sim')}")
        time.sleep(0.05)
    return f"http://127.0.0.1:{int(port_file.read_text().strip())}"


def _echo(line: str) -> None:
    print(f"llmload demo: {line}", flush=True)
