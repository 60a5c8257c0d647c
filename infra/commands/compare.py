"""`llmload compare RUN_A RUN_B`: per-step changes from baseline A to candidate B."""

from __future__ import annotations

import argparse
import sys
from typing import Any

METHODS = ("bootstrap", "threshold")  # analysis.compare.runs.METHODS (not imported: no pandas here)

EXIT_REGRESSION = 3


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare two runs step by step and flag regressions",
        description=(
            "Compare run B against baseline A per step and metric. By default (--method "
            "bootstrap) each side is a RUN_URI: A and B are resampled, and a figure regresses "
            "when the 95%% interval of its relative change excludes 0 and the change exceeds "
            "--threshold; figures with too few requests are 'not enough data'. --method "
            "threshold compares summaries only (a RUN_URI or a report directory holding "
            "summary.json). Exit 3 with --fail-on-regression when a metric regressed."
        ),
    )
    parser.add_argument(
        "run_a", metavar="RUN_A", help="baseline: RUN_URI (or report directory: --method threshold)"
    )
    parser.add_argument(
        "run_b",
        metavar="RUN_B",
        help="candidate: RUN_URI (or report directory: --method threshold)",
    )
    parser.add_argument(
        "--out", metavar="DIR", default=None, help="write compare.md/.csv/.json here"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.10,
        metavar="FRACTION",
        help="relative change that counts as a regression (default 0.10: 10%%)",
    )
    parser.add_argument(
        "--error-rate-threshold",
        type=float,
        default=0.01,
        metavar="FRACTION",
        help="error-rate increase (absolute) that counts as a regression (default 0.01)",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default=METHODS[0],
        help="bootstrap: significant changes, from each request's values (default); "
        "threshold: the observed change against --threshold alone, from the summaries",
    )
    parser.add_argument(
        "--resamples",
        type=int,
        default=None,
        metavar="N",
        help="bootstrap resamples per run and step (default 1000)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="seed of the bootstrap's resamples: the same seed, the same intervals (default 0)",
    )
    parser.add_argument(
        "--fail-on-regression", action="store_true", help="exit 3 when anything regressed"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from analysis.compare.bootstrap import RESAMPLES, SEED
    from analysis.compare.runs import compare_runs, render_comparison_markdown, write_comparison
    from analysis.report.summary import check_out_dir

    if args.out:
        check_out_dir(args.out)  # before the comparison prints anything
    result = compare_runs(
        args.run_a,
        args.run_b,
        threshold=args.threshold,
        error_rate_threshold=args.error_rate_threshold,
        method=args.method,
        resamples=RESAMPLES if args.resamples is None else args.resamples,
        seed=SEED if args.seed is None else args.seed,
    )
    for warning in result.warnings:
        print(f"llmload: warning: {warning}", file=sys.stderr)
    print(render_comparison_markdown(result))
    if args.out:
        files = write_comparison(result, args.out)
        print(f"comparison written to {args.out}/ ({', '.join(files)})")
    if args.fail_on_regression and result.regressions:
        print(f"llmload: {len(result.regressions)} regression(s)", file=sys.stderr)
        return EXIT_REGRESSION
    return 0
