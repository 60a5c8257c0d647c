"""The sweep report's files: sweep.json, sweep.csv, sweep.md, sweep.html and the Pareto plot.

    files = write_sweep(sweep, "out/sweep-demo/")    # analysis.compare.sweep.Sweep in

The plot draws, per workload, every configuration's steps as tokens/s per accelerator
against tokens/s per user (one marker and colour per configuration, each point labelled
with its step), the Pareto front as a line through its points, and the best configuration
under the SLO ringed.
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path
from typing import Final

import pandas as pd
from matplotlib.figure import Figure

from analysis.compare.sweep import Sweep, SweepEntry, SweepPoint
from analysis.render.plots import Plot, _no_data, _svg
from analysis.render.present import MISSING, SIMULATED_BANNER, ms, num
from analysis.render.report_html import _figure, _list, _table, page_head, simulated_banner
from analysis.report.summary import make_out_dir

PLOT_FILE: Final = "sweep-pareto.svg"
_METRIC_NAMES: Final = {
    "output_tokens_per_s": "output tokens/s",
    "tpot_mean_s": "TPOT mean",
    "ttft_p99_s": "TTFT p99",
    "goodput_requests_per_s": "goodput (requests/s)",
}


def write_sweep(sweep: Sweep, out_dir: str | Path) -> dict[str, Path]:
    """Write the sweep files into `out_dir` (created); returns name -> path."""
    out = make_out_dir(out_dir)
    files = {n: out / n for n in ("sweep.json", "sweep.csv", "sweep.md", "sweep.html", PLOT_FILE)}
    text = json.dumps(sweep.to_json(), indent=2, allow_nan=False)
    files["sweep.json"].write_text(text + "\n", encoding="utf-8")
    frame = pd.DataFrame([p.__dict__ for p in sweep.points])
    frame.to_csv(files["sweep.csv"], index=False, na_rep="")
    plot = pareto_plot(sweep)
    files[PLOT_FILE].write_text(plot.svg, encoding="utf-8")
    files["sweep.md"].write_text(render_markdown(sweep), encoding="utf-8")
    files["sweep.html"].write_text(render_html(sweep, plot), encoding="utf-8")
    return files


def _mark(value: bool | None) -> str:
    return MISSING if value is None else "pass" if value else "FAIL"


def config_table(sweep: Sweep) -> tuple[list[str], list[list[str]]]:
    headers = ["configuration", "workload", "engine arguments", "status", "start-up (s)",
               "accelerators", "run"]  # fmt: skip
    rows = [[e.config, e.workload, e.args or MISSING, e.status.replace("_", " "),
             num(e.startup_s), _accelerators(sweep, e), e.run_id or MISSING]
            for e in sweep.entries]  # fmt: skip
    if sweep.capacities:  # a capacity search ran: what each configuration holds
        found = {(c.workload, c.config): c.text for c in sweep.capacities}
        headers.insert(6, "capacity under the SLO")
        for e, row in zip(sweep.entries, rows, strict=True):
            row.insert(6, found.get((e.workload, e.config), MISSING))
    return headers, rows


def _accelerators(sweep: Sweep, entry: SweepEntry) -> str:
    """The configuration's accelerators: as given, else as its runs' telemetry counted them."""
    if entry.accelerators:
        return str(entry.accelerators)
    seen = {p.accelerators for p in sweep.points if p.config == entry.config
            and p.workload == entry.workload and math.isfinite(p.accelerators)}  # fmt: skip
    return ", ".join(f"{n:g}" for n in sorted(seen)) + " (telemetry)" if seen else "unknown"


def point_table(sweep: Sweep, workload: str) -> tuple[list[str], list[list[str]]]:
    headers = ["configuration", "step", "requests/s", "output tok/s", "tok/s per accelerator",
               "tok/s per user", "goodput req/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
               "TPOT mean (ms)", "TPOT p99 (ms)", "J/token", "cost / 1M tokens", "SLO",
               "Pareto"]  # fmt: skip
    best = sweep.best.get(workload)
    rows = []
    for p in (p for p in sweep.points if p.workload == workload):
        name = f"{p.config} (best)" if p is best else p.config
        rows.append([name, p.step, num(p.requests_per_s, 2), num(p.output_tokens_per_s),
                     num(p.tokens_per_s_per_accelerator), num(p.tokens_per_s_per_user),
                     num(p.goodput_requests_per_s, 2), ms(p.ttft_p50_s), ms(p.ttft_p99_s),
                     ms(p.tpot_mean_s), ms(p.tpot_p99_s), num(p.j_per_output_token, 3),
                     num(p.cost_per_1m_output_tokens, 3), _mark(p.slo_pass),
                     "yes" if p.pareto else ""])  # fmt: skip
    return headers, rows


def _value(metric: str, value: float | None) -> str:
    if value is None:
        return MISSING
    latency = metric.endswith("_s") and not metric.endswith("_per_s")
    return f"{ms(value)} ms" if latency else num(value, 2)


def verdict_table(sweep: Sweep, workload: str) -> tuple[list[str], list[list[str]]]:
    headers = ["step", "figure", "best", "other", "best's", "other's", "change",
               "95% interval", "verdict"]  # fmt: skip
    rows = []
    for v in (v for v in sweep.verdicts if v.workload == workload):
        change = MISSING if v.change is None else f"{v.change:+.1%}"
        interval = (MISSING if v.ci_low is None or v.ci_high is None
                    else f"[{v.ci_low:+.1%}, {v.ci_high:+.1%}]")  # fmt: skip
        said = f"{v.verdict} ({v.why})" if v.why else v.verdict
        rows.append([v.step, _METRIC_NAMES.get(v.metric, v.metric), v.best, v.other,
                     _value(v.metric, v.best_value), _value(v.metric, v.other_value), change,
                     interval, said])  # fmt: skip
    return headers, rows


NOTE: Final = (
    "Tokens/s per user is 1 / TPOT mean: the decode speed a user sees. The Pareto front holds "
    "the steps no other step beats on both tokens/s per accelerator and per user. The best "
    "configuration has the highest tokens/s per accelerator among the steps that meet the SLO. "
    "Verdicts: the best configuration's run (A) against each other one's (B), step by step, by "
    "compare's bootstrap ({resamples} resamples, seed {seed}): a difference is significant when "
    "the 95% interval of (B - A) / A excludes 0{threshold}."
)


def _note(sweep: Sweep) -> str:
    extra = f" and the change exceeds {sweep.threshold:.0%}" if sweep.threshold else ""
    return NOTE.format(resamples=sweep.resamples, seed=sweep.seed, threshold=extra)


def _failures(sweep: Sweep) -> list[str]:
    out = []
    for e in sweep.entries:
        if e.status != "done":
            tail = (
                f"; log tail: {e.log_tail.strip().splitlines()[-1]}" if e.log_tail.strip() else ""
            )
            out.append(f"{e.config}: {e.status.replace('_', ' ')}"
                       f"{': ' + e.error if e.error else ''}{tail}")  # fmt: skip
    return out


def render_markdown(sweep: Sweep) -> str:
    from analysis.render.report_md import md_table

    lines = [f"# llmload engine sweep: {sweep.name}", ""]
    if sweep.simulated:
        lines += [f"> **{SIMULATED_BANNER}**", ""]
    for workload in sweep.workloads:
        lines += [f"- **{workload}**: {line}" for line in sweep.headlines(workload)]
    lines += ["", "## Configurations", "", md_table(*config_table(sweep)), ""]
    failures = _failures(sweep)
    if failures:
        lines += ["## Configurations that did not complete", "", *(f"- {f}" for f in failures),
                  ""]  # fmt: skip
    if sweep.warnings:
        lines += ["## Warnings", "", *(f"- {w}" for w in sweep.warnings), ""]
    lines += [f"![Pareto front]({PLOT_FILE})", "", _note(sweep), ""]
    for workload in sweep.workloads:
        title = f" ({workload})" if len(sweep.workloads) > 1 else ""
        lines += [f"## Steps{title}", "", md_table(*point_table(sweep, workload)), ""]
        headers, rows = verdict_table(sweep, workload)
        if rows:
            lines += [f"## Verdicts{title}", "", md_table(headers, rows), ""]
    return "\n".join(lines)


def render_html(sweep: Sweep, plot: Plot | None = None) -> str:
    title = f"llmload engine sweep: {sweep.name}"
    parts = page_head(title)
    if sweep.simulated:
        parts.append(simulated_banner())
    parts.append(_list([f"{w}: {line}" for w in sweep.workloads for line in sweep.headlines(w)],
                       "best"))  # fmt: skip
    parts += ["<h2>Configurations</h2>", _table(*config_table(sweep), "configurations")]
    failures = _failures(sweep)
    if failures:
        parts += ["<h2>Configurations that did not complete</h2>", _list(failures, "failures")]
    if sweep.warnings:
        parts += ["<h2>Warnings</h2>", _list(sweep.warnings, "warnings")]
    parts += ["<h2>Pareto front</h2>", _figure(plot or pareto_plot(sweep)),
              f"<p>{escape(_note(sweep))}</p>"]  # fmt: skip
    for workload in sweep.workloads:
        title_w = f" ({workload})" if len(sweep.workloads) > 1 else ""
        parts += [f"<h2>Steps{escape(title_w)}</h2>", _table(*point_table(sweep, workload),
                                                             "points")]  # fmt: skip
        headers, rows = verdict_table(sweep, workload)
        if rows:
            parts += [f"<h2>Verdicts{escape(title_w)}</h2>", _table(headers, rows, "verdicts")]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


_MARKERS: Final = "osD^v<>ph*"


def _finite(p: SweepPoint) -> bool:
    return math.isfinite(p.tokens_per_s_per_user) and math.isfinite(p.tokens_per_s_per_accelerator)


def pareto_plot(sweep: Sweep) -> Plot:
    """Tokens/s per accelerator against tokens/s per user, one panel per workload."""
    workloads = sweep.workloads or ["default"]
    fig = Figure(figsize=(6.4 * len(workloads), 4.8), layout="constrained")
    axes = fig.subplots(1, len(workloads), squeeze=False).ravel()
    configs = list(dict.fromkeys(e.config for e in sweep.entries))
    for ax, workload in zip(axes, workloads, strict=True):
        drawn = False
        for i, config in enumerate(configs):
            points = [p for p in sweep.points if p.workload == workload and p.config == config
                      and _finite(p)]  # fmt: skip
            if not points:
                continue
            drawn = True
            points.sort(key=lambda p: p.level)
            ax.plot([p.tokens_per_s_per_user for p in points],
                    [p.tokens_per_s_per_accelerator for p in points],
                    marker=_MARKERS[i % len(_MARKERS)], linestyle=":", label=config)  # fmt: skip
            for p in points:
                ax.annotate(p.step, (p.tokens_per_s_per_user, p.tokens_per_s_per_accelerator),
                            textcoords="offset points", xytext=(4, 4), fontsize="x-small")  # fmt: skip
        front = [p for p in sweep.front(workload) if _finite(p)]
        if front:
            ax.plot([p.tokens_per_s_per_user for p in front],
                    [p.tokens_per_s_per_accelerator for p in front], color="black",
                    linewidth=1.5, alpha=0.6, label="Pareto front")  # fmt: skip
        best = sweep.best.get(workload)
        if best is not None and _finite(best):
            ax.scatter([best.tokens_per_s_per_user], [best.tokens_per_s_per_accelerator],
                       s=220, facecolors="none", edgecolors="red", linewidths=2,
                       label=f"best: {best.config} {best.step}", zorder=5)  # fmt: skip
        ax.set_xlabel("output tokens/s per user (1 / TPOT mean)")
        ax.set_ylabel("output tokens/s per accelerator")
        sim = " (SIMULATED)" if sweep.simulated else ""
        ax.set_title(f"{workload}{sim}" if len(workloads) > 1 or sim else "Pareto front")
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize="small")
        else:
            _no_data(ax)
    return Plot("plot-pareto", "Tokens/s per accelerator against tokens/s per user", _svg(fig))
