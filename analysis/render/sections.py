"""The sections of a report, declared once: report.md and report.html both draw `SECTIONS`.

A section is a title, an anchor and a `draw` function that returns what it shows for one
report (a note, a list of lines, tables, plots), or None when the report has nothing for it
(a run without sessions has no Sessions section). The renderers only lay the pieces out:
Markdown as headings, bullets and pipe tables; HTML as the same with ids and CSS classes.
Plots are drawn in HTML only.

Adding a section: its summary columns and warnings as a `RowPart` in the derive module that
computes them (analysis/derive/parts.py, listed in `analysis.steps.aggregate.ROW_PARTS`), one
`draw` function (its table and note in `present.py`) and one `Section(...)` in `SECTIONS`,
in the place it should appear.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from analysis.render.plots import Plot, all_plots
from analysis.render.present import (
    CACHE_NOTE,
    PATH_NOTE,
    REASONING_NOTE,
    SESSIONS_NOTE,
    VALIDITY_NOTE,
    accelerator_lines,
    accelerator_table,
    cache_table,
    completeness_lines,
    error_table,
    path_table,
    reasoning_table,
    search_lines,
    search_table,
    session_table,
    slo_lines,
    step_table,
    turn_table,
    validity_table,
)

if TYPE_CHECKING:
    from analysis.report.summary import Report


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    css: str = ""  # the HTML table's class
    title: str = ""  # a sub-heading above it ("By turn")
    anchor: str = ""  # the sub-heading's HTML id


@dataclass(frozen=True)
class Drawn:
    """What one section shows for one report, in this order: note, lines, tables, plots."""

    note: str = ""
    lines: list[str] | None = None  # a list section's lines (even none: the list is there)
    lines_css: str = ""  # the HTML list's class
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)  # HTML only


@dataclass(frozen=True)
class Section:
    anchor: str  # the HTML heading's id
    title: str
    draw: Callable[[Report], Drawn | None]  # None: nothing to show for this report
    html_only: bool = False  # plots: report.md never draws it (so never pays for it)


STEPS_NOTE: Final = (
    "Latencies over successful requests sent in each step's steady window; ITL weights every "
    "token; throughput over the window. All columns: summary.csv."
)


def _slo(report: Report) -> Drawn:
    return Drawn(lines=slo_lines(report))


def _search(report: Report) -> Drawn | None:
    if report.search is None:
        return None
    headers, rows = search_table(report)
    tables = [Table(headers, rows, "search")] if rows else []
    return Drawn(lines=search_lines(report), tables=tables)


def _steps(report: Report) -> Drawn:
    return Drawn(note=STEPS_NOTE, tables=[Table(*step_table(report), css="steps")])


def _one_table(
    note: str, table: Callable[[Report], tuple[list[str], list[list[str]]]], css: str
) -> Callable[[Report], Drawn | None]:
    """A section that is one table under its note, left out when the table has no rows."""

    def draw(report: Report) -> Drawn | None:
        headers, rows = table(report)
        return Drawn(note=note, tables=[Table(headers, rows, css)]) if rows else None

    return draw


def _sessions(report: Report) -> Drawn | None:
    headers, rows = session_table(report)
    if not rows:
        return None
    turns = Table(*turn_table(report), css="turns", title="By turn", anchor="turns")
    return Drawn(note=SESSIONS_NOTE, tables=[Table(headers, rows, "sessions"), turns])


def _plots(report: Report) -> Drawn:
    return Drawn(plots=all_plots(report))


def _accelerator(report: Report) -> Drawn | None:
    """The accelerators' telemetry per step (--accelerator-metrics); none without it."""
    if report.accelerator is None:
        return None
    headers, rows = accelerator_table(report)
    return Drawn(lines=accelerator_lines(report), tables=[Table(headers, rows, "accelerator")])


def _errors(report: Report) -> Drawn | None:
    headers, rows = error_table(report)
    return Drawn(tables=[Table(headers, rows)]) if rows else None


def _completeness(report: Report) -> Drawn:
    return Drawn(lines=completeness_lines(report))


def _warnings(report: Report) -> Drawn | None:
    return Drawn(lines=list(report.warnings), lines_css="warnings") if report.warnings else None


SECTIONS: Final = (
    Section("slo", "SLO", _slo),
    Section("capacity-search", "Capacity search", _search),
    Section("steps", "Steps", _steps),
    Section("reasoning", "Reasoning", _one_table(REASONING_NOTE, reasoning_table, "reasoning")),
    Section(
        "valid-outputs", "Valid outputs", _one_table(VALIDITY_NOTE, validity_table, "validity")
    ),  # fmt: skip
    Section("request-path", "Request path", _one_table(PATH_NOTE, path_table, "path")),
    Section("prefix-cache", "Prefix cache", _one_table(CACHE_NOTE, cache_table, "cache")),
    Section("sessions", "Sessions", _sessions),
    Section("accelerator", "Accelerator", _accelerator),
    Section("plots", "Plots", _plots, html_only=True),
    Section("errors", "Errors by kind", _errors),
    Section("completeness", "Completeness", _completeness),
    Section("warnings", "Warnings", _warnings),
)
"""Every section of a report below its head (title, verdict, facts), in report order."""
