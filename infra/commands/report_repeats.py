"""`llmload report` given several runs or `--campaign ID`: each run's report, then repeats.

    status = report_repeats(args)     # from infra/commands/report.py, args already checked

Each run's normal report goes to `<out>/<run_id>/`, summarised in memory (the bootstrap
resamples every request's values, ITL's per token); the repeats report (analysis/compare/repeats.py)
goes to `<out>/`, or with a campaign of several workloads to `<out>/repeats-<workload>/`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.kernel.errors import UsageError


def run_uris(args: argparse.Namespace) -> dict[str, list[str]]:
    """The runs to report, by workload name ("" for runs given by URI)."""
    if args.campaign is None:
        if args.events_uri is not None:
            raise UsageError("--events-uri goes with --campaign ID (where to find its runs)")
        if not args.run_uri:
            raise UsageError("give a RUN_URI (or several), or --campaign ID --events-uri URI")
        return {"": list(args.run_uri)}
    if args.run_uri:
        raise UsageError("give RUN_URIs or --campaign, not both")
    if not args.events_uri:
        raise UsageError("--campaign needs --events-uri URI: where the campaign's runs are")
    from analysis.compare.repeats import campaign_runs

    return campaign_runs(args.events_uri, args.campaign)


def report_repeats(args: argparse.Namespace, fail_on: tuple[str, ...] = ()) -> int:
    """Report every run, then the repeats of each workload's runs; exit status 0, 3 (a step
    of some run missed the SLO, with --fail-on-slo) or 4 (a run's verdict is in `fail_on`)."""
    from analysis.compare.bootstrap import SLICES
    from analysis.compare.repeats import summarize_repeats
    from analysis.compare.repeats_report import step_table, write_repeats
    from analysis.kernel.slo import parse_slo
    from analysis.read.engine import DEFAULT_MEMORY_LIMIT
    from analysis.render.build import build_report
    from analysis.render.report_md import md_table
    from analysis.report.summary import CSV_ROWS

    if args.resamples < 1:
        raise UsageError(f"--resamples must be >= 1, not {args.resamples}")
    if args.csv_rows is not None and args.csv_rows < 0:
        raise UsageError(f"--csv-rows must be >= 0 (0: always write requests.csv), not "
                         f"{args.csv_rows}")  # fmt: skip
    csv_rows = CSV_ROWS if args.csv_rows is None else args.csv_rows
    slo = parse_slo(args.slo)
    groups = run_uris(args)
    name = args.campaign or "repeats"
    out = Path(args.out or f"llmload-report-{name}")
    failed, invalid = [], []
    for workload, uris in groups.items():
        reports = []
        for uri in uris:
            run_id = uri.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            report = build_report(uri, out / run_id, slo, html=not args.no_html,
                                  progress=not args.quiet, csv_rows=csv_rows,
                                  by=args.by, validity=args.validity,
                                  memory_limit=args.memory_limit or DEFAULT_MEMORY_LIMIT,
                                  spill_dir=args.spill_dir, jobs=args.jobs,
                                  in_memory=args.in_memory, bootstrap=(SLICES, args.seed))  # fmt: skip
            reports.append(report)
            for warning in report.warnings:
                print(f"llmload: warning: {run_id}: {warning}", file=sys.stderr)
            verdict = report.verdict
            if verdict is not None and verdict.failed(fail_on):
                invalid.append(f"{report.run_id} ({verdict.verdict})")
            failed += [f"{report.run_id} step {r['step']}" for r in report.step_rows
                       if r["slo_pass"] is False]  # fmt: skip
        repeats = summarize_repeats(reports, resamples=args.resamples, seed=args.seed)
        where = out / f"repeats-{workload}" if len(groups) > 1 else out
        files = write_repeats(repeats, where, html=not args.no_html)
        for warning in repeats.warnings:
            print(f"llmload: warning: {warning}", file=sys.stderr)
        if not args.quiet:
            label = f" (workload {workload})" if workload else ""
            print(f"repeats of {len(reports)} runs{label}: median [{repeats.confidence:.0%} "
                  "interval]")  # fmt: skip
            print(md_table(*step_table(repeats)))
            print(f"repeats written to {where}/ ({', '.join(files)}); each run's report "
                  f"in {out}/<run_id>/")  # fmt: skip
    if invalid:
        print(f"llmload: the verdict of {'; '.join(invalid)} (--fail-on-invalid)",
              file=sys.stderr)  # fmt: skip
        return 4
    if args.fail_on_slo and failed:
        print(f"llmload: SLO failed in {'; '.join(failed)}", file=sys.stderr)
        return 3
    return 0
