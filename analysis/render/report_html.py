"""report.html: one self-contained file (inline CSS, plots as data-URI SVG images, no script)."""

from __future__ import annotations

import base64
from html import escape
from typing import TYPE_CHECKING

from analysis.judge.stopping import stopped_facts
from analysis.render.plots import Plot
from analysis.render.present import SIMULATED_BANNER, run_facts, verdict_heading
from analysis.render.sections import SECTIONS, Drawn, Section

if TYPE_CHECKING:
    from analysis.report.summary import Report

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


def _list(lines: list[str], css: str = "") -> str:
    cls = f' class="{css}"' if css else ""
    return f"<ul{cls}>" + "".join(f"<li>{escape(x)}</li>" for x in lines) + "</ul>"


def _drawn(section: Section, drawn: Drawn) -> list[str]:
    """One section in HTML: its heading, note, list, tables and plots."""
    parts = [f'<h2 id="{section.anchor}">{escape(section.title)}</h2>']
    parts += [f"<p>{escape(drawn.note)}</p>"] if drawn.note else []
    if drawn.lines:
        parts.append(_list([s.replace("`", "") for s in drawn.lines], drawn.lines_css))
    for table in drawn.tables:
        if table.title:
            parts.append(f'<h3 id="{table.anchor}">{escape(table.title)}</h3>')
        parts.append(_table(table.headers, table.rows, table.css))
    parts += [_figure(plot) for plot in drawn.plots]
    return parts


def page_head(title: str, heading: str | None = None) -> list[str]:
    """A self-contained page's opening: doctype, head with the report's style, and <h1>."""
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(heading or title)}</h1>",
    ]


def simulated_banner() -> str:
    return f'<div class="banner" id="simulated-banner">{escape(SIMULATED_BANNER)}</div>'


def render_html(report: Report) -> str:
    verdict, reasons = verdict_heading(report)
    title = f"llmload report: {report.run_id}"
    parts = page_head(title, f"{title} · verdict: {verdict}")
    if reasons:
        parts.append(_list(reasons, "verdict"))
    if report.simulated:
        parts.append(simulated_banner())
    facts = [*run_facts(report), *stopped_facts(report.manifest)]  # --stop-when cut it short
    parts.append(_table(["", ""], [[k, v] for k, v in facts], "facts"))
    for section in SECTIONS:
        drawn = section.draw(report)
        if drawn is not None:
            parts += _drawn(section, drawn)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
