"""`llmload report RUN_URI`: merge a run's events into percentile reports per concurrency step."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_SLO_FAILED = 3


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "report",
        help="merge a run's events into per-step percentile reports",
        description=(
            "Read every part of a run (s3://bucket/prefix/<run_id>, file:///path/<run_id> or a "
            "path), merge all workers exactly and write requests.parquet/.csv, summary.csv/.json, "
            "report.md and report.html. Exit 3 with --fail-on-slo when a step misses the SLO."
        ),
    )
    parser.add_argument("run_uri", metavar="RUN_URI", help="<events-uri>/<run_id>")
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="output directory (default: ./llmload-report-<run_id>)",
    )
    parser.add_argument(
        "--slo",
        metavar="SPEC",
        default=None,
        help="objectives, e.g. ttft_p99=0.5,tpot_p50=0.05,e2e_p99=10 and per-request goodput "
        "thresholds such as ttft=1,tpot=0.1 (docs/reports.md)",
    )
    parser.add_argument(
        "--fail-on-slo", action="store_true", help="exit 3 when a step misses the SLO"
    )
    parser.add_argument(
        "--by",
        choices=("model",),
        default=None,
        help="split every summary row, table and plot: model (one row per step and model "
        "of a --model a:0.7,b:0.3 run)",
    )
    parser.add_argument("--no-html", action="store_true", help="skip report.html (and its plots)")
    parser.add_argument("--quiet", action="store_true", help="no progress line, no summary")
    parser.add_argument(
        "--memory-limit",
        default=None,
        metavar="SIZE",
        help="memory the analysis engine may hold, e.g. 2GB (the default); beyond it it spills "
        "to --spill-dir",
    )
    parser.add_argument(
        "--spill-dir",
        default=None,
        metavar="DIR",
        help="where the engine spills (default: a temporary folder, removed afterwards)",
    )
    parser.add_argument(
        "--in-memory",
        action="store_true",
        help="load every chunk and compute with numpy instead of the out-of-core engine "
        "(the reference path: the same figures; needs memory for the whole run)",
    )
    parser.add_argument(
        "--csv-rows",
        type=int,
        default=None,
        metavar="N",
        help="write requests.csv only up to N requests (default 1,000,000; 0: always); "
        "requests.parquet holds every request",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from analysis.build import build_report
    from analysis.present import step_table
    from analysis.report import CSV_ROWS
    from analysis.report_md import md_table
    from analysis.slo import parse_slo

    slo = parse_slo(args.slo)  # a bad spec fails before anything is read or written
    if args.fail_on_slo and not slo.objectives:
        from analysis.errors import UsageError

        raise UsageError("--fail-on-slo needs step objectives; add e.g. --slo ttft_p99=0.5")
    run_id = args.run_uri.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    out = args.out or f"llmload-report-{run_id}"
    if args.csv_rows is not None and args.csv_rows < 0:
        from analysis.errors import UsageError

        raise UsageError(f"--csv-rows must be >= 0 (0: always write requests.csv), not "
                         f"{args.csv_rows}")  # fmt: skip
    csv_rows = CSV_ROWS if args.csv_rows is None else args.csv_rows
    from analysis.engine import DEFAULT_MEMORY_LIMIT

    report = build_report(args.run_uri, out, slo, html=not args.no_html, progress=not args.quiet,
                          csv_rows=csv_rows, in_memory=args.in_memory,
                          memory_limit=args.memory_limit or DEFAULT_MEMORY_LIMIT,
                          spill_dir=args.spill_dir, by=args.by)  # fmt: skip
    for warning in report.warnings:
        print(f"llmload: warning: {warning}", file=sys.stderr)
    if not args.quiet:
        print(md_table(*step_table(report)))
        if report.slo.objectives:  # --slo, or the run's own (a search's)
            rate_run = any(r.get("mode") == "rate" for r in report.step_rows)
            best = report.best_rate if rate_run else report.best_concurrency
            level = "rate (requests/s)" if rate_run else "concurrency"
            print(f"highest {level} meeting the SLO: {best if best is not None else 'none'}")
        print(f"report written to {out}/ ({', '.join(report.files)})")
    if args.fail_on_slo and report.slo_failed:
        failing = [str(r["step"]) for r in report.step_rows if r["slo_pass"] is False]
        print(f"llmload: SLO failed in step(s) {', '.join(failing)}", file=sys.stderr)
        return EXIT_SLO_FAILED
    return 0
