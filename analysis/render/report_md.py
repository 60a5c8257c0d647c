"""report.md: the run's head (verdict, facts), then every section of `sections.SECTIONS`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis.judge.stopping import stopped_facts
from analysis.render.present import SIMULATED_BANNER, run_facts, verdict_heading
from analysis.render.sections import SECTIONS

if TYPE_CHECKING:
    from analysis.report.summary import Report

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
    for section in SECTIONS:
        drawn = None if section.html_only else section.draw(report)
        if drawn is None:
            continue
        out += [f"## {section.title}", ""]
        out += [drawn.note, ""] if drawn.note else []
        out += [*(f"- {line}" for line in drawn.lines), ""] if drawn.lines is not None else []
        for table in drawn.tables:
            out += [f"### {table.title}", ""] if table.title else []
            out += [md_table(table.headers, table.rows), ""]
    return "\n".join(out)
