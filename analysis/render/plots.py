"""The report's plots as SVG text: matplotlib `Figure` objects only, never pyplot's global state.

Each function takes a Report and returns a Plot (id, title, SVG). Missing values are left
out of lines (never drawn as 0); an empty plot says "no data". A run with rate (open-loop)
steps gets latency against its achieved rate and goodput against its intended rate in place
of the plots against concurrency (a rate step's concurrency is only its cap). A run with
sessions also gets TTFT and the cached-token share by turn index.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.derive.path import E2E_PARTS
from analysis.render.present import PATH_LABELS
from analysis.steps.aggregate import CURVE_QUANTILES

if TYPE_CHECKING:
    from analysis.report.summary import Report

_STEP_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


@dataclass(frozen=True)
class Plot:
    id: str
    title: str
    svg: str


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    return buf.getvalue()


def _values(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in rows], dtype=float)


def group_label(row: dict[str, Any]) -> str:
    """How a plot names a summary row: `cold`, `c=8` (concurrency), `r=38` (rate); a row of
    a split by model (`--by model`) adds its model: `c=8 a`."""
    if row["group"] == "cold":
        label = "cold"
    elif row.get("mode") == "rate" and row.get("rate") is not None:
        label = f"r={float(row['rate']):g}"
    else:
        label = f"c={row['concurrency']}"
    return f"{label} {row['model']}" if "model" in row else label


def _by_model(
    rows: list[dict[str, Any]], series: list[tuple[str, np.ndarray]]
) -> list[tuple[str, np.ndarray]]:
    """Rows split by model (`--by model`): each series once per model, missing (NaN) on the
    other models' rows; unsplit rows: the series as they are."""
    if not rows or "model" not in rows[0]:
        return series
    models = np.array([str(r["model"]) for r in rows], dtype=object)
    return [
        (f"{label} {model}", np.where(models == model, y, np.nan))
        for model in dict.fromkeys(models)
        for label, y in series
    ]


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")


def _shade_windows(ax: Axes, report: Report, t0: int) -> None:
    """Shade each step's steady window on a time axis of seconds since `t0` (ns)."""
    for row in report.table.rows:
        if row["window_start_ns"] is not None and row["group"] == "step":
            start, end = (row["window_start_ns"] - t0) / 1e9, (row["window_end_ns"] - t0) / 1e9
            ax.axvspan(start, end, color="#55a868", alpha=0.08)


def _concurrency_axis(ax: Axes, conc: np.ndarray) -> None:
    ax.set_xlabel("concurrency (users)")
    positive = conc[conc > 0]
    if len(positive) and positive.max() / positive.min() >= 4:
        ax.set_xscale("log", base=2)
        ax.set_xticks(np.unique(positive))
        ax.set_xticklabels([f"{c:g}" for c in np.unique(positive)])
    ax.grid(True, alpha=0.3)


def _lines(ax: Axes, x: np.ndarray, series: list[tuple[str, np.ndarray]], scale: float) -> None:
    drawn = False
    for label, y in series:
        ok = ~np.isnan(y) & ~np.isnan(x)
        if ok.any():
            # by x: a capacity search runs its levels out of order (bisection)
            order = np.argsort(x[ok], kind="stable")
            ax.plot(x[ok][order], y[ok][order] * scale, marker="o", label=label)
            drawn = True
    if drawn:
        ax.legend(fontsize="small")
    else:
        _no_data(ax)


def _latency_percentiles(rows: list[dict[str, Any]], x: np.ndarray, axis: Callable[[Axes], None],
                         title: str) -> Figure:  # fmt: skip
    """TTFT, TPOT and ITL p50/p90/p99 (ms) against `x`, one panel each."""
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, metric in zip(axes, ("ttft", "tpot", "itl"), strict=True):
        series = [(p, _values(rows, f"{metric}_{p}_s")) for p in ("p50", "p90", "p99")]
        _lines(ax, x, _by_model(rows, series), 1000)
        ax.set_title(f"{metric.upper()} (ms)")
        ax.set_ylabel("ms")
        axis(ax)
    fig.suptitle(title)
    return fig


def latency_vs_concurrency(report: Report) -> Plot:
    rows = report.step_rows
    conc = _values(rows, "concurrency")
    fig = _latency_percentiles(rows, conc, lambda ax: _concurrency_axis(ax, conc),
                               "Latency percentiles vs concurrency")  # fmt: skip
    return Plot("plot-latency", "TTFT, TPOT and ITL p50/p90/p99 vs concurrency", _svg(fig))


def throughput_vs_concurrency(report: Report) -> Plot:
    rows = report.step_rows
    conc = _values(rows, "concurrency")
    fig = Figure(figsize=(6, 3.6), layout="constrained")
    ax = fig.subplots()
    _lines(
        ax, conc, _by_model(rows, [("output tokens/s", _values(rows, "output_tokens_per_s"))]), 1
    )
    ax.set_ylabel("output tokens/s")
    _concurrency_axis(ax, conc)
    ax.set_title("Output throughput vs concurrency")
    return Plot("plot-throughput", "Output tokens/s vs concurrency", _svg(fig))


def _rate_axis(ax: Axes, label: str, rates: np.ndarray) -> None:
    ax.set_xlabel(label)
    positive = rates[rates > 0]
    if len(positive) and positive.max() / positive.min() >= 8:
        ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)


def latency_vs_rate(report: Report) -> Plot:
    """TTFT, TPOT and ITL percentiles against the rate the generator achieved."""
    rows = report.step_rows
    achieved = _values(rows, "rate_achieved")
    axis = lambda ax: _rate_axis(ax, "achieved rate (requests/s sent)", achieved)  # noqa: E731
    fig = _latency_percentiles(rows, achieved, axis,
                               "Latency percentiles vs achieved request rate")  # fmt: skip
    return Plot(
        "plot-latency-rate", "TTFT, TPOT and ITL p50/p90/p99 vs achieved request rate", _svg(fig)
    )


def goodput_vs_rate(report: Report) -> Plot:
    """What the server completed (goodput, or requests/s without thresholds) per intended rate,
    beside what was sent and the line where completions keep up with the rate."""
    rows = report.step_rows
    rate = _values(rows, "rate")
    goodput = _values(rows, "goodput_requests_per_s")
    has_goodput = bool((~np.isnan(goodput)).any())
    fig = Figure(figsize=(6, 3.6), layout="constrained")
    ax = fig.subplots()
    series = [
        ("goodput requests/s" if has_goodput else "requests/s completed",
         goodput if has_goodput else _values(rows, "requests_per_s")),
        ("achieved (sent) requests/s", _values(rows, "rate_achieved")),
    ]  # fmt: skip
    _lines(ax, rate, _by_model(rows, series), 1)
    known = rate[~np.isnan(rate)]
    if len(known):
        ends = np.array([known.min(), known.max()])
        ax.plot(ends, ends, linestyle=":", color="gray", label="= intended rate")
        ax.legend(fontsize="small")
    ax.set_ylabel("requests/s")
    _rate_axis(ax, "intended rate (requests/s)", rate)
    what = "Goodput" if has_goodput else "Completed requests/s"
    ax.set_title(f"{what} vs intended rate")
    return Plot("plot-goodput-rate", f"{what} vs intended request rate", _svg(fig))


def _level(row: dict[str, Any]) -> float:
    """A step's load level: its intended rate (rate step) or its concurrency."""
    rate = row.get("rate") if row.get("mode") == "rate" else None
    return float(rate) if rate is not None else float(row["concurrency"])


def throughput_vs_latency(report: Report) -> Plot:
    rows = sorted(report.step_rows, key=_level)  # by load, whatever order a search ran them in
    tput = _values(rows, "output_tokens_per_s")
    labels = np.array([group_label(r) for r in rows], dtype=object)
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, key, label in (
        (axes[0], "ttft_p99_s", "TTFT p99 (ms)"),
        (axes[1], "tpot_p50_s", "TPOT p50 (ms)"),
    ):
        lat = _values(rows, key) * 1000
        ok = ~np.isnan(tput) & ~np.isnan(lat)
        if ok.any():
            ax.plot(tput[ok], lat[ok], marker="o")
            for x, y, label in zip(tput[ok], lat[ok], labels[ok], strict=True):
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4))
        else:
            _no_data(ax)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    fig.suptitle("Throughput vs latency (the knee)")
    return Plot("plot-knee", "Throughput vs latency (the knee)", _svg(fig))


def latency_distributions(report: Report) -> Plot:
    """Per-step CDFs of TTFT, TPOT, E2E (per request) and ITL (per token)."""
    rows = report.table.rows
    fig = Figure(figsize=(12, 7), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    for ax, metric in zip(axes, ("ttft", "tpot", "itl", "e2e"), strict=True):
        drawn = False
        for g, (row, curves) in enumerate(zip(rows, report.table.curves, strict=True)):
            curve = curves.get(metric)
            if curve is None or np.isnan(curve).all():
                continue
            label = group_label(row)
            color = _STEP_COLORS[g % len(_STEP_COLORS)]
            ax.plot(curve * 1000, CURVE_QUANTILES, label=label, color=color, drawstyle="steps-post")
            drawn = True
        if drawn:
            ax.legend(fontsize="x-small")
        else:
            _no_data(ax)
        ax.set_title(f"{metric.upper()} CDF" + (" (per token)" if metric == "itl" else ""))
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction")
        ax.grid(True, alpha=0.3)
    fig.suptitle("Latency distributions per step")
    return Plot("plot-distributions", "Per-step latency distributions (CDF)", _svg(fig))


def timeline(report: Report) -> Plot:
    """Requests in flight and errors over wall-clock time, steady windows shaded."""
    bins = report.table.timeline_bins()
    fig = Figure(figsize=(12, 4), layout="constrained")
    ax = fig.subplots()
    if len(bins.in_flight) == 0:
        _no_data(ax)
        return Plot("plot-timeline", "Requests in flight and errors over time", _svg(fig))
    t0 = bins.t0
    x = bins.edges_s
    ax.step(x, bins.in_flight, where="post", label="in flight", color="#4c72b0")
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("requests in flight")
    if bins.errors.any():
        ax2 = ax.twinx()
        ax2.bar(x[:-1], bins.errors, width=np.diff(x), align="edge", color="#c44e52", alpha=0.6)
        ax2.set_ylabel("errors per bin", color="#c44e52")
    for row in report.table.rows:
        if row["window_start_ns"] is None:
            continue
        start = (row["window_start_ns"] - t0) / 1e9
        end = (row["window_end_ns"] - t0) / 1e9
        color = "#999999" if row["group"] == "cold" else "#55a868"
        ax.axvspan(start, end, color=color, alpha=0.12)
        label = group_label(row)
        ax.text(start, 1.0, label, transform=ax.get_xaxis_transform(), fontsize="x-small", va="top")
    ax.grid(True, alpha=0.3)
    ax.set_title("Requests in flight (line), errors (bars), steady windows (shaded)")
    return Plot("plot-timeline", "Requests in flight and errors over time", _svg(fig))


def server_metrics(report: Report) -> Plot | None:
    """The server's running/waiting requests and KV-cache usage over time, under TTFT.

    None when the run holds no server metrics (the target had no /metrics): no plot at all.
    """
    scraped = report.server_metrics
    if scraped is None or scraped.samples == 0:
        return None
    frame = scraped.frame
    at = frame["scraped_at_ns"].to_numpy(np.int64)
    sent, ttft = report.table.ttft_by_send()  # master clock, like the windows
    ttft = ttft * 1000
    t0 = int(min(at.min(), sent.min())) if len(sent) else int(at.min())
    fig = Figure(figsize=(12, 7), layout="constrained")
    ax_ttft, ax_load, ax_kv = fig.subplots(3, 1, sharex=True)
    ok = ~np.isnan(ttft)
    if ok.any():
        ax_ttft.plot((sent[ok] - t0) / 1e9, ttft[ok], ".", markersize=3, color="#4c72b0")
    else:
        _no_data(ax_ttft)
    ax_ttft.set_ylabel("TTFT (ms)")
    ax_ttft.set_title("TTFT per request (by send time)")
    x = (at - t0) / 1e9
    drawn = False
    for column, color in (("running", "#55a868"), ("waiting", "#c44e52")):
        y = frame[column].to_numpy(float)
        if not np.isnan(y).all():
            ax_load.step(x, y, where="post", label=column, color=color)
            drawn = True
    if drawn:
        ax_load.legend(fontsize="small")
    else:
        _no_data(ax_load)
    ax_load.set_ylabel("requests")
    ax_load.set_title("Server: requests running and waiting")
    kv = frame["kv_cache_usage"].to_numpy(float) * 100
    if not np.isnan(kv).all():
        ax_kv.step(x, kv, where="post", color="#8172b3")
    else:
        _no_data(ax_kv)
    ax_kv.set_ylabel("KV cache (%)")
    ax_kv.set_title("Server: KV-cache usage")
    ax_kv.set_xlabel("seconds since the run's first request or scrape")
    for ax in (ax_ttft, ax_load, ax_kv):
        ax.grid(True, alpha=0.3)
        _shade_windows(ax, report, t0)
    fig.suptitle("Server metrics (scraped from /metrics) beside TTFT; steady windows shaded")
    title = "Server running/waiting requests and KV-cache usage over time, beside TTFT"
    return Plot("plot-server-metrics", title, _svg(fig))


def by_turn(report: Report) -> Plot | None:
    """TTFT p50/p99 and the cached share of prompt tokens by turn index: how the history a
    session resends, and the server's prefix cache, shape its later turns. None without
    sessions."""
    rows = report.turns
    if not report.table.has_sessions or not rows:
        return None
    turn = _values(rows, "turn")
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    ax_ttft, ax_cache = fig.subplots(1, 2)
    _lines(ax_ttft, turn, [(p, _values(rows, f"ttft_{p}_s")) for p in ("p50", "p99")], 1000)
    ax_ttft.set_title("TTFT (ms)")
    ax_ttft.set_ylabel("ms")
    _lines(ax_cache, turn, [("cached / prompt tokens", _values(rows, "cache_hit_pct"))], 1)
    ax_cache.set_title("Cached prompt tokens (%)")
    ax_cache.set_ylabel("%")
    ax_cache.set_ylim(0, 100)
    for ax in (ax_ttft, ax_cache):
        ax.set_xlabel("turn index (0 = first request of a session)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, alpha=0.3)
    fig.suptitle("By turn index: TTFT and the server's prefix-cache hits")
    return Plot("plot-turns", "TTFT p50/p99 and cached-token share by turn index", _svg(fig))


_PATH_COLORS = ("#8c8c8c", "#937860", "#c44e52", "#dd8452", "#8172b3", "#4c72b0", "#55a868")


def request_path(report: Report) -> Plot | None:
    """Per step, a stacked bar of the request path's parts on the way to E2E (their means over
    the successful requests with an engine span, which add up to the mean E2E of those
    requests); beside it, from the top of prefill, the first-token delivery (its top is the
    mean TTFT), and the client's delay. None when no step has spans."""
    rows = [r for r in report.table.rows if not np.isnan(_values([r], "span_share")[0])]
    if not rows or all(float(r["span_share"] or 0) == 0 for r in rows):
        return None
    labels = [group_label(r) for r in rows]
    x = np.arange(len(rows))
    fig = Figure(figsize=(12, 4), layout="constrained")
    ax = fig.subplots()
    bottom = np.zeros(len(rows))
    colors = dict(zip(PATH_LABELS, _PATH_COLORS, strict=True))
    first_token_at = bottom
    for part in E2E_PARTS:
        if part == "server_decode":  # the first token leaves here, beside decode
            first_token_at = bottom.copy()
        values = np.nan_to_num(_values(rows, f"{part}_mean_s")) * 1000
        ax.bar(x, values, bottom=bottom, color=colors[part], label=PATH_LABELS[part], width=0.6)
        bottom += values
    delivery = np.nan_to_num(_values(rows, "first_token_delivery_mean_s")) * 1000
    ax.bar(x + 0.36, delivery, bottom=first_token_at, width=0.12,
           color=colors["first_token_delivery"], label=PATH_LABELS["first_token_delivery"])  # fmt: skip
    delay = np.nan_to_num(_values(rows, "client_delay_p50_ms"))
    ax.bar(x - 0.36, delay, width=0.12, color="black", label="client delay p50 (before TTFT)")
    ax.set_xticks(x, labels)
    ax.set_ylabel("ms (mean per request)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncols=4)
    fig.suptitle("Where the time goes: each part of the request path, mean per step")
    title = ("The request path per step: network, queue, prefill, decode, tail (stacked means: "
             "E2E); the first-token delivery beside decode (its top: TTFT)")  # fmt: skip
    return Plot("plot-request-path", title, _svg(fig))


def accelerator(report: Report) -> Plot | None:
    """The accelerators' power (all GPUs) and utilisation (their mean) over time; None
    without telemetry."""
    telemetry = report.accelerator
    if telemetry is None or telemetry.frame.empty:
        return None
    by_reading = telemetry.frame.groupby("scraped_at_ns", sort=True)
    power = by_reading["power_w"].sum(min_count=1)
    util = by_reading["util_pct"].mean()
    at = power.index.to_numpy(np.int64)
    t0 = int(at.min())
    x = (at - t0) / 1e9
    fig = Figure(figsize=(12, 5), layout="constrained")
    ax_power, ax_util = fig.subplots(2, 1, sharex=True)
    for ax, y, label, color in ((ax_power, power, "power (W, all GPUs)", "#c44e52"),
                                (ax_util, util, "utilisation (%, mean GPU)", "#4c72b0")):  # fmt: skip
        values = y.to_numpy(float)
        if np.isnan(values).all():
            _no_data(ax)
        else:
            ax.step(x, values, where="post", color=color)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        _shade_windows(ax, report, t0)
    ax_util.set_xlabel("seconds since the first reading")
    simulated = " (SIMULATED)" if telemetry.simulated else ""
    fig.suptitle(f"Accelerator telemetry{simulated}; steady windows shaded")
    return Plot("plot-accelerator", f"Accelerator power and utilisation over time{simulated}",
                _svg(fig))  # fmt: skip


def all_plots(report: Report) -> list[Plot]:
    load = (
        [latency_vs_rate(report), goodput_vs_rate(report)]
        if report.open_loop
        else [latency_vs_concurrency(report), throughput_vs_concurrency(report)]
    )
    plots = [
        *load,
        throughput_vs_latency(report),
        latency_distributions(report),
        timeline(report),
    ]
    extras = (request_path(report), by_turn(report), server_metrics(report), accelerator(report))
    return [*plots, *(p for p in extras if p is not None)]
