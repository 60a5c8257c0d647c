"""The campaign's report step: build a run's report and say what it found.

report = report_run(run_uri, out_dir, slo)        # files in out_dir, as `llmload report`
print(describe(report))                           # step table, SLO verdict, report path
aborted_line(report)                              # "ABORTED: ... stopped by SIGTERM", or None
search_line(report)                               # what a capacity search found, or None
repeats_reports([(workload, run_uri), ...], out_root, slo)  # each workload's repeats report
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis.render.build import build_report
from analysis.render.present import SIMULATED_BANNER, step_table
from analysis.render.report_md import md_table
from analysis.report.summary import Report


def report_run(run_uri: str, out_dir: Path, slo: str) -> Report:
    return build_report(run_uri, out_dir, slo or None, html=True, progress=False)


def repeats_reports(runs: Sequence[tuple[str, str]], out_root: Path, slo: str) -> list[str]:
    """The repeats report of each workload's runs (`runs`: workload name, run URI), written to
    `<out_root>/repeats-<workload>/`; one line per report saying where, and what it found
    that a reader must know (steps left out, figures without an interval)."""
    from analysis.compare.repeats import repeats_of
    from analysis.compare.repeats_report import write_repeats

    by: dict[str, list[str]] = {}
    for workload, uri in runs:
        by.setdefault(workload, []).append(uri)
    lines = []
    for workload, uris in by.items():
        repeats = repeats_of(uris, slo or None)
        where = out_root / f"repeats-{workload}"
        files = write_repeats(repeats, where)
        main = files.get("repeats.html") or files["repeats.md"]
        lines.append(f"workload {workload}: repeats of {len(uris)} runs (median and "
                     f"{repeats.confidence:.0%} interval per step): {main.resolve()}")  # fmt: skip
        lines += [f"warning: {w}" for w in repeats.warnings]
    return lines


def describe(report: Report, label: str = "") -> str:
    """What a person reads after a run: the per-step table, labelled when simulated."""
    lines = []
    heading = f"{label}run {report.run_id}"
    if report.simulated:
        lines += [f"{heading}: SIMULATED engine", SIMULATED_BANNER]
    else:
        lines.append(heading)
    aborted = aborted_line(report)
    if aborted is not None:
        lines.append(aborted)
    lines.append(md_table(*step_table(report)))
    if report.verdict is not None:  # the validity verdict (analysis/judge/verdict.py)
        lines.append(f"verdict: {report.verdict.line}")
    search = search_line(report)
    if search is not None:
        lines.append(search)
    elif report.slo.objectives:
        verdict = "FAILED" if report.slo_failed else "met"
        lines.append(f"SLO {verdict}; {_best_level(report)}")
    main = report.files.get("report.html") or report.files.get("report.md")
    lines.append(f"report: {Path(main).resolve() if main else 'not written'}")
    return "\n".join(lines)


def aborted_line(report: Report) -> str | None:
    """One line when the run was stopped before its plan ended (None: it was not)."""
    if report.manifest.get("status") != "aborted":
        return None
    by = report.manifest.get("stopped_by")
    how = f"stopped by {by}" if by else "stopped"
    return f"ABORTED: the run was {how} before its last step ended; its last step is cut short"


def failing_steps(report: Report) -> list[str]:
    return [str(r["step"]) for r in report.step_rows if r["slo_pass"] is False]


def search_block(report: Report) -> dict[str, Any] | None:
    """The run's capacity search as the manifest records it (None: the run had no search)."""
    block = report.manifest.get("search")
    return dict(block) if isinstance(block, Mapping) else None


def search_line(report: Report) -> str | None:
    """One line: the highest level a capacity search found meeting the SLO (None: no search)."""
    block = search_block(report)
    if block is None:
        return None
    mode = str(block.get("mode") or "level")
    slo = block.get("slo") or report.slo.spec
    status = block.get("status")
    result = block.get("result")
    best = result.get("level") if isinstance(result, Mapping) else None
    if status == "lowest_failed":
        probes = block.get("probes") or []
        first = probes[0] if probes and isinstance(probes[0], Mapping) else {}
        lowest = level_text(mode, first.get("level"))
        misses = "; ".join(str(f) for f in first.get("failures") or [])
        why = f" ({misses})" if misses else ""
        return f"capacity search: even the lowest level ({lowest}) missed the SLO {slo}{why}"
    line = f"capacity search: highest {mode} meeting the SLO: {level_text(mode, best)}"
    if status == "found":
        return line
    if status == "all_passed":
        return f"{line} (the highest level tried: the capacity is above it; add higher levels)"
    return f"{line} so far: the search did not finish (status {status})"


def level_text(mode: str, level: Any) -> str:
    """A level as people read it: `8` (concurrency), `2.5 requests/s` (rate), `none`."""
    if not isinstance(level, int | float):
        return "none"
    return f"{level:g} requests/s" if mode == "rate" else f"{level:g}"


def _best_level(report: Report) -> str:
    """The highest level whose step meets every objective: a rate in open-loop runs."""
    rows = report.step_rows
    if any(r.get("mode") == "rate" for r in rows):
        rates = [r.get("rate") for r in rows if r["slo_pass"] is True]
        best = max((float(x) for x in rates if isinstance(x, int | float)), default=None)
        return f"highest rate meeting it: {level_text('rate', best)}"
    concurrency = report.best_concurrency
    return f"highest concurrency meeting it: {concurrency if concurrency is not None else 'none'}"
