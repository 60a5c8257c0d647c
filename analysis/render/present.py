"""Presentation helpers shared by the Markdown and HTML reports: numbers, facts, the step table."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

from analysis.judge.search import level_text, result_line, verdict_text

if TYPE_CHECKING:
    from analysis.report.summary import Report

MISSING: Final = "—"

SIMULATED_BANNER: Final = (
    "SIMULATED TARGET: this run measured a simulated engine. The numbers describe the "
    "harness and the simulator, not real inference performance."
)


def is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def ms(value: Any) -> str:
    """Seconds shown as milliseconds with 3 significant digits; missing as a dash."""
    if is_missing(value):
        return MISSING
    v = float(value) * 1000
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def num(value: Any, digits: int = 1) -> str:
    if is_missing(value):
        return MISSING
    return f"{float(value):,.{digits}f}"


def pct(value: Any) -> str:
    return MISSING if is_missing(value) else f"{float(value):.1%}"


def percent(value: Any) -> str:
    """A value already in percent (0-100): `30.3%`; missing as a dash."""
    return MISSING if is_missing(value) else f"{float(value):.1f}%"


def step_label(row: dict[str, Any]) -> str:
    """`cold` or the step's index; a row of a split by model adds its model: `2 a`."""
    label = "cold" if row["group"] == "cold" else str(row["step"])
    return f"{label} {row['model']}" if "model" in row else label


def slo_label(row: dict[str, Any]) -> str:
    if row.get("slo_pass") is None:
        return MISSING
    return "pass" if row["slo_pass"] else f"FAIL ({row['slo_failures']})"


def count(value: Any) -> str:
    return MISSING if is_missing(value) else str(value)


def rate_cell(value: Any) -> str:
    """An arrival rate in requests/s: `38`, `0.25`; missing as a dash."""
    return MISSING if is_missing(value) else f"{float(value):.3g}"


def cap_label(row: dict[str, Any]) -> str:
    """A rate step's `concurrency`: its cap on requests in flight, 0 = none."""
    if row.get("mode") != "rate":
        return str(row["concurrency"])
    return str(row["concurrency"]) if row["concurrency"] else "none"


_STEP_HEAD: Final = (
    ("step", step_label),
    ("concurrency", lambda r: str(r["concurrency"])),
)
_OPEN_LOOP_HEAD: Final = (
    ("step", step_label),
    ("rate req/s", lambda r: rate_cell(r.get("rate"))),
    ("achieved req/s", lambda r: rate_cell(r.get("rate_achieved"))),
    ("slip p99 ms", lambda r: num(r.get("slip_p99_ms"), 2)),
    ("queued", lambda r: count(r.get("requests_queued"))),
    ("dropped", lambda r: count(r.get("requests_dropped"))),
    ("max concurrency", cap_label),
)

STEP_TABLE: Final = (
    *_STEP_HEAD,
    ("requests", lambda r: str(r["requests"])),
    ("ok", lambda r: str(r["ok"])),
    ("error rate", lambda r: pct(r["error_rate"])),
    ("TTFT p50 ms", lambda r: ms(r["ttft_p50_s"])),
    ("TTFT p99 ms", lambda r: ms(r["ttft_p99_s"])),
    ("TPOT p50 ms", lambda r: ms(r["tpot_p50_s"])),
    ("TPOT p99 ms", lambda r: ms(r["tpot_p99_s"])),
    ("ITL p50 ms", lambda r: ms(r["itl_p50_s"])),
    ("ITL p99 ms", lambda r: ms(r["itl_p99_s"])),
    ("E2E p50 ms", lambda r: ms(r["e2e_p50_s"])),
    ("E2E p99 ms", lambda r: ms(r["e2e_p99_s"])),
    ("output tok/s", lambda r: num(r["output_tokens_per_s"])),
    ("req/s", lambda r: num(r["requests_per_s"], 2)),
    ("goodput req/s", lambda r: num(r["goodput_requests_per_s"], 2)),
    ("SLO", slo_label),
    ("verdict", lambda r: str(r.get("verdict") or MISSING)),
)
"""Columns of the human step table: (header, row -> text). summary.csv has every column."""

OPEN_LOOP_STEP_TABLE: Final = (*_OPEN_LOOP_HEAD, *STEP_TABLE[len(_STEP_HEAD) :])
"""The step table of a run with rate steps: the rate, what was sent, how late, what waited
or was dropped, and the cap, in place of the concurrency."""


def step_table(report: Report) -> tuple[list[str], list[list[str]]]:
    columns = OPEN_LOOP_STEP_TABLE if report.open_loop else STEP_TABLE
    headers = [h for h, _ in columns]
    return headers, [[cell(r) for _, cell in columns] for r in report.table.rows]


SESSION_TABLE: Final = (
    ("step", step_label),
    ("sessions", lambda r: count(r.get("sessions"))),
    ("complete", lambda r: count(r.get("sessions_complete"))),
    ("error", lambda r: count(r.get("sessions_error"))),
    ("cut", lambda r: count(r.get("sessions_cut"))),
    ("turns mean", lambda r: num(r.get("session_turns_mean"), 2)),
    ("session E2E p50 s", lambda r: num(r.get("session_e2e_p50_s"), 2)),
    ("session E2E p99 s", lambda r: num(r.get("session_e2e_p99_s"), 2)),
    ("tool wait mean s", lambda r: num(r.get("tool_wait_s_mean"), 2)),
    ("think mean s", lambda r: num(r.get("think_s_mean"), 2)),
    ("cached tokens", lambda r: percent(r.get("cached_tokens_pct"))),
)
"""Per-step session columns (runs with sessions): sessions by the step of their first turn."""

TURN_TABLE: Final = (
    ("turn", lambda r: str(r["turn"])),
    ("requests", lambda r: str(r["requests"])),
    ("TTFT p50 ms", lambda r: ms(r["ttft_p50_s"])),
    ("TTFT p99 ms", lambda r: ms(r["ttft_p99_s"])),
    ("prompt tokens mean", lambda r: num(r["prompt_tokens_mean"])),
    ("cached tokens mean", lambda r: num(r["cached_tokens_mean"])),
    ("cache hit", lambda r: percent(r["cache_hit_pct"])),
)
"""The by-turn table (summary.json `turns`)."""


def session_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Session columns per step; no rows when the run has no sessions."""
    if not report.table.has_sessions:
        return [h for h, _ in SESSION_TABLE], []
    rows = [r for r in report.table.rows if r["group"] == "step" or r.get("sessions")]
    return [h for h, _ in SESSION_TABLE], [[cell(r) for _, cell in SESSION_TABLE] for r in rows]


CACHE_TABLE: Final = (
    ("step", step_label),
    ("cache phase", lambda r: r.get("cache_phase") or MISSING),
    ("flush", lambda r: r.get("cache_flush") or MISSING),
    ("primed", lambda r: count(r.get("cache_primed"))),
    ("cached (server)", lambda r: percent(r.get("cached_tokens_pct"))),
    ("cached (implied)", lambda r: percent(r.get("cached_implied_pct"))),
)
"""Per step: the cache phase before it and the cached share reported against the implied."""

CACHE_NOTE: Final = (
    "Before each step (--cache-phase) the engine's prefix cache was flushed and/or each shared "
    "prefix sent once; cached: the share of prompt tokens the server reported cached, and the "
    "share the shared prefixes imply once cached (whole --engine-block-size blocks; "
    "docs/prefix-cache.md)."
)


ACCELERATOR_TABLE: Final = (
    ("step", step_label),
    ("accelerators", lambda r: num(r.get("accelerators"), 0)),
    ("tok/s per accelerator", lambda r: num(r.get("output_tokens_per_s_per_accelerator"))),
    ("energy J", lambda r: num(r.get("accel_energy_j"))),
    ("J/token", lambda r: num(r.get("accel_j_per_output_token"), 3)),
    ("power W", lambda r: num(r.get("accel_power_w_mean"))),
    ("util %", lambda r: num(r.get("accel_util_pct_mean"))),
    ("memory MiB max", lambda r: num(r.get("accel_memory_used_mib_max"), 0)),
    ("SM MHz", lambda r: num(r.get("accel_sm_clock_mhz_mean"), 0)),
    ("throttled", lambda r: percent(r.get("accel_throttled_pct"))),
    ("cost / 1M tokens", lambda r: num(r.get("cost_per_1m_output_tokens"), 2)),
)
"""Per step: the accelerators' energy, power and use over the window, and the cost per token."""


def accelerator_lines(report: Report) -> list[str]:
    """What the accelerator telemetry is: its source, whether it is simulated, what it counts."""
    telemetry = report.accelerator
    if telemetry is None:
        return []
    about = report.manifest.get("accelerator") or {}
    source = about.get("source") or ", ".join(telemetry.sources) or MISSING
    lines = []
    if telemetry.simulated:
        lines.append("SIMULATED: the telemetry is the simulator's model of its GPUs "
                     '(simulated="true"), not a measurement of any accelerator.')  # fmt: skip
    lines.append(f"source: {source}; {telemetry.gpus} GPU(s), "
                 f"{telemetry.frame['scraped_at_ns'].nunique()} reading(s), "
                 f"{telemetry.failures} failed")  # fmt: skip
    lines.append("The telemetry counts all of the accelerators' work in each window, this "
                 "run's and any other client's (docs/metrics.md).")  # fmt: skip
    return lines


def accelerator_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The accelerator table: every step row (none without telemetry)."""
    rows = [r for r in report.table.rows if r["group"] == "step"]
    return _table_if(ACCELERATOR_TABLE, rows, lambda r: report.accelerator is not None)


def _table_if(
    columns: tuple[tuple[str, Any], ...], rows: list[dict[str, Any]], shown: Any
) -> tuple[list[str], list[list[str]]]:
    """A section's table of `rows`; no rows unless `shown(row)` holds for one of them."""
    if not any(shown(r) for r in rows):
        return [h for h, _ in columns], []
    return [h for h, _ in columns], [[cell(r) for _, cell in columns] for r in rows]


def cache_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The cache table; no rows when the run had no shared prefixes and no cache phase."""
    rows = [r for r in report.table.rows if r["group"] == "step"]
    return _table_if(CACHE_TABLE, rows, lambda r: r.get("cache_phase")
                     or not is_missing(r.get("cached_implied_pct")))  # fmt: skip


REASONING_TABLE: Final = (
    ("step", step_label),
    ("ok", lambda r: str(r["ok"])),
    ("reasoned", lambda r: count(r.get("requests_reasoning"))),
    ("TTFT p50 ms", lambda r: ms(r["ttft_p50_s"])),
    ("TTFR p50 ms", lambda r: ms(r.get("ttfr_p50_s"))),
    ("TTFR p99 ms", lambda r: ms(r.get("ttfr_p99_s"))),
    ("TTFO p50 ms", lambda r: ms(r.get("ttfo_p50_s"))),
    ("TTFO p99 ms", lambda r: ms(r.get("ttfo_p99_s"))),
    ("reasoning tokens mean", lambda r: num(r.get("reasoning_tokens_mean"))),
    ("answer tokens mean", lambda r: num(r.get("answer_tokens_mean"))),
)
"""Per step: when reasoning and the answer began, and their tokens (runs that reasoned)."""

VALIDITY_TABLE: Final = (
    ("step", step_label),
    ("ok", lambda r: str(r["ok"])),
    ("checked", lambda r: count(r.get("requests_checked"))),
    ("invalid", lambda r: count(r.get("requests_invalid"))),
    ("valid share", lambda r: pct(r.get("valid_share"))),
    ("goodput req/s", lambda r: num(r.get("goodput_requests_per_s"), 2)),
)
"""Per step: the answers checked against the format asked for and the tools offered."""

VALIDITY_NOTE: Final = (
    "Each successful answer checked against what its request asked for (--response-format, "
    "the tools offered): an invalid one stays an ok row but is never good; goodput counts "
    "valid answers only (docs/metrics.md, Valid outputs)."
)

REASONING_NOTE: Final = (
    "TTFT counts the first token of any kind, reasoning included; TTFR the first reasoning "
    "token, over the requests that reasoned; TTFO the first answer token (content or a tool "
    "call), over the requests that answered: what a user waits for (docs/metrics.md)."
)


def validity_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The valid-output table; no rows when no answer was checked."""
    return _table_if(VALIDITY_TABLE, report.table.rows, lambda r: r.get("requests_checked"))


def reasoning_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The reasoning table; no rows when no successful request reasoned."""
    return _table_if(REASONING_TABLE, report.table.rows, lambda r: r.get("requests_reasoning"))


def turn_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per turn index; no rows when the run has no sessions."""
    return [h for h, _ in TURN_TABLE], [[cell(r) for _, cell in TURN_TABLE] for r in report.turns]


PATH_LABELS: Final = {
    "network_up": "network up",
    "server_other": "server other",
    "server_queue": "queue",
    "server_prefill": "prefill",
    "first_token_delivery": "1st-token delivery",
    "server_decode": "decode",
    "tail": "tail",
}
"""How the report names each part of the request path (analysis/derive/path.py PARTS)."""


def _has_path(row: dict[str, Any]) -> bool:
    share = row.get("span_share")
    delay = row.get("client_delay_p99_ms")
    return not (is_missing(share) and is_missing(delay))


def path_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Per step: the client's delay and connects, then each part of the request path (p50 /
    p99 ms) and the share of successful requests with an engine span; no rows when the run
    recorded neither (before schema 1.4, no spans)."""
    headers = ["step", "client delay p50/p99", "new conns", "connect p99", "spans",
               *(f"{label} p50/p99" for label in PATH_LABELS.values())]  # fmt: skip
    rows = [r for r in report.table.rows if _has_path(r)]
    out = []
    for r in rows:
        cells = [step_label(r), f"{num(r['client_delay_p50_ms'], 2)} / {num(r['client_delay_p99_ms'], 2)}",
                 count(r["connections_new"]), num(r["connect_p99_ms"], 2), pct(r["span_share"])]  # fmt: skip
        cells += [f"{ms(r[f'{p}_p50_s'])} / {ms(r[f'{p}_p99_s'])}" for p in PATH_LABELS]
        out.append(cells)
    return headers, out


PATH_NOTE: Final = (
    "Where the time goes, in ms: the client's delay (deciding to send -> writing the request; "
    "not part of TTFT) over the requests sent in the window, then each part of the path "
    "after the write over the successful requests with an engine span: network up + server "
    "other + queue + prefill + first-token delivery = TTFT; network up + server other + "
    "queue + prefill + decode + tail = E2E (the first token travels while the server "
    "decodes; the tail is the last token's delivery: docs/metrics.md, 'The request path'). "
    "Per request: requests.csv."
)

SESSIONS_NOTE: Final = (
    "Sessions count in the step of their first turn; turns, session E2E and waits over the "
    "complete ones; cached tokens over the step's successful requests that reported them. "
    "By turn: the steady requests of every step. One row per session: sessions.csv."
)


def error_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Error counts by kind, only the kinds that occurred."""
    kinds = sorted(
        {
            k[len("errors_") :]
            for r in report.table.rows
            for k, v in r.items()
            if k.startswith("errors_") and v
        }
    )
    rows = [[step_label(r), *(str(r[f"errors_{k}"]) for k in kinds)] for r in report.table.rows]
    return ["step", *kinds], rows if kinds else []


def verdict_heading(report: Report) -> tuple[str, list[str]]:
    """The run's verdict for the report's first line, and its reasons (docs/reports.md)."""
    verdict = report.verdict
    if verdict is None:
        return "not judged", []
    return verdict.verdict.upper() if verdict.verdict != "valid" else "valid", verdict.reasons


def run_facts(report: Report) -> list[tuple[str, str]]:
    """(label, text) pairs from the manifest: model, server, versions, hardware, workers."""
    m = report.manifest
    target = m.get("target") or {}
    versions = m.get("versions") or {}
    hardware = m.get("hardware") or (m.get("config") or {}).get("hardware")
    server = ", ".join(
        str(v)
        for v in (target.get("url"), target.get("server_version"), target.get("server_header"))
        if v
    )
    workers = m.get("workers") or []
    hosts = m.get("hosts") or []
    facts = [
        ("run", f"{report.run_id} ({m.get('status', 'unknown status')})"),
        ("model", str(target.get("model") or "not recorded")),
        ("server", server or "not recorded"),
        ("simulated", "YES" if report.simulated else "no"),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "not recorded"),
        ("hardware", str(hardware) if hardware else "not recorded"),
        ("workers", f"{len(workers)} on {len(hosts)} host(s)" if workers else "not recorded"),
        ("started", str(m.get("created_at") or "not recorded")),
        ("ended", str(m.get("ended_at") or "not recorded")),
        ("events", report.run_uri),
    ]
    config = m.get("config") or {}
    for key in ("model_full_name", "revision", "server_version", "launch_args"):
        if config.get(key):  # engine facts a campaign records (docs/engines.md)
            facts.insert(2, (key.replace("_", " "), str(config[key])))
    spans = m.get("spans")
    if isinstance(spans, dict):  # the master's OTLP receiver (--otlp-listen)
        facts.append((
            "engine spans",
            f"{spans.get('received', 0):,} received on {spans.get('listen')}, "
            f"{spans.get('stored', 0):,} stored in {spans.get('parts', 0)} part(s)"
            + (f", {spans['rejected_bodies']} body(ies) refused" if spans.get("rejected_bodies") else ""),
        ))  # fmt: skip
    engine = ((m.get("cold_start") or {}).get("engine") or {}).get("spans")
    if isinstance(engine, dict) and engine:  # the engine's own start-up spans
        facts.append((
            "engine start-up",
            ", ".join(f"{name} {float(v.get('seconds', 0)):.1f} s" for name, v in engine.items()),
        ))  # fmt: skip
    return facts


def completeness_lines(report: Report) -> list[str]:
    c = report.completeness
    expected = f" of {c.parts_expected} recorded" if c.parts_expected else ""
    rows = ", ".join(
        f"{t} {c.rows_read.get(t, 0):,}"
        + (f" of {c.rows_expected[t]:,} recorded" if c.rows_expected.get(t) else "")
        for t in ("requests", "chunks")
    )
    present = len(set(c.workers_found) & set(c.workers_expected)) if c.workers_expected else None
    workers = (
        f"{present} of {len(c.workers_expected)} expected"
        if present is not None
        else f"{len(c.workers_found)} (no worker list recorded)"
    )
    lines = [
        f"complete: {'yes' if c.complete else 'NO'}",
        f"parts: {c.parts_read} read of {c.parts_found} found{expected}; "
        f"{len(c.missing_parts)} missing, {len(c.corrupt_parts)} unreadable",
        f"rows read: {rows}",
        f"workers with parts: {workers}",
    ]
    for worker, lost in c.rows_rejected.items():
        reason = (c.sink_errors.get(worker) or ["no reason recorded"])[0]
        lines.append(f"rows rejected by worker {worker}'s event sink: {lost:,} ({reason})")
    for worker, lost in c.rows_dropped.items():
        lines.append(f"rows dropped by worker {worker}'s event sink (after close): {lost:,}")
    return lines


def slo_lines(report: Report) -> list[str]:
    slo = report.slo
    if not slo:
        return ["no SLO given (use --slo, e.g. ttft_p99=0.5,tpot_p50=0.05,e2e_p99=10,ttft=1)"]
    lines = [f"SLO: `{slo.spec}`"]
    if report.slo_source == "run":
        lines[0] += " (the run's own, from its manifest: no --slo was given to the report)"
    if slo.objectives:
        failing = [step_label(r) for r in report.step_rows if r["slo_pass"] is False]
        lines.append(
            "all steps meet the SLO" if not failing else f"steps failing: {', '.join(failing)}"
        )
        if report.open_loop:
            rate = report.best_rate
            lines.append(
                f"highest rate meeting the SLO: {level_text('rate', rate)}"
                if rate is not None
                else "no rate step meets the SLO"
            )
        else:
            best = report.best_concurrency
            lines.append(
                f"highest concurrency meeting the SLO: {best}"
                if best is not None
                else "no step meets the SLO"
            )
    if slo.thresholds:
        lines.append(
            "goodput counts requests meeting every per-request threshold: "
            + ", ".join(f"{t.name} <= {t.limit:g} s" for t in slo.thresholds)
        )
    else:
        lines.append("goodput not computed: give per-request thresholds (e.g. ttft=1,tpot=0.1)")
    return lines


def search_lines(report: Report) -> list[str]:
    """The capacity search in a few lines: its result first (empty: the run had no search)."""
    search = report.search
    if search is None:
        return []
    precision = f"{search.precision:.0%}" if search.precision is not None else MISSING
    lines = [
        result_line(search),
        f"searched by {search.mode} under the SLO `{search.slo}` (precision {precision}, at "
        f"least {count(search.min_requests)} requests per probe); status: {search.status}",
        "live verdicts: what the search decided on (the master's sketches, 1% accuracy, "
        "warmup included); exact verdicts: the events over each step's steady window",
    ]
    differ = [p for p in search.probes if p.passed_exact is not None and p.passed != p.passed_exact]
    if differ:
        listed = ", ".join(str(p.step) for p in differ)
        lines.append(f"live and exact verdicts differ in step(s) {listed} (see the warnings)")
        best = search.best_exact
        found = search.result.level if search.result is not None else None
        if best is None or best.level != found:
            lines.append(
                "by the exact verdicts, the highest level meeting the SLO is "
                + (f"{level_text(search.mode, best.level)} (step {best.step})" if best else "none")
            )
    return lines


def search_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per probe, in the order the search ran them."""
    search = report.search
    if search is None:
        return [], []
    headers = ["order", "step", "level", "phase", "live verdict", "exact verdict", "requests"]
    rows = [
        [
            str(p.order),
            count(p.step),
            level_text(search.mode, p.level),
            p.phase,
            verdict_text(p.passed, p.failures) + (" (few requests)" if p.few_requests else ""),
            verdict_text(p.passed_exact, p.failures_exact),
            count(p.requests),
        ]
        for p in search.probes
    ]
    return headers, rows
