"""`llmload compare RUN_A RUN_B`: per-step changes from baseline A to candidate B."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_REGRESSION = 3


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare two runs step by step and flag regressions",
        description=(
            "Compare run B against baseline A (each a RUN_URI or a report directory holding "
            "summary.json), per step and metric. Exit 3 with --fail-on-regression when a "
            "metric regressed beyond the threshold."
        ),
    )
    parser.add_argument("run_a", metavar="RUN_A", help="baseline: RUN_URI or report directory")
    parser.add_argument("run_b", metavar="RUN_B", help="candidate: RUN_URI or report directory")
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
        "--fail-on-regression", action="store_true", help="exit 3 when anything regressed"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from analysis.compare import compare_runs, render_comparison_markdown, write_comparison

    result = compare_runs(
        args.run_a,
        args.run_b,
        threshold=args.threshold,
        error_rate_threshold=args.error_rate_threshold,
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
