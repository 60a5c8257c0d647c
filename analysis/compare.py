"""Compare two runs step by step: A (baseline) vs B (candidate), relative changes, regressions.

    comparison = compare_runs("s3://b/runs/base", "s3://b/runs/new", threshold=0.10)
    comparison.regressions          # the changes worse than the threshold

A run is a RUN_URI (summarised on the fly) or a report directory holding summary.json.
Steps are matched by concurrency in closed-loop runs and by intended rate in open-loop (rate)
runs, the cold groups with each other; a rate run and a concurrency run measure different
things and are not paired at all. Latencies regress when
they grow by more than `threshold` (relative), throughputs when they shrink by more than it,
the error rate when it grows by more than `error_rate_threshold` (absolute, in points).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import pandas as pd

from analysis.errors import UsageError
from analysis.report import SUMMARY_KIND, jsonable, make_out_dir

LOWER_IS_BETTER: Final = tuple(
    f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p99")
)
HIGHER_IS_BETTER: Final = (
    "output_tokens_per_s",
    "requests_per_s",
    "goodput_requests_per_s",
    "input_tokens_per_s",
)
ABSOLUTE: Final = ("error_rate",)
COMPARED: Final = (*LOWER_IS_BETTER, *HIGHER_IS_BETTER, *ABSOLUTE)
"""summary.csv columns compared, in report order."""

DEFAULT_THRESHOLD: Final = 0.10
DEFAULT_ERROR_RATE_THRESHOLD: Final = 0.01


@dataclass(frozen=True)
class Change:
    """One metric of one step: A, B, the change and whether it is a regression."""

    step: str  # "cold" or the step label "c=<concurrency>" / "r=<rate>"
    concurrency: int  # a rate step's: its cap on requests in flight (0 none)
    rate: float | None  # the intended rate of a rate step (requests/s); None otherwise
    metric: str
    a: float | None
    b: float | None
    change: float | None  # relative (b - a) / a; absolute b - a for error_rate
    regression: bool


@dataclass
class Comparison:
    run_a: str
    run_b: str
    threshold: float
    error_rate_threshold: float
    changes: list[Change] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # steps present in one run only
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    @property
    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(c) for c in self.changes])

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "schema_version": "1.0",
                "kind": "llmload.comparison",
                "run_a": self.run_a,
                "run_b": self.run_b,
                "threshold": self.threshold,
                "error_rate_threshold": self.error_rate_threshold,
                "regressions": len(self.regressions),
                "unmatched": self.unmatched,
                "warnings": self.warnings,
                "changes": [asdict(c) for c in self.changes],
            }
        )


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _compare_value(
    metric: str, a: Any, b: Any, threshold: float, error_threshold: float
) -> tuple[float | None, float | None, float | None, bool]:
    fa = None if _missing(a) else float(a)
    fb = None if _missing(b) else float(b)
    if fa is None or fb is None:
        return fa, fb, None, False
    if metric in ABSOLUTE:
        delta = fb - fa
        return fa, fb, delta, delta > error_threshold
    if fa == 0:
        return fa, fb, None, False
    rel = (fb - fa) / abs(fa)
    worse = rel > threshold if metric in LOWER_IS_BETTER else rel < -threshold
    return fa, fb, rel, worse


def _is_rate(row: dict[str, Any]) -> bool:
    return row.get("mode") == "rate" and not _missing(row.get("rate"))


def _kind(rows: list[dict[str, Any]]) -> str:
    """`rate` when any step is a rate (open-loop) step, else `concurrency` (summaries before
    1.2 have no `mode`: concurrency)."""
    return "rate" if any(_is_rate(r) for r in rows if r.get("group") == "step") else "concurrency"


_Key = tuple[str, bool, float, int]  # group, rate step?, level, occurrence of that level


def _keyed(rows: list[dict[str, Any]]) -> dict[_Key, dict[str, Any]]:
    """Rows keyed by (group, is a rate step, level, occurrence of that level); the level is
    the intended rate of a rate step, else the concurrency."""
    out: dict[_Key, dict[str, Any]] = {}
    seen: dict[tuple[str, bool, float], int] = {}
    for row in rows:
        rate = _is_rate(row)
        base = (str(row["group"]), rate, float(row["rate"] if rate else row["concurrency"]))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[(*base, n)] = row
    return out


def _label(key: _Key) -> str:
    group, rate, level, n = key
    if group == "cold":
        return "cold"
    return ("r=" if rate else "c=") + f"{level:g}" + (f"#{n + 1}" if n else "")


def compare_summaries(
    rows_a: list[dict[str, Any]],
    rows_b: list[dict[str, Any]],
    *,
    run_a: str = "A",
    run_b: str = "B",
    threshold: float = DEFAULT_THRESHOLD,
    error_rate_threshold: float = DEFAULT_ERROR_RATE_THRESHOLD,
) -> Comparison:
    """Compare two lists of summary rows (summary.json `steps`)."""
    _check_thresholds(threshold, error_rate_threshold)
    result = Comparison(run_a, run_b, threshold, error_rate_threshold)
    kind_a, kind_b = _kind(rows_a), _kind(rows_b)
    if kind_a != kind_b:
        result.unmatched = [
            f"{_label(key)} only in {side}"
            for side, rows in (("A", rows_a), ("B", rows_b))
            for key in _keyed(rows)
        ]
        result.warnings.append(
            f"A is a {kind_a} run and B a {kind_b} run: "
            + ("open-loop (rate) steps and closed-loop (concurrency) steps load a server "
               "differently, so no step is paired; compare runs of one kind")
        )  # fmt: skip
        return result
    a, b = _keyed(rows_a), _keyed(rows_b)
    caps = []
    for key in sorted(set(a) | set(b), key=lambda k: (k[0] != "cold", k[1], k[2], k[3])):
        label = _label(key)
        if key not in a or key not in b:
            result.unmatched.append(f"{label} only in {'A' if key in a else 'B'}")
            continue
        conc = int(a[key]["concurrency"])
        rate = key[2] if key[1] else None
        if rate is not None and int(b[key]["concurrency"]) != conc:
            caps.append(f"{label} (A {conc or 'none'}, B {int(b[key]['concurrency']) or 'none'})")
        for metric in COMPARED:
            va, vb, change, worse = _compare_value(
                metric, a[key].get(metric), b[key].get(metric), threshold, error_rate_threshold
            )
            result.changes.append(Change(label, conc, rate, metric, va, vb, change, worse))
    if result.unmatched:
        result.warnings.append("steps without a partner: " + ", ".join(result.unmatched))
    if caps:
        result.warnings.append(
            "rate steps paired across different caps on requests in flight (--max-concurrency): "
            + ", ".join(caps)
        )
    return result


def _summary_rows(where: str, slo: str | None) -> tuple[list[dict[str, Any]], list[str], str]:
    """A run's summary rows, warnings and the SLO spec its goodput and verdicts used."""
    path = Path(where)
    summary = path / "summary.json" if path.is_dir() else path
    if summary.is_file() and summary.suffix == ".json":
        try:
            doc = json.loads(summary.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UsageError(f"{summary} is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("kind") != SUMMARY_KIND:
            raise UsageError(f"{summary} is not an llmload summary.json")
        spec = str((doc.get("slo") or {}).get("spec") or "")
        return list(doc.get("steps") or []), list(doc.get("warnings") or []), spec
    from analysis.load import load_run
    from analysis.report import summarize_run

    report = summarize_run(load_run(where, chunks=False), slo)  # out of core (chunkfacts.py)
    return report.table.rows, report.warnings, report.slo.spec


def _check_thresholds(threshold: float, error_rate_threshold: float) -> None:
    for flag, value in (
        ("--threshold", threshold),
        ("--error-rate-threshold", error_rate_threshold),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(
                f"regression thresholds must be >= 0: {flag} {value} (e.g. --threshold 0.1: 10%)"
            )


def compare_runs(
    run_a: str,
    run_b: str,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    error_rate_threshold: float = DEFAULT_ERROR_RATE_THRESHOLD,
    slo: str | None = None,
) -> Comparison:
    """Compare run B against baseline A (each a RUN_URI or a report directory)."""
    _check_thresholds(threshold, error_rate_threshold)  # before anything is read
    rows_a, warn_a, slo_a = _summary_rows(run_a, slo)
    rows_b, warn_b, slo_b = _summary_rows(run_b, slo)
    result = compare_summaries(
        rows_a,
        rows_b,
        run_a=run_a,
        run_b=run_b,
        threshold=threshold,
        error_rate_threshold=error_rate_threshold,
    )
    if slo_a != slo_b:  # without --slo each run is judged by its own (report.summarize_run)
        result.warnings.append(
            f"A and B were judged by different SLOs (A {slo_a or 'none'!r}, B {slo_b or 'none'!r}): "
            "their goodput is not comparable; build both reports with one --slo and compare "
            "the report directories"
        )
    result.warnings += [f"A: {w}" for w in warn_a] + [f"B: {w}" for w in warn_b]
    return result


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return "—"
    if metric.endswith("_s") and not metric.endswith("_per_s"):
        return f"{value * 1000:.4g} ms"
    if metric in ABSOLUTE:
        return f"{value:.2%}"
    return f"{value:,.2f}"


def _fmt_change(change: Change) -> str:
    if change.change is None:
        return "—"
    if change.metric in ABSOLUTE:
        return f"{change.change * 100:+.2f} pts"
    return f"{change.change:+.1%}"


def render_comparison_markdown(result: Comparison) -> str:
    from analysis.report_md import md_table

    out = [
        "# llmload comparison",
        "",
        f"- A (baseline): `{result.run_a}`",
        f"- B (candidate): `{result.run_b}`",
        f"- regression: latency up or throughput down by more than {result.threshold:.0%}, "
        f"error rate up by more than {result.error_rate_threshold * 100:g} points",
        f"- **{len(result.regressions)} regression(s)**",
        "",
    ]
    headers = ["step", "metric", "A", "B", "change", ""]
    rows = [
        [
            c.step,
            c.metric,
            _fmt(c.metric, c.a),
            _fmt(c.metric, c.b),
            _fmt_change(c),
            "REGRESSION" if c.regression else "",
        ]
        for c in sorted(result.changes, key=lambda c: not c.regression)
    ]
    out += [md_table(headers, rows), ""]
    if result.warnings:
        out += ["## Warnings", "", *(f"- {w}" for w in result.warnings), ""]
    return "\n".join(out)


def write_comparison(result: Comparison, out_dir: str | Path) -> dict[str, Path]:
    out = make_out_dir(out_dir)
    files = {name: out / name for name in ("compare.md", "compare.csv", "compare.json")}
    files["compare.md"].write_text(render_comparison_markdown(result), encoding="utf-8")
    result.frame.to_csv(files["compare.csv"], index=False, na_rep="")
    text = json.dumps(result.to_json(), indent=2, allow_nan=False)
    files["compare.json"].write_text(text + "\n", encoding="utf-8")
    return files
