"""report.html: one self-contained file (inline CSS, plots as data-URI SVG images, no script)."""

from __future__ import annotations

import base64
from html import escape
from typing import TYPE_CHECKING

from analysis.plots import Plot, all_plots
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

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem auto;
       max-width: 1280px; padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
table.facts td { text-align: left; }
.banner { background: #b00020; color: #fff; padding: 0.8rem 1rem; font-weight: bold;
          border-radius: 4px; }
.warnings li { color: #8a4b00; }
.verdict li { color: #8a0000; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; }
figcaption { font-size: 0.85rem; color: #555; }
.fail { color: #b00020; font-weight: bold; } .pass { color: #1b7a1b; }
"""


def _table(headers: list[str], rows: list[list[str]], css: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    cls = f' class="{css}"' if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(text: str) -> str:
    if text.startswith("FAIL"):
        return f'<span class="fail">{escape(text)}</span>'
    if text == "pass":
        return '<span class="pass">pass</span>'
    return escape(text)


def _figure(plot: Plot) -> str:
    data = base64.b64encode(plot.svg.encode("utf-8")).decode("ascii")
    title = escape(plot.title)
    return (
        f'<figure id="{plot.id}-figure"><img id="{plot.id}" alt="{title}" title="{title}" '
        f'src="data:image/svg+xml;base64,{data}"><figcaption>{title}</figcaption></figure>'
    )


def _section(
    anchor: str, title: str, note: str, headers: list[str], rows: list[list[str]], css: str
) -> list[str]:
    """A titled table with its note; nothing when it has no rows."""
    if not rows:
        return []
    return [f'<h2 id="{anchor}">{escape(title)}</h2>', f"<p>{escape(note)}</p>",
            _table(headers, rows, css)]  # fmt: skip


def _list(lines: list[str], css: str = "") -> str:
    cls = f' class="{css}"' if css else ""
    return f"<ul{cls}>" + "".join(f"<li>{escape(x)}</li>" for x in lines) + "</ul>"


def render_html(report: Report) -> str:
    verdict, reasons = verdict_heading(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>llmload report: {escape(report.run_id)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>llmload report: {escape(report.run_id)} · verdict: {escape(verdict)}</h1>",
    ]
    if reasons:
        parts.append(_list(reasons, "verdict"))
    if report.simulated:
        parts.append(f'<div class="banner" id="simulated-banner">{escape(SIMULATED_BANNER)}</div>')
    facts = [*run_facts(report), *stopped_facts(report.manifest)]  # --stop-when cut it short
    parts.append(_table(["", ""], [[k, v] for k, v in facts], "facts"))
    if report.warnings:
        parts += ["<h2>Warnings</h2>", _list(report.warnings, "warnings")]
    parts += ["<h2>SLO</h2>", _list([s.replace("`", "") for s in slo_lines(report)])]
    if report.search is not None:
        headers, rows = search_table(report)
        parts += [
            '<h2 id="capacity-search">Capacity search</h2>',
            _list([s.replace("`", "") for s in search_lines(report)]),
            _table(headers, rows, "search") if rows else "",
        ]
    headers, rows = step_table(report)
    parts += [
        "<h2>Steps</h2>",
        "<p>Latencies over successful requests sent in each step's steady window; ITL weights "
        "every token; throughput over the window. Every column is in summary.csv.</p>",
        _table(headers, rows, "steps"),
    ]
    parts += _section("request-path", "Request path", PATH_NOTE, *path_table(report), "path")
    parts += _section("prefix-cache", "Prefix cache", CACHE_NOTE, *cache_table(report), "cache")
    headers, rows = session_table(report)
    if rows:
        turn_headers, turn_rows = turn_table(report)
        parts += [
            '<h2 id="sessions">Sessions</h2>',
            f"<p>{escape(SESSIONS_NOTE)}</p>",
            _table(headers, rows, "sessions"),
            '<h3 id="turns">By turn</h3>',
            _table(turn_headers, turn_rows, "turns"),
        ]
    parts += [
        "<h2>Plots</h2>",
        *(_figure(p) for p in all_plots(report)),
    ]
    headers, rows = error_table(report)
    if rows:
        parts += ["<h2>Errors by kind</h2>", _table(headers, rows)]
    parts += ["<h2>Completeness</h2>", _list(completeness_lines(report))]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
