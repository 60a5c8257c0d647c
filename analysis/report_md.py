"""report.md: the run's facts, SLO verdict, capacity search, per-step table and warnings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis.present import (
    CACHE_NOTE,
    PATH_NOTE,
    SESSIONS_NOTE,
    SIMULATED_BANNER,
    cache_table,
    completeness_lines,
    error_table,
    path_table,
    run_facts,
    search_lines,
    search_table,
    session_table,
    slo_lines,
    step_table,
    turn_table,
    verdict_heading,
)
from analysis.stopping import stopped_facts

if TYPE_CHECKING:
    from analysis.report import Report

_REASONS = 10  # reasons listed under the verdict; summary.json has them all


def _more(reasons: list[str]) -> list[str]:
    extra = len(reasons) - _REASONS
    return [f"- … and {extra} more (summary.json `verdict.reasons`)"] if extra > 0 else []


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(headers), "|" + "---|" * len(headers), *(line(r) for r in rows)])


def render_markdown(report: Report) -> str:
    verdict, reasons = verdict_heading(report)
    out = [f"# llmload report: {report.run_id} · verdict: {verdict}", ""]
    out += [*(f"- {r}" for r in reasons[:_REASONS]), *_more(reasons), ""] if reasons else []
    if report.simulated:
        out += [f"> **{SIMULATED_BANNER}**", ""]
    facts = [*run_facts(report), *stopped_facts(report.manifest)]  # --stop-when cut it short
    out += [md_table(["", ""], [[k, v] for k, v in facts]), ""]
    out += ["## SLO", "", *(f"- {line}" for line in slo_lines(report)), ""]
    if report.search is not None:
        headers, rows = search_table(report)
        out += ["## Capacity search", "", *(f"- {line}" for line in search_lines(report)), ""]
        out += [md_table(headers, rows), ""] if rows else []
    headers, rows = step_table(report)
    out += [
        "## Steps",
        "",
        "Latencies over successful requests sent in each step's steady window; "
        "ITL weights every token; throughput over the window. All columns: summary.csv.",
        "",
        md_table(headers, rows),
        "",
    ]
    headers, rows = path_table(report)
    if rows:
        out += ["## Request path", "", PATH_NOTE, "", md_table(headers, rows), ""]
    headers, rows = cache_table(report)
    if rows:
        out += ["## Prefix cache", "", CACHE_NOTE, "", md_table(headers, rows), ""]
    headers, rows = session_table(report)
    if rows:
        turn_headers, turn_rows = turn_table(report)
        out += ["## Sessions", "", SESSIONS_NOTE, "", md_table(headers, rows), ""]
        out += ["### By turn", "", md_table(turn_headers, turn_rows), ""]
    headers, rows = error_table(report)
    if rows:
        out += ["## Errors by kind", "", md_table(headers, rows), ""]
    out += ["## Completeness", "", *(f"- {line}" for line in completeness_lines(report)), ""]
    if report.warnings:
        out += ["## Warnings", "", *(f"- {w}" for w in report.warnings), ""]
    return "\n".join(out)
