"""`llmload sweep`: the sweep report (Pareto front, best configuration, verdicts) again.

    llmload sweep llmload-reports/sweep-demo                 # a campaign's sweep folder
    llmload sweep a=s3://b/runs/r1 b=s3://b/runs/r2 --slo tpot_p99=0.1 --out sweep-ab

From a sweep folder (or its sweep-state.json) it rebuilds the report the campaign wrote,
with another `--slo` if given; from NAME=RUN_URI pairs it compares any runs of one plan as
configurations (runs of engines started by hand, or of two campaigns).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from analysis.kernel.errors import UsageError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "sweep",
        help="build an engine sweep's report: Pareto front, best configuration, verdicts",
        description=(
            "Build the sweep report (docs/sweeps.md) from a sweep folder written by "
            "`llmload campaign` (or its sweep-state.json), or from NAME=RUN_URI pairs, one per "
            "configuration. Writes sweep.md, sweep.html, sweep.json, sweep.csv and "
            "sweep-pareto.svg."
        ),
    )
    parser.add_argument("source", nargs="+", metavar="FOLDER|NAME=RUN_URI",
                        help="a sweep folder or its sweep-state.json; or NAME=RUN_URI pairs")  # fmt: skip
    parser.add_argument("--slo", default=None, help="judge every run by this SLO (--slo syntax)")
    parser.add_argument("--accelerators", action="append", default=[], metavar="NAME=N",
                        help="accelerators of a configuration given by NAME=RUN_URI (repeatable)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the report (default: the sweep folder, or llmload-sweep)")  # fmt: skip
    parser.add_argument("--resamples", type=int, default=None, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=None, help="bootstrap seed")
    parser.set_defaults(handler=run)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise UsageError(f"{what} must be NAME=VALUE, not {value!r}")
        if name in out:
            raise UsageError(f"{what}: configuration {name!r} given twice")
        out[name] = rest
    return out


def _state(source: Path) -> dict[str, Any]:
    from infra.campaign.sweep import STATE_FILE

    path = source / STATE_FILE if source.is_dir() else source
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a sweep state ({exc}); give a sweep folder written by "
                         "`llmload campaign`, or NAME=RUN_URI pairs") from None  # fmt: skip


def run(args: argparse.Namespace) -> int:
    import analysis.compare.bootstrap as bootstrap
    from analysis.compare.sweep import SweepEntry, build_sweep
    from analysis.compare.sweep_report import write_sweep
    from analysis.kernel.slo import parse_slo
    from infra.campaign.sweep import entries_of

    parse_slo(args.slo)  # a bad SLO: one line, before anything is read
    resamples = bootstrap.RESAMPLES if args.resamples is None else args.resamples
    seed = bootstrap.SEED if args.seed is None else args.seed
    if len(args.source) == 1 and "=" not in args.source[0]:
        if args.accelerators:
            raise UsageError("--accelerators goes with NAME=RUN_URI pairs; a sweep folder "
                             "records each configuration's")  # fmt: skip
        source = Path(args.source[0])
        state = _state(source)
        entries = entries_of(state)
        name = str(state.get("name", "sweep"))
        out = args.out or (source if source.is_dir() else source.parent)
    else:
        runs = _pairs(args.source, "each run")
        counts = _pairs(args.accelerators, "--accelerators")
        unknown = set(counts) - set(runs)
        if unknown:
            raise UsageError(f"--accelerators names no given configuration: {sorted(unknown)}")
        entries = []
        for config, uri in runs.items():
            try:
                n = int(counts.get(config, "0"))
            except ValueError:
                n = -1
            if n < 0:
                raise UsageError(f"--accelerators {config}=... must be a count >= 0")
            entries.append(SweepEntry(config, uri, accelerators=n, run_id=uri.rstrip("/")
                                      .rsplit("/", 1)[-1]))  # fmt: skip
        name = "sweep"
        out = args.out or Path("llmload-sweep")
    sweep = build_sweep(entries, args.slo, name=name, resamples=resamples, seed=seed)
    files = write_sweep(sweep, out)
    for workload in sweep.workloads:
        for line in sweep.headlines(workload):
            print(f"llmload sweep: {workload}: {line}")
    for warning in sweep.warnings:
        print(f"llmload sweep: warning: {warning}")
    print(f"llmload sweep: report {files['sweep.md']}")
    return 0
