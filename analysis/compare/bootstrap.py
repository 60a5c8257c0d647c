"""Confidence intervals by bootstrap: how far a step's headline figures could move by chance.

A step's figure (TTFT p99, output tokens/s...) is one draw: run the same plan again and it
comes out a little different. The bootstrap estimates by how much from the run itself, by
resampling what the step measured and recomputing the figure each time:

- **latency percentiles** (TTFT, TPOT, E2E per request; ITL per token): the step's requests
  are cut into GROUPS groups of consecutive completions, the groups are drawn with
  replacement, as many as there are, and each drawn group brings all its requests, each
  request all its samples. A request's ITL samples move together, and so do the requests in
  flight together: a pause of the server or of the client (a garbage collection, a busy
  CPU) stretches all of them at once. Drawn one by one, tokens or requests would give the
  narrower and wrong interval of independent samples, and a tail (an ITL p99) made by two
  such pauses would look firm. The figure is llmload's nearest-rank percentile of the
  resample (analysis/derive/stats.py), weighted by how often each request was drawn; a mean
  (`names=`, MORE_LATENCY_FIGURES) the weighted mean of the resample.
- **throughputs** (output tokens/s, requests/s, goodput): a throughput counts what finished
  in the step's window, so drawing requests of a fixed number cannot move it. The window is
  cut into SLICES equal slices instead, the slices are drawn with replacement, and the
  figure is scaled by what the drawn slices finished against what all of them did
  (a block bootstrap: the window's busy and quiet spells are what make it vary).

Each (run, step) draws one resample plan for all its figures (they move together), from a
seeded generator: `numpy.random.default_rng(SeedSequence([seed, run, step]))`, seed 0 by
default (`--seed`), RESAMPLES resamples (`--resamples`). The same inputs and seed give the
same intervals, bit for bit.

An interval is the percentile interval of the resampled figures (nearest rank, 2.5% and
97.5% for 95%). A figure has too few data to judge (`enough` False) when fewer than
MIN_REQUESTS successful requests carry it, or fewer than MIN_TAIL samples lie beyond its
percentile (a p99 needs 500 requests: at 150 the p99 is the second-highest value, and an
interval of it says nothing).

A drawn group brings all its requests, so a resample is GROUPS counts: each figure is
computed from per-group sums or per-group cumulative weights (Figure.resample), never from
a resamples x requests table (1,000 x 1M counts at a million requests: 8 GB, minutes).

Resampling needs each request's values: runs are summarised with their chunks in memory
(the ITL samples), so the intervals are for runs of up to a few million chunk rows; a run
summarised out of core has no ITL interval (`enough` False, reason given).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from analysis.derive.stats import weighted_quantiles
from analysis.kernel.percentiles import PERCENTILES

if TYPE_CHECKING:
    from analysis.report.summary import Report
    from analysis.steps.outofcore import DiskStep

RESAMPLES: Final = 1000
"""Resamples per (run, step) by default (`--resamples`)."""

SEED: Final = 0
"""The default seed (`--seed`)."""

CONFIDENCE: Final = 0.95
"""The confidence of every interval: the 2.5% and 97.5% points of the resampled figures."""

SLICES: Final = 10
"""Equal slices of a step's window that the throughputs are resampled by."""

GROUPS: Final = 10
"""Groups of consecutive completions that a step's requests are resampled by (fewer when
the step has fewer requests: then each request is a group)."""

MIN_REQUESTS: Final = 20
"""A figure carried by fewer successful requests than this has too few data to judge."""

MIN_TAIL: Final = 5
"""A percentile needs at least this many samples beyond it (p99: 500 requests)."""

LATENCY_FIGURES: Final = tuple(
    f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e") for s in ("p50", "p99")
)
RATE_FIGURES: Final = ("output_tokens_per_s", "requests_per_s", "goodput_requests_per_s")
FIGURES: Final = (*LATENCY_FIGURES, *RATE_FIGURES)
"""The headline figures given intervals, in report order."""

MORE_LATENCY_FIGURES: Final = tuple(
    f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p90")
)
MORE_RATE_FIGURES: Final = ("input_tokens_per_s",)
"""Latency and rate figures that step_sample resamples when asked (`names=`): compare judges
them too, so that no figure of a step it shows is decided without an interval. Input
tokens/s counts the requests whose first token came in the window: its slices are cut by
that moment (the end less the time from first token to end)."""

_TOLERANCE = 1e-9  # as analysis/derive/stats.py: "exactly 99 of 100" must not become "just under"


@dataclass(frozen=True)
class Figure:
    """One figure of one step, ready to resample.

    A percentile figure (`q` set): `values` sorted ascending, `owner[i]` the unit (request)
    each value belongs to, `weight[i]` how many samples it stands for. A rate figure (`q`
    None): `totals[j]` what slice j finished; the figure scales with their drawn sum."""

    name: str
    observed: float
    q: float | None = None
    values: np.ndarray | None = None
    owner: np.ndarray | None = None
    weight: np.ndarray | None = None
    totals: np.ndarray | None = None
    requests: int = 0  # successful requests carrying the figure
    why_not: str = ""  # non-empty: too few data to judge, and why
    mean: bool = False  # a mean (`q` None, `values`/`owner`/`weight` set): not a rate

    @property
    def by_request(self) -> bool:
        """Resampled by drawing requests (percentiles, means), not slices of the window."""
        return self.q is not None or self.mean

    @property
    def enough(self) -> bool:
        return not self.why_not

    def resample(self, counts: np.ndarray, unit_group: np.ndarray | None = None) -> np.ndarray:
        """The figure under each resample. A request figure: `counts` (resamples x groups)
        says how often each group was drawn, `unit_group` each unit's (request's) group; a
        rate: `counts` (resamples x slices) how often each slice was drawn. NaN where a
        resample has no data.

        A drawn group brings all its requests, so a resample only reweighs the groups: each
        figure is computed from per-group sums (a mean) or per-group cumulative weights along
        the sorted values (a percentile: a binary search per resample), never from a matrix
        of resamples x samples. With integer weights (counts of samples) the sums are exact,
        so the result is the weighted nearest rank of the resample, bit for bit."""
        if self.totals is None and (self.values is None or not len(self.values)):
            return np.full(len(counts), np.nan)  # no samples (none carried it, or out of core)
        if self.q is None and not self.mean:
            assert self.totals is not None
            whole = float(self.totals.sum())
            if not whole or not np.isfinite(self.observed):
                return np.full(len(counts), np.nan)
            drawn = counts @ self.totals / len(self.totals)  # mean slice, as drawn
            return self.observed * drawn / (whole / len(self.totals))
        assert self.values is not None and self.owner is not None and self.weight is not None
        assert unit_group is not None
        groups = counts.shape[1]
        owner_group = unit_group[self.owner]
        if self.mean:
            sums = np.bincount(owner_group, self.weight * self.values, minlength=groups)
            weights = counts @ np.bincount(owner_group, self.weight, minlength=groups)
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(weights > 0, (counts @ sums) / weights, np.nan)
        assert self.q is not None
        return _weighted_rank(self.values, owner_group, self.weight, counts, self.q)


def _weighted_rank(
    values: np.ndarray, group: np.ndarray, weight: np.ndarray, counts: np.ndarray, q: float
) -> np.ndarray:
    """Per resample (a row of `counts`: how often each group was drawn), the weighted nearest
    rank q of `values` (sorted ascending), each value weighing weight x its group's count:
    the first value at which the cumulative weight reaches q of the total."""
    n, resamples = len(values), len(counts)
    positions = [np.flatnonzero(group == g) for g in range(counts.shape[1])]
    cumulative = [np.cumsum(weight[p]) for p in positions]

    def weight_up_to(index: np.ndarray) -> np.ndarray:  # per resample: cum. weight at index
        out = np.zeros(resamples)
        for g, (where, cum) in enumerate(zip(positions, cumulative, strict=True)):
            if not len(where):
                continue
            taken = np.searchsorted(where, index, side="right") - 1
            out += counts[:, g] * np.where(taken >= 0, cum[np.maximum(taken, 0)], 0.0)
        return out

    total = weight_up_to(np.full(resamples, n - 1))
    target = q * total - _TOLERANCE * total
    low, high = np.zeros(resamples, dtype=np.int64), np.full(resamples, n, dtype=np.int64)
    while (open_ := low < high).any():  # the first index whose cumulative weight >= target
        mid = (low + high) // 2
        below = weight_up_to(np.minimum(mid, n - 1)) < target
        low = np.where(open_ & below, mid + 1, low)
        high = np.where(open_ & ~below, mid, high)
    value = values[np.clip(low, 0, n - 1)]
    return np.where(total > 0, value, np.nan)


@dataclass(frozen=True)
class StepSample:
    """What one run measured in one step, as the bootstrap resamples it."""

    requests: int  # units of the request resample: the step's successful requests
    figures: dict[str, Figure]
    group: np.ndarray  # per request: its group of consecutive completions (_groups)

    def resampled(self, resamples: int, seed: np.random.SeedSequence) -> dict[str, np.ndarray]:
        """figure -> its value under each of `resamples` resamples (one plan for all)."""
        rng = np.random.default_rng(seed)
        n = self.requests
        group = self.group
        k = int(group.max()) + 1 if n else 0
        by_group = (  # how often each group is drawn; its requests come with it
            rng.multinomial(k, np.full(k, 1.0 / k), size=resamples)
            if n
            else np.zeros((resamples, 0), dtype=np.int64)
        )
        by_slice = rng.multinomial(SLICES, np.full(SLICES, 1.0 / SLICES), size=resamples)
        return {
            name: fig.resample(by_group, group) if fig.by_request else fig.resample(by_slice)
            for name, fig in self.figures.items()
        }


def interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The nearest-rank percentile interval of resampled figures (NaN ones left out)."""
    tail = (1.0 - confidence) / 2.0
    low, high = weighted_quantiles(values[np.isfinite(values)], None, [tail, 1.0 - tail])
    return float(low), float(high)


def nearest_rank_median(values: np.ndarray) -> float:
    """The lower median of the finite values (a value that was measured); NaN when none."""
    return float(weighted_quantiles(values[np.isfinite(values)], None, [0.5])[0])


def seed_for(seed: int, *path: int) -> np.random.SeedSequence:
    """The seed sequence of one (run, step): the same numbers give the same resamples."""
    return np.random.SeedSequence([int(seed), *(int(p) for p in path)])


def _why_not(requests: int, tail_samples: float, q: float) -> str:
    if requests < MIN_REQUESTS:
        return f"{requests} successful request(s), fewer than {MIN_REQUESTS}"
    if tail_samples < MIN_TAIL:
        need = int(np.ceil(MIN_TAIL / (1.0 - q)))
        return f"p{q * 100:g} needs {need}+ samples ({MIN_TAIL} beyond it); {requests} request(s)"
    return ""


Prepared = tuple[
    tuple[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]
]
"""A metric's samples as the figures take them: (values, owner, weight) with the missing and
weightless left out, in their order and sorted by value (stable)."""


def _prepare(values: np.ndarray, owner: np.ndarray, weight: np.ndarray) -> Prepared:
    """A metric's samples, filtered and sorted once for all its figures (p50, p99, mean...)."""
    keep = np.isfinite(values) & (weight > 0)
    values, owner, weight = values[keep], owner[keep], weight[keep]
    order = np.argsort(values, kind="stable")
    return (values, owner, weight), (values[order], owner[order], weight[order])


def _percentile_figure(name: str, observed: float, prepared: Prepared, requests: int) -> Figure:
    (values, owner, weight), (ordered, ordered_owner, ordered_weight) = prepared
    if name.split("_")[1] == "mean":
        return Figure(name, observed, None, values, owner, weight, requests=requests,
                      why_not=_why_not(requests, float("inf"), 0.5), mean=True)  # fmt: skip
    q = PERCENTILES[name.split("_")[1]]
    tail = float(weight.sum()) * (1.0 - q)
    return Figure(name, observed, q, ordered, ordered_owner, ordered_weight,
                  requests=requests, why_not=_why_not(requests, tail, q))  # fmt: skip


def _slice_totals(done_ns: np.ndarray, amounts: np.ndarray, start: int, end: int) -> np.ndarray:
    inside = (done_ns >= start) & (done_ns <= end)
    edges = np.linspace(start, end, SLICES + 1)
    which = np.clip(np.searchsorted(edges, done_ns[inside], side="right") - 1, 0, SLICES - 1)
    return np.bincount(which, weights=amounts[inside], minlength=SLICES).astype(np.float64)


def step_rows(report: Report) -> Iterator[tuple[int, dict[str, Any], np.ndarray | DiskStep]]:
    """(position in report.table.rows, row, its window's requests: a mask in memory, the
    engine's draw out of core) of every step row."""
    if report.disk_steps is not None:
        for position, row in enumerate(report.table.rows):
            if row["group"] == "step":
                yield position, row, report.disk_steps[position]
        return
    per = report.per_request
    step = per["step"].to_numpy()
    base = per["steady"].to_numpy(bool) & ~per["cold"].to_numpy(bool)
    base &= per["status"].to_numpy(object) != "dropped"
    for position, row in enumerate(report.table.rows):
        if row["group"] != "step":
            continue
        mask = base & (step == row["step"])
        if "model" in row:
            mask &= per["model"].astype(str).to_numpy(object) == str(row["model"])
        yield position, row, mask


def step_sample(
    report: Report,
    row: dict[str, Any],
    members: np.ndarray | DiskStep,
    names: tuple[str, ...] = FIGURES,
) -> StepSample:
    """The bootstrap's view of one step row of a report (`members`: its window's requests, as
    step_rows gives them): the figures `names`, of FIGURES, MORE_LATENCY_FIGURES and
    MORE_RATE_FIGURES."""
    if not isinstance(members, np.ndarray):
        return disk_step_sample(members, row, names)
    per = report.per_request
    ok_mask = members & (per["status"].to_numpy(object) == "ok")
    rows = np.flatnonzero(ok_mask)
    n = len(rows)
    unit = np.arange(n, dtype=np.int64)
    ones = np.ones(n)
    figures: dict[str, Figure] = {}
    rates = (*RATE_FIGURES, *MORE_RATE_FIGURES)
    prepared: dict[str, tuple[Prepared, int] | None] = {}  # metric -> its samples, once
    for name in (n for n in names if n not in rates):
        metric = name.split("_")[0]
        observed = _observed(row, name)
        if metric not in prepared:
            if metric == "itl":
                prepared[metric] = _itl_samples(report, rows)
            else:
                values = per[f"{metric}_s"].to_numpy(np.float64)[rows]
                carried = int(np.isfinite(values).sum())
                prepared[metric] = (_prepare(values, unit, ones), carried)
        samples = prepared[metric]
        if samples is None:
            figures[name] = Figure(name, observed, requests=n,
                                   why_not="the run was summarised out of core: no per-token samples")  # fmt: skip
            continue
        figures[name] = _percentile_figure(name, observed, samples[0], samples[1])
    done = report.table.done_ns
    assert done is not None  # compare reads the request rows into memory (analysis/compare/runs.py)
    eligible = ~per["cold"].to_numpy(bool) & (per["status"].to_numpy(object) == "ok")
    start, end = row.get("window_start_ns"), row.get("window_end_ns")
    good = per["good"].to_numpy(dtype=object)
    amounts = {
        "output_tokens_per_s": np.nan_to_num(per["output_tokens"].to_numpy(np.float64)),
        "requests_per_s": np.ones(len(per)),
        "goodput_requests_per_s": np.array([g is True for g in good], dtype=np.float64),
        "input_tokens_per_s": np.nan_to_num(
            _reported_or(per, "prompt_tokens", "prompt_tokens_requested")
        ),
    }
    to_end = per["e2e_s"].to_numpy(np.float64) - per["ttft_s"].to_numpy(np.float64)
    first_token = done - np.round(np.nan_to_num(to_end) * 1e9).astype(np.int64)
    for name in (n for n in names if n in rates):
        observed = _observed(row, name)
        if start is None or end is None or not np.isfinite(observed):
            figures[name] = Figure(name, observed, totals=np.zeros(SLICES), requests=n,
                                   why_not="the step has no window or no such figure")  # fmt: skip
            continue
        when = first_token if name == "input_tokens_per_s" else done
        totals = _slice_totals(when[eligible], amounts[name][eligible], int(start), int(end))
        why = f"{n} successful request(s), fewer than {MIN_REQUESTS}" if n < MIN_REQUESTS else ""
        figures[name] = Figure(name, observed, totals=totals, requests=n, why_not=why)
    return StepSample(n, figures, _groups(done[rows]))


def disk_step_sample(disk: DiskStep, row: dict[str, Any], names: tuple[str, ...]) -> StepSample:
    """step_sample of a step drawn from the engine (analysis/steps/outofcore.bootstrap_steps):
    its sampled requests are the units, each with its latencies and ITL samples; the rates'
    slice totals are the whole run's."""
    n = len(disk.done_ns)
    unit = np.arange(n, dtype=np.int64)
    ones = np.ones(n)
    figures: dict[str, Figure] = {}
    rates = (*RATE_FIGURES, *MORE_RATE_FIGURES)
    prepared: dict[str, tuple[Prepared, int]] = {}
    for name in (n for n in names if n not in rates):
        metric = name.split("_")[0]
        if metric not in prepared:
            if metric == "itl":
                owner, values, weight = disk.itl
                prepared[metric] = (_prepare(values, owner, weight), len(np.unique(owner)))
            else:
                values = disk.values[f"{metric}_s"]
                prepared[metric] = (_prepare(values, unit, ones), int(np.isfinite(values).sum()))
        samples, carried = prepared[metric]
        figures[name] = _percentile_figure(name, _observed(row, name), samples, carried)
    for name in (n for n in names if n in rates):
        observed = _observed(row, name)
        totals = disk.totals.get(name)
        if totals is None or not np.isfinite(observed):
            figures[name] = Figure(name, observed, totals=np.zeros(SLICES), requests=n,
                                   why_not="the step has no window or no such figure")  # fmt: skip
            continue
        why = f"{n} successful request(s), fewer than {MIN_REQUESTS}" if n < MIN_REQUESTS else ""
        figures[name] = Figure(name, observed, totals=totals, requests=n, why_not=why)
    return StepSample(n, figures, _groups(disk.done_ns))


def _reported_or(per: Any, column: str, otherwise: str) -> np.ndarray:
    """A count column as floats, `otherwise`'s value where it is missing (NaN where both)."""
    value = per[column].to_numpy(np.float64, na_value=np.nan)
    return np.where(np.isnan(value), per[otherwise].to_numpy(np.float64, na_value=np.nan), value)


def _observed(row: dict[str, Any], name: str) -> float:
    value = row.get(name)
    return float("nan") if value is None else float(value)


def _groups(done_ns: np.ndarray) -> np.ndarray:
    """Each request's group: GROUPS groups of consecutive completions, as equal as can be."""
    n = len(done_ns)
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(done_ns, kind="stable")] = np.arange(n)
    return rank * min(GROUPS, n) // max(n, 1)


def _itl_samples(report: Report, rows: np.ndarray) -> tuple[Prepared, int] | None:
    """The ITL samples of the requests `rows` (their owner: the position among them) and how
    many requests carry one; None when the run was summarised out of core."""
    itl = report.itl
    if itl is None:
        return None
    position = np.full(len(report.per_request), -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    owner = position[itl.request]
    keep = owner >= 0
    values, weight = itl.value_s[keep], itl.weight[keep]
    carried = len(np.unique(owner[keep]))
    return _prepare(values, owner[keep], weight), carried
