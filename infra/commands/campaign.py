"""`llmload campaign CONFIG`: run the campaign a YAML/TOML file describes, then report it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXIT_SLO_FAILED = 3
"""fail_on_slo and a step missed the SLO, or a capacity search's lowest level missed it."""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "campaign",
        help="run a load campaign described by a YAML or TOML file, then report it",
        description=(
            "Validate the campaign file (docs/campaign-config.md), start a Locust master and "
            "its local workers (or wait for external ones), run every workload in turn, and "
            "write one report per run. Exit 2 on an invalid file (nothing started), 3 when "
            "fail_on_slo is set and a step misses the SLO, or when a capacity search finds "
            "that even its lowest level misses the SLO (after every workload ran)."
        ),
    )
    parser.add_argument("config", metavar="CONFIG", type=Path, help="campaign file (.yaml, .toml)")
    parser.add_argument(
        "--out", metavar="DIR", type=Path, default=None,
        help="reports go to DIR/<run_id>/ (default: the file's report_dir)",
    )  # fmt: skip
    parser.add_argument(
        "--validate", action="store_true", help="only check the file, start nothing"
    )
    parser.add_argument(
        "--repeat", metavar="N", type=int, default=None,
        help="run each workload N times (new run ids, one campaign id), then write the "
        "median and confidence interval per step to DIR/repeats-<workload>/ (overrides the "
        "file's repeat)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", metavar="auto|N", default=None,
        help="start N local worker processes, or 'auto': one per CPU this process may use "
        "(overrides the file's workers_per_host, external included)",
    )  # fmt: skip
    parser.add_argument(
        "--resume", action="store_true",
        help="engine sweep: skip the configurations an interrupted try of this sweep finished "
        "(its state: DIR/sweep-<name>/sweep-state.json)",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from infra.campaign import CampaignStopped, load_campaign, run_campaign
    from infra.campaign.extra import check_extra
    from infra.campaign.procs import sigterm_interrupts

    campaign = load_campaign(args.config)
    if args.repeat is not None:
        campaign = _with_repeat(campaign, args.repeat)
    if args.workers is not None:
        campaign = _with_workers(campaign, args.workers)
    from locustfiles.options.table import command_line

    written = command_line({**campaign.settings(), "workload": campaign.workload[0].spec})
    check_extra(campaign.extra, str(args.config), tuple(written))  # before anything starts
    out_root = args.out or Path(campaign.report_dir)
    check_report_dir(out_root, str(args.config))
    if args.validate:
        names = ", ".join(w.name for w in campaign.workload)
        configs = (f"; engine sweep of {len(campaign.engine.plan())} configuration(s)"
                   if campaign.engine.is_sweep else "")  # fmt: skip
        print(f"{args.config}: valid ({len(campaign.workload)} workload(s): {names}{configs})")
        return 0
    if args.resume and not campaign.engine.is_sweep:
        from analysis.kernel.errors import UsageError

        raise UsageError(f"--resume continues an engine sweep; {args.config} has no "
                         "engine.command or engine.configurations (docs/sweeps.md)")  # fmt: skip
    try:
        with sigterm_interrupts():
            if campaign.engine.is_sweep:
                return _sweep(campaign, out_root, args.resume)
            results = run_campaign(campaign, out_root, echo=_echo)
    except CampaignStopped as stop:  # the run ended aborted, its events kept (its line said)
        return stop.exit_status  # 143 SIGTERM, 130 SIGINT
    return _outcome(campaign, results)


def _sweep(campaign: Any, out_root: Path, resume: bool) -> int:
    """An engine sweep (infra/campaign/sweep.py): exit 1 when a configuration did not
    complete its plan (the report holds the others), else as a campaign's runs say."""
    from infra.campaign.sweep import run_sweep, sweep_failed

    outcome = run_sweep(campaign, out_root, echo=_echo, resume=resume)
    status = _outcome(campaign, outcome.results)
    if sweep_failed(outcome):
        bad = [f"{name} ({r['status'].replace('_', ' ')})"
               for name, r in outcome.state["configurations"].items() if r["status"] != "done"]  # fmt: skip
        print(f"llmload: sweep: configuration(s) that did not complete: {', '.join(bad)}",
              file=sys.stderr)  # fmt: skip
        return 1
    return status


def _outcome(campaign: Any, results: list[Any]) -> int:
    """Each run's warnings and summary line; the exit status its SLO outcomes give."""
    from infra.campaign.report import describe, failing_steps

    failed, lowest_failed = [], []
    for result in results:
        for warning in result.report.warnings:
            print(f"llmload: warning: {warning}", file=sys.stderr)
        print(describe(result.report, label=f"workload {result.workload.name}: "), flush=True)
        if result.report.slo_failed:
            failed.append(f"{result.run_id} (step(s) {', '.join(failing_steps(result.report))})")
        if result.lowest_failed:
            lowest_failed.append(result.run_id)
    status = 0
    if campaign.fail_on_slo and failed:
        print(f"llmload: SLO failed in {'; '.join(failed)}", file=sys.stderr)
        status = EXIT_SLO_FAILED
    if lowest_failed:
        print(
            "llmload: capacity search: even the lowest level missed the SLO in "
            f"{'; '.join(lowest_failed)}",
            file=sys.stderr,
        )
        status = EXIT_SLO_FAILED
    return status


def _with_repeat(campaign: Any, repeat: int) -> Any:
    """The campaign with `--repeat N` in place of its file's `repeat`; UsageError when N is
    not 1..MAX_REPEAT."""
    import dataclasses

    from analysis.kernel.errors import UsageError
    from infra.campaign.config import MAX_REPEAT

    if not 1 <= repeat <= MAX_REPEAT:
        raise UsageError(f"--repeat must be between 1 and {MAX_REPEAT}, not {repeat}")
    return dataclasses.replace(campaign, repeat=repeat)


def _with_workers(campaign: Any, text: str) -> Any:
    """The campaign with `--workers auto|N` in place of its file's workers_per_host;
    UsageError for anything else (0, -1, 'many', 'external')."""
    import dataclasses

    from analysis.kernel.errors import UsageError
    from infra.campaign.config import EXTERNAL, workers_setting

    try:
        workers = workers_setting(text)
    except UsageError:
        workers = EXTERNAL  # refused below, with the one line --workers says
    if workers == EXTERNAL:
        raise UsageError(
            f"--workers must be 'auto' (one per CPU) or a number of local worker processes "
            f">= 1, not {text!r} (external workers: workers_per_host: external in the file)"
        )
    return dataclasses.replace(campaign, workers_per_host=workers)


def _echo(line: str) -> None:
    print(f"llmload campaign: {line}", flush=True)


def check_report_dir(path: Path, source: str) -> None:
    """The campaign's report folder can be made: its nearest existing ancestor is a folder
    that takes a new entry (tried with a temporary folder, removed at once). UsageError
    otherwise, before anything starts (`report_dir: /proc/nope` was a traceback after the
    first run)."""
    import tempfile

    from analysis.kernel.errors import UsageError

    ancestor = path.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    reason = f"{ancestor} is not a folder"
    if ancestor.is_dir():
        try:
            Path(tempfile.mkdtemp(prefix=".llmload-check-", dir=ancestor)).rmdir()
            return
        except OSError as exc:
            reason = f"{ancestor}: {exc.strerror or exc}"
    raise UsageError(
        f"{source}: report_dir {path} cannot be made ({reason}); give a folder you can write"
    )
