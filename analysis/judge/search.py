"""The capacity search a run recorded (manifest `search`), each verdict checked on the events.

During a run with `--search`, the master judged every probe step on its live statistics:
mergeable sketches of 1% relative accuracy over every finished request of the step, the
warmup included (locustfiles/master/search.py). The report judges the same steps exactly, from the
events and over their steady windows, under the search's own SLO, and flags every probe
whose live verdict the events contradict.

    search = summarize_search(run.manifest, table, report_slo)   # None: the run had no search
    search.probes[0].passed, search.probes[0].passed_exact, search.result, search.warnings
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from analysis.derive.windows import Window
from analysis.kernel.errors import UsageError
from analysis.kernel.slo import Slo, invalid_answers, parse_slo
from analysis.steps.aggregate import StepTable


@dataclass(frozen=True)
class Probe:
    """One level the search ran: its step, the live verdict and the exact one."""

    order: int  # 1-based, in the order the search ran them
    step: int | None
    level: float | None  # users (concurrency search) or requests/s (rate search)
    phase: str  # coarse | bisect
    passed: bool | None  # live verdict (the master's sketches); None when not recorded
    requests: int | None  # finished requests the live verdict saw
    few_requests: bool  # fewer than the search's min_requests
    failures: list[str]  # live: objectives missed, worded as the report words them
    passed_exact: bool | None  # from the events under the search's SLO; None: no step row
    failures_exact: list[str]
    values: dict[str, Any] = field(default_factory=dict)  # live: the statistics judged


@dataclass(frozen=True)
class SearchResult:
    """The highest level that met the SLO (live verdict), with its step's exact rates."""

    level: float
    step: int | None
    requests_per_s: float | None
    goodput_requests_per_s: float | None  # under the search's SLO; None without thresholds


@dataclass
class SearchSummary:
    mode: str  # concurrency | rate
    slo: str  # the spec the search judged by
    precision: float | None
    min_requests: int | None
    status: str
    probes: list[Probe]
    result: SearchResult | None
    warnings: list[str] = field(default_factory=list)

    @property
    def best_exact(self) -> Probe | None:
        """The highest-level probe that met the SLO by the exact verdicts (None: none did)."""
        passing = [p for p in self.probes if p.passed_exact and p.level is not None]
        return max(passing, key=lambda p: p.level or 0.0) if passing else None

    def to_dict(self) -> dict[str, Any]:
        """summary.json `search`: the manifest's block plus the exact verdicts and rates."""
        return {
            "mode": self.mode,
            "slo": self.slo,
            "precision": self.precision,
            "min_requests": self.min_requests,
            "status": self.status,
            "probes": [asdict(p) for p in self.probes],
            "result": asdict(self.result) if self.result is not None else None,
            "result_exact": (
                {"level": best.level, "step": best.step}
                if (best := self.best_exact) is not None
                else None
            ),
        }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def level_text(mode: str, level: float | None) -> str:
    """A level as the report writes it: `38.0 requests/s`, `8 users`."""
    if level is None:
        return "no level"
    if mode == "rate":
        return f"{level:.1f} requests/s" if round(level, 1) == level else f"{level:.3g} requests/s"
    return f"{level:g} users"


def goodput_under(table: StepTable, slo: Slo, row: dict[str, Any]) -> float | None:
    """A step row's goodput_requests_per_s judged by `slo`'s per-request thresholds.

    The same definition as the step table's (docs/metrics.md): good requests, not cold, that
    ended inside the step's window, over the window's length. None without thresholds.
    """
    start, end = row.get("window_start_ns"), row.get("window_end_ns")
    if not slo.thresholds or start is None or end is None:
        return None
    window = Window(int(start), int(end), str(row.get("window_source")))
    if window.length_s <= 0:
        return None
    if table.good_in_window is not None:  # the engine's path (analysis/steps/outofcore.py)
        counted = table.good_in_window(slo, window)
        return None if counted is None else float(counted) / window.length_s
    assert table.done_ns is not None
    per = table.per_request
    status = per["status"].astype(str).to_numpy()
    good = slo.good(per, status == "ok", invalid_answers(per))
    if good is None:
        return None
    eligible = ~per["cold"].to_numpy(bool) & (status != "dropped")
    done_in = eligible & window.contains(table.done_ns) & good
    return float(np.count_nonzero(done_in)) / window.length_s


def summarize_search(
    manifest: dict[str, Any], table: StepTable, report_slo: Slo
) -> SearchSummary | None:
    """The manifest's `search` block with exact verdicts; None when the run had no search."""
    block = manifest.get("search")
    if not isinstance(block, dict):
        return None
    mode = str(block.get("mode") or "concurrency")
    spec = str(block.get("slo") or "")
    warnings: list[str] = []
    slo: Slo | None
    try:
        slo = parse_slo(spec)
    except UsageError as exc:
        slo = None
        warnings.append(
            f"capacity search: its SLO {spec!r} cannot be read ({exc}); no exact verdicts"
        )
    rows = {r["step"]: r for r in table.rows if r["group"] == "step"}
    min_requests = _int(block.get("min_requests"))
    probes = []
    for order, entry in enumerate(block.get("probes") or [], start=1):
        if not isinstance(entry, dict):
            continue
        step = _int(entry.get("step"))
        row = rows.get(step)
        exact: list[str] = []
        passed_exact = None
        if slo is not None and slo.objectives and row is not None:
            exact = slo.failures(row)
            passed_exact = not exact
        live = entry.get("passed")
        probes.append(
            Probe(
                order=order,
                step=step,
                level=_number(entry.get("level")),
                phase=str(entry.get("phase") or ""),
                passed=live if isinstance(live, bool) else None,
                requests=_int(entry.get("requests")),
                few_requests=bool(entry.get("few_requests")),
                failures=[str(f) for f in entry.get("failures") or []],
                passed_exact=passed_exact,
                failures_exact=exact,
                values=dict(entry.get("values") or {}),
            )
        )
    result = None
    found = block.get("result")
    if isinstance(found, dict) and _number(found.get("level")) is not None:
        step = _int(found.get("step"))
        row = rows.get(step) or {}
        if slo is not None and slo.spec != report_slo.spec and row:
            goodput = goodput_under(table, slo, row)
        else:
            goodput = _number(row.get("goodput_requests_per_s"))
        result = SearchResult(
            level=float(found["level"]),
            step=step,
            requests_per_s=_number(row.get("requests_per_s")),
            goodput_requests_per_s=None if goodput != goodput else goodput,
        )
    summary = SearchSummary(
        mode=mode,
        slo=spec,
        precision=_number(block.get("precision")),
        min_requests=min_requests,
        status=str(block.get("status") or "running"),
        probes=probes,
        result=result,
        warnings=warnings,
    )
    summary.warnings.extend(_probe_warnings(summary))
    return summary


def verdict_text(passed: bool | None, failures: list[str]) -> str:
    """`pass`, `FAIL (ttft_p99 0.61 > 0.5)` or a dash when there is no verdict."""
    if passed is None:
        return "—"
    if passed:
        return "pass"
    return f"FAIL ({'; '.join(failures)})" if failures else "FAIL"


def _probe_warnings(search: SearchSummary) -> list[str]:
    out = []
    for p in search.probes:
        name = f"capacity search, step {p.step} ({level_text(search.mode, p.level)})"
        if p.passed is not None and p.passed_exact is not None and p.passed != p.passed_exact:
            out.append(
                f"{name}: the search judged it {verdict_text(p.passed, p.failures)} on live "
                f"statistics, the events say {verdict_text(p.passed_exact, p.failures_exact)}: "
                "the search judged on live sketches (1% accuracy, warmup included), the report "
                "on the exact steady window; the search's result may be one level off"
            )
        if p.few_requests:
            floor = f" (fewer than {search.min_requests})" if search.min_requests else ""
            out.append(
                f"{name}: its live verdict rests on only {p.requests} finished request(s)"
                f"{floor}: the step reached its time limit first; its high percentiles are weak"
            )
    if search.status == "running":
        out.append(
            "capacity search: the manifest still says running: the run ended before the search "
            "finished; its result is the last level that passed, if any"
        )
    elif search.status == "stopped":
        out.append("capacity search: the run stopped before the search ended")
    return out


def _found_text(search: SearchSummary, result: SearchResult) -> str:
    if result.goodput_requests_per_s is not None:
        rate = f"goodput {result.goodput_requests_per_s:.2f} requests/s"
    elif result.requests_per_s is not None:
        rate = f"{result.requests_per_s:.2f} requests/s completed (no per-request thresholds: no goodput)"
    else:
        rate = "no throughput measured"
    return f"{level_text(search.mode, result.level)} (step {result.step}), {rate}"


def result_line(search: SearchSummary) -> str:
    """One line: what the search found, for report.md and report.html."""
    what = "rate" if search.mode == "rate" else "concurrency"
    result = search.result
    if result is None:
        if search.status in ("running", "stopped"):
            return f"the search did not finish ({search.status}) and no level met the SLO so far"
        first = search.probes[0].level if search.probes else None
        return f"even the lowest level ({level_text(search.mode, first)}) missed the SLO"
    found = _found_text(search, result)
    if search.status == "all_passed":
        return f"every level passed: capacity is above {found}"
    if search.status == "found":
        return f"highest {what} meeting the SLO: {found}"
    return f"the search did not finish ({search.status}); highest {what} meeting the SLO so far: {found}"
