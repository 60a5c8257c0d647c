"""`llmload report RUN_URI`: merge a run's events into percentile reports per concurrency step."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_NOTHING_MEASURED = 1  # no step holds a successful request: as for events that cannot be used
EXIT_SLO_FAILED = 3
EXIT_INVALID = 4  # analysis.judge.verdict.EXIT_INVALID: the run's verdict is one failed on


def parse_fail_on(spec: str | None) -> tuple[str, ...]:
    """`--fail-on-invalid` verdicts; UsageError naming an unknown one."""
    from analysis.judge.verdict import VALID, VERDICTS
    from analysis.kernel.errors import UsageError

    if spec is None:
        return ()
    named = tuple(v.strip() for v in spec.split(",") if v.strip())
    bad = [v for v in named if v not in VERDICTS or v == VALID]
    if bad or not named:
        raise UsageError(
            f"--fail-on-invalid {spec!r}: give verdicts among "
            f"{', '.join(v for v in VERDICTS if v != VALID)} (comma-separated)"
        )
    return named


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "report",
        help="merge a run's events into per-step percentile reports",
        description=(
            "Read every part of a run (s3://bucket/prefix/<run_id>, file:///path/<run_id> or a "
            "path), merge all workers exactly and write requests.parquet/.csv, summary.csv/.json, "
            "report.md and report.html. Exit 3 with --fail-on-slo when a step misses the SLO. "
            "Several runs (or --campaign): each run's report in DIR/<run_id>/, and repeats.* "
            "in DIR: per step the median across the runs and its 95% confidence interval."
        ),
    )
    parser.add_argument(
        "run_uri", metavar="RUN_URI", nargs="*",
        help="<events-uri>/<run_id>; several: repeats of one plan, each run's report in "
        "DIR/<run_id>/ and the median and confidence interval per step in DIR/repeats.*",
    )  # fmt: skip
    parser.add_argument(
        "--campaign", metavar="ID", default=None,
        help="report the runs of this campaign id (printed by `llmload campaign`, manifest "
        "config campaign_id) as repeats; with --events-uri",
    )  # fmt: skip
    parser.add_argument(
        "--events-uri", metavar="URI", default=None, help="with --campaign: where its runs are"
    )
    parser.add_argument(
        "--resamples", type=int, default=1000, metavar="N",
        help="repeats: bootstrap resamples per step (default 1000)",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N",
        help="repeats: seed of the bootstrap (default 0; the same seed, the same intervals)",
    )  # fmt: skip
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
        "--validity",
        metavar="SPEC",
        default=None,
        help="limits of the validity verdict, e.g. cpu=80,lag_ms=5,slip_ms=10,stalled=0.05,"
        "moved=5,overload=0.01 (those are the defaults; docs/reports.md, Verdicts)",
    )
    parser.add_argument(
        "--fail-on-invalid",
        nargs="?",
        const="incomplete,client-limited,failed",  # analysis.judge.verdict.INVALID (a test)
        default=None,
        metavar="VERDICTS",
        help="exit 4 when the run's verdict is one of VERDICTS (default when given alone: "
        "incomplete,client-limited,failed; add server-overloaded to fail on it too)",
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
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="threads of the analysis engine (default: the machine's cores); every one works "
        "under the one --memory-limit",
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
    from analysis.kernel.slo import parse_slo
    from analysis.render.build import build_report
    from analysis.render.present import step_table
    from analysis.render.report_md import md_table
    from analysis.report.summary import CSV_ROWS

    slo = parse_slo(args.slo)  # a bad spec fails before anything is read or written
    fail_on = parse_fail_on(args.fail_on_invalid)
    if args.fail_on_slo and not slo.objectives:
        from analysis.kernel.errors import UsageError

        raise UsageError("--fail-on-slo needs step objectives; add e.g. --slo ttft_p99=0.5")
    if len(args.run_uri) != 1 or args.campaign or args.events_uri:  # report_repeats.py
        from infra.commands.report_repeats import report_repeats

        return report_repeats(args, fail_on)
    args.run_uri = args.run_uri[0]
    run_id = args.run_uri.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    out = args.out or f"llmload-report-{run_id}"
    if args.csv_rows is not None and args.csv_rows < 0:
        from analysis.kernel.errors import UsageError

        raise UsageError(f"--csv-rows must be >= 0 (0: always write requests.csv), not "
                         f"{args.csv_rows}")  # fmt: skip
    csv_rows = CSV_ROWS if args.csv_rows is None else args.csv_rows
    from analysis.read.engine import DEFAULT_MEMORY_LIMIT

    report = build_report(args.run_uri, out, slo, html=not args.no_html, progress=not args.quiet,
                          csv_rows=csv_rows, in_memory=args.in_memory,
                          memory_limit=args.memory_limit or DEFAULT_MEMORY_LIMIT,
                          spill_dir=args.spill_dir, by=args.by, jobs=args.jobs,
                          validity=args.validity)  # fmt: skip
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
    verdict = report.verdict
    if verdict is not None and not args.quiet:
        print(f"verdict: {verdict.line}")
    if not any((row.get("ok") or 0) > 0 for row in report.step_rows):
        sent = sum(int(row.get("requests") or 0) for row in report.step_rows)
        print(f"llmload: error: run {run_id}: no step holds a successful request ({sent} "
              f"request(s) in the steps' windows): nothing was measured; {out}/report.md "
              "says why", file=sys.stderr)  # fmt: skip
        return EXIT_NOTHING_MEASURED
    if verdict is not None and verdict.failed(fail_on):
        print(f"llmload: the run's verdict is {verdict.verdict} (--fail-on-invalid)",
              file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    if args.fail_on_slo and report.slo_failed:
        failing = [str(r["step"]) for r in report.step_rows if r["slo_pass"] is False]
        print(f"llmload: SLO failed in step(s) {', '.join(failing)}", file=sys.stderr)
        return EXIT_SLO_FAILED
    return 0
