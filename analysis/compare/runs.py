"""Compare two runs step by step: A (baseline) vs B (candidate), relative changes, regressions.

    comparison = compare_runs("s3://b/runs/base", "s3://b/runs/new", threshold=0.10)
    comparison.regressions          # the changes found to be regressions

Steps are matched by concurrency in closed-loop runs and by intended rate in open-loop (rate)
runs, the cold groups with each other; a rate run and a concurrency run measure different
things and are not paired at all. Two methods decide what is a regression:

- `bootstrap` (the default): each side is a RUN_URI, summarised with its per-request values.
  For every matched step and every figure of RESAMPLED (TTFT, TPOT, ITL, E2E mean, p50, p90
  and p99; the four throughputs), A and B are resampled
  independently (RESAMPLES times, seeded), the relative change (B - A) / A is taken per
  resample and its 95% interval read off. A latency regresses when the interval lies above 0
  and the observed change exceeds `threshold`; a throughput when the interval lies below 0
  and the observed change is below -`threshold`. A figure too thin to judge on either side
  (a p99 over fewer than 500 requests...) is "not enough data", never "no change".
- `threshold`: summary rows only (a RUN_URI or a report directory holding summary.json):
  latencies regress when they grow by more than `threshold` (relative), throughputs when
  they shrink by more than it.

The cold group keeps the threshold rule under either method (marked `method: threshold`), and
so does the error rate: it regresses when it grows by more than `error_rate_threshold`
(absolute, in points).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pandas as pd

import analysis.compare.bootstrap as bootstrap
from analysis.kernel.errors import UsageError
from analysis.report.summary import SUMMARY_KIND, jsonable, make_out_dir

if TYPE_CHECKING:
    from analysis.report.summary import Report

COMPARISON_SCHEMA_VERSION: Final = "1.1"
"""Version of compare.json; 1.1 added the method, intervals and verdicts."""

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

RESAMPLED: Final = (
    *bootstrap.FIGURES,
    *bootstrap.MORE_LATENCY_FIGURES,
    *bootstrap.MORE_RATE_FIGURES,
)
"""What the bootstrap decides in a step: every latency figure (mean, p50, p90, p99) and every
throughput; the error rate keeps its absolute threshold."""

DEFAULT_THRESHOLD: Final = 0.10
DEFAULT_ERROR_RATE_THRESHOLD: Final = 0.01

METHODS: Final = ("bootstrap", "threshold")
DEFAULT_METHOD: Final = "bootstrap"
MIN_RESAMPLES: Final = 100
"""Fewer resamples than this cannot place a 95% interval's ends (`--resamples`)."""

REGRESSION: Final = "regression"
IMPROVEMENT: Final = "improvement"
NO_SIGNIFICANT_CHANGE: Final = "no significant change"  # bootstrap: the interval holds 0...
WITHIN_THRESHOLD: Final = "within threshold"  # threshold rule: |change| <= threshold
NOT_ENOUGH_DATA: Final = "not enough data"  # too few data (or no value) on a side: undecided
VERDICTS: Final = (REGRESSION, IMPROVEMENT, NO_SIGNIFICANT_CHANGE, WITHIN_THRESHOLD,
                   NOT_ENOUGH_DATA)  # fmt: skip


@dataclass(frozen=True)
class Change:
    """One metric of one step: A, B, the change, the verdict and whether it is a regression."""

    step: str  # "cold" or the step label "c=<concurrency>" / "r=<rate>"
    concurrency: int  # a rate step's: its cap on requests in flight (0 none)
    rate: float | None  # the intended rate of a rate step (requests/s); None otherwise
    metric: str
    a: float | None
    b: float | None
    change: float | None  # relative (b - a) / a; absolute b - a for error_rate
    regression: bool
    method: str = "threshold"  # what decided: "bootstrap" or "threshold"
    ci_low: float | None = None  # bootstrap: the 95% interval of the relative change
    ci_high: float | None = None
    verdict: str = ""  # one of VERDICTS
    why: str = ""  # why "not enough data", or why a change is not significant


@dataclass
class Comparison:
    run_a: str
    run_b: str
    threshold: float
    error_rate_threshold: float
    changes: list[Change] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # steps present in one run only
    warnings: list[str] = field(default_factory=list)
    method: str = "threshold"
    resamples: int | None = None  # bootstrap only
    seed: int | None = None
    confidence: float | None = None

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    @property
    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(c) for c in self.changes])

    def verdicts(self) -> dict[str, int]:
        """How many changes earned each verdict (every verdict named, zeros included)."""
        return {v: sum(c.verdict == v for c in self.changes) for v in VERDICTS}

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "schema_version": COMPARISON_SCHEMA_VERSION,
                "kind": "llmload.comparison",
                "run_a": self.run_a,
                "run_b": self.run_b,
                "method": self.method,
                "resamples": self.resamples,
                "seed": self.seed,
                "confidence": self.confidence,
                "threshold": self.threshold,
                "error_rate_threshold": self.error_rate_threshold,
                "regressions": len(self.regressions),
                "verdicts": self.verdicts(),
                "unmatched": self.unmatched,
                "warnings": self.warnings,
                "changes": [asdict(c) for c in self.changes],
            }
        )


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _threshold_change(
    where: tuple[str, int, float | None], metric: str, a: Any, b: Any, threshold: float,
    error_threshold: float,
) -> Change:  # fmt: skip
    """The threshold rule: no interval, the observed change against the threshold."""
    fa = None if _missing(a) else float(a)
    fb = None if _missing(b) else float(b)
    if fa is None or fb is None:
        side = "A and B" if fa is None and fb is None else "A" if fa is None else "B"
        return Change(*where, metric, fa, fb, None, False, verdict=NOT_ENOUGH_DATA,
                      why=f"no value in {side}")  # fmt: skip
    if metric in ABSOLUTE:
        change, limit, worse_sign = fb - fa, error_threshold, 1.0
    elif fa == 0:
        return Change(*where, metric, fa, fb, None, False, verdict=NOT_ENOUGH_DATA,
                      why="A is 0: no relative change")  # fmt: skip
    else:
        change, limit = (fb - fa) / abs(fa), threshold
        worse_sign = 1.0 if metric in LOWER_IS_BETTER else -1.0
    worse, better = change * worse_sign > limit, change * worse_sign < -limit
    verdict = REGRESSION if worse else IMPROVEMENT if better else WITHIN_THRESHOLD
    return Change(*where, metric, fa, fb, change, worse, verdict=verdict)


def _bootstrap_change(
    where: tuple[str, int, float | None], metric: str, fig_a: bootstrap.Figure,
    fig_b: bootstrap.Figure, draws_a: np.ndarray, draws_b: np.ndarray, threshold: float,
    confidence: float,
) -> Change:  # fmt: skip
    """One figure by bootstrap: the interval of the relative change, then the verdict."""
    fa = None if _missing(fig_a.observed) else float(fig_a.observed)
    fb = None if _missing(fig_b.observed) else float(fig_b.observed)
    change = (fb - fa) / abs(fa) if fa and fb is not None else None
    if fig_a.why_not and fig_a.why_not == fig_b.why_not:
        why = f"A and B: {fig_a.why_not}"
    else:
        why = "; ".join(
            f"{side}: {f.why_not}" for side, f in (("A", fig_a), ("B", fig_b)) if f.why_not
        )
    if not why and (fa is None or fb is None):
        why = f"no value in {'A' if fa is None else 'B'}"
    elif not why and not fa:
        why = "A is 0: no relative change"
    if why:
        return Change(*where, metric, fa, fb, change, False, "bootstrap",
                      verdict=NOT_ENOUGH_DATA, why=why)  # fmt: skip
    assert fa and fb is not None and change is not None
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = (draws_b - draws_a) / np.abs(draws_a)
    low, high = bootstrap.interval(relative, confidence)
    if not (math.isfinite(low) and math.isfinite(high)):
        return Change(*where, metric, fa, fb, change, False, "bootstrap",
                      verdict=NOT_ENOUGH_DATA, why="no resample has a value on both sides")  # fmt: skip
    # in the direction of "worse": latencies up, throughputs down
    sign = 1.0 if metric in LOWER_IS_BETTER else -1.0
    worse_low, worse_high = sorted((low * sign, high * sign))
    if worse_low > 0 and change * sign > threshold:
        verdict, why = REGRESSION, ""
    elif worse_high < 0 and change * sign < -threshold:
        verdict, why = IMPROVEMENT, ""
    elif low > 0 or high < 0:
        verdict, why = NO_SIGNIFICANT_CHANGE, f"significant, but within ±{threshold:.0%}"
    else:
        verdict, why = NO_SIGNIFICANT_CHANGE, f"the {confidence:.0%} interval holds 0"
    return Change(*where, metric, fa, fb, change, verdict == REGRESSION, "bootstrap", low, high,
                  verdict, why)  # fmt: skip


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


_Judge = Callable[[tuple[str, int, float | None], dict[str, Any], dict[str, Any]], list[Change]]
"""(step label, concurrency, rate), A's row, B's row -> the changes of that pair of steps."""


def _pair(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], result: Comparison,
          judge: _Judge) -> Comparison:  # fmt: skip
    """Match the steps of A and B and judge every pair into `result`."""
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
        result.changes += judge((label, conc, rate), a[key], b[key])
    if result.unmatched:
        result.warnings.append("steps without a partner: " + ", ".join(result.unmatched))
    if caps:
        result.warnings.append(
            "rate steps paired across different caps on requests in flight (--max-concurrency): "
            + ", ".join(caps)
        )
    return result


def compare_summaries(
    rows_a: list[dict[str, Any]],
    rows_b: list[dict[str, Any]],
    *,
    run_a: str = "A",
    run_b: str = "B",
    threshold: float = DEFAULT_THRESHOLD,
    error_rate_threshold: float = DEFAULT_ERROR_RATE_THRESHOLD,
) -> Comparison:
    """Compare two lists of summary rows (summary.json `steps`) by the threshold rule."""
    _check_thresholds(threshold, error_rate_threshold)

    def judge(where: tuple[str, int, float | None], ra: dict[str, Any], rb: dict[str, Any]
              ) -> list[Change]:  # fmt: skip
        return [
            _threshold_change(where, m, ra.get(m), rb.get(m), threshold, error_rate_threshold)
            for m in COMPARED
        ]

    return _pair(rows_a, rows_b, Comparison(run_a, run_b, threshold, error_rate_threshold), judge)


def compare_reports(
    report_a: Report,
    report_b: Report,
    *,
    run_a: str = "A",
    run_b: str = "B",
    threshold: float = DEFAULT_THRESHOLD,
    error_rate_threshold: float = DEFAULT_ERROR_RATE_THRESHOLD,
    resamples: int = bootstrap.RESAMPLES,
    seed: int = bootstrap.SEED,
) -> Comparison:
    """Compare two reports summarised with their per-request values (and chunks, for ITL):
    the bootstrap decides FIGURES of every matched step, the threshold rule the rest.

    A's step at position p of its rows draws its resamples from seed_for(seed, 0, p), B's
    from seed_for(seed, 1, p): the same reports and seed give the same intervals."""
    _check_thresholds(threshold, error_rate_threshold)
    _check_bootstrap(resamples, seed)
    confidence = bootstrap.CONFIDENCE
    places = [
        {id(row): (position, members) for position, row, members in bootstrap.step_rows(r)}
        for r in (report_a, report_b)
    ]

    def judge(where: tuple[str, int, float | None], ra: dict[str, Any], rb: dict[str, Any]
              ) -> list[Change]:  # fmt: skip
        changes = [
            _threshold_change(where, m, ra.get(m), rb.get(m), threshold, error_rate_threshold)
            for m in COMPARED
        ]
        if id(ra) not in places[0] or id(rb) not in places[1]:
            return changes  # the cold group: no resampled figures
        samples, draws = [], []
        for run, (report, row) in enumerate(((report_a, ra), (report_b, rb))):
            position, members = places[run][id(row)]
            sample = bootstrap.step_sample(report, row, members, RESAMPLED)
            samples.append(sample.figures)
            draws.append(sample.resampled(resamples, bootstrap.seed_for(seed, run, position)))
        decided = {
            name: _bootstrap_change(where, name, samples[0][name], samples[1][name],
                                    draws[0][name], draws[1][name], threshold, confidence)
            for name in RESAMPLED
        }  # fmt: skip
        return [decided.get(c.metric, c) for c in changes]

    result = Comparison(run_a, run_b, threshold, error_rate_threshold, method="bootstrap",
                        resamples=resamples, seed=seed, confidence=confidence)  # fmt: skip
    return _pair(report_a.table.rows, report_b.table.rows, result, judge)


def _summary_path(where: str) -> Path | None:
    """The summary.json that `where` names (a report directory or the file), else None."""
    path = Path(where)
    summary = path / "summary.json" if path.is_dir() else path
    return summary if summary.is_file() and summary.suffix == ".json" else None


def _summary_rows(where: str, slo: str | None) -> tuple[list[dict[str, Any]], list[str], str]:
    """A run's summary rows, warnings and the SLO spec its goodput and verdicts used."""
    summary = _summary_path(where)
    if summary is not None:
        try:
            doc = json.loads(summary.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UsageError(f"{summary} is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("kind") != SUMMARY_KIND:
            raise UsageError(f"{summary} is not an llmload summary.json")
        spec = str((doc.get("slo") or {}).get("spec") or "")
        return list(doc.get("steps") or []), list(doc.get("warnings") or []), spec
    from analysis.read.load import load_run
    from analysis.report.summary import summarize_run

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


def _check_bootstrap(resamples: int, seed: int) -> None:
    if resamples < MIN_RESAMPLES:
        raise UsageError(
            f"--resamples must be >= {MIN_RESAMPLES}, not {resamples} "
            f"(default {bootstrap.RESAMPLES})"
        )
    if seed < 0:
        raise UsageError(f"--seed must be >= 0, not {seed}")


def compare_runs(
    run_a: str,
    run_b: str,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    error_rate_threshold: float = DEFAULT_ERROR_RATE_THRESHOLD,
    slo: str | None = None,
    method: str = DEFAULT_METHOD,
    resamples: int = bootstrap.RESAMPLES,
    seed: int = bootstrap.SEED,
) -> Comparison:
    """Compare run B against baseline A: by bootstrap (each a RUN_URI, summarised with its
    chunks in memory) or by the threshold rule (each a RUN_URI or a report directory)."""
    _check_thresholds(threshold, error_rate_threshold)  # before anything is read
    if method not in METHODS:
        raise UsageError(f"--method must be one of {', '.join(METHODS)}, not {method!r}")
    if method == "threshold":
        rows_a, warn_a, slo_a = _summary_rows(run_a, slo)
        rows_b, warn_b, slo_b = _summary_rows(run_b, slo)
        result = compare_summaries(rows_a, rows_b, run_a=run_a, run_b=run_b, threshold=threshold,
                                   error_rate_threshold=error_rate_threshold)  # fmt: skip
    else:
        _check_bootstrap(resamples, seed)
        for where in (run_a, run_b):
            if _summary_path(where) is not None:
                raise UsageError(
                    f"{where} is a report (summary.json): the bootstrap needs each request's "
                    "values; give the run's RUN_URI, or --method threshold"
                )
        from analysis.read.engine import DEFAULT_MEMORY_LIMIT, Engine, engine_share
        from analysis.read.load import load_run
        from analysis.report.summary import summarize_run

        # out of core (analysis/steps/outofcore.py): each step's figures exact, its resamples
        # drawn from a seeded sample of its requests (bootstrap_steps), one run at a time
        with Engine(engine_share(DEFAULT_MEMORY_LIMIT), on_disk=True) as engine:
            report_a, report_b = (
                summarize_run(load_run(where, chunks=False, requests=False), slo, engine,
                              bootstrap=(bootstrap.SLICES, seed), requests_file=False)
                for where in (run_a, run_b)
            )  # fmt: skip
        result = compare_reports(report_a, report_b, run_a=run_a, run_b=run_b,
                                 threshold=threshold, error_rate_threshold=error_rate_threshold,
                                 resamples=resamples, seed=seed)  # fmt: skip
        warn_a, slo_a = report_a.warnings, report_a.slo.spec
        warn_b, slo_b = report_b.warnings, report_b.slo.spec
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


def _fmt_interval(change: Change) -> str:
    if change.ci_low is None or change.ci_high is None:
        return "—"
    return f"[{change.ci_low:+.1%}, {change.ci_high:+.1%}]"


def _fmt_verdict(change: Change) -> str:
    text = "REGRESSION" if change.regression else change.verdict
    return f"{text} ({change.why})" if change.why else text


_ORDER = {REGRESSION: 0, IMPROVEMENT: 1, NOT_ENOUGH_DATA: 3}  # the rest: 2


def render_comparison_markdown(result: Comparison) -> str:
    from analysis.render.report_md import md_table

    rule = (
        f"latency up or throughput down by more than {result.threshold:.0%}, "
        f"error rate up by more than {result.error_rate_threshold * 100:g} points"
    )
    if result.method == "bootstrap":
        how = (
            f"- method: bootstrap, {result.resamples} resamples (seed {result.seed}) per run "
            f"and step; a regression when the {result.confidence or 0:.0%} interval of the "
            f"relative change excludes 0 and the change is a {rule} (figures without an "
            "interval: the threshold rule)"
        )
    else:
        how = f"- method: threshold; a regression: {rule}"
    counts = result.verdicts()
    out = [
        "# llmload comparison",
        "",
        f"- A (baseline): `{result.run_a}`",
        f"- B (candidate): `{result.run_b}`",
        how,
        f"- **{len(result.regressions)} regression(s)**, "
        + ", ".join(f"{n} {v}" for v, n in counts.items() if n and v != REGRESSION),
        "",
    ]
    headers = ["step", "metric", "A", "B", "change", f"{result.confidence or 0.95:.0%} interval",
               "verdict"]  # fmt: skip
    rows = [
        [
            c.step,
            c.metric,
            _fmt(c.metric, c.a),
            _fmt(c.metric, c.b),
            _fmt_change(c),
            _fmt_interval(c),
            _fmt_verdict(c),
        ]
        for c in sorted(result.changes, key=lambda c: _ORDER.get(c.verdict, 2))
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
