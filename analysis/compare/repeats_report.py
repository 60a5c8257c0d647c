"""The repeats report's files: repeats.csv, repeats.json, repeats.md and repeats.html.

    files = write_repeats(repeats, "out/")      # analysis.compare.repeats.Repeats in, paths out

The tables show each figure as `median [ci_low, ci_high]`; the plots draw the median of each
figure against the step's level with the interval as error bars, and every run's own value
as a faint dot, so a reader sees both the interval and the spread it came from.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Final

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.compare.bootstrap import LATENCY_FIGURES, RATE_FIGURES
from analysis.compare.repeats import RepeatFigure, Repeats
from analysis.render.plots import Plot, _no_data, _svg
from analysis.render.present import MISSING, SIMULATED_BANNER, ms, num
from analysis.render.report_html import _figure, _list, _table, page_head, simulated_banner
from analysis.report.summary import make_out_dir

_NAMES: Final = {
    **{f: f"{f.split('_')[0].upper()} {f.split('_')[1]} (ms)" for f in LATENCY_FIGURES},
    "output_tokens_per_s": "output tokens/s",
    "requests_per_s": "requests/s",
    "goodput_requests_per_s": "goodput (requests/s)",
}
NOTE: Final = (
    "Per step: the median of the runs' figures, and its {confidence:.0%} confidence interval "
    "by a two-level bootstrap ({resamples} resamples, seed {seed}): runs drawn with "
    "replacement, and within each drawn run its requests (latencies) or window slices "
    "(throughputs). A figure without an interval had too few data in some run (see why)."
)


def write_repeats(repeats: Repeats, out_dir: str | Path, *, html: bool = True) -> dict[str, Path]:
    """Write the repeats files into `out_dir` (created); returns name -> path."""
    out = make_out_dir(out_dir)
    files = {name: out / name for name in ("repeats.csv", "repeats.json", "repeats.md")}
    repeats.frame.to_csv(files["repeats.csv"], index=False, na_rep="")
    text = json.dumps(repeats.to_json(), indent=2, allow_nan=False)
    files["repeats.json"].write_text(text + "\n", encoding="utf-8")
    files["repeats.md"].write_text(render_markdown(repeats), encoding="utf-8")
    if html:
        files["repeats.html"] = out / "repeats.html"
        files["repeats.html"].write_text(render_html(repeats), encoding="utf-8")
    return files


def cell(figure: RepeatFigure) -> str:
    """`11.2 [10.9, 11.6]` (ms for latencies); `11.2 (no interval)` when not enough data."""
    show = ms if figure.figure in LATENCY_FIGURES else num
    if figure.median is None:
        return MISSING
    if figure.ci_low is None or figure.ci_high is None:
        return f"{show(figure.median)} (no interval)"
    return f"{show(figure.median)} [{show(figure.ci_low)}, {show(figure.ci_high)}]"


def step_table(repeats: Repeats) -> tuple[list[str], list[list[str]]]:
    """One row per step, one column per figure: median [interval]."""
    steps: dict[str, dict[str, RepeatFigure]] = {}
    for f in repeats.figures:
        steps.setdefault(f.step, {})[f.figure] = f
    names = [*LATENCY_FIGURES, *RATE_FIGURES]
    headers = ["step", *(_NAMES[n] for n in names)]
    rows = [[step, *(cell(by[n]) if n in by else MISSING for n in names)]
            for step, by in steps.items()]  # fmt: skip
    return headers, rows


def runs_table(repeats: Repeats) -> tuple[list[str], list[list[str]]]:
    """Every run's value of every figure (the spread behind the medians)."""
    headers = ["step", "figure", *repeats.run_ids]
    rows = []
    for f in repeats.figures:
        show = ms if f.figure in LATENCY_FIGURES else num
        rows.append([f.step, _NAMES[f.figure], *(show(v) for v in f.values)])
    return headers, rows


def short_lines(repeats: Repeats) -> list[str]:
    return [f"{f.step} {_NAMES[f.figure]}: no interval ({f.why})"
            for f in repeats.figures if not f.enough]  # fmt: skip


def _facts(repeats: Repeats) -> list[tuple[str, str]]:
    return [
        ("runs", f"{len(repeats.run_ids)}: {', '.join(repeats.run_ids)}"),
        ("confidence", f"{repeats.confidence:.0%}"),
        ("resamples", str(repeats.resamples)),
        ("seed", str(repeats.seed)),
    ]


def _note(repeats: Repeats) -> str:
    return NOTE.format(confidence=repeats.confidence, resamples=repeats.resamples,
                       seed=repeats.seed)  # fmt: skip


def render_markdown(repeats: Repeats) -> str:
    from analysis.render.report_md import md_table

    lines = ["# llmload repeats", ""]
    if repeats.simulated:
        lines += [f"> **{SIMULATED_BANNER}**", ""]
    lines += [f"- {k}: {v}" for k, v in _facts(repeats)] + [""]
    if repeats.warnings:
        lines += ["## Warnings", "", *(f"- {w}" for w in repeats.warnings), ""]
    lines += ["## Steps", "", _note(repeats), "", md_table(*step_table(repeats)), ""]
    short = short_lines(repeats)
    if short:
        lines += ["## Figures without an interval", "", *(f"- {s}" for s in short), ""]
    lines += ["## Every run", "", md_table(*runs_table(repeats)), ""]
    return "\n".join(lines)


def render_html(repeats: Repeats) -> str:
    title = f"llmload repeats: {len(repeats.run_ids)} runs"
    parts = page_head(title)
    if repeats.simulated:
        parts.append(simulated_banner())
    parts.append(_table(["", ""], [[k, v] for k, v in _facts(repeats)], "facts"))
    if repeats.warnings:
        parts += ["<h2>Warnings</h2>", _list(repeats.warnings, "warnings")]
    parts += ["<h2>Steps</h2>", f"<p>{escape(_note(repeats))}</p>",
              _table(*step_table(repeats), "steps")]  # fmt: skip
    short = short_lines(repeats)
    if short:
        parts += ["<h2>Figures without an interval</h2>", _list(short)]
    parts += ["<h2>Plots</h2>", *(_figure(p) for p in plots(repeats))]
    parts += ["<h2>Every run</h2>", _table(*runs_table(repeats), "runs")]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


_PANELS: Final = (
    ("ttft", "TTFT (ms)", ("ttft_p50_s", "ttft_p99_s")),
    ("tpot", "TPOT (ms)", ("tpot_p50_s", "tpot_p99_s")),
    ("itl", "ITL (ms)", ("itl_p50_s", "itl_p99_s")),
    ("e2e", "E2E (ms)", ("e2e_p50_s", "e2e_p99_s")),
    ("output-tokens", "output tokens/s", ("output_tokens_per_s",)),
    ("requests", "requests/s", ("requests_per_s", "goodput_requests_per_s")),
)


def plots(repeats: Repeats) -> list[Plot]:
    """Per figure group: the median against the level with its interval as error bars."""
    by_name: dict[str, list[RepeatFigure]] = {}
    for f in repeats.figures:
        by_name.setdefault(f.figure, []).append(f)
    rate = any(f.mode == "rate" for f in repeats.figures)
    xlabel = "intended rate (requests/s)" if rate else "concurrency (users)"
    fig = Figure(figsize=(12, 6.4), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    for ax, (_, title, names) in zip(axes, _PANELS, strict=True):
        drawn = False
        for name in names:
            points = by_name.get(name, [])
            if _errorbars(ax, points, _NAMES[name].split(" (")[0]):
                drawn = True
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize="small")
        else:
            _no_data(ax)
    fig.suptitle(f"Median of {len(repeats.run_ids)} runs, {repeats.confidence:.0%} interval")
    return [Plot("plot-repeats", "Median across runs with confidence intervals", _svg(fig))]


def _errorbars(ax: Axes, points: list[RepeatFigure], label: str) -> bool:
    """One series: medians with error bars, runs' values as dots; False when nothing to draw."""
    shown = [p for p in points if p.median is not None]
    if not shown:
        return False
    shown.sort(key=lambda p: p.level)
    scale = 1000.0 if shown[0].figure in LATENCY_FIGURES else 1.0
    x = np.array([p.level for p in shown])
    y = np.array([float(p.median or 0.0) for p in shown]) * scale
    low = np.array([np.nan if p.ci_low is None else p.ci_low for p in shown]) * scale
    high = np.array([np.nan if p.ci_high is None else p.ci_high for p in shown]) * scale
    err = np.vstack([np.nan_to_num(y - low), np.nan_to_num(high - y)]).clip(min=0)
    bars = ax.errorbar(x, y, yerr=err, marker="o", capsize=4, label=label)
    color = bars[0].get_color()
    for p in shown:
        runs = np.array([v for v in p.values if v is not None]) * scale
        ax.scatter(np.full(len(runs), p.level), runs, s=10, alpha=0.35, color=color)
    return True
