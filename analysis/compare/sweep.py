"""Which configuration wins: the runs of an engine sweep side by side (docs/sweeps.md).

    sweep = build_sweep([SweepEntry("max-num-seqs-1", "s3://b/runs/r1"), ...], slo="tpot_p99=0.1")
    sweep.points        # one per configuration and step: the figures the choice is made on
    sweep.best          # per workload: the configuration (and step) that wins under the SLO
    sweep.verdicts      # the best against each other configuration, step by step, bootstrap

Every configuration ran the same plan. Per step, a point holds requests/s, output tokens/s
per instance and per accelerator, tokens/s per user (1 / TPOT mean: the decode speed a user
sees; the mean, because a request whose answer came in one read has a TPOT of 0, which
would leave a median of 0 undefined here), goodput, TTFT p50/p99, TPOT mean/p50/p99,
energy and cost per token where the run had
accelerator telemetry or a price, and whether the step met the SLO.

- **The Pareto front** (per workload): the points no other point beats on both tokens/s per
  accelerator and tokens/s per user. Moving along it trades one for the other.
- **The best configuration**: the highest tokens/s per accelerator among the steps that
  meet the SLO (every step when the SLO has no step objective). None when no step meets it.
- **Verdicts**: the best configuration's run against each other one's, at every step level
  both ran, by compare's bootstrap (analysis/compare/runs.py, `compare_reports`): per
  figure, the 95% interval of the relative change. With `threshold` 0 (the default here),
  a change is significant when its interval excludes 0; "not significantly different" is
  a possible answer, and so is "not enough data".

Tokens/s per accelerator is the run's own column where it has one (`--accelerators`, or the
GPUs its telemetry saw), else output tokens/s over the configuration's `accelerators`; a
configuration whose accelerators are unknown counts as one, and the sweep says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

import analysis.compare.bootstrap as bootstrap
from analysis.compare.runs import (
    IMPROVEMENT,
    NOT_ENOUGH_DATA,
    REGRESSION,
    Change,
    compare_reports,
)
from analysis.judge.search import SearchSummary, level_text, result_line
from analysis.report.summary import jsonable

if TYPE_CHECKING:
    from analysis.report.summary import Report

SWEEP_SCHEMA_VERSION: Final = "1.0"
JUDGED: Final = ("output_tokens_per_s", "tpot_mean_s", "ttft_p99_s", "goodput_requests_per_s")
"""The figures each verdict judges: throughput, the decode speed a user sees, the tail of
the first token, and the requests that met the SLO."""
UNKNOWN_ACCELERATORS: Final = ("accelerators unknown (no telemetry, no engine.accelerators): "
                               "tokens/s per accelerator counts one")  # fmt: skip
BEST_BETTER: Final = "best significantly better"
OTHER_BETTER: Final = "other significantly better"
NOT_DIFFERENT: Final = "not significantly different"
STATUSES: Final = ("done", "crashed", "failed", "failed_start")
"""A configuration's outcome: its plan ran (`done`); the engine exited during the plan
(`crashed`: its runs are kept, with the errors they met); the run failed (`failed`); the
engine never became ready (`failed_start`)."""


@dataclass(frozen=True)
class SweepEntry:
    """One configuration's run (of one workload), and what the sweep knows of its engine."""

    config: str
    run_uri: str | None  # None: no run (the engine never started)
    workload: str = "default"
    args: str = ""
    accelerators: int = 0  # 0: unknown
    status: str = "done"
    startup_s: float | None = None
    error: str = ""
    log_tail: str = ""
    run_id: str = ""


@dataclass
class SweepPoint:
    config: str
    workload: str
    step: str  # "c=4" or "r=2"
    level: float
    mode: str
    requests_per_s: float
    output_tokens_per_s: float
    accelerators: float  # NaN: unknown (counted as one)
    tokens_per_s_per_accelerator: float
    tokens_per_s_per_user: float  # 1 / TPOT mean
    goodput_requests_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    j_per_output_token: float
    cost_per_1m_output_tokens: float
    slo_pass: bool | None
    simulated: bool
    pareto: bool = False


@dataclass
class Verdict:
    workload: str
    step: str
    best: str
    other: str
    metric: str
    best_value: float | None
    other_value: float | None
    change: float | None  # (other - best) / best
    ci_low: float | None
    ci_high: float | None
    verdict: str  # BEST_BETTER, OTHER_BETTER, NOT_DIFFERENT or "not enough data"
    why: str = ""


@dataclass(frozen=True)
class Capacity:
    """What a configuration's capacity search found (analysis/judge/search.py)."""

    workload: str
    config: str
    mode: str  # concurrency | rate
    slo: str  # the SLO the search judged by
    status: str  # found | all_passed | lowest_failed | stopped | running
    level: float | None  # the highest level that met the SLO, live verdicts; None: none
    level_exact: float | None  # the same, by the verdicts checked on the events
    requests_per_s: float | None  # measured at `level`
    line: str  # the report's own sentence for it

    @property
    def text(self) -> str:
        """The level as a reader compares it: `above 120 requests/s`, `41.2 requests/s`."""
        if self.level is None:
            return "none (the lowest level missed the SLO)"
        said = level_text(self.mode, self.level)
        if self.status == "all_passed":
            return f"above {said} (every level passed)"
        if self.status != "found":
            return f"{said} so far (search {self.status})"
        return said

    @property
    def rank(self) -> tuple[int, float]:
        """Higher is more capacity: a search whose every level passed ranks by its top."""
        return (0, -1.0) if self.level is None else (1, self.level)


@dataclass
class Sweep:
    entries: list[SweepEntry]
    slo: str
    points: list[SweepPoint] = field(default_factory=list)
    capacities: list[Capacity] = field(default_factory=list)
    best: dict[str, SweepPoint | None] = field(default_factory=dict)  # by workload
    verdicts: list[Verdict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    resamples: int = bootstrap.RESAMPLES
    seed: int = bootstrap.SEED
    threshold: float = 0.0
    name: str = "sweep"

    @property
    def simulated(self) -> bool:
        return any(p.simulated for p in self.points)

    @property
    def workloads(self) -> list[str]:
        """The workloads some configuration ran (one without a run names none)."""
        return list(dict.fromkeys(e.workload for e in self.entries if e.run_uri)) or ["default"]

    def front(self, workload: str) -> list[SweepPoint]:
        """The workload's Pareto points, by tokens/s per user."""
        return sorted((p for p in self.points if p.workload == workload and p.pareto),
                      key=lambda p: p.tokens_per_s_per_user)  # fmt: skip

    def best_line(self, workload: str) -> str:
        """The winner in one line, with how sure the verdicts are of it."""
        best = self.best.get(workload)
        if best is None:
            ran = [p for p in self.points if p.workload == workload]
            if not ran:
                return "no configuration produced a step to judge"
            return f"no configuration met the SLO {self.slo} at any step"
        under = f" under the SLO {self.slo}" if self.slo else ""
        line = (f"best{under}: {best.config} at {best.step}: "
                f"{best.tokens_per_s_per_accelerator:.1f} output tokens/s per accelerator, "
                f"{best.tokens_per_s_per_user:.1f} tokens/s per user")  # fmt: skip
        close = [v.other for v in self.verdicts if v.workload == workload
                 and v.step == best.step and v.metric == "output_tokens_per_s"
                 and v.verdict != BEST_BETTER]  # fmt: skip
        if close:
            line += (f"; its throughput is not significantly higher than that of "
                     f"{', '.join(close)} at {best.step}")  # fmt: skip
        return line

    def headlines(self, workload: str) -> list[str]:
        """What the sweep found for the workload: the best line, then the capacities."""
        return [self.best_line(workload), *filter(None, [self.capacity_line(workload)])]

    def capacity_line(self, workload: str) -> str:
        """The configurations by capacity under their search's SLO ("" without a search)."""
        found = sorted((c for c in self.capacities if c.workload == workload),
                       key=lambda c: c.rank, reverse=True)  # fmt: skip
        if not found:
            return ""
        what = "rate" if found[0].mode == "rate" else "concurrency"
        said = "; ".join(f"{c.config} {c.text}" for c in found)
        line = f"capacity under the SLO {found[0].slo} (search by {what}): {said}"
        differ = [c.config for c in found if c.level_exact != c.level]
        if differ:
            line += (f" (the events' exact verdicts put {', '.join(differ)} elsewhere: "
                     "see each run's report)")  # fmt: skip
        return line

    def to_json(self) -> dict[str, Any]:
        return jsonable({
            "schema_version": SWEEP_SCHEMA_VERSION,
            "kind": "llmload.sweep",
            "name": self.name,
            "simulated": self.simulated,
            "slo": self.slo,
            "resamples": self.resamples,
            "seed": self.seed,
            "threshold": self.threshold,
            "configurations": [asdict(e) for e in self.entries],
            "points": [asdict(p) for p in self.points],
            "best": {w: (asdict(p) if p else None) for w, p in self.best.items()},
            "best_lines": {w: self.best_line(w) for w in self.workloads},
            "capacities": [asdict(c) | {"text": c.text} for c in self.capacities],
            "capacity_lines": {w: line for w in self.workloads if (line := self.capacity_line(w))},
            "verdicts": [asdict(v) for v in self.verdicts],
            "warnings": self.warnings,
        })  # fmt: skip


def _num(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return number if math.isfinite(number) else float("nan")


def _step(row: dict[str, Any]) -> tuple[str, float]:
    if row.get("mode") == "rate" and not math.isnan(_num(row.get("rate"))):
        return f"r={_num(row['rate']):g}", _num(row["rate"])
    return f"c={int(row['concurrency'])}", float(row["concurrency"])


def points_of(entry: SweepEntry, report: Report, warnings: list[str]) -> list[SweepPoint]:
    """The configuration's steps as sweep points."""
    out = []
    for row in report.step_rows:
        step, level = _step(row)
        tokens = _num(row.get("output_tokens_per_s"))
        accelerators = _num(row.get("accelerators"))
        if math.isnan(accelerators) and entry.accelerators > 0:
            accelerators = float(entry.accelerators)
        per_accel = _num(row.get("output_tokens_per_s_per_accelerator"))
        if math.isnan(per_accel):
            per_accel = tokens / (accelerators if accelerators > 0 else 1.0)
        tpot = _num(row.get("tpot_mean_s"))
        out.append(SweepPoint(
            config=entry.config, workload=entry.workload, step=step, level=level,
            mode=str(row.get("mode") or "concurrency"),
            requests_per_s=_num(row.get("requests_per_s")), output_tokens_per_s=tokens,
            accelerators=accelerators, tokens_per_s_per_accelerator=per_accel,
            tokens_per_s_per_user=1.0 / tpot if tpot > 0 else float("nan"),
            goodput_requests_per_s=_num(row.get("goodput_requests_per_s")),
            ttft_p50_s=_num(row.get("ttft_p50_s")), ttft_p99_s=_num(row.get("ttft_p99_s")),
            tpot_mean_s=tpot, tpot_p50_s=_num(row.get("tpot_p50_s")),
            tpot_p99_s=_num(row.get("tpot_p99_s")),
            j_per_output_token=_num(row.get("accel_j_per_output_token")),
            cost_per_1m_output_tokens=_num(row.get("cost_per_1m_output_tokens")),
            slo_pass=row.get("slo_pass"), simulated=report.simulated,
        ))  # fmt: skip
    if out and math.isnan(out[0].accelerators):
        warnings.append(f"{entry.config}: {UNKNOWN_ACCELERATORS}")
    return sorted(out, key=lambda p: p.level)  # a search's probes by level, not by order


def capacity_of(entry: SweepEntry, search: SearchSummary) -> Capacity:
    """The configuration's capacity search as the sweep compares it."""
    exact = search.best_exact
    result = search.result
    return Capacity(
        workload=entry.workload, config=entry.config, mode=search.mode, slo=search.slo,
        status=search.status, level=result.level if result is not None else None,
        level_exact=exact.level if exact is not None else None,
        requests_per_s=result.requests_per_s if result is not None else None,
        line=result_line(search),
    )  # fmt: skip


def mark_pareto(points: Sequence[SweepPoint]) -> None:
    """Mark the points no other point of their workload beats on both axes (tokens/s per
    accelerator and per user; a point with either unknown is never on the front)."""
    for p in points:
        x, y = p.tokens_per_s_per_user, p.tokens_per_s_per_accelerator
        if math.isnan(x) or math.isnan(y):
            p.pareto = False
            continue
        p.pareto = not any(
            q is not p and q.workload == p.workload
            and q.tokens_per_s_per_user >= x and q.tokens_per_s_per_accelerator >= y
            and (q.tokens_per_s_per_user > x or q.tokens_per_s_per_accelerator > y)
            for q in points
        )  # fmt: skip


def pick_best(points: Iterable[SweepPoint], workload: str) -> SweepPoint | None:
    """The highest tokens/s per accelerator among the workload's steps that meet the SLO
    (slo_pass None: no objective, every step counts)."""
    eligible = [p for p in points if p.workload == workload and p.slo_pass is not False
                and not math.isnan(p.tokens_per_s_per_accelerator)]  # fmt: skip
    return max(eligible, key=lambda p: p.tokens_per_s_per_accelerator, default=None)


def _verdict(change: Change) -> tuple[str, str]:
    """Compare's verdict of B (the other) against A (the best), said of the two."""
    if change.verdict == NOT_ENOUGH_DATA or change.ci_low is None:
        return NOT_ENOUGH_DATA, change.why
    if change.verdict == REGRESSION:
        return BEST_BETTER, ""
    if change.verdict == IMPROVEMENT:
        return OTHER_BETTER, ""
    return NOT_DIFFERENT, change.why


def judge(best: Report, other: Report, best_name: str, other_name: str, workload: str,
          sweep: Sweep) -> list[Verdict]:  # fmt: skip
    """The best configuration's run (A) against another's (B), at every step both ran."""
    comparison = compare_reports(best, other, run_a=best_name, run_b=other_name,
                                 threshold=sweep.threshold, resamples=sweep.resamples,
                                 seed=sweep.seed)  # fmt: skip
    out = []
    for change in comparison.changes:
        if change.metric not in JUDGED or change.step == "cold":
            continue
        if change.a is None and change.b is None:
            continue  # neither run has the figure (goodput without thresholds)
        verdict, why = _verdict(change)
        out.append(Verdict(workload, change.step, best_name, other_name, change.metric,
                           change.a, change.b, change.change, change.ci_low, change.ci_high,
                           verdict, why))  # fmt: skip
    return out


def build_sweep(
    entries: Sequence[SweepEntry],
    slo: str | None = None,
    *,
    name: str = "sweep",
    resamples: int = bootstrap.RESAMPLES,
    seed: int = bootstrap.SEED,
    threshold: float = 0.0,
) -> Sweep:
    """Summarise every configuration's run (with its per-request values, as compare does),
    then the points, the Pareto front, the best configuration and its verdicts."""
    from analysis.read.engine import DEFAULT_MEMORY_LIMIT, Engine, engine_share
    from analysis.read.load import load_run
    from analysis.report.summary import summarize_run

    sweep = Sweep(list(entries), slo or "", resamples=resamples, seed=seed,
                  threshold=threshold, name=name)  # fmt: skip
    reports: dict[tuple[str, str], Report] = {}
    with Engine(engine_share(DEFAULT_MEMORY_LIMIT), on_disk=True) as engine:
        for entry in entries:
            if entry.run_uri is None:
                continue
            run = load_run(entry.run_uri, chunks=False, requests=False)
            report = summarize_run(run, slo, engine, bootstrap=(bootstrap.SLICES, seed),
                                   requests_file=False)  # fmt: skip
            reports[(entry.workload, entry.config)] = report
            if not sweep.slo and report.slo.spec:
                sweep.slo = report.slo.spec  # each run's own SLO, when none is given
            sweep.points += points_of(entry, report, sweep.warnings)
            if report.search is not None:
                sweep.capacities.append(capacity_of(entry, report.search))
            if entry.status == "crashed":
                sweep.warnings.append(f"{entry.config}: the engine exited during its plan; "
                                      "its steps hold the errors that followed")  # fmt: skip
    for entry in entries:
        if entry.status in ("failed_start", "failed"):
            sweep.warnings.append(f"{entry.config}: {entry.status.replace('_', ' ')}: "
                                  f"{entry.error or 'see its log'}")  # fmt: skip
    mark_pareto(sweep.points)
    for workload in sweep.workloads:
        best = pick_best(sweep.points, workload)
        sweep.best[workload] = best
        if best is None:
            continue
        for entry in entries:
            key = (workload, entry.config)
            if entry.workload != workload or entry.config == best.config or key not in reports:
                continue
            sweep.verdicts += judge(reports[(workload, best.config)], reports[key],
                                    best.config, entry.config, workload, sweep)  # fmt: skip
    unknown = [w.split(":")[0] for w in sweep.warnings if w.endswith(UNKNOWN_ACCELERATORS)]
    if len(unknown) > 1:  # one line for them all
        sweep.warnings = [w for w in sweep.warnings if not w.endswith(UNKNOWN_ACCELERATORS)]
        sweep.warnings.append(f"{', '.join(unknown)}: {UNKNOWN_ACCELERATORS}")
    if len({p.simulated for p in sweep.points}) > 1:
        sweep.warnings.append("some configurations ran against a SIMULATED engine and some "
                              "against a real one: they are not comparable")  # fmt: skip
    return sweep
