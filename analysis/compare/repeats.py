"""Repeats of one plan: per step, the median across runs and a confidence interval of it.

    repeats = repeats_of(["s3://b/runs/r1", "s3://b/runs/r2", ...])   # loads and summarises
    repeats = summarize_repeats(reports, resamples=1000, seed=0)       # Reports in hand
    repeats.figures[0].median, .ci_low, .ci_high, .values              # one per step and figure

Run the same plan R times and each headline figure (analysis/compare/bootstrap.py FIGURES) comes out
R times per step. The point shown is the nearest-rank (lower) median of the R runs' figures:
a value some run measured. Its interval is a two-level bootstrap: for each resample b, R runs
are drawn with replacement (one draw of runs per step, shared by its figures), each drawn
run brings its own b-th within-run resample (bootstrap.StepSample.resampled: groups of
requests, or window slices for throughputs, drawn with replacement), and the statistic is the
nearest-rank median over the drawn runs. The CONFIDENCE interval is the percentile interval
of those statistics. So the interval widens both when runs disagree and when each run had
few requests.

Steps are matched across runs by concurrency (closed loop) or intended rate (open loop), as
`llmload compare` matches them (with `--by model` rows, by model as well). A step some run
lacks is left out with a warning (runs of different plans); a rate run with a concurrency
run is refused (UsageError). A figure some run has too few data for (`enough` False there)
gets its median and per-run values but no interval, and says why.

Seeds: run i (1-based, in the order given) resamples its step at report position p with
`seed_for(seed, i, p)`; the draw of runs for the k-th matched step uses `seed_for(seed, 0, k)`.
The same reports, seed and resamples give the same intervals, bit for bit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pandas as pd

from analysis.compare.bootstrap import (
    CONFIDENCE,
    FIGURES,
    RESAMPLES,
    SEED,
    SLICES,
    StepSample,
    interval,
    nearest_rank_median,
    seed_for,
    step_rows,
    step_sample,
)
from analysis.kernel.errors import UsageError
from analysis.report.summary import jsonable

if TYPE_CHECKING:
    from analysis.kernel.slo import Slo
    from analysis.report.summary import Report
    from analysis.steps.outofcore import DiskStep

REPEATS_KIND: Final = "llmload.repeats"
REPEATS_SCHEMA_VERSION: Final = "1.0"

_Key = tuple[bool, float, str, int]  # rate step?, level, model ("" unsplit), occurrence


@dataclass(frozen=True)
class RepeatFigure:
    """One figure of one step across the runs: median, interval, and every run's value."""

    step: str  # "c=4" / "r=8" (a row of a split by model adds its model: "c=4 a")
    mode: str  # "concurrency" or "rate"
    concurrency: int  # a rate step's: its cap on requests in flight (0 none)
    rate: float | None  # the intended rate of a rate step (requests/s); None otherwise
    figure: str  # a bootstrap.FIGURES name, e.g. ttft_p50_s
    median: float | None  # nearest-rank median of the runs' values (None: no run has it)
    ci_low: float | None  # None: no interval (see `why`)
    ci_high: float | None
    values: tuple[float | None, ...]  # each run's figure, in the order of Repeats.run_ids
    runs: int  # runs that measured the figure
    enough: bool  # every run had data enough to resample it
    why: str = ""  # when not enough: which run, and why

    @property
    def level(self) -> float:
        return (
            float(self.rate)
            if self.mode == "rate" and self.rate is not None
            else float(self.concurrency)
        )


@dataclass
class Repeats:
    """The repeats report: per matched step and figure, a RepeatFigure."""

    run_ids: list[str]
    run_uris: list[str]
    seed: int
    resamples: int
    confidence: float
    simulated: bool
    figures: list[RepeatFigure] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # steps left out (some run lacks them)
    warnings: list[str] = field(default_factory=list)

    @property
    def frame(self) -> pd.DataFrame:
        """repeats.csv: one row per step and figure; `values` a JSON list (null: missing)."""
        rows = []
        for f in self.figures:
            row = asdict(f)
            row["values"] = json.dumps(jsonable(list(f.values)))
            rows.append(row)
        columns = [
            "step", "mode", "concurrency", "rate", "figure", "median", "ci_low", "ci_high",
            "values", "runs", "enough", "why",
        ]  # fmt: skip
        return pd.DataFrame(rows, columns=columns)

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "schema_version": REPEATS_SCHEMA_VERSION,
                "kind": REPEATS_KIND,
                "simulated": self.simulated,
                "runs": self.run_ids,
                "run_uris": self.run_uris,
                "seed": self.seed,
                "resamples": self.resamples,
                "confidence": self.confidence,
                "unmatched": self.unmatched,
                "warnings": self.warnings,
                "figures": [asdict(f) for f in self.figures],
            }
        )


def repeats_of(
    run_uris: Sequence[str],
    slo: Slo | str | None = None,
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Repeats:
    """Load and summarise each run with its chunks in memory (ITL needs them), then
    summarize_repeats."""
    from analysis.read.engine import DEFAULT_MEMORY_LIMIT, Engine, engine_share
    from analysis.read.load import load_run
    from analysis.report.summary import summarize_run

    with Engine(engine_share(DEFAULT_MEMORY_LIMIT), on_disk=True) as engine:
        reports = [
            summarize_run(load_run(uri, progress=False, chunks=False, requests=False), slo,
                          engine, bootstrap=(SLICES, seed), requests_file=False)
            for uri in run_uris
        ]  # fmt: skip
    return summarize_repeats(reports, resamples=resamples, seed=seed)


def summarize_repeats(
    reports: Sequence[Report], *, resamples: int = RESAMPLES, seed: int = SEED
) -> Repeats:
    """The repeats of reports summarised in memory (Report.itl set); see the module docstring."""
    if not reports:
        raise UsageError("repeats need at least one run")
    if resamples < 1:
        raise UsageError(f"--resamples must be >= 1, not {resamples}")
    modes = {"rate" if r.open_loop else "concurrency" for r in reports if r.step_rows}
    if len(modes) > 1:
        raise UsageError(
            "the runs mix rate (open-loop) and concurrency steps: they measure different "
            "things; give repeats of one plan"
        )
    out = Repeats(
        run_ids=[r.run_id for r in reports],
        run_uris=[r.run_uri for r in reports],
        seed=int(seed),
        resamples=int(resamples),
        confidence=CONFIDENCE,
        simulated=any(r.simulated for r in reports),
    )
    if len(set(out.run_ids)) != len(out.run_ids):
        out.warnings.append("a run is given more than once: its figures count once per mention")
    keyed = [_keyed_steps(r) for r in reports]
    matched = [k for k in keyed[0] if all(k in other for other in keyed[1:])]
    every = dict.fromkeys(k for steps in keyed for k in steps)
    for key in every:
        if key not in matched:
            holders = [rid for rid, steps in zip(out.run_ids, keyed, strict=True) if key in steps]
            label = next(steps[key][1]["label"] for steps in keyed if key in steps)
            out.unmatched.append(label)
            out.warnings.append(
                f"step {label} is not in every run (only in {', '.join(holders)}): left out; "
                "repeats are of one plan"
            )
    for number, key in enumerate(matched):
        steps = [steps[key] for steps in keyed]
        out.figures.extend(_step_figures(reports, steps, number, resamples, seed))
    return out


def _keyed_steps(report: Report) -> dict[_Key, tuple[int, dict[str, Any], np.ndarray | DiskStep]]:
    """The report's step rows keyed as compare keys them (analysis/compare/runs.py), each with
    its position, its row (plus `label`) and its window's request mask."""
    from analysis.render.plots import group_label

    out: dict[_Key, tuple[int, dict[str, Any], np.ndarray | DiskStep]] = {}
    seen: dict[tuple[bool, float, str], int] = {}
    for position, row, members in step_rows(report):
        rate = row.get("mode") == "rate" and row.get("rate") is not None
        level = float(row["rate"] if rate else row["concurrency"])
        base = (rate, level, str(row.get("model", "")))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[(*base, n)] = (position, {**row, "label": group_label(row)}, members)
    return out


def _step_figures(
    reports: Sequence[Report],
    steps: list[tuple[int, dict[str, Any], np.ndarray | DiskStep]],
    number: int,
    resamples: int,
    seed: int,
) -> list[RepeatFigure]:
    """Every figure of one matched step (steps[i]: run i's position, row and members)."""
    samples: list[StepSample] = [
        step_sample(report, row, members)
        for report, (_, row, members) in zip(reports, steps, strict=True)
    ]
    resampled = [
        sample.resampled(resamples, seed_for(seed, run_no, position))
        for run_no, (sample, (position, _, _)) in enumerate(zip(samples, steps, strict=True), 1)
    ]
    draw = np.random.default_rng(seed_for(seed, 0, number))
    drawn = draw.integers(0, len(reports), size=(resamples, len(reports)))
    row = steps[0][1]
    mode = "rate" if row.get("mode") == "rate" and row.get("rate") is not None else "concurrency"
    out = []
    for name in FIGURES:
        figures = [s.figures[name] for s in samples]
        observed = np.array([f.observed for f in figures], dtype=float)
        values = tuple(float(v) if math.isfinite(v) else None for v in observed)
        median = nearest_rank_median(observed)
        short = [(rid, f.why_not) for rid, f in zip(_ids(reports), figures, strict=True)
                 if not f.enough]  # fmt: skip
        low = high = None
        if not short:
            stacked = np.stack([r[name] for r in resampled])  # runs x resamples
            lo, hi = interval(over_runs(stacked, drawn))
            low, high = _finite(lo), _finite(hi)
        why = _why(short, len(reports))
        out.append(RepeatFigure(
            step=row["label"], mode=mode, concurrency=int(row["concurrency"]),
            rate=float(row["rate"]) if mode == "rate" else None, figure=name,
            median=_finite(median), ci_low=low, ci_high=high, values=values,
            runs=int(np.isfinite(observed).sum()), enough=not short, why=why,
        ))  # fmt: skip
    return out


def over_runs(resampled: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """The second level: `resampled[i, b]` is run i's figure under its resample b, `drawn[b]`
    the runs drawn (with replacement) for resample b; the nearest-rank median over the drawn
    runs' b-th resamples, per b (NaN where none of them has a value)."""
    picked = resampled[drawn, np.arange(drawn.shape[0])[:, None]]  # resamples x runs drawn
    ordered = np.sort(picked, axis=1)  # NaN last
    finite = np.isfinite(ordered).sum(axis=1)
    index = np.maximum(finite - 1, 0) // 2
    medians = ordered[np.arange(len(ordered)), index]
    return np.where(finite > 0, medians, np.nan)


def campaign_runs(events_uri: str, campaign_id: str) -> dict[str, list[str]]:
    """The run URIs under `events_uri` whose manifest config has this `campaign_id`, by
    workload name (in the order they ran: repeat index, then run id); UsageError when none."""
    from analysis.kernel.layout import MANIFEST_NAME
    from analysis.kernel.storage import StorageError, join_uri, open_store

    store = open_store(events_uri)
    found: list[tuple[str, int, str, str]] = []
    for info in store.list(""):
        run_id, _, name = info.key.partition("/")
        if name != MANIFEST_NAME:
            continue
        try:
            manifest = json.loads(store.get(info.key))
        except (ValueError, OSError, StorageError):
            continue  # not a manifest this can read: not one of the campaign's
        config = manifest.get("config") if isinstance(manifest, dict) else None
        if not isinstance(config, dict) or config.get("campaign_id") != campaign_id:
            continue
        repeat = config.get("repeat")
        order = int(repeat) if isinstance(repeat, int) else 0
        found.append((str(config.get("workload_name") or ""), order, run_id, info.key))
    if not found:
        raise UsageError(
            f"no run under {events_uri} belongs to campaign {campaign_id!r} (manifest config "
            "campaign_id); check --events-uri and the id the campaign printed"
        )
    out: dict[str, list[str]] = {}
    for workload, _, run_id, _ in sorted(found, key=lambda f: (f[1], f[2])):
        out.setdefault(workload, []).append(join_uri(events_uri, run_id))
    return out


def _why(short: list[tuple[str, str]], runs: int) -> str:
    """`run b: 10 successful request(s), ...`; one reason shared by several runs said once."""
    by: dict[str, list[str]] = {}
    for rid, reason in short:
        by.setdefault(reason, []).append(rid)
    said = []
    for reason, rids in by.items():
        who = (f"all {runs} runs" if len(rids) == runs and runs > 1
               else f"run{'s' if len(rids) > 1 else ''} {', '.join(rids)}")  # fmt: skip
        said.append(f"{who}: {reason}")
    return "; ".join(said)


def _ids(reports: Sequence[Report]) -> list[str]:
    return [r.run_id for r in reports]


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


__all__ = [
    "REPEATS_KIND",
    "REPEATS_SCHEMA_VERSION",
    "RepeatFigure",
    "Repeats",
    "campaign_runs",
    "over_runs",
    "repeats_of",
    "summarize_repeats",
]
